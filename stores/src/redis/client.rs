//! Lethe's own connections to a Redis server, for the route's clients and for the purge: TCP, or
//! TLS verified like every upstream (a `rediss://` server is never spoken to in plain text),
//! authenticated with the route's credential, in the protocol asked for.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resp::{Proto, Replies, Reply, command_bytes};

/// The largest answer Lethe reads from Redis.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// Why a connection to Redis failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Redis cannot be reached, did not answer in time, or dropped the connection.
    #[error("{0}")]
    Unavailable(String),
    /// What the configuration names does not work: the credential or database is refused, the
    /// server's certificate is not trusted.
    #[error("{0}")]
    Misconfigured(String),
}

/// One Redis server, as a route or an erasure target names it.
#[derive(Clone)]
pub struct Server {
    host: String,
    port: u16,
    /// `rediss://`: spoken to over TLS only.
    tls: bool,
    /// The ACL user and password Lethe authenticates with.
    credential: Option<(String, String)>,
    /// The database, when not 0.
    db: Option<u32>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_string())
    }
}

/// The server without its credential, for reports and logs.
impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)?;
        match self.db {
            Some(db) => write!(f, "/{db}"),
            None => Ok(()),
        }
    }
}

impl Server {
    /// The server of a `redis://` or `rediss://` URL (`[user[:password]@]host[:port][/db]`,
    /// user and password percent-encoded); `credential` (user, password) when the URL has none.
    pub fn of_url(url: &str, credential: Option<(String, String)>) -> Result<Server, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("rediss://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else {
            return Err(format!(
                "{} is not a redis:// or rediss:// URL",
                redacted(url)
            ));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, address) = match authority.rsplit_once('@') {
            Some((userinfo, address)) => (Some(userinfo), address),
            None => (None, authority),
        };
        let credential = match userinfo {
            None => credential,
            Some(userinfo) => {
                let (user, password) = userinfo.split_once(':').unwrap_or(("default", userinfo));
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| format!("{}: the credential is not UTF-8", redacted(url)))
                };
                let user = if user.is_empty() { "default" } else { user };
                Some((decode(user)?, decode(password)?))
            }
        };
        let bad_port = || format!("{}: the port is not a number", redacted(url));
        // An IPv6 address is written in brackets: `[::1]:6379`.
        let (host, port) = match address.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((host, "")) => (host, None),
                Some((host, port)) => (host, Some(port.strip_prefix(':').ok_or_else(bad_port)?)),
                None => return Err(format!("{}: an unclosed [", redacted(url))),
            },
            None => match address.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (address, None),
            },
        };
        let port = match port {
            Some(port) => port.parse().map_err(|_| bad_port())?,
            None => 6379,
        };
        if host.is_empty() {
            return Err(format!("{}: no host", redacted(url)));
        }
        let db =
            match path.trim_end_matches('/') {
                "" | "0" => None,
                db => Some(db.parse().map_err(|_| {
                    format!("{}: the database {db:?} is not a number", redacted(url))
                })?),
            };
        Ok(Server {
            host: host.to_owned(),
            port,
            tls,
            credential,
            db,
        })
    }
}

impl Server {
    /// The server a route names: its upstream URL, with the route's credential (the ACL user
    /// in `header`, its password in `value`).
    /// The database Lethe's connections to the server use.
    pub fn db(&self) -> u32 {
        self.db.unwrap_or(0)
    }

    pub fn of_route(route: &crate::data::forward::Route) -> Result<Server, String> {
        let credential = route.credential.as_ref().map(|c| {
            (
                c.name.clone(),
                String::from_utf8_lossy(c.value.as_bytes()).into_owned(),
            )
        });
        Server::of_url(&route.upstream.to_string(), credential)
    }
}

/// A URL without the password it may carry, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// How long a command may wait in Redis for data, beyond the time any exchange may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    No,
    For(Duration),
    Forever,
}

impl Wait {
    /// What `commands::waits` says of a command.
    pub fn of(waits: Option<Option<Duration>>) -> Wait {
        match waits {
            None => Wait::No,
            Some(Some(limit)) => Wait::For(limit),
            Some(None) => Wait::Forever,
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Sync + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin> Io for T {}

/// A connection to Redis.
pub struct Client {
    stream: Box<dyn Io>,
    frames: Replies,
    proto: Proto,
    /// How long one exchange may take before the connection is given up.
    timeout: Duration,
}

impl Client {
    /// Connects within `timeout` (which also bounds each later exchange), over TLS checked
    /// with `tls` for a `rediss://` server, and authenticates and selects the database in
    /// `proto`.
    pub async fn connect(
        server: &Server,
        tls: &Arc<rustls::ClientConfig>,
        proto: Proto,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let late = || ClientError::Unavailable(format!("{server} did not answer in time"));
        let tcp = tokio::time::timeout(
            timeout,
            TcpStream::connect((server.host.as_str(), server.port)),
        )
        .await
        .map_err(|_| late())?
        .map_err(|e| ClientError::Unavailable(format!("{server} cannot be reached: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = match server.tls {
            false => Box::new(tcp),
            true => {
                let name = ServerName::try_from(server.host.clone()).map_err(|e| {
                    ClientError::Misconfigured(format!("{server}: not a TLS server name: {e}"))
                })?;
                let handshake = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp);
                let tls = tokio::time::timeout(timeout, handshake)
                    .await
                    .map_err(|_| late())?
                    .map_err(|e| {
                        match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                            // Not the server we were told of, or not one we may trust.
                            Some(rustls::Error::InvalidCertificate(why)) => {
                                ClientError::Misconfigured(format!(
                                    "{server}: its TLS certificate is not trusted: {why:?}"
                                ))
                            }
                            _ => ClientError::Unavailable(format!("{server}: TLS failed: {e}")),
                        }
                    })?;
                Box::new(tls)
            }
        };
        let mut client = Client {
            stream,
            frames: Replies::new(MAX_ANSWER_BYTES),
            proto,
            timeout,
        };
        let credential = server
            .credential
            .as_ref()
            .map(|(user, password)| [user.as_bytes().to_vec(), password.as_bytes().to_vec()]);
        let mut hello: Vec<Vec<Vec<u8>>> = Vec::new();
        match (proto, credential) {
            (Proto::Resp3, credential) => hello.push(
                [b"HELLO".to_vec(), b"3".to_vec()]
                    .into_iter()
                    .chain(
                        credential
                            .into_iter()
                            .flat_map(|[u, p]| [b"AUTH".to_vec(), u, p]),
                    )
                    .collect(),
            ),
            (Proto::Resp2, Some([user, password])) => {
                hello.push(vec![b"AUTH".to_vec(), user, password]);
            }
            (Proto::Resp2, None) => {}
        }
        if let Some(db) = server.db {
            hello.push(vec![b"SELECT".to_vec(), db.to_string().into_bytes()]);
        }
        for reply in client.call(&hello).await? {
            if let Reply::Error(e) = reply {
                return Err(ClientError::Misconfigured(format!(
                    "{server} refused the credential or database: {}",
                    e
                )));
            }
        }
        Ok(client)
    }

    /// Sends `commands` at once and reads an answer to each.
    pub async fn call(
        &mut self,
        commands: &[impl AsRef<[Vec<u8>]>],
    ) -> Result<Vec<Reply>, ClientError> {
        self.call_waiting(commands, Wait::No).await
    }

    /// `call`, for commands that may wait in Redis for data as long as `wait` says.
    async fn call_waiting(
        &mut self,
        commands: &[impl AsRef<[Vec<u8>]>],
        wait: Wait,
    ) -> Result<Vec<Reply>, ClientError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for command in commands {
            command_bytes(command.as_ref(), &mut out);
        }
        let exchange = async {
            self.stream
                .write_all(&out)
                .await
                .map_err(|e| e.to_string())?;
            let mut replies = Vec::with_capacity(commands.len());
            for _ in commands {
                match self.frames.next(&mut self.stream, self.proto).await {
                    Ok(Some(frame)) => replies.push(frame),
                    Ok(None) => return Err("Redis closed the connection".to_owned()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(replies)
        };
        let limit = match wait {
            Wait::No => Some(self.timeout),
            Wait::For(longer) => Some(self.timeout + longer),
            Wait::Forever => None,
        };
        let answered = match limit {
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .map_err(|_| ClientError::Unavailable("Redis did not answer in time".to_owned()))?,
            None => exchange.await,
        };
        answered.map_err(ClientError::Unavailable)
    }

    /// Sends `commands` without waiting for answers (a subscription's come as they come).
    pub async fn send(&mut self, commands: &[Vec<Vec<u8>>]) -> Result<(), ClientError> {
        let mut out = Vec::new();
        for command in commands {
            command_bytes(command, &mut out);
        }
        tokio::time::timeout(self.timeout, self.stream.write_all(&out))
            .await
            .map_err(|_| {
                ClientError::Unavailable("Redis did not take the command in time".to_owned())
            })?
            .map_err(|e| ClientError::Unavailable(e.to_string()))
    }

    /// The next frame Redis sends, however long it takes (a subscription's messages); `None`
    /// once Redis closed the connection.
    pub async fn next(&mut self) -> Result<Option<Reply>, ClientError> {
        self.frames
            .next(&mut self.stream, self.proto)
            .await
            .map_err(|e| ClientError::Unavailable(e.to_string()))
    }

    /// One command; Redis' error answer is `Err` with its text.
    pub async fn one(&mut self, command: &[&[u8]]) -> Result<Reply, ClientError> {
        let command: Vec<Vec<u8>> = command.iter().map(|a| a.to_vec()).collect();
        let reply = self.call(std::slice::from_ref(&command)).await?;
        match reply.into_iter().next() {
            Some(Reply::Error(e)) => Err(refused(&e)),
            Some(reply) => Ok(reply),
            None => Err(ClientError::Unavailable("Redis sent no answer".to_owned())),
        }
    }

    /// Sends every plan at once, each as one transaction when it is more than one command;
    /// answers, for each, one frame per command (or an `EXECABORT`: the first error Redis
    /// queued the transaction with).
    pub async fn run_many(
        &mut self,
        plans: &[&[Vec<Vec<u8>>]],
        wait: Wait,
    ) -> Result<Vec<Result<Vec<Reply>, Reply>>, ClientError> {
        let (multi, exec) = (vec![b"MULTI".to_vec()], vec![b"EXEC".to_vec()]);
        let all: Vec<&Vec<Vec<u8>>> = plans
            .iter()
            .flat_map(|send| match send.len() {
                0 | 1 => send.iter().collect::<Vec<_>>(),
                _ => std::iter::once(&multi)
                    .chain(send.iter())
                    .chain(std::iter::once(&exec))
                    .collect(),
            })
            .collect();
        let mut replies = self.call_waiting(&all, wait).await?.into_iter();
        let mut answers = Vec::with_capacity(plans.len());
        for send in plans {
            answers.push(match send.len() {
                0 | 1 => Ok(replies.by_ref().take(send.len()).collect()),
                n => transaction(replies.by_ref().take(n + 2).collect(), n)?,
            });
        }
        Ok(answers)
    }
}

/// The answers to `MULTI`, `n` commands and `EXEC`: one frame per command, or why nothing ran.
fn transaction(
    mut replies: Vec<Reply>,
    n: usize,
) -> Result<Result<Vec<Reply>, Reply>, ClientError> {
    let exec = replies.pop().unwrap_or(Reply::Null);
    if let Some(queued) = replies
        .iter()
        .skip(1)
        .find(|r| matches!(r, Reply::Error(_)))
    {
        return Ok(Err(queued.clone()));
    }
    match exec {
        Reply::Array(values) if values.len() == n => Ok(Ok(values)),
        // A watched key changed: nothing ran.
        Reply::Null => Ok(Err(Reply::Null)),
        Reply::Error(e) => Ok(Err(Reply::Error(e))),
        _ => Err(ClientError::Unavailable(
            "Redis' answer to EXEC does not match what was sent".to_owned(),
        )),
    }
}

/// Redis' error answer: a refused credential or permission, or a replica where a primary was
/// named, is a misconfiguration.
fn refused(text: &str) -> ClientError {
    let text = text.to_owned();
    let code = text.split(' ').next().unwrap_or_default();
    match code {
        "NOAUTH" | "WRONGPASS" | "NOPERM" | "READONLY" => ClientError::Misconfigured(text),
        _ => ClientError::Unavailable(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> Arc<rustls::ClientConfig> {
        crate::data::forward::tls_client(None).expect("Mozilla's roots")
    }

    #[test]
    fn urls_name_the_server_its_credential_and_database() {
        let plain = Server::of_url("redis://127.0.0.1:6380/2", None).unwrap();
        assert_eq!(plain.to_string(), "redis://127.0.0.1:6380/2");
        assert!(!plain.tls && plain.credential.is_none());
        let secure = Server::of_url("rediss://lethe:p%40ss%3A1@cache.example/0", None).unwrap();
        assert_eq!(secure.to_string(), "rediss://cache.example:6379");
        assert!(secure.tls);
        assert_eq!(secure.credential, Some(("lethe".into(), "p@ss:1".into())));
        let given = Some(("route".to_owned(), "secret".to_owned()));
        let v6 = Server::of_url("redis://[::1]:7000", given.clone()).unwrap();
        assert_eq!(
            (v6.host.as_str(), v6.port, v6.credential),
            ("::1", 7000, given)
        );
        let v6 = Server::of_url("redis://[::1]", None).unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 6379));
        let password_only = Server::of_url("redis://:pw@h", None).unwrap();
        assert_eq!(
            password_only.credential,
            Some(("default".into(), "pw".into()))
        );
    }

    #[test]
    fn bad_urls_are_refused_without_showing_their_password() {
        for url in [
            "http://h:6379",
            "redis://:secret@h:port",
            "redis://:secret@h/zero",
            "redis://:secret@",
        ] {
            let e = Server::of_url(url, None).unwrap_err();
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn refusals_of_the_credential_are_misconfigurations() {
        assert!(matches!(
            refused("WRONGPASS invalid username-password pair"),
            ClientError::Misconfigured(_)
        ));
        assert!(matches!(
            refused("NOPERM this user has no permissions"),
            ClientError::Misconfigured(_)
        ));
        assert!(matches!(
            refused("LOADING Redis is loading"),
            ClientError::Unavailable(_)
        ));
    }

    #[tokio::test]
    async fn a_rediss_server_that_does_not_speak_tls_is_refused_and_never_sent_the_credential() {
        use tokio::io::AsyncReadExt;
        // A server that answers in plain RESP and keeps what it was sent.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heard = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut heard = vec![0; 4096];
            let n = socket.read(&mut heard).await.unwrap();
            socket.write_all(b"-ERR plain text only\r\n").await.unwrap();
            heard.truncate(n);
            heard
        });
        let url = format!("rediss://lethe:the-password@127.0.0.1:{port}");
        let server = Server::of_url(&url, None).unwrap();
        let e = Client::connect(&server, &tls(), Proto::Resp2, Duration::from_secs(5))
            .await
            .err()
            .expect("no plain-text fallback");
        assert!(e.to_string().contains("TLS"), "{e}");
        let heard = heard.await.unwrap();
        assert_eq!(
            heard.first(),
            Some(&0x16),
            "a TLS handshake record came first"
        );
        assert!(!heard.windows(12).any(|w| w == b"the-password"));
    }
}

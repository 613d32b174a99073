//! A Redis route's connections: a client authenticates with a Lethe token (`AUTH`, `HELLO ...
//! AUTH`), then every command is decided on the keys it names before Redis sees it. Writes carry
//! the deadline Lethe computes (`PEXPIREAT ... LT` in the same transaction, so no key outlives
//! it and an earlier one is kept); reads of a hidden subject's keys answer as if the keys did
//! not exist; `SCAN` answers the caller's keys only; `MULTI`/`EXEC` is all or nothing. Each
//! client connection has its own connection to Redis, authenticated with the route's credential.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lethe_policy::Refusal;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use self::plan::{Answer, Draft, Plan, Proof, WRITE_SCRIPT, lost_script, readable};
pub(super) use self::settle::Recorded;
use self::transaction::Queue;
use super::client::{Client, ClientError, Server, Wait};
use super::commands::{Command, classify, waits};
use super::keys::{Pattern, owner};
use super::resp::{Args, Commands, Gone, Proto, ReadError, Reply};
use crate::data::forward::Route;
use crate::data::policy_cache::View;
use crate::data::route::Timeouts;
use crate::data::tokens::TokenCache;
use crate::data::{DataState, RequestContext};

/// The collection lineage keeps a Redis route's keys under.
pub const KEYS: &str = "keys";

/// The most commands of a pipeline answered together (what one client makes Lethe hold).
const MAX_RUN: usize = 128;

/// How long Redis may take to answer one command before the connection is given up.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// A refusal, as `redis-py` raises its permission error for it.
fn refused(refusal: Refusal) -> Reply {
    Reply::error(format!("NOPERM lethe:{} {refusal}", refusal.code()))
}

/// A refusal of Lethe's own (no policy decision), with its stable code.
fn refused_with(code: &str, message: &str) -> Reply {
    Reply::error(format!("NOPERM lethe:{code} {message}"))
}

fn invalid(message: &str) -> Reply {
    Reply::error(format!("ERR lethe:invalid_request {message}"))
}

fn unavailable(code: &str, message: &str) -> Reply {
    Reply::error(format!("ERR lethe:{code} {message}"))
}

/// One client connection of a Redis route.
pub(super) struct Connection<'a> {
    route: &'a Route,
    state: &'a Arc<DataState>,
    patterns: &'a [Pattern],
    recorded: &'a Recorded,
    ctx: Option<RequestContext>,
    /// The policy a pipeline's run is decided with, while one is: its commands are decided
    /// at one moment, as one request's keys are (a flip that overtakes a write is still found
    /// after it).
    run_policy: Option<Option<Arc<Policy>>>,
    upstream: Option<Client>,
    /// `WRITE_SCRIPT`'s digest, as Redis answered when `upstream` was made and loaded it;
    /// `None` when the route's Redis user may not run scripts.
    write_script: Option<Vec<u8>>,
    /// The connection to Redis the client's subscriptions live on (made on its first
    /// `SUBSCRIBE`): its frames reach the client as they come, each message decided again.
    subscriber: Option<Client>,
    queue: Option<Queue>,
    /// The protocol the client chose (`HELLO`); RESP2 until it does.
    proto: Proto,
    /// How many commands, and bytes of them, one `MULTI` may queue (Lethe keeps them until
    /// `EXEC`): at most `queued` commands of `command_bytes` together.
    limits: Limits,
}

/// What a client connection heard first: its client, or its subscriptions' connection.
enum Heard {
    Client(Result<Option<Args>, ReadError>),
    Subscription(Result<Option<Reply>, ClientError>),
}

/// What the caller's decisions on some keys take.
struct Policy {
    tenant: String,
    /// The subject the caller's token binds it to.
    bound: Option<String>,
    view: View,
}

/// What to do after answering a command.
enum Then {
    Go,
    Close,
}

impl<'a> Connection<'a> {
    pub(super) fn new(
        route: &'a Route,
        state: &'a Arc<DataState>,
        patterns: &'a [Pattern],
        recorded: &'a Recorded,
        limits: Limits,
    ) -> Self {
        Connection {
            route,
            state,
            patterns,
            recorded,
            ctx: None,
            run_policy: None,
            upstream: None,
            write_script: None,
            subscriber: None,
            queue: None,
            proto: Proto::Resp2,
            limits,
        }
    }

    /// Serves the client until it leaves, the protocol cannot go on, or Lethe stops.
    pub(super) async fn serve(
        mut self,
        mut client: TcpStream,
        limit: usize,
        timeouts: Timeouts,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut commands = Commands::new(limit);
        let authenticate_by = tokio::time::Instant::now() + timeouts.authenticate;
        // A command read with a pipeline's run that could not join it: served next.
        let mut carried = None;
        loop {
            let next = match carried.take() {
                Some(next) => next,
                None => {
                    let heard = tokio::select! {
                        next = commands.next(&mut client, self.next_command_by(authenticate_by, &timeouts), timeouts.command) => Heard::Client(next),
                        pushed = self.pushed() => Heard::Subscription(pushed),
                        _ = stopped(&mut stopping) => return,
                    };
                    match heard {
                        Heard::Client(next) => next,
                        Heard::Subscription(pushed) => {
                            let (answers, then) = match pushed {
                                Ok(Some(_)) if let Err(refusal) = self.caller_holds().await => {
                                    (vec![refusal], Then::Close)
                                }
                                Ok(Some(frame)) if self.deliverable(&frame).await => {
                                    (vec![frame], Then::Go)
                                }
                                Ok(Some(_)) => (Vec::new(), Then::Go),
                                // The subscriptions are gone with the connection: the client
                                // reconnects and subscribes again, as it would to Redis.
                                Ok(None) | Err(_) => (
                                    vec![unavailable(
                                        "upstream_unavailable",
                                        "the connection to Redis holding the subscriptions closed",
                                    )],
                                    Then::Close,
                                ),
                            };
                            if !self.answer(&mut client, &answers, then).await {
                                return;
                            }
                            continue;
                        }
                    }
                }
            };
            // Every command of an authenticated client is served only while its token holds:
            // one expired or revoked since `AUTH` closes the connection.
            let next = match next {
                Ok(Some(args)) if self.vouched_for(&args) => match self.caller_holds().await {
                    Ok(()) => Ok(Some(args)),
                    Err(refusal) => {
                        self.answer(&mut client, &[refusal], Then::Close).await;
                        return;
                    }
                },
                other => other,
            };
            let (answers, then) = match next {
                Ok(None) => return,
                // The stream cannot be read past this point: say why, and close.
                Err(ReadError::TimedOut(why)) => (
                    vec![Reply::error(format!("ERR lethe:timeout {why}"))],
                    Then::Close,
                ),
                Err(e) => (vec![invalid(&e.to_string())], Then::Close),
                Ok(Some(args)) if self.batchable(&args) => {
                    // The pipeline's next commands already read join this one, so that Redis
                    // is asked for all of them at once.
                    let mut run = vec![args];
                    while run.len() < MAX_RUN {
                        match commands.buffered() {
                            None => break,
                            Some(Ok(args)) if self.batchable(&args) => run.push(args),
                            Some(other) => {
                                carried = Some(other.map(Some));
                                break;
                            }
                        }
                    }
                    match self.run(run, Wait::No).await {
                        Ok(answers) => (answers, Then::Go),
                        Err(gone) => (vec![gone], Then::Close),
                    }
                }
                Ok(Some(args)) if self.subscribing(&args) => {
                    match self.subscription(args).await {
                        // Redis' confirmations come on the subscription, as they come.
                        Ok(()) => (Vec::new(), Then::Go),
                        Err(refusal) => (vec![refusal], Then::Go),
                    }
                }
                Ok(Some(args)) if !matches!(waits(&args), Ok(None)) => {
                    // While Redis waits for data the client may leave: Redis would stop waiting
                    // for it, and dropping the connection to Redis makes it so, so that nothing
                    // is taken for nobody. Lethe may stop too.
                    let (answer, then) = tokio::select! {
                        answered = self.command(args.clone()) => answered,
                        gone = commands.until_gone(&mut client) => match gone {
                            Gone::Left => return,
                            Gone::Overflowed => {
                                let why = "more than a command's worth sent behind a waiting command";
                                self.answer(&mut client, &[invalid(why)], Then::Close).await;
                                return;
                            }
                        },
                        _ = stopped(&mut stopping) => return,
                    };
                    // Its answer is decided again now that it comes: the caller, the subjects
                    // and their consents may have changed while Redis waited.
                    match self.caller_holds().await {
                        Ok(()) => (vec![self.still_readable(&args, answer).await], then),
                        Err(refusal) => (vec![refusal], Then::Close),
                    }
                }
                Ok(Some(args)) => {
                    let (answer, then) = self.command(args).await;
                    (vec![answer], then)
                }
            };
            if !self.answer(&mut client, &answers, then).await {
                return;
            }
        }
    }

    /// The bound `queue` would pass with `args` queued too, if it would.
    fn over_queue(&self, queue: &Queue, args: &[Vec<u8>]) -> Option<String> {
        let Limits {
            queued,
            command_bytes,
        } = self.limits;
        if queue.commands.len() >= queued {
            Some(format!("{queued} commands"))
        } else if queue.bytes + bytes_of(args) > command_bytes {
            Some(format!("{command_bytes} bytes"))
        } else {
            None
        }
    }

    /// Writes `answers` to the client; `false` when the connection is done with.
    async fn answer(&self, client: &mut TcpStream, answers: &[Reply], then: Then) -> bool {
        let mut out = Vec::new();
        for answer in answers {
            answer.write(self.proto, &mut out);
        }
        if client.write_all(&out).await.is_err() {
            return false;
        }
        if matches!(then, Then::Close) {
            let _ = client.shutdown().await;
            return false;
        }
        true
    }

    /// When the client's next command must have begun: within the time to authenticate from
    /// its connection until it has, then within the idle timeout; any time while it subscribes
    /// (its messages come when they come).
    fn next_command_by(
        &self,
        authenticate_by: tokio::time::Instant,
        timeouts: &Timeouts,
    ) -> Option<tokio::time::Instant> {
        match (&self.ctx, &self.subscriber) {
            (None, _) => Some(authenticate_by),
            (Some(_), Some(_)) => None,
            (Some(_), None) => tokio::time::Instant::now().checked_add(timeouts.idle),
        }
    }

    /// Whether a command is served only while the caller's token holds: every command once
    /// authenticated, but one that authenticates again (`AUTH`, `HELLO`) or leaves.
    fn vouched_for(&self, args: &[Vec<u8>]) -> bool {
        self.ctx.is_some()
            && !matches!(
                classify(args),
                Command::Auth | Command::Hello | Command::Quit
            )
    }

    /// Refused when the token the client authenticated with has expired or been revoked since:
    /// the refusal both planes give from the revocation's answer on. The caller is forgotten.
    async fn caller_holds(&mut self) -> Result<(), Reply> {
        let Some(ctx) = &self.ctx else {
            return Ok(());
        };
        let gone = |why: &str| Reply::error(format!("NOAUTH lethe:unauthenticated {why}"));
        let refusal = if TokenCache::expired(&ctx.claims) {
            gone("the token has expired")
        } else {
            match self.state.revocations.check(&ctx.claims).await {
                Ok(()) => return Ok(()),
                Err(crate::revocations::Refused::Revoked) => gone("the token was revoked"),
                Err(_) => unavailable(
                    "state_unavailable",
                    "whether the token was revoked cannot be known",
                ),
            }
        };
        self.ctx = None;
        Err(refusal)
    }

    /// A waiting command's answer, as it may be given now: what it names of a subject that may
    /// no longer be read (a flip, a withdrawn consent since it was asked) is answered as Redis
    /// answers a wait that found nothing. A `BLPOP` that took her element leaves it taken: it
    /// is hers, and being erased.
    async fn still_readable(&self, args: &[Vec<u8>], answer: Reply) -> Reply {
        let keys = answered_keys(args, &answer);
        if keys.is_empty() {
            return answer;
        }
        let Ok(texts) = keys
            .iter()
            .map(|k| std::str::from_utf8(k))
            .collect::<Result<Vec<&str>, _>>()
        else {
            return Reply::Null;
        };
        match self.readable_now(&texts).await {
            Ok(true) => answer,
            Ok(false) => Reply::Null,
            Err(refusal) => refusal,
        }
    }

    /// Whether the caller may read every one of `keys` now (each decided on its owner's current
    /// state and consent); `false` for a key no pattern gives to the caller's scope. `Err` when
    /// the policy cannot be read.
    async fn readable_now(&self, keys: &[&str]) -> Result<bool, Reply> {
        let Ok(owners) = self.owners(keys) else {
            return Ok(false);
        };
        let policy = self.policy(&owners).await?;
        let now = crate::now();
        Ok(owners.iter().all(|owner| {
            let bound = policy.bound.as_deref();
            readable(
                &policy.view,
                &policy.tenant,
                &self.route.name,
                bound,
                owner,
                now,
            )
            .is_ok()
        }))
    }

    /// `policy`, reused within a pipeline's run while it holds every subject of `owners`.
    async fn decided_policy(
        &mut self,
        owners: &[(String, String, String)],
    ) -> Result<Arc<Policy>, Reply> {
        if let Some(Some(policy)) = &self.run_policy
            && policy.view.holds(owners.iter().map(|o| o.0.as_str()))
        {
            return Ok(policy.clone());
        }
        let policy = Arc::new(self.policy(owners).await?);
        if let Some(kept) = self.run_policy.as_mut() {
            *kept = Some(policy.clone());
        }
        Ok(policy)
    }

    /// The policy the caller's decisions on keys of `owners` take: its tenant, the subject its
    /// token binds, and the subjects' policy.
    async fn policy(&self, owners: &[(String, String, String)]) -> Result<Policy, Reply> {
        let ctx = self.ctx()?;
        let tenant = ctx.tenant().to_owned();
        let bound = ctx.bound.then(|| ctx.subject.clone()).flatten();
        // Collected first: an iterator held across the await would make the future not Send.
        let subjects: Vec<&str> = owners.iter().map(|o| o.0.as_str()).collect();
        let view = self
            .state
            .policy
            .view(&tenant, subjects)
            .await
            .map_err(|_| unavailable("state_unavailable", "the state store cannot be read"))?;
        Ok(Policy {
            tenant,
            bound,
            view,
        })
    }

    /// Whether a command can be answered within a run of a pipeline: one on keys, from an
    /// authenticated client outside `MULTI` (the others change the connection's state).
    fn batchable(&self, args: &[Vec<u8>]) -> bool {
        self.ctx.is_some()
            && self.queue.is_none()
            && matches!(classify(args), Command::Keyed(..))
            && matches!(waits(args), Ok(None))
    }

    async fn command(&mut self, args: Vec<Vec<u8>>) -> (Reply, Then) {
        let command = classify(&args);
        match command {
            Command::Auth => return (self.auth(&args).await, Then::Go),
            Command::Hello => return self.hello(&args).await,
            Command::Quit => return (Reply::ok(), Then::Close),
            Command::Ping if self.queue.is_none() => {
                let pong = match args.get(1) {
                    Some(text) => Reply::Bulk(text.clone()),
                    None => Reply::Simple(b"PONG".to_vec()),
                };
                return (pong, Then::Go);
            }
            _ => {}
        }
        if self.ctx.is_none() {
            return (Reply::error("NOAUTH Authentication required."), Then::Go);
        }
        let answer = match command {
            Command::Multi if self.queue.is_some() => {
                Reply::error("ERR MULTI calls can not be nested")
            }
            Command::Multi => {
                self.queue = Some(Queue::default());
                Reply::ok()
            }
            Command::Exec => match self.queue.take() {
                None => Reply::error("ERR EXEC without MULTI"),
                Some(queue) if queue.failed => {
                    Reply::error("EXECABORT Transaction discarded because of previous errors.")
                }
                Some(queue) => match self.exec(queue.commands).await {
                    Ok(frame) => frame,
                    Err(gone) => return (gone, Then::Close),
                },
            },
            Command::Discard => match self.queue.take() {
                Some(_) => Reply::ok(),
                None => Reply::error("ERR DISCARD without MULTI"),
            },
            _ if let Some(over) = self.queue.as_ref().and_then(|q| self.over_queue(q, &args)) => {
                let queue = self.queue.get_or_insert_with(Queue::default);
                queue.failed = true;
                invalid(&format!("more than {over} in one transaction"))
            }
            _ if self.queue.is_some() => {
                // Decided now so that a refusal discards the transaction, as Redis' errors do;
                // decided again at `EXEC`, when its answer is made.
                let draft = self.draft(command, &args).await;
                let queue = self.queue.get_or_insert_with(Queue::default);
                match draft {
                    Ok(_) => {
                        queue.bytes += bytes_of(&args);
                        queue.commands.push(args);
                        Reply::Simple(b"QUEUED".to_vec())
                    }
                    Err(refusal) => {
                        queue.failed = true;
                        refusal
                    }
                }
            }
            Command::Scan => match self.scan(args).await {
                Ok(frame) => frame,
                Err(gone) => return (gone, Then::Close),
            },
            _ => {
                let wait = match waits(&args) {
                    Ok(wait) => Wait::of(wait),
                    Err(e) => return (invalid(&e), Then::Go),
                };
                match self.run(vec![args], wait).await {
                    Ok(mut answers) => answers.pop().unwrap_or(Reply::Null),
                    Err(gone) => return (gone, Then::Close),
                }
            }
        };
        (answer, Then::Go)
    }

    /// `AUTH [username] token`: the username is ignored, the password is a Lethe token.
    async fn auth(&mut self, args: &[Vec<u8>]) -> Reply {
        let token = match args.len() {
            2 => &args[1],
            3 => &args[2],
            _ => return Reply::error("ERR wrong number of arguments for 'auth' command"),
        };
        self.authenticate(token).await
    }

    async fn authenticate(&mut self, token: &[u8]) -> Reply {
        let wrong =
            |message: String| Reply::error(format!("WRONGPASS lethe:unauthenticated {message}"));
        let Ok(token) = std::str::from_utf8(token) else {
            return wrong("the token is not text".to_owned());
        };
        let claims = match self.state.tokens.verify(token) {
            Ok(claims) => claims,
            Err(e) => return wrong(e.to_string()),
        };
        match self.state.revocations.check(&claims).await {
            Ok(()) => {}
            Err(crate::revocations::Refused::Revoked) => {
                return wrong("the token was revoked".to_owned());
            }
            Err(_) => {
                return unavailable(
                    "state_unavailable",
                    "whether the token was revoked cannot be known",
                );
            }
        }
        let ctx = RequestContext::new(
            String::new(),
            claims,
            &self.route.name,
            &hyper::HeaderMap::new(),
            &self.state.folding,
        );
        match ctx {
            Ok(ctx) => {
                self.ctx = Some(ctx);
                Reply::ok()
            }
            Err(e) => refused_with(e.code.as_str(), &e.message),
        }
    }

    /// `HELLO [2|3 [AUTH username token] [SETNAME name]]`: the protocol the client speaks from
    /// now on (and Lethe to Redis for it), and who it is.
    async fn hello(&mut self, args: &[Vec<u8>]) -> (Reply, Then) {
        let proto = match args.get(1).map(Vec::as_slice) {
            None => self.proto,
            Some(b"2") => Proto::Resp2,
            Some(b"3") => Proto::Resp3,
            Some(_) => {
                return (
                    Reply::error("NOPROTO sorry, this protocol version is not supported"),
                    Then::Go,
                );
            }
        };
        let mut i = 2;
        while i < args.len() {
            match args[i].to_ascii_uppercase().as_slice() {
                b"AUTH" if i + 2 < args.len() => {
                    let answer = self.authenticate(&args[i + 2]).await;
                    if matches!(answer, Reply::Error(_)) {
                        return (answer, Then::Go);
                    }
                    i += 3;
                }
                b"SETNAME" if i + 1 < args.len() => i += 2,
                _ => return (Reply::error("ERR syntax error in HELLO"), Then::Go),
            }
        }
        if proto != self.proto {
            // Redis is spoken to in the client's protocol: a new connection for the new one.
            self.proto = proto;
            self.upstream = None;
        }
        let text = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
        let info = Reply::Map(vec![
            (text("server"), text("redis")),
            (
                text("proto"),
                Reply::Int(if proto == Proto::Resp3 { 3 } else { 2 }),
            ),
            (text("mode"), text("standalone")),
            (text("role"), text("master")),
            (text("modules"), Reply::Array(Vec::new())),
        ]);
        (info, Then::Go)
    }

    /// The caller's context (only called once authenticated).
    fn ctx(&self) -> Result<&RequestContext, Reply> {
        self.ctx
            .as_ref()
            .ok_or_else(|| Reply::error("NOAUTH Authentication required."))
    }

    /// Whose each of `keys` is; refused when a key matches no pattern, or names another
    /// tenant or (for a token bound to one) another subject, or a subject not in its one
    /// spelling.
    fn owners(&self, keys: &[&str]) -> Result<Vec<(String, String, String)>, Reply> {
        let ctx = self.ctx()?;
        keys.iter()
            .map(|key| {
                let owner = owner(self.patterns, key).ok_or_else(|| {
                    refused_with("unknown_endpoint", "a key matches no pattern of the route")
                })?;
                if owner.tenant != ctx.tenant() {
                    return Err(refused(Refusal::ScopeViolation));
                }
                let canonical = lethe_policy::names::canonical_key(owner.subject, ctx.fold)
                    .map_err(|e| invalid(&format!("the subject a key names {e}")))?;
                if canonical != owner.subject {
                    return Err(invalid(
                        "the subject a key names is not in its one spelling",
                    ));
                }
                if ctx.bound && ctx.subject.as_deref() != Some(owner.subject) {
                    return Err(refused(Refusal::ScopeViolation));
                }
                Ok((
                    owner.subject.to_owned(),
                    owner.purpose.to_owned(),
                    owner.category.to_owned(),
                ))
            })
            .collect()
    }

    /// The deadline each key already has in Redis (`PEXPIRETIME`): `None` for a key that does
    /// not exist, `Some(None)` for one without a deadline (written around Lethe).
    async fn held(&mut self, keys: &[&str]) -> Result<Vec<Option<Option<DateTime<Utc>>>>, Reply> {
        let asks: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .map(|key| vec![b"PEXPIRETIME".to_vec(), key.as_bytes().to_vec()])
            .collect();
        self.call(&asks)
            .await?
            .into_iter()
            .map(|reply| match reply {
                Reply::Int(-2) => Ok(None),
                Reply::Int(-1) => Ok(Some(None)),
                Reply::Int(ms) => Ok(Some(DateTime::from_timestamp_millis(ms))),
                _ => Err(unavailable(
                    "upstream_invalid",
                    "Redis' PEXPIRETIME is no number",
                )),
            })
            .collect()
    }

    /// Sends `commands` on this client's Redis connection (made on first use).
    async fn call(&mut self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Reply>, Reply> {
        let upstream = self.upstream().await?;
        match upstream.call(commands).await {
            Ok(replies) => Ok(replies),
            Err(e) => {
                self.upstream = None;
                Err(unavailable("upstream_unavailable", &e.to_string()))
            }
        }
    }

    /// A new connection to the route's Redis, in the client's protocol.
    async fn connect(&self) -> Result<Client, Reply> {
        let failed = |e: String| unavailable("upstream_unavailable", &e);
        let server = Server::of_route(self.route).map_err(failed)?;
        let timeout = self.route.timeout.unwrap_or(UPSTREAM_TIMEOUT);
        let tls = self.state.upstreams.tls();
        Client::connect(&server, &tls, self.proto, timeout)
            .await
            .map_err(|e| failed(e.to_string()))
    }

    /// `WRITE_SCRIPT`'s digest on the route's Redis (connecting to it first), if it runs
    /// scripts.
    async fn write_script(&mut self) -> Result<Option<Vec<u8>>, Reply> {
        self.upstream().await?;
        Ok(self.write_script.clone())
    }

    async fn upstream(&mut self) -> Result<&mut Client, Reply> {
        if self.upstream.is_none() {
            let mut client = self.connect().await?;
            // A route's user without scripting (an ACL without @scripting) gets every write
            // the general way: its deadline read first.
            let load: &[&[u8]] = &[b"SCRIPT", b"LOAD", WRITE_SCRIPT.as_bytes()];
            self.write_script = match client.one(load).await {
                Ok(Reply::Bulk(digest)) => Some(digest),
                _ => None,
            };
            self.upstream = Some(client);
        }
        self.upstream
            .as_mut()
            .ok_or_else(|| unavailable("upstream_unavailable", "no connection to Redis"))
    }

    /// Answers a run of a pipeline's commands (outside `MULTI`) in as few round trips to Redis
    /// as their decisions allow: the deadlines every write's keys hold, read at once, then every
    /// command sent at once, a write with its deadline in a transaction of its own. `Err` when
    /// the connection to Redis is lost: the client's connection is closed with it.
    async fn run(&mut self, run: Vec<Vec<Vec<u8>>>, wait: Wait) -> Result<Vec<Reply>, Reply> {
        let mut drafts = Vec::with_capacity(run.len());
        self.run_policy = Some(None);
        for args in &run {
            drafts.push(self.draft(classify(args), args).await);
        }
        self.run_policy = None;
        let asks: Vec<&str> = drafts
            .iter()
            .flat_map(|draft| match draft {
                Ok(Draft::Pending(write)) => write.asks().collect(),
                _ => Vec::new(),
            })
            .collect();
        // A failed read refuses the writes that needed it, and only them.
        let held = match asks.is_empty() {
            true => Ok(Vec::new()),
            false => self.held(&asks).await,
        };
        let mut held_each = held.as_deref().unwrap_or_default().iter();
        let plans: Vec<Result<Plan, Reply>> = drafts
            .into_iter()
            .map(|draft| match (draft?, &held) {
                (Draft::Ready(plan), _) => Ok(plan),
                (Draft::Pending(write), Ok(_)) => {
                    let mine: Vec<_> = held_each
                        .by_ref()
                        .take(write.asks().count())
                        .copied()
                        .collect();
                    write.decide(&mine)
                }
                (Draft::Pending(_), Err(refusal)) => Err(refusal.clone()),
            })
            .collect();
        let sends: Vec<&[Vec<Vec<u8>>]> = plans
            .iter()
            .flatten()
            .filter(|plan| !plan.send.is_empty())
            .map(|plan| plan.send.as_slice())
            .collect();
        let mut results = match sends.is_empty() {
            true => Vec::new(),
            false => {
                let upstream = self.upstream().await?;
                match upstream.run_many(&sends, wait).await {
                    Ok(results) => results,
                    Err(e) => {
                        self.upstream = None;
                        return Err(unavailable("upstream_unavailable", &e.to_string()));
                    }
                }
            }
        }
        .into_iter();
        let mut answers = Vec::with_capacity(plans.len());
        for plan in plans {
            answers.push(match plan {
                Err(refusal) => refusal,
                Ok(plan) if plan.send.is_empty() => {
                    if let Answer::Idle(wait) = plan.answer {
                        match wait {
                            Wait::No => {}
                            Wait::For(limit) => tokio::time::sleep(limit).await,
                            Wait::Forever => std::future::pending().await,
                        }
                    }
                    plan.assemble(Vec::new())
                }
                Ok(plan) => match results.next() {
                    Some(Ok(replies)) => {
                        let replies = match plan.proof == Proof::Scripted && lost_script(&replies) {
                            // Redis forgot the script (`SCRIPT FLUSH`, a failover), so it wrote
                            // nothing: sent again whole, which loads it again.
                            true => self.call(&plan.with_script_whole()).await?,
                            false => replies,
                        };
                        let kept = plan.kept(&replies);
                        let answer = plan.assemble(replies);
                        self.settled(&kept, &plan.deleted, answer).await
                    }
                    Some(Err(refused)) => refused,
                    None => unavailable(
                        "upstream_invalid",
                        "Redis answered fewer commands than sent",
                    ),
                },
            });
        }
        Ok(answers)
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`, answered with the caller's keys
    /// only: another tenant's, another subject's (for a bound token), a hidden subject's and
    /// keys no pattern owns are left out; the cursor is Redis' own.
    async fn scan(&mut self, mut args: Vec<Vec<u8>>) -> Result<Reply, Reply> {
        // One SCAN walks at most this much of the keyspace: `COUNT 2147483647` would walk all
        // of it in one command, as `KEYS` (refused) does.
        for at in 2..args.len().saturating_sub(1) {
            if args[at].eq_ignore_ascii_case(b"COUNT") {
                let count = std::str::from_utf8(&args[at + 1])
                    .ok()
                    .and_then(|c| c.parse::<u64>().ok());
                if count.is_some_and(|c| c > MAX_SCAN_COUNT) {
                    args[at + 1] = MAX_SCAN_COUNT.to_string().into_bytes();
                }
            }
        }
        let reply = match self.call(&[args]).await {
            Ok(mut replies) => replies.pop().unwrap_or(Reply::Null),
            Err(gone) => return Err(gone),
        };
        let Reply::Array(mut parts) = reply else {
            return Ok(reply);
        };
        let (Some(Reply::Array(keys)), Some(cursor)) = (parts.pop(), parts.pop()) else {
            return Ok(unavailable(
                "upstream_invalid",
                "Redis' SCAN answer is not a cursor and keys",
            ));
        };
        let mut mine: Vec<(Vec<u8>, (String, String, String))> = Vec::new();
        for key in keys {
            let Reply::Bulk(key) = key else {
                continue;
            };
            let Ok(text) = std::str::from_utf8(&key) else {
                continue;
            };
            if let Some(owner) = self.owners(&[text]).ok().and_then(|o| o.into_iter().next()) {
                mine.push((key, owner));
            }
        }
        let owners: Vec<_> = mine.iter().map(|(_, owner)| owner.clone()).collect();
        let policy = match self.policy(&owners).await {
            Ok(policy) => policy,
            Err(frame) => return Ok(frame),
        };
        let now = crate::now();
        let (store, bound) = (&self.route.name, policy.bound.as_deref());
        let visible: Vec<Reply> = mine
            .into_iter()
            .filter(|(_, owner)| {
                readable(&policy.view, &policy.tenant, store, bound, owner, now).is_ok()
            })
            .map(|(key, _)| Reply::Bulk(key))
            .collect();
        Ok(Reply::Array(vec![cursor, Reply::Array(visible)]))
    }
}

/// The most keys one `SCAN` may ask Redis to walk.
const MAX_SCAN_COUNT: u64 = 1_000;

/// The keys a waiting command's answer gives data of: the key a `BLPOP`, `BRPOP`, `BZPOPMIN` or
/// `BZPOPMAX` took from (its answer's first element), every stream an `XREAD` answers for;
/// none for a nil (the wait found nothing) or an error.
fn answered_keys(args: &[Vec<u8>], answer: &Reply) -> Vec<Vec<u8>> {
    let key_of = |reply: &Reply| match reply {
        Reply::Bulk(key) => Some(key.clone()),
        _ => None,
    };
    let streams = name_of(args) == "XREAD";
    match answer {
        Reply::Array(items) if streams => items
            .iter()
            .filter_map(|item| match item {
                Reply::Array(pair) => pair.first().and_then(key_of),
                _ => None,
            })
            .collect(),
        Reply::Map(pairs) if streams => pairs.iter().filter_map(|(key, _)| key_of(key)).collect(),
        Reply::Array(items) => items.first().and_then(key_of).into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Redis' own answer to a command with too few or too many arguments.
fn wrong_arity(args: &[Vec<u8>]) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{}' command",
        name_of(args).to_lowercase()
    ))
}

/// The keys at `positions` of `args`, as text (a key that is not UTF-8 matches no pattern).
fn utf8_keys<'a>(args: &'a [Vec<u8>], positions: &[usize]) -> Result<Vec<&'a str>, Reply> {
    positions
        .iter()
        .map(|&p| {
            std::str::from_utf8(&args[p]).map_err(|_| {
                refused_with("unknown_endpoint", "a key matches no pattern of the route")
            })
        })
        .collect()
}

/// The bytes a command's arguments hold.
fn bytes_of(args: &[Vec<u8>]) -> usize {
    args.iter().map(Vec::len).sum()
}

fn name_of(args: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&args[0]).to_ascii_uppercase()
}

async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// The bounds a Redis route keeps each client connection within.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The largest command, in bytes; and the most bytes one `MULTI` may queue.
    pub command_bytes: usize,
    /// The most commands one `MULTI` may queue.
    pub queued: usize,
}

/// Serves one client connection of `route`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    route: &Route,
    state: &Arc<DataState>,
    patterns: &[Pattern],
    recorded: &Recorded,
    limits: Limits,
    timeouts: Timeouts,
    client: TcpStream,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    Connection::new(route, state, patterns, recorded, limits)
        .serve(client, limits.command_bytes, timeouts, stopping)
        .await;
}

#[cfg(test)]
mod model_tests;
mod plan;
mod pubsub;
mod settle;
mod transaction;

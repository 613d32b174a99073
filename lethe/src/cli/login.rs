//! `lethe login` and `lethe logout`: a person signs the CLI in through the organisation's
//! OpenID provider (`[auth.oidc]`), with the device authorization grant (RFC 8628) where the
//! provider offers it, else the authorization code flow with PKCE to a loopback redirect
//! (RFC 8252); the tokens are kept in the user's config directory, readable by them only, and
//! every verb then acts as that person.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Failure;
use crate::auth::issuer::{Issuer, Metadata};
use crate::auth::oidc::{OidcError, challenge};
use crate::config::{AccessTokenConfig, Config};

/// A token is renewed this long before it expires, so that it does not expire on the way.
const RENEW_BEFORE: u64 = 60;
/// The longest a person is waited for (the provider's device code may allow less).
const SIGN_IN_WAIT: Duration = Duration::from_secs(600);
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";

/// What `lethe login` keeps: the provider's tokens for this person.
#[derive(Debug, Serialize, Deserialize)]
struct Credentials {
    issuer: String,
    client_id: String,
    access_token: String,
    #[serde(default)]
    refresh_token: Option<String>,
    /// When the access token expires (seconds since the epoch).
    expires_at: u64,
}

/// Where the credentials are kept: `$XDG_CONFIG_HOME/lethe`, else `~/.config/lethe`.
fn credentials_path() -> Result<PathBuf, Failure> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".config"))
            .ok_or_else(|| Failure("neither XDG_CONFIG_HOME nor HOME is set".into(), 2))?,
    };
    Ok(base.join("lethe").join("credentials.json"))
}

fn provider_of(config: &Config) -> Result<&AccessTokenConfig, Failure> {
    config.auth.oidc.as_ref().ok_or_else(|| {
        Failure(
            "this configuration has no [auth.oidc]: there is no provider to sign in through".into(),
            2,
        )
    })
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn failed(what: &str) -> impl Fn(OidcError) -> Failure + '_ {
    move |e| Failure(format!("{what}: {e}"), 1)
}

pub(super) async fn login(config: &Config, browser: bool) -> Result<(), Failure> {
    let access = provider_of(config)?;
    let client_id = access.cli_client_id.as_deref().ok_or_else(|| {
        Failure(
            "[auth.oidc] names no cli_client_id: the provider's client for the CLI".into(),
            2,
        )
    })?;
    let tls = crate::data::forward::tls_of(config).map_err(|e| Failure(e, 2))?;
    let issuer = Issuer::new(&access.issuer, &tls);
    let metadata = issuer
        .metadata()
        .await
        .map_err(failed("the provider"))?
        .clone();
    let sign_in = SignIn {
        issuer: &issuer,
        metadata: &metadata,
        access,
        client_id,
    };
    let tokens = match (&metadata.device_authorization_endpoint, browser) {
        (Some(endpoint), false) => sign_in.device(endpoint).await?,
        _ => sign_in.loopback().await?,
    };
    let credentials = Credentials::of(&tokens, &access.issuer, client_id)?;
    let path = credentials_path()?;
    credentials.save(&path)?;
    eprintln!(
        "Signed in through {}; the CLI now acts as you (kept in {}, until {}{}).",
        access.issuer,
        path.display(),
        rfc3339(credentials.expires_at),
        if credentials.refresh_token.is_some() {
            ", then renewed"
        } else {
            ""
        }
    );
    Ok(())
}

pub(super) fn logout() -> Result<(), Failure> {
    let path = credentials_path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => eprintln!("Signed out: {} removed.", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!("Not signed in."),
        Err(e) => return Err(Failure(format!("cannot remove {}: {e}", path.display()), 1)),
    }
    Ok(())
}

/// The access token of the person signed in with `lethe login` for this configuration's
/// provider, renewed when it is about to expire; `None` when nobody is signed in (or the
/// configuration has no provider).
pub(super) async fn signed_in_token(config: &Config) -> Result<Option<String>, Failure> {
    let Some(access) = &config.auth.oidc else {
        return Ok(None);
    };
    let path = credentials_path()?;
    let Some(mut credentials) = Credentials::load(&path)? else {
        return Ok(None);
    };
    if credentials.issuer != access.issuer {
        return Err(Failure(
            format!(
                "signed in through {}, but this configuration's provider is {}: run `lethe login`",
                credentials.issuer, access.issuer
            ),
            2,
        ));
    }
    if credentials.expires_at > now() + RENEW_BEFORE {
        return Ok(Some(credentials.access_token));
    }
    // One renewal at a time among the CLI's processes: a provider that rotates refresh tokens
    // revokes the whole sign-in when one is spent twice. Whoever waited finds it renewed.
    let _renewing = renewal_lock(&path)?;
    credentials = Credentials::load(&path)?
        .ok_or_else(|| Failure("signed out meanwhile: run `lethe login`".into(), 2))?;
    if credentials.expires_at > now() + RENEW_BEFORE {
        return Ok(Some(credentials.access_token));
    }
    let Some(refresh) = credentials.refresh_token.clone() else {
        return Err(Failure(
            "your sign-in has expired: run `lethe login`".into(),
            2,
        ));
    };
    let tls = crate::data::forward::tls_of(config).map_err(|e| Failure(e, 2))?;
    let issuer = Issuer::new(&access.issuer, &tls);
    let metadata = issuer.metadata().await.map_err(failed("the provider"))?;
    let mut form = form_with(&credentials.client_id, access);
    form.append_pair("grant_type", "refresh_token")
        .append_pair("refresh_token", &refresh);
    let tokens = issuer
        .post(&metadata.token_endpoint, form.finish(), None)
        .await
        .map_err(|e| {
            Failure(
                format!("your sign-in could not be renewed ({e}): run `lethe login`"),
                2,
            )
        })?;
    let renewed = Credentials::of(&tokens, &access.issuer, &credentials.client_id)?;
    // A provider that does not rotate refresh tokens keeps the one it gave.
    credentials = Credentials {
        refresh_token: renewed.refresh_token.or(Some(refresh)),
        ..renewed
    };
    credentials.save(&path)?;
    Ok(Some(credentials.access_token))
}

/// An exclusive lock beside the credentials, held until dropped.
fn renewal_lock(path: &std::path::Path) -> Result<std::fs::File, Failure> {
    let lock = path.with_extension("lock");
    let failed = |e: std::io::Error| Failure(format!("{}: {e}", lock.display()), 1);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock)
        .map_err(failed)?;
    file.lock().map_err(failed)?;
    Ok(file)
}

/// The form fields every request of the CLI's client carries: a public client names itself,
/// and the resource it wants a token for where the configuration names one (RFC 8707).
fn form_with(
    client_id: &str,
    access: &AccessTokenConfig,
) -> form_urlencoded::Serializer<'static, String> {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("client_id", client_id);
    if let Some(resource) = &access.resource {
        form.append_pair("resource", resource);
    }
    form
}

struct SignIn<'a> {
    issuer: &'a Issuer,
    metadata: &'a Metadata,
    access: &'a AccessTokenConfig,
    client_id: &'a str,
}

impl SignIn<'_> {
    fn form(&self) -> form_urlencoded::Serializer<'static, String> {
        form_with(self.client_id, self.access)
    }

    /// RFC 8628: the person is shown where to go and the code to enter there; the token
    /// endpoint is asked at the interval the provider gives until they have.
    async fn device(&self, endpoint: &str) -> Result<Value, Failure> {
        let mut form = self.form();
        form.append_pair("scope", &self.access.cli_scopes.join(" "));
        let started = self
            .issuer
            .post(endpoint, form.finish(), None)
            .await
            .map_err(failed("the provider refused to start a sign-in"))?;
        let text = |name: &str| started[name].as_str().map(str::to_owned);
        let (Some(device_code), Some(user_code), Some(uri)) = (
            text("device_code"),
            text("user_code"),
            text("verification_uri"),
        ) else {
            return Err(Failure(
                "the provider's device authorization answer lacks device_code, user_code or verification_uri".into(),
                1,
            ));
        };
        let (uri, user_code) = (printable(&uri), printable(&user_code));
        match text("verification_uri_complete") {
            Some(complete) => eprintln!(
                "To sign in, open {}\n(or open {uri} and enter the code {user_code}).",
                printable(&complete)
            ),
            None => eprintln!("To sign in, open {uri} and enter the code {user_code}."),
        }
        let lifetime = started["expires_in"].as_u64().unwrap_or(600);
        let deadline =
            tokio::time::Instant::now() + SIGN_IN_WAIT.min(Duration::from_secs(lifetime));
        let mut interval = started["interval"].as_u64().unwrap_or(5).clamp(1, 60);
        loop {
            tokio::time::sleep(Duration::from_secs(interval)).await;
            if tokio::time::Instant::now() >= deadline {
                return Err(Failure("the sign-in was not completed in time".into(), 1));
            }
            let mut form = self.form();
            form.append_pair("grant_type", DEVICE_GRANT)
                .append_pair("device_code", &device_code);
            match self
                .issuer
                .post(&self.metadata.token_endpoint, form.finish(), None)
                .await
            {
                Ok(tokens) => return Ok(tokens),
                Err(OidcError::Refused(code)) if code == "authorization_pending" => {}
                Err(OidcError::Refused(code)) if code == "slow_down" => interval += 5,
                Err(e) => return Err(failed("the sign-in did not complete")(e)),
            }
        }
    }

    /// RFC 8252: the browser is sent to the provider and back to a listener on this machine's
    /// loopback address, which takes one answer carrying this sign-in's `state`.
    async fn loopback(&self) -> Result<Value, Failure> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| Failure(format!("cannot listen on 127.0.0.1: {e}"), 1))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let redirect = format!("http://127.0.0.1:{port}/callback");
        let (verifier, state) = (random_hex()?, random_hex()?);
        let mut query = self.form();
        query
            .append_pair("response_type", "code")
            .append_pair("redirect_uri", &redirect)
            .append_pair("scope", &self.access.cli_scopes.join(" "))
            .append_pair("state", &state)
            .append_pair("code_challenge", &challenge(&verifier))
            .append_pair("code_challenge_method", "S256");
        let endpoint = &self.metadata.authorization_endpoint;
        let joiner = if endpoint.contains('?') { '&' } else { '?' };
        eprintln!(
            "To sign in, open this address in a browser on this machine:\n{}{joiner}{}",
            printable(endpoint),
            query.finish()
        );
        let code = tokio::time::timeout(SIGN_IN_WAIT, redirected_code(listener, &state))
            .await
            .map_err(|_| Failure("the sign-in was not completed in time".into(), 1))??;
        let mut form = self.form();
        form.append_pair("grant_type", "authorization_code")
            .append_pair("code", &code)
            .append_pair("redirect_uri", &redirect)
            .append_pair("code_verifier", &verifier);
        self.issuer
            .post(&self.metadata.token_endpoint, form.finish(), None)
            .await
            .map_err(failed("the provider refused the sign-in"))
    }
}

/// The code of the first answer to `/callback` that carries `state`. Connections are served
/// side by side, each with a few seconds to send its request; anything else (a browser's
/// favicon, a stray page, a wrong `state`) is answered 404 and changes nothing.
async fn redirected_code(
    listener: tokio::net::TcpListener,
    state: &str,
) -> Result<String, Failure> {
    let (found, mut answers) = tokio::sync::mpsc::channel::<Result<String, Failure>>(1);
    let state: std::sync::Arc<str> = state.into();
    loop {
        let stream = tokio::select! {
            Some(answer) = answers.recv() => return answer,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => return Err(Failure(format!("the loopback listener failed: {e}"), 1)),
            },
        };
        let (found, state) = (found.clone(), std::sync::Arc::clone(&state));
        let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
            let answer = callback_answer(request.uri(), &state);
            let (status, page) = match &answer {
                Some(Ok(_)) => (
                    StatusCode::OK,
                    "Signed in: you can close this page and go back to the terminal.",
                ),
                Some(Err(_)) => (
                    StatusCode::BAD_REQUEST,
                    "The sign-in failed: see the terminal.",
                ),
                None => (StatusCode::NOT_FOUND, "Not found."),
            };
            if let Some(answer) = answer {
                let _ = found.try_send(answer);
            }
            let response = Response::builder()
                .status(status)
                .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from_static(page.as_bytes())));
            async move { response }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(5))
            .keep_alive(false)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(connection);
    }
}

/// What a request to the loopback listener says: `None` for anything but `/callback` with this
/// sign-in's `state`; else the code, or the provider's error.
fn callback_answer(uri: &hyper::Uri, state: &str) -> Option<Result<String, Failure>> {
    if uri.path() != "/callback" {
        return None;
    }
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if field("state") != Some(state) {
        return None;
    }
    Some(match (field("code"), field("error")) {
        (Some(code), None) => Ok(code.to_owned()),
        (_, error) => Err(Failure(
            format!(
                "the provider refused the sign-in: {}",
                printable(error.unwrap_or("no code"))
            ),
            1,
        )),
    })
}

impl Credentials {
    /// The credentials of a token answer.
    fn of(tokens: &Value, issuer: &str, client_id: &str) -> Result<Self, Failure> {
        let access_token = tokens["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Failure("the provider's answer carries no access token".into(), 1))?;
        Ok(Credentials {
            issuer: issuer.to_owned(),
            client_id: client_id.to_owned(),
            access_token: access_token.to_owned(),
            refresh_token: tokens["refresh_token"].as_str().map(str::to_owned),
            // Without `expires_in` the token is renewed (or asked for again) at once.
            expires_at: now().saturating_add(tokens["expires_in"].as_u64().unwrap_or(0)),
        })
    }

    /// The credentials kept at `path`, if any; a file others can read is refused, not used.
    fn load(path: &std::path::Path) -> Result<Option<Self>, Failure> {
        let unreadable = |e: String| Failure(format!("{}: {e}", path.display()), 2);
        let metadata = match std::fs::metadata(path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(e.to_string())),
        };
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(unreadable(format!(
                "others can read these credentials (mode {mode:o}): remove the file and run `lethe login`"
            )));
        }
        // Others who can write the folder could put credentials of their own in place.
        let folder = path.parent().map(std::fs::metadata);
        if let Some(Ok(folder)) = folder
            && folder.permissions().mode() & 0o022 != 0
        {
            return Err(unreadable(format!(
                "others can write the folder of these credentials (mode {:o}): make it 0700",
                folder.permissions().mode() & 0o777
            )));
        }
        let text = std::fs::read(path).map_err(|e| unreadable(e.to_string()))?;
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| unreadable(format!("not the CLI's credentials: {e}")))
    }

    /// Written whole to a file only the user can read (its folder too), then moved in place.
    fn save(&self, path: &std::path::Path) -> Result<(), Failure> {
        let failed = |e: std::io::Error| Failure(format!("{}: {e}", path.display()), 1);
        if let Some(folder) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(folder)
                .map_err(failed)?;
            // A folder that was there already is made the user's alone too.
            std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))
                .map_err(failed)?;
        }
        let written = path.with_extension(format!("json.{}", std::process::id()));
        let _ = std::fs::remove_file(&written);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&written)
            .map_err(failed)?;
        let text = serde_json::to_vec_pretty(self).map_err(|e| Failure(e.to_string(), 1))?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(failed)?;
        std::fs::rename(&written, path).map_err(failed)
    }
}

/// What the provider said, fit for a terminal: no control characters (an escape sequence could
/// rewrite what the person reads).
fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).collect()
}

/// 32 random bytes in hex: a PKCE verifier (RFC 7636 allows 43 to 128 such characters) or a
/// `state`.
fn random_hex() -> Result<String, Failure> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| Failure(format!("no randomness: {e}"), 1))?;
    Ok(hex::encode(bytes))
}

fn rfc3339(seconds: u64) -> String {
    i64::try_from(seconds)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(|| seconds.to_string(), |t| t.to_rfc3339())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_provider_says_is_printed_without_control_characters() {
        assert_eq!(
            printable("\u{1b}[2J\u{1b}]0;owned\u{7}ABCD-EFGH"),
            "[2J]0;ownedABCD-EFGH"
        );
    }

    /// Stray requests, a wrong `state` and a connection that never sends its request do not
    /// keep the listener from taking the real answer.
    #[tokio::test]
    async fn the_loopback_listener_takes_the_real_answer_after_stray_requests() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let address = listener.local_addr().unwrap();
        let waiting = tokio::spawn(async move { redirected_code(listener, "s-1").await });
        let _silent = tokio::net::TcpStream::connect(address).await.unwrap();
        for path in [
            "/favicon.ico",
            "/callback?code=x",
            "/callback?code=x&state=s-2",
            "/callback?code=c-1&state=s-1",
        ] {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let request =
                format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            let expected = if path.ends_with("state=s-1") {
                "200"
            } else {
                "404"
            };
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {expected}")),
                "{path}: {answer}"
            );
        }
        let code = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(code.unwrap(), "c-1");
    }

    #[test]
    fn only_the_callback_with_this_sign_ins_state_answers() {
        let answer = |uri: &str| callback_answer(&uri.parse().unwrap(), "s-1");
        assert!(
            answer("/callback?code=c-1&state=s-1").is_some_and(|a| a.is_ok_and(|c| c == "c-1"))
        );
        assert!(answer("/callback?error=access_denied&state=s-1").is_some_and(|a| a.is_err()));
        assert!(answer("/callback?state=s-1").is_some_and(|a| a.is_err()));
        for other in [
            "/callback?code=c-1&state=s-2",
            "/callback?code=c-1",
            "/favicon.ico",
            "/?code=c-1&state=s-1",
        ] {
            assert!(answer(other).is_none(), "{other}");
        }
    }

    #[test]
    fn credentials_are_kept_for_their_owner_only() {
        let folder = std::env::temp_dir().join(format!("lethe-login-{}", uuid::Uuid::new_v4()));
        let path = folder.join("lethe").join("credentials.json");
        let credentials = Credentials {
            issuer: "https://idp.example".into(),
            client_id: "lethe-cli".into(),
            access_token: "at".into(),
            refresh_token: Some("rt".into()),
            expires_at: 1,
        };
        credentials.save(&path).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let loaded = Credentials::load(&path).unwrap().unwrap();
        assert_eq!(loaded.access_token, "at");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            Credentials::load(&path).is_err(),
            "a file others can read is refused"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let folder_of = path.parent().unwrap();
        std::fs::set_permissions(folder_of, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            Credentials::load(&path).is_err(),
            "a folder others can write is refused"
        );
        credentials.save(&path).unwrap();
        assert_eq!(
            mode(folder_of),
            0o700,
            "saving makes the folder the user's alone"
        );
        std::fs::remove_dir_all(&folder).unwrap();
    }
}

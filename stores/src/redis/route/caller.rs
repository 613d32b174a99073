//! Who is calling: `AUTH` and `HELLO ... AUTH` verify a Lethe token, and every later command is
//! served only while that token holds (not expired, not revoked).

use super::{Connection, Then, refused_with, unavailable};
use crate::data::RequestContext;
use crate::data::tokens::TokenCache;
use crate::redis::commands::{Command, classify};
use crate::redis::resp::{Proto, Reply};

impl Connection<'_> {
    /// Whether a command is served only while the caller's token holds: every command once
    /// authenticated, but one that authenticates again (`AUTH`, `HELLO`) or leaves.
    pub(super) fn vouched_for(&self, args: &[Vec<u8>]) -> bool {
        self.ctx.is_some()
            && !matches!(
                classify(args),
                Command::Auth | Command::Hello | Command::Quit
            )
    }

    /// Refused when the token the client authenticated with has expired or been revoked since:
    /// the refusal both planes give from the revocation's answer on. The caller is forgotten.
    pub(super) async fn caller_holds(&mut self) -> Result<(), Reply> {
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

    /// `AUTH [username] token`: the username is ignored, the password is a Lethe token.
    pub(super) async fn auth(&mut self, args: &[Vec<u8>]) -> Reply {
        let token = match args.len() {
            2 => &args[1],
            3 => &args[2],
            _ => return Reply::error("ERR wrong number of arguments for 'auth' command"),
        };
        self.authenticate(token).await
    }

    pub(super) async fn authenticate(&mut self, token: &[u8]) -> Reply {
        let wrong =
            |message: String| Reply::error(format!("WRONGPASS lethe:unauthenticated {message}"));
        let Ok(token) = std::str::from_utf8(token) else {
            return wrong("the token is not text".to_owned());
        };
        let claims = match self.state.tokens.verify(token).await {
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
    pub(super) async fn hello(&mut self, args: &[Vec<u8>]) -> (Reply, Then) {
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
    pub(super) fn ctx(&self) -> Result<&RequestContext, Reply> {
        self.ctx
            .as_ref()
            .ok_or_else(|| Reply::error("NOAUTH Authentication required."))
    }
}

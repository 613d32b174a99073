//! A Redis route's connections: a client authenticates with a Lethe token (`AUTH`, `HELLO ...
//! AUTH`), then every command is decided on the keys it names before Redis sees it. Writes carry
//! the deadline Lethe computes (`PEXPIREAT ... LT` in the same transaction, so no key outlives
//! it and an earlier one is kept); reads of a hidden subject's keys answer as if the keys did
//! not exist; `SCAN` answers the caller's keys only; `MULTI`/`EXEC` is all or nothing. Each
//! client connection has its own connection to Redis, authenticated with the route's credential.

use std::sync::Arc;
use std::time::Duration;

use lethe_policy::Refusal;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub(super) use self::settle::Recorded;
use self::transaction::Queue;
use super::client::{Client, ClientError, Wait};
use super::commands::{Command, classify, waits};
use super::keys::Pattern;
use super::resp::{Args, Commands, Gone, Proto, ReadError, Reply};
use crate::data::forward::Route;
use crate::data::policy_cache::View;
use crate::data::route::Timeouts;
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
                            let (answers, then) = self.pushed_answer(pushed).await;
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
                    let run = self.run_of(args, &mut commands, &mut carried);
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
                    let waited = self.waiting(args, &mut commands, &mut client, &mut stopping);
                    match waited.await {
                        Some(answered) => answered,
                        None => return,
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

    /// What reaches the client of a frame pushed on its subscriptions' connection: decided when
    /// it is sent, for a caller whose token still holds.
    async fn pushed_answer(
        &mut self,
        pushed: Result<Option<Reply>, ClientError>,
    ) -> (Vec<Reply>, Then) {
        match pushed {
            Ok(Some(_)) if let Err(refusal) = self.caller_holds().await => {
                (vec![refusal], Then::Close)
            }
            Ok(Some(frame)) if self.deliverable(&frame).await => (vec![frame], Then::Go),
            Ok(Some(_)) => (Vec::new(), Then::Go),
            // The subscriptions are gone with the connection: the client reconnects and
            // subscribes again, as it would to Redis.
            Ok(None) | Err(_) => (
                vec![unavailable(
                    "upstream_unavailable",
                    "the connection to Redis holding the subscriptions closed",
                )],
                Then::Close,
            ),
        }
    }

    /// A pipeline's run: `first` and the commands after it already read that can join it, so
    /// that Redis is asked for all of them at once; the first that cannot is `carried` over.
    fn run_of(
        &self,
        first: Args,
        commands: &mut Commands,
        carried: &mut Option<Result<Option<Args>, ReadError>>,
    ) -> Vec<Args> {
        let mut run = vec![first];
        while run.len() < MAX_RUN {
            match commands.buffered() {
                None => break,
                Some(Ok(args)) if self.batchable(&args) => run.push(args),
                Some(other) => {
                    *carried = Some(other.map(Some));
                    break;
                }
            }
        }
        run
    }

    /// A waiting command (`BLPOP`, `XREAD BLOCK`, ...), answered as it may be when Redis
    /// answers; `None` when the connection is done with. While Redis waits for data the client
    /// may leave: Redis would stop waiting for it, and dropping the connection to Redis makes it
    /// so, so that nothing is taken for nobody. Lethe may stop too.
    async fn waiting(
        &mut self,
        args: Args,
        commands: &mut Commands,
        client: &mut TcpStream,
        stopping: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<(Vec<Reply>, Then)> {
        let (answer, then) = tokio::select! {
            answered = self.command(args.clone()) => answered,
            gone = commands.until_gone(client) => match gone {
                Gone::Left => return None,
                Gone::Overflowed => {
                    let why = "more than a command's worth sent behind a waiting command";
                    self.answer(client, &[invalid(why)], Then::Close).await;
                    return None;
                }
            },
            _ = stopped(stopping) => return None,
        };
        // Its answer is decided again now that it comes: the caller, the subjects and their
        // consents may have changed while Redis waited.
        Some(match self.caller_holds().await {
            Ok(()) => (vec![self.still_readable(&args, answer).await], then),
            Err(refusal) => (vec![refusal], Then::Close),
        })
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

mod caller;
mod decide;
#[cfg(test)]
mod model_tests;
mod plan;
mod pubsub;
mod settle;
mod transaction;
mod upstream;

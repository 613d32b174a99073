//! A Redis route's connections: a client authenticates with a Lethe token (`AUTH`, `HELLO ...
//! AUTH`), then every command is decided on the keys it names before Redis sees it. Writes carry
//! the deadline Lethe computes (`PEXPIREAT ... LT` in the same transaction, so no key outlives
//! it and an earlier one is kept); reads of a hidden subject's keys answer as if the keys did
//! not exist; `SCAN` answers the caller's keys only; `MULTI`/`EXEC` is all or nothing. Each
//! client connection has its own connection to Redis, authenticated with the route's credential.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lethe_policy::{
    Action, Held, Layer, Overwrite, ReadContext, Refusal, Stamp, WriteFacts, decide_read,
    decide_write_over,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::client::{Client, ClientError, Server, Wait};
use super::commands::{
    Combine, Command, Effect, Keys, Missing, classify, key_positions, reveals, waits,
};
use super::keys::{Pattern, owner};
use super::resp::{Frames, Proto, ReadError, Reply};
use crate::auth::Role;
use crate::data::forward::Route;
use crate::data::lineage::LineageWriter;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::policy_cache::View;
use crate::data::{DataState, RequestContext};
use crate::state::ItemRecord;

/// The collection lineage keeps a Redis route's keys under.
pub const KEYS: &str = "keys";

/// The most commands of a pipeline answered together (what one client makes Lethe hold).
const MAX_RUN: usize = 128;

/// How long Redis may take to answer one command before the connection is given up.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// A write of one key in one round trip (`ONE_TRIP`): the deadline the key holds decides the
/// one it is written with (an earlier one is kept; a key without one was written around Lethe and
/// is not Lethe's to overwrite), read and written at once so nothing comes between. `ARGV`: the
/// refusal of an unstamped key, the deadline Lethe computed (ms), then the command's name and its
/// arguments after the key. Answers the command's own answer (its error as Redis gave it) and
/// the deadline written. Lethe's own script: it reaches the key decided only.
const WRITE_SCRIPT: &str = "local held = redis.call('PEXPIRETIME', KEYS[1]) \
if held == -1 then return redis.error_reply(ARGV[1]) end \
local deadline = tonumber(ARGV[2]) \
if held >= 0 and held < deadline then deadline = held end \
local reply = redis.pcall(ARGV[3], KEYS[1], unpack(ARGV, 4)) \
if type(reply) == 'table' and reply.err then return reply end \
redis.call('PEXPIREAT', KEYS[1], string.format('%d', deadline), 'LT') \
return {reply, deadline}";

/// The writes `WRITE_SCRIPT` carries: each leaves its one key in Redis whenever it does not
/// fail, and answers a status or a count, which pass through Lua unchanged (a counter's value,
/// a double, a map would not).
const ONE_TRIP: &[&[u8]] = &[b"LPUSH", b"RPUSH", b"SADD", b"HSET"];

/// The most arguments a write `WRITE_SCRIPT` carries (Lua unpacks them on a bounded stack).
const ONE_TRIP_ARGS: usize = 1000;

/// The most keys a route remembers the lineage row of.
const RECORDED_KEYS: u64 = 100_000;

/// The stamp each key's lineage row holds, as this route recorded it. A key written again keeps
/// its deadline (a write over a key is clamped to the deadline it holds), so a session cache
/// rewritten all day would record the same row at every write: a write whose stamp is the one
/// recorded is only checked. A key that left Redis and came back holds a new deadline, so a row
/// marked deleted since (by another replica, the purge, the sweeper) is recorded again; and when
/// the lineage writer drops a batch, every row is forgotten, since it may have been one of them.
#[derive(Debug)]
pub(super) struct Recorded {
    rows: moka::sync::Cache<String, Arc<Stamp>>,
    /// The lineage writer's dropped batches when `rows` was last looked at.
    drops_seen: std::sync::atomic::AtomicU64,
}

impl Recorded {
    pub(super) fn new() -> Recorded {
        Recorded {
            rows: moka::sync::Cache::new(RECORDED_KEYS),
            drops_seen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The rows remembered, none if `lineage` dropped a batch since the last look.
    fn rows(&self, lineage: &LineageWriter) -> &moka::sync::Cache<String, Arc<Stamp>> {
        let dropped = lineage.dropped();
        if self
            .drops_seen
            .swap(dropped, std::sync::atomic::Ordering::AcqRel)
            != dropped
        {
            self.rows.invalidate_all();
        }
        &self.rows
    }
}

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

/// What a hidden key reads as, for the command `args`.
fn missing(kind: Missing, args: &[Vec<u8>]) -> Reply {
    let asked = args.len().saturating_sub(2);
    match kind {
        Missing::Nil => Reply::Null,
        Missing::Zero => Reply::Int(0),
        Missing::EmptyArray => Reply::Array(Vec::new()),
        Missing::EmptyMap => Reply::Map(Vec::new()),
        Missing::EmptySet => Reply::Set(Vec::new()),
        Missing::EmptyBulk => Reply::Bulk(Vec::new()),
        Missing::MinusTwo => Reply::Int(-2),
        Missing::NoneType => Reply::Simple(b"none".to_vec()),
        Missing::EmptyScan => {
            Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(Vec::new())])
        }
        Missing::NilPerField => Reply::Array(vec![Reply::Null; asked]),
        Missing::ZeroPerMember => Reply::Array(vec![Reply::Int(0); asked]),
    }
}

/// How the answer to a client's command is made from Redis' answers to what was sent for it.
#[derive(Debug, Clone)]
enum Answer {
    /// Redis' answer to the first command sent.
    First,
    /// Lethe's own answer; nothing is sent.
    Local(Reply),
    /// `MGET`: Redis' values for the keys sent, a nil in the place of each hidden key.
    Splice(Vec<bool>),
    /// A wait for data on keys that are all hidden: nil once the wait is over, as Redis would
    /// answer for keys that do not exist.
    Idle(Wait),
    /// `WRITE_SCRIPT`'s: the command's own answer.
    Scripted,
}

/// How Lethe learns which of a write's keys Redis holds after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// An `EXISTS` of each key written ends the plan's commands (`LPUSHX`, `SETNX`, an
    /// `EXPIRE` of a missing key write nothing).
    Exists,
    /// The plan is one command that writes its keys unless it fails (a plain `SET`).
    Succeeded,
    /// The plan is `WRITE_SCRIPT`, which answers the deadline it wrote.
    Scripted,
}

/// What Lethe sends Redis for one client command, and how it answers the client.
#[derive(Debug, Clone)]
struct Plan {
    send: Vec<Vec<Vec<u8>>>,
    answer: Answer,
    /// The stamps the keys written were decided with: checked again after the write, then
    /// recorded in lineage.
    written: Vec<(String, Stamp)>,
    proof: Proof,
    /// The keys it removes: their lineage rows are marked deleted once Redis has.
    deleted: Vec<String>,
}

impl Plan {
    fn local(frame: Reply) -> Plan {
        Plan {
            send: Vec::new(),
            answer: Answer::Local(frame),
            written: Vec::new(),
            proof: Proof::Exists,
            deleted: Vec::new(),
        }
    }

    fn forward(args: Vec<Vec<u8>>) -> Plan {
        Plan {
            send: vec![args],
            answer: Answer::First,
            written: Vec::new(),
            proof: Proof::Exists,
            deleted: Vec::new(),
        }
    }

    /// The keys written that Redis holds after the write: its answers to the `EXISTS` that
    /// end the plan's commands (`replies` answer `send` one for one).
    fn kept(&self, replies: &[Reply]) -> Vec<(String, Stamp)> {
        match (self.proof, replies) {
            (Proof::Succeeded, [Reply::Error(_)] | []) => return Vec::new(),
            (Proof::Succeeded, _) => return self.written.clone(),
            (Proof::Scripted, [Reply::Array(answered)]) => {
                let written = answered.get(1).and_then(|d| match d {
                    Reply::Int(ms) => DateTime::from_timestamp_millis(*ms),
                    _ => None,
                });
                return match written {
                    Some(at) => self
                        .written
                        .iter()
                        .map(|(key, stamp)| {
                            let mut stamp = stamp.clone();
                            stamp.expires_at = at;
                            (key.clone(), stamp)
                        })
                        .collect(),
                    None => Vec::new(),
                };
            }
            (Proof::Scripted, _) => return Vec::new(),
            (Proof::Exists, _) => {}
        }
        let exists = replies
            .get(replies.len().saturating_sub(self.written.len())..)
            .unwrap_or_default();
        self.written
            .iter()
            .zip(exists)
            .filter(|(_, held)| **held == Reply::Int(1))
            .map(|(written, _)| written.clone())
            .collect()
    }

    /// The commands of a `WRITE_SCRIPT` plan with the script itself in place of its digest.
    fn with_script_whole(&self) -> Vec<Vec<Vec<u8>>> {
        let mut whole = self.send.clone();
        if let Some(command) = whole.first_mut() {
            command.splice(..2, [b"EVAL".to_vec(), WRITE_SCRIPT.as_bytes().to_vec()]);
        }
        whole
    }

    /// The client's answer from Redis' answers to this plan's commands.
    fn assemble(&self, mut replies: Vec<Reply>) -> Reply {
        match &self.answer {
            Answer::Local(frame) => frame.clone(),
            Answer::Idle(_) => Reply::Null,
            Answer::Scripted => match replies.pop() {
                Some(Reply::Array(answered)) if answered.len() == 2 => {
                    answered.into_iter().next().unwrap_or(Reply::Null)
                }
                Some(refused @ Reply::Error(_)) => refused,
                _ => unavailable(
                    "upstream_invalid",
                    "Redis' answer to Lethe's write script is not its two values",
                ),
            },
            Answer::First if replies.is_empty() => Reply::Null,
            Answer::First => replies.swap_remove(0),
            Answer::Splice(hidden) => {
                let Some(Reply::Array(values)) = replies.into_iter().next() else {
                    return unavailable("upstream_invalid", "Redis' answer to MGET is no array");
                };
                let mut values = values.into_iter();
                Reply::Array(
                    hidden
                        .iter()
                        .map(|h| match h {
                            true => Reply::Null,
                            false => values.next().unwrap_or(Reply::Null),
                        })
                        .collect(),
                )
            }
        }
    }
}

/// A write decided but for the deadlines its keys already hold in Redis, which are read for a
/// whole pipeline at once.
struct Pending {
    args: Vec<Vec<u8>>,
    names: Vec<String>,
    /// Each key's subject, purpose and category.
    owners: Vec<(String, String, String)>,
    /// The keys (by place in `names`) the command writes.
    written: Vec<usize>,
    effect: Effect,
    policy: Arc<Policy>,
    now: DateTime<Utc>,
    /// A write that `WRITE_SCRIPT` (of this digest) carries: it needs no deadline read first.
    scripted: Option<Vec<u8>>,
}

/// Lethe's decision on a command: its plan, or a write that needs what its keys hold first.
enum Draft {
    Ready(Plan),
    Pending(Pending),
}

impl Pending {
    /// The keys whose deadline in Redis the decision needs.
    fn asks(&self) -> impl Iterator<Item = &str> {
        let asked = if self.scripted.is_some() {
            &[][..]
        } else {
            &self.written[..]
        };
        asked.iter().map(|&i| self.names[i].as_str())
    }

    /// The plan, given the deadline each key of `asks` holds (`None` for a key that does not
    /// exist, `Some(None)` for one without a deadline).
    fn decide(self, asked: &[Option<Option<DateTime<Utc>>>]) -> Result<Plan, Reply> {
        let Pending {
            args,
            names,
            owners,
            written,
            effect,
            policy,
            now,
            scripted,
        } = self;
        let (tenant, view) = (&policy.tenant, &policy.view);
        let mut held = vec![None; names.len()];
        for (&i, deadline) in written.iter().zip(asked) {
            held[i] = *deadline;
        }
        let mut stamps = Vec::new();
        for (i, owner) in owners.iter().enumerate() {
            let facts = stored(tenant, owner);
            let previous = held[i]
                .flatten()
                .map(|at| stamp_of(view, tenant, owner, at));
            // The key's deadline in Redis is its stamp's; a key without one was written
            // around Lethe, and nobody can show it is theirs.
            let held = match (&held[i], &previous) {
                (Some(None), _) => Held::Unstamped,
                (_, Some(stamp)) => Held::Stamped(stamp),
                _ => Held::Nothing,
            };
            let decided =
                decide_write_over(view, &facts, held, Overwrite::Allowed, now).map_err(refused)?;
            if let Some(stamp) = decided {
                stamps.push((names[i].clone(), stamp));
            }
        }
        if effect == Effect::Take {
            // It adds nothing, so its keys' deadlines stand; sent alone, for a transaction
            // would not wait.
            return Ok(Plan::forward(args));
        }
        let written_stamps: Vec<(String, Stamp)> = written
            .iter()
            .filter_map(|&i| stamps.iter().find(|(k, _)| *k == names[i]).cloned())
            .collect();
        if let [(key, stamp)] = written_stamps.as_slice()
            && let Some(digest) = scripted
        {
            let refusal = refused(Refusal::UnstampedItem);
            let Reply::Error(refusal) = refusal else {
                return Err(refusal);
            };
            let mut args = args.into_iter();
            let name = args.next().unwrap_or_default();
            let send = [
                b"EVALSHA".to_vec(),
                digest,
                b"1".to_vec(),
                key.as_bytes().to_vec(),
                refusal.into_bytes(),
                stamp.expires_at.timestamp_millis().to_string().into_bytes(),
                name,
            ]
            .into_iter()
            .chain(args.skip(1))
            .collect();
            return Ok(Plan {
                send: vec![send],
                answer: Answer::Scripted,
                written: written_stamps,
                proof: Proof::Scripted,
                deleted: Vec::new(),
            });
        }
        if let [(_, stamp)] = written_stamps.as_slice()
            && plain_set(&args)
        {
            // A plain SET replaces its key whatever it held: it carries the deadline itself,
            // one command rather than a transaction.
            let mut args = args;
            args.push(b"PXAT".to_vec());
            args.push(stamp.expires_at.timestamp_millis().to_string().into_bytes());
            return Ok(Plan {
                send: vec![args],
                answer: Answer::First,
                written: written_stamps,
                proof: Proof::Succeeded,
                deleted: Vec::new(),
            });
        }
        let mut send = vec![args];
        for (key, stamp) in &written_stamps {
            send.push(vec![
                b"PEXPIREAT".to_vec(),
                key.as_bytes().to_vec(),
                stamp.expires_at.timestamp_millis().to_string().into_bytes(),
                b"LT".to_vec(),
            ]);
        }
        // What Redis holds after the write decides what lineage records: a write that
        // wrote nothing (LPUSHX, SETNX, EXPIRE of a missing key) claims nothing.
        for (key, _) in &written_stamps {
            send.push(vec![b"EXISTS".to_vec(), key.as_bytes().to_vec()]);
        }
        let deleted = match effect {
            Effect::Delete => names,
            _ => Vec::new(),
        };
        Ok(Plan {
            send,
            answer: Answer::First,
            written: written_stamps,
            proof: Proof::Exists,
            deleted,
        })
    }
}

/// A transaction the client opened with `MULTI`: its commands' plans, or that one was refused.
#[derive(Default)]
struct Queue {
    plans: Vec<Plan>,
    failed: bool,
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
    /// The most commands one `MULTI` may queue (Lethe keeps them until `EXEC`).
    max_queued: usize,
}

/// What a client connection heard first: its client, or its subscriptions' connection.
enum Heard {
    Client(Result<Option<Option<Vec<Vec<u8>>>>, ReadError>),
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
        max_queued: usize,
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
            max_queued,
        }
    }

    /// Serves the client until it leaves, the protocol cannot go on, or Lethe stops.
    pub(super) async fn serve(
        mut self,
        mut client: TcpStream,
        limit: usize,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut frames = Frames::new(limit);
        // A command read with a pipeline's run that could not join it: served next.
        let mut carried = None;
        loop {
            let next = match carried.take() {
                Some(next) => next,
                None => {
                    let heard = tokio::select! {
                        next = frames.command(&mut client) => Heard::Client(next),
                        pushed = self.pushed() => Heard::Subscription(pushed),
                        _ = stopped(&mut stopping) => return,
                    };
                    match heard {
                        Heard::Client(next) => next,
                        Heard::Subscription(pushed) => {
                            let (answers, then) = match pushed {
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
            let (answers, then) = match next {
                Ok(None) => return,
                // The stream cannot be read past this point: say why, and close.
                Err(e) => (vec![invalid(&e.to_string())], Then::Close),
                Ok(Some(Some(args))) if self.batchable(&args) => {
                    // The pipeline's next commands already read join this one, so that Redis
                    // is asked for all of them at once.
                    let mut run = vec![args];
                    while run.len() < MAX_RUN {
                        match frames.buffered_command() {
                            None => break,
                            Some(Ok(Some(args))) if self.batchable(&args) => run.push(args),
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
                Ok(Some(Some(args))) if self.subscribing(&args) => {
                    match self.subscription(args).await {
                        // Redis' confirmations come on the subscription, as they come.
                        Ok(()) => (Vec::new(), Then::Go),
                        Err(refusal) => (vec![refusal], Then::Go),
                    }
                }
                Ok(Some(Some(args))) if !matches!(waits(&args), Ok(None)) => {
                    // While Redis waits for data the client may leave: Redis would stop waiting
                    // for it, and dropping the connection to Redis makes it so, so that nothing
                    // is taken for nobody. Lethe may stop too.
                    let (answer, then) = tokio::select! {
                        answered = self.command(args) => answered,
                        _ = left(&client) => return,
                        _ = stopped(&mut stopping) => return,
                    };
                    (vec![answer], then)
                }
                Ok(Some(Some(args))) => {
                    let (answer, then) = self.command(args).await;
                    (vec![answer], then)
                }
                Ok(Some(None)) => (
                    vec![invalid("a command is an array of bulk strings")],
                    Then::Close,
                ),
            };
            if !self.answer(&mut client, &answers, then).await {
                return;
            }
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

    /// The next frame of the client's subscriptions; never, while it has none.
    async fn pushed(&mut self) -> Result<Option<Reply>, ClientError> {
        match self.subscriber.as_mut() {
            Some(subscriber) => subscriber.next().await,
            None => std::future::pending().await,
        }
    }

    /// Whether a command is about the client's subscriptions (a `PING` too, once it has some:
    /// Redis answers it there).
    fn subscribing(&self, args: &[Vec<u8>]) -> bool {
        self.ctx.is_some()
            && self.queue.is_none()
            && match classify(args) {
                Command::Subscribe | Command::Unsubscribe => true,
                Command::Ping => self.subscriber.is_some(),
                _ => false,
            }
    }

    /// Sends a subscription command on the subscriptions' own connection (made on first use);
    /// each channel subscribed to must be named like a key of the caller's scope.
    async fn subscription(&mut self, args: Vec<Vec<u8>>) -> Result<(), Reply> {
        if matches!(classify(&args), Command::Subscribe) {
            if args.len() < 2 {
                return Err(wrong_arity(&args));
            }
            let channels = utf8_keys(&args, &(1..args.len()).collect::<Vec<_>>())?;
            self.owners(&channels)?;
        }
        if self.subscriber.is_none() {
            self.subscriber = Some(self.connect().await?);
        }
        let sent = match self.subscriber.as_mut() {
            Some(subscriber) => subscriber.send(&[args]).await,
            None => {
                return Err(unavailable(
                    "upstream_unavailable",
                    "no connection to Redis",
                ));
            }
        };
        sent.map_err(|e| {
            self.subscriber = None;
            unavailable("upstream_unavailable", &e.to_string())
        })
    }

    /// Whether a frame of the subscriptions reaches the client: a message on a channel whose
    /// subject the caller may not read now (suppressed, erased, no `retrieve` consent) is
    /// dropped, as the flip hides a subject from every read at once; so is one that cannot be
    /// decided (the state store unreachable).
    async fn deliverable(&self, frame: &Reply) -> bool {
        let (Reply::Push(items) | Reply::Array(items)) = frame else {
            return true;
        };
        let (Some(Reply::Bulk(kind)), Some(Reply::Bulk(channel))) = (items.first(), items.get(1))
        else {
            return true;
        };
        if !matches!(kind.as_slice(), b"message" | b"smessage") {
            return true;
        }
        let Ok(channel) = std::str::from_utf8(channel) else {
            return false;
        };
        let Ok(owners) = self.owners(&[channel]) else {
            return false;
        };
        let Ok(policy) = self.policy(&owners).await else {
            return false;
        };
        owners.iter().all(|owner| {
            readable(
                &policy.view,
                &policy.tenant,
                &self.route.name,
                policy.bound.as_deref(),
                owner,
                crate::now(),
            )
            .is_ok()
        })
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
                Some(queue) => match self.exec(queue.plans).await {
                    Ok(frame) => frame,
                    Err(gone) => return (gone, Then::Close),
                },
            },
            Command::Discard => match self.queue.take() {
                Some(_) => Reply::ok(),
                None => Reply::error("ERR DISCARD without MULTI"),
            },
            _ if self
                .queue
                .as_ref()
                .is_some_and(|q| q.plans.len() >= self.max_queued) =>
            {
                let queue = self.queue.get_or_insert_with(Queue::default);
                queue.failed = true;
                invalid(&format!(
                    "more than {} commands in one transaction",
                    self.max_queued
                ))
            }
            _ if self.queue.is_some() => {
                let plan = self.plan(command, &args).await;
                let queue = self.queue.get_or_insert_with(Queue::default);
                match plan {
                    Ok(plan) => {
                        queue.plans.push(plan);
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

    /// Lethe's decision on one command, as what to send Redis.
    async fn plan(&mut self, command: Command, args: &[Vec<u8>]) -> Result<Plan, Reply> {
        match self.draft(command, args).await? {
            Draft::Ready(plan) => Ok(plan),
            Draft::Pending(write) => {
                let held = self.held(&write.asks().collect::<Vec<_>>()).await?;
                write.decide(&held)
            }
        }
    }

    /// Lethe's decision on one command, but for a write the deadlines its keys hold in Redis.
    async fn draft(&mut self, command: Command, args: &[Vec<u8>]) -> Result<Draft, Reply> {
        let (effect, keys) = match command {
            Command::Keyed(effect, keys) => (effect, keys),
            Command::Ping => return Ok(Draft::Ready(Plan::local(Reply::Simple(b"PONG".to_vec())))),
            Command::Echo => {
                return match args.get(1) {
                    Some(text) if args.len() == 2 => {
                        Ok(Draft::Ready(Plan::local(Reply::Bulk(text.clone()))))
                    }
                    _ => Err(Reply::error(
                        "ERR wrong number of arguments for 'echo' command",
                    )),
                };
            }
            Command::Select => {
                return match args.get(1).map(Vec::as_slice) {
                    Some(b"0") if args.len() == 2 => Ok(Draft::Ready(Plan::local(Reply::ok()))),
                    _ => Err(refused_with(
                        "forbidden",
                        "the route's database is set by its upstream URL",
                    )),
                };
            }
            Command::ClientName => return Ok(Draft::Ready(Plan::local(Reply::ok()))),
            Command::Watch | Command::Unwatch if self.queue.is_some() => {
                return Err(Reply::error("ERR WATCH inside MULTI is not allowed"));
            }
            Command::Watch => {
                let keys: Vec<&str> = utf8_keys(args, &(1..args.len()).collect::<Vec<_>>())?;
                self.owners(&keys)?;
                return Ok(Draft::Ready(Plan::forward(args.to_vec())));
            }
            Command::Unwatch => return Ok(Draft::Ready(Plan::forward(args.to_vec()))),
            Command::Publish => {
                if args.len() != 3 {
                    return Err(wrong_arity(args));
                }
                // A message carries its subject's data to the subscribers: the subject must be
                // active, with `store` consent, as for any write (nothing is kept, so no
                // deadline is set).
                let owners = self.owners(&utf8_keys(args, &[1])?)?;
                let policy = self.policy(&owners).await?;
                for owner in &owners {
                    let facts = stored(&policy.tenant, owner);
                    decide_write_over(
                        &policy.view,
                        &facts,
                        Held::Nothing,
                        Overwrite::Allowed,
                        crate::now(),
                    )
                    .map_err(refused)?;
                }
                return Ok(Draft::Ready(Plan::forward(args.to_vec())));
            }
            Command::Subscribe | Command::Unsubscribe => {
                return Err(Reply::error(format!(
                    "ERR Command not allowed inside a transaction: {}",
                    name_of(args)
                )));
            }
            Command::Server => {
                return match self.ctx()?.claims.role {
                    Role::Admin => Ok(Draft::Ready(Plan::forward(args.to_vec()))),
                    _ => Err(refused_with(
                        "forbidden",
                        &format!(
                            "{} describes the whole server: admin tokens only",
                            name_of(args)
                        ),
                    )),
                };
            }
            Command::Refused(why) => {
                return Err(refused_with(
                    "forbidden",
                    &format!("{} is refused: {why}", name_of(args)),
                ));
            }
            Command::Scan => {
                return Err(refused_with("forbidden", "SCAN is not served inside MULTI"));
            }
            _ => {
                return Err(refused_with(
                    "unknown_endpoint",
                    &format!("{} is not a command Lethe serves", name_of(args)),
                ));
            }
        };
        let positions = key_positions(keys, args).map_err(|e| Reply::error(format!("ERR {e}")))?;
        let names = utf8_keys(args, &positions)?;
        let owners = self.owners(&names)?;
        let one_subject = owners.iter().all(|o| o.0 == owners[0].0);
        if effect == Effect::Write && keys.moves_data() && !one_subject {
            return Err(refused(Refusal::ScopeViolation));
        }
        let policy = self.decided_policy(&owners).await?;
        let (tenant, bound, view) = (&policy.tenant, &policy.bound, &policy.view);
        let now = crate::now();
        match effect {
            Effect::Read(_) | Effect::ReadEach | Effect::Count | Effect::Combine(_) => {
                let (store, bound) = (&self.route.name, bound.as_deref());
                let hidden: Vec<bool> = owners
                    .iter()
                    .map(|owner| readable(view, tenant, store, bound, owner, now).is_err())
                    .collect();
                read_plan(effect, keys, args, &positions, hidden).map(Draft::Ready)
            }
            Effect::Write | Effect::Expire | Effect::Delete | Effect::Take => {
                let written: Vec<usize> = match effect {
                    Effect::Delete => Vec::new(),
                    _ => keys.written(positions.len()),
                };
                if reveals(args) {
                    // Its answer is stored data: the caller must be allowed to read it too.
                    for owner in &owners {
                        readable(view, tenant, &self.route.name, bound.as_deref(), owner, now)
                            .map_err(refused)?;
                    }
                }
                // Not inside MULTI: there an unstamped key must discard the transaction when it
                // is queued, not fail one command of it at EXEC.
                let scripted =
                    match effect == Effect::Write && one_trip(args) && self.queue.is_none() {
                        true => self.write_script().await?,
                        false => None,
                    };
                Ok(Draft::Pending(Pending {
                    scripted,
                    args: args.to_vec(),
                    names: names.iter().map(|n| (*n).to_owned()).collect(),
                    owners,
                    written,
                    effect,
                    policy,
                    now,
                }))
            }
        }
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

    /// Runs a client's transaction: every plan's commands in one `MULTI`/`EXEC`.
    async fn exec(&mut self, plans: Vec<Plan>) -> Result<Reply, Reply> {
        let send: Vec<Vec<Vec<u8>>> = plans.iter().flat_map(|p| p.send.clone()).collect();
        let mut replies = if send.is_empty() {
            Vec::new()
        } else {
            let mut all = Vec::with_capacity(send.len() + 2);
            all.push(vec![b"MULTI".to_vec()]);
            all.extend(send);
            all.push(vec![b"EXEC".to_vec()]);
            let upstream = self.upstream().await?;
            let mut got = match upstream.call(&all).await {
                Ok(got) => got,
                Err(e) => {
                    self.upstream = None;
                    return Err(unavailable("upstream_unavailable", &e.to_string()));
                }
            };
            match got.pop() {
                Some(Reply::Array(values)) => values,
                Some(other) => return Ok(other),
                None => Vec::new(),
            }
        }
        .into_iter();
        let mut answers = Vec::with_capacity(plans.len());
        let (mut written, mut deleted) = (Vec::new(), Vec::new());
        for plan in &plans {
            let mine: Vec<Reply> = replies.by_ref().take(plan.send.len()).collect();
            written.extend(plan.kept(&mine));
            answers.push(plan.assemble(mine));
            deleted.extend(plan.deleted.iter().cloned());
        }
        Ok(self
            .settled(&written, &deleted, Reply::Array(answers))
            .await)
    }

    /// After Redis took a command: the keys it removed are marked deleted in lineage, and the
    /// keys it holds written are kept unless a flip overtook the write (the data plane's own
    /// step: the overtaken keys are unlinked again and the write refused; those that cannot be
    /// are recorded for the purge), recorded in lineage for the dry run, the inventory and the
    /// sweeper (which unlinks a revoked consent's keys).
    async fn settled(
        &mut self,
        written: &[(String, Stamp)],
        deleted: &[String],
        answer: Reply,
    ) -> Reply {
        if matches!(answer, Reply::Error(_)) {
            return answer;
        }
        let now = crate::now();
        let state: &DataState = self.state;
        let recorded = self.recorded.rows(&state.lineage);
        if !deleted.is_empty() {
            for key in deleted {
                recorded.invalidate(key);
            }
            if self
                .state
                .store
                .mark_items_deleted(&self.route.name, KEYS, deleted, now)
                .await
                .is_err()
            {
                return unavailable("state_unavailable", "the state store cannot be written");
            }
        }
        let (known, new): (Vec<_>, Vec<_>) = written.iter().partition(|(key, stamp)| {
            recorded
                .get(key.as_str())
                .is_some_and(|held| *held == *stamp)
        });
        // Both groups are checked whatever the first found: a flip that overtook one key of a
        // write overtook its other keys too, and each is undone.
        let mut refusal = None;
        for (group, recording) in [(known, Recording::Known), (new, Recording::Batched)] {
            if group.is_empty() {
                continue;
            }
            let kept = self.keep(&group, recording, now).await;
            for (key, stamp) in group {
                match kept {
                    Ok(()) if recording == Recording::Batched => {
                        recorded.insert(key.clone(), Arc::new(stamp.clone()));
                    }
                    Ok(()) => {}
                    // What was undone (or not) is recorded as it is: found again next time.
                    Err(_) => recorded.invalidate(key.as_str()),
                }
            }
            if let Err(e) = kept {
                refusal.get_or_insert(e);
            }
        }
        match refusal {
            None => answer,
            Some(e) if e.status == hyper::StatusCode::SERVICE_UNAVAILABLE => {
                unavailable(e.code.as_str(), &e.message)
            }
            Some(e) => refused_with(e.code.as_str(), &e.message),
        }
    }

    /// Keeps the keys `written` (of one tenant) unless a flip overtook them: those are unlinked.
    async fn keep(
        &mut self,
        written: &[&(String, Stamp)],
        recording: Recording,
        now: DateTime<Utc>,
    ) -> Result<(), crate::data::error::DataError> {
        let Some((_, first)) = written.first() else {
            return Ok(());
        };
        let tenant = first.tenant.clone();
        let rows = written
            .iter()
            .map(|(key, stamp)| {
                ItemRecord::stamped(
                    &self.route.name,
                    KEYS,
                    key.clone(),
                    stamp.clone(),
                    now,
                    None,
                )
            })
            .collect();
        let state: &Arc<DataState> = self.state;
        let undo = |overtaken: Vec<ItemRecord>| async move {
            let unlink: Vec<Vec<u8>> = std::iter::once(b"UNLINK".to_vec())
                .chain(overtaken.iter().map(|r| r.item_id.as_bytes().to_vec()))
                .collect();
            match self.call(&[unlink]).await {
                Ok(_) => Vec::new(),
                Err(_) => overtaken,
            }
        };
        keep_unless_overtaken(state, &tenant, rows, recording, None, undo).await
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]`, answered with the caller's keys
    /// only: another tenant's, another subject's (for a bound token), a hidden subject's and
    /// keys no pattern owns are left out; the cursor is Redis' own.
    async fn scan(&mut self, args: Vec<Vec<u8>>) -> Result<Reply, Reply> {
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

/// What a read sends, given which of its keys are hidden.
fn read_plan(
    effect: Effect,
    keys: Keys,
    args: &[Vec<u8>],
    positions: &[usize],
    hidden: Vec<bool>,
) -> Result<Plan, Reply> {
    if keys == Keys::Streams {
        return streams_plan(args, positions, &hidden);
    }
    if let Effect::Combine(how) = effect {
        return Ok(combine_plan(how, keys, args, positions, &hidden));
    }
    Ok(plain_read_plan(effect, args, positions, hidden))
}

/// Sets combined (`SUNION`, `ZINTER`, `SINTERCARD`, ...) with each hidden key counted as a
/// missing one: an empty set.
fn combine_plan(
    how: Combine,
    keys: Keys,
    args: &[Vec<u8>],
    positions: &[usize],
    hidden: &[bool],
) -> Plan {
    let empty = match how {
        Combine::InterCard => Reply::Int(0),
        // The sorted-set forms answer arrays, the set forms sets.
        _ if keys == Keys::Counted => Reply::Array(Vec::new()),
        _ => Reply::Set(Vec::new()),
    };
    let first_hidden = hidden.first().copied().unwrap_or(false);
    let any_hidden = hidden.iter().any(|h| *h);
    match how {
        _ if !any_hidden => Plan::forward(args.to_vec()),
        Combine::Inter | Combine::InterCard => Plan::local(empty),
        Combine::Diff if first_hidden => Plan::local(empty),
        _ if hidden.iter().all(|h| *h) => Plan::local(empty),
        Combine::Union | Combine::Diff => {
            Plan::forward(without_hidden(keys, args, positions, hidden))
        }
    }
}

/// `args` without the hidden keys: a key count (`ZUNION 3 ...`) says how many are left, and
/// each hidden key's weight (`WEIGHTS`) goes with it.
fn without_hidden(
    keys: Keys,
    args: &[Vec<u8>],
    positions: &[usize],
    hidden: &[bool],
) -> Vec<Vec<u8>> {
    let mut dropped: Vec<usize> = positions
        .iter()
        .zip(hidden)
        .filter(|(_, h)| **h)
        .map(|(&p, _)| p)
        .collect();
    let last = positions.last().copied().unwrap_or(0);
    if let Some(weights) = args
        .iter()
        .skip(last + 1)
        .position(|a| a.eq_ignore_ascii_case(b"WEIGHTS"))
        .map(|at| last + 1 + at)
    {
        dropped.extend(
            hidden
                .iter()
                .enumerate()
                .filter(|(_, h)| **h)
                .map(|(i, _)| weights + 1 + i),
        );
    }
    let count_at = positions
        .first()
        .filter(|_| keys == Keys::Counted)
        .map(|first| first - 1);
    let left = hidden.iter().filter(|h| !**h).count();
    args.iter()
        .enumerate()
        .filter(|(i, _)| !dropped.contains(i))
        .map(|(i, a)| match count_at {
            Some(at) if at == i => left.to_string().into_bytes(),
            _ => a.clone(),
        })
        .collect()
}

/// `XREAD ... STREAMS keys ids`: the visible streams (each with its id) are read; when none
/// is, nil, after the wait the client asked for (as Redis answers for streams that do not
/// exist).
fn streams_plan(args: &[Vec<u8>], positions: &[usize], hidden: &[bool]) -> Result<Plan, Reply> {
    let wait = Wait::of(waits(args).map_err(|e| invalid(&e))?);
    let (Some(&first), count) = (positions.first(), positions.len()) else {
        return Err(invalid("XREAD names no stream"));
    };
    if hidden.iter().all(|h| *h) {
        return Ok(Plan {
            send: Vec::new(),
            answer: Answer::Idle(wait),
            written: Vec::new(),
            proof: Proof::Exists,
            deleted: Vec::new(),
        });
    }
    let visible = |offset: usize| {
        (0..count)
            .filter(|&i| !hidden[i])
            .map(move |i| args[first + offset + i].clone())
    };
    let send = args[..first]
        .iter()
        .cloned()
        .chain(visible(0))
        .chain(visible(count))
        .collect();
    Ok(Plan::forward(send))
}

fn plain_read_plan(
    effect: Effect,
    args: &[Vec<u8>],
    positions: &[usize],
    hidden: Vec<bool>,
) -> Plan {
    let visible_args = || -> Vec<Vec<u8>> {
        std::iter::once(args[0].clone())
            .chain(
                positions
                    .iter()
                    .zip(&hidden)
                    .filter(|(_, h)| !**h)
                    .map(|(&p, _)| args[p].clone()),
            )
            .collect()
    };
    let none_visible = hidden.iter().all(|h| *h);
    match effect {
        Effect::Read(kind) if hidden.iter().any(|h| *h) => Plan::local(missing(kind, args)),
        Effect::Count if none_visible => Plan::local(Reply::Int(0)),
        Effect::Count => Plan::forward(visible_args()),
        Effect::ReadEach if none_visible => {
            Plan::local(Reply::Array(vec![Reply::Null; hidden.len()]))
        }
        Effect::ReadEach => Plan {
            send: vec![visible_args()],
            answer: Answer::Splice(hidden),
            written: Vec::new(),
            proof: Proof::Exists,
            deleted: Vec::new(),
        },
        _ => Plan::forward(args.to_vec()),
    }
}

/// What writing a key of `owner` (its subject, purpose and category) in `tenant` stores.
fn stored<'a>(
    tenant: &'a str,
    (subject, purpose, category): &'a (String, String, String),
) -> WriteFacts<'a> {
    WriteFacts {
        tenant,
        subject,
        purpose,
        category,
        layer: Layer::Raw,
        action: Action::Store,
        authorised_epoch: None,
        requested_expires_at: None,
    }
}

/// Redis' own answer to a command with too few or too many arguments.
fn wrong_arity(args: &[Vec<u8>]) -> Reply {
    Reply::error(format!(
        "ERR wrong number of arguments for '{}' command",
        name_of(args).to_lowercase()
    ))
}

/// May `subject`'s key (kept for `purpose` and `category`) be read by the caller of `tenant`
/// (bound to `bound`, if its token is), from route `store`?
fn readable(
    view: &crate::data::policy_cache::View,
    tenant: &str,
    store: &str,
    bound: Option<&str>,
    owner: &(String, String, String),
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    let read = ReadContext {
        tenant,
        store,
        bound_subject: bound,
        purpose: None,
    };
    // A key's deadline is Redis' to keep (it drops the key then), so a read is decided on the
    // subject's state and consent: the stamp is given a deadline not yet past.
    let stamp = stamp_of(view, tenant, owner, now + chrono::TimeDelta::seconds(1));
    decide_read(view, &read, Some(&stamp), now)
}

/// The stamp a key's pattern gives it: its owner and use, in its subject's current epoch, with
/// `expires_at`.
fn stamp_of(
    view: &crate::data::policy_cache::View,
    tenant: &str,
    (subject, purpose, category): &(String, String, String),
    expires_at: DateTime<Utc>,
) -> Stamp {
    use lethe_policy::PolicyView;
    Stamp {
        tenant: tenant.to_owned(),
        subject: subject.clone(),
        purpose: purpose.clone(),
        category: category.clone(),
        layer: Layer::Raw,
        expires_at,
        epoch: view.subject(tenant, subject).map_or(0, |p| p.state.epoch),
    }
}

/// Whether Redis answered that it does not know a script (`NOSCRIPT`).
fn lost_script(replies: &[Reply]) -> bool {
    matches!(replies, [Reply::Error(e)] if e.starts_with("NOSCRIPT"))
}

/// `SET key value`, without options: it replaces its key whatever it held.
fn plain_set(args: &[Vec<u8>]) -> bool {
    args.len() == 3 && args[0].eq_ignore_ascii_case(b"SET")
}

/// Whether `WRITE_SCRIPT` carries the write `args`: a plain `SET`, or one of `ONE_TRIP` within
/// `ONE_TRIP_ARGS` (its arity is Redis' to check).
fn one_trip(args: &[Vec<u8>]) -> bool {
    let named = |name: &[u8]| args.first().is_some_and(|a| a.eq_ignore_ascii_case(name));
    plain_set(args) || (args.len() <= ONE_TRIP_ARGS && ONE_TRIP.iter().any(|name| named(name)))
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

fn name_of(args: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&args[0]).to_ascii_uppercase()
}

/// Resolves once the client closed its side of the connection; never while it sends more.
async fn left(client: &TcpStream) {
    let mut byte = [0u8; 1];
    match client.peek(&mut byte).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// The bounds a Redis route keeps each client connection within.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The largest command, in bytes.
    pub command_bytes: usize,
    /// The most commands one `MULTI` may queue.
    pub queued: usize,
}

/// Serves one client connection of `route`.
pub(super) async fn serve(
    route: &Route,
    state: &Arc<DataState>,
    patterns: &[Pattern],
    recorded: &Recorded,
    limits: Limits,
    client: TcpStream,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    Connection::new(route, state, patterns, recorded, limits.queued)
        .serve(client, limits.command_bytes, stopping)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
    }

    fn sent(plan: &Plan) -> Vec<String> {
        plan.send
            .first()
            .map(|c| {
                c.iter()
                    .map(|a| String::from_utf8_lossy(a).into())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn combined(line: &str, hidden: &[bool]) -> Plan {
        let args = args(line);
        let Command::Keyed(Effect::Combine(how), keys) = classify(&args) else {
            panic!("{line} combines no sets");
        };
        let positions = key_positions(keys, &args).unwrap();
        combine_plan(how, keys, &args, &positions, hidden)
    }

    #[test]
    fn a_hidden_key_combines_as_a_missing_one() {
        let union = combined("SUNION a b c", &[false, true, false]);
        assert_eq!(sent(&union), ["SUNION", "a", "c"]);
        let weighted = combined(
            "ZUNION 3 a b c WEIGHTS 1 2 3 WITHSCORES",
            &[false, true, false],
        );
        assert_eq!(
            sent(&weighted),
            ["ZUNION", "2", "a", "c", "WEIGHTS", "1", "3", "WITHSCORES"]
        );
        for (line, hidden) in [
            ("SINTER a b", [false, true]),
            ("SDIFF a b", [true, false]),
            ("ZINTER 2 a b", [true, false]),
            ("SUNION a b", [true, true]),
        ] {
            let plan = combined(line, &hidden);
            assert!(plan.send.is_empty(), "{line}: nothing sent");
            let empty = plan.assemble(Vec::new());
            assert!(
                matches!(&empty, Reply::Set(s) if s.is_empty())
                    || matches!(&empty, Reply::Array(a) if a.is_empty()),
                "{line}: {empty:?}"
            );
        }
        assert_eq!(
            sent(&combined("SDIFF a b c", &[false, true, false])),
            ["SDIFF", "a", "c"]
        );
        let count = combined("SINTERCARD 2 a b LIMIT 5", &[false, true]);
        assert_eq!(count.assemble(Vec::new()), Reply::Int(0));
        assert_eq!(
            sent(&combined("SUNION a b", &[false, false])),
            ["SUNION", "a", "b"]
        );
    }
}

//! What Lethe sends Redis for one client command, and how it makes the client's answer from
//! Redis' answers: a command decided on its keys' owners (`draft`), a write decided once the
//! deadlines its keys hold are known (`Pending::decide`), a read with its hidden keys left out or
//! answered as missing.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lethe_policy::{
    Action, Held, Layer, Overwrite, ReadContext, Refusal, Stamp, WriteFacts, decide_read,
    decide_write_over,
};

use super::{
    Connection, Policy, name_of, refused, refused_with, unavailable, utf8_keys, wrong_arity,
};
use crate::auth::Role;
use crate::redis::client::Wait;
use crate::redis::commands::{Command, Effect, Keys, key_positions, reveals};
use crate::redis::resp::Reply;

mod read;
use read::read_plan;

/// A write of one key in one round trip (`ONE_TRIP`): the deadline the key holds decides the
/// one it is written with (an earlier one is kept; a key without one was written around Lethe and
/// is not Lethe's to overwrite), read and written at once so nothing comes between. `ARGV`: the
/// refusal of an unstamped key, the deadline Lethe computed (ms), then the command's name and its
/// arguments after the key. Answers the command's own answer (its error as Redis gave it) and
/// the deadline written. Lethe's own script: it reaches the key decided only.
pub(super) const WRITE_SCRIPT: &str = "local held = redis.call('PEXPIRETIME', KEYS[1]) \
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
pub(super) const ONE_TRIP: &[&[u8]] = &[b"LPUSH", b"RPUSH", b"SADD", b"HSET"];

/// The most arguments a write `WRITE_SCRIPT` carries (Lua unpacks them on a bounded stack).
pub(super) const ONE_TRIP_ARGS: usize = 1000;

/// How the answer to a client's command is made from Redis' answers to what was sent for it.
#[derive(Debug, Clone)]
pub(super) enum Answer {
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
pub(super) enum Proof {
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
pub(super) struct Plan {
    pub(super) send: Vec<Vec<Vec<u8>>>,
    pub(super) answer: Answer,
    /// The stamps the keys written were decided with: checked again after the write, then
    /// recorded in lineage.
    pub(super) written: Vec<(String, Stamp)>,
    pub(super) proof: Proof,
    /// The keys it removes: their lineage rows are marked deleted once Redis has.
    pub(super) deleted: Vec<String>,
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
    pub(super) fn kept(&self, replies: &[Reply]) -> Vec<(String, Stamp)> {
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
    pub(super) fn with_script_whole(&self) -> Vec<Vec<Vec<u8>>> {
        let mut whole = self.send.clone();
        if let Some(command) = whole.first_mut() {
            command.splice(..2, [b"EVAL".to_vec(), WRITE_SCRIPT.as_bytes().to_vec()]);
        }
        whole
    }

    /// The client's answer from Redis' answers to this plan's commands.
    pub(super) fn assemble(&self, mut replies: Vec<Reply>) -> Reply {
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
pub(super) struct Pending {
    pub(super) args: Vec<Vec<u8>>,
    pub(super) names: Vec<String>,
    /// Each key's subject, purpose and category.
    pub(super) owners: Vec<(String, String, String)>,
    /// The keys (by place in `names`) the command writes.
    pub(super) written: Vec<usize>,
    pub(super) effect: Effect,
    pub(super) policy: Arc<Policy>,
    pub(super) now: DateTime<Utc>,
    /// A write that `WRITE_SCRIPT` (of this digest) carries: it needs no deadline read first.
    pub(super) scripted: Option<Vec<u8>>,
}

/// Lethe's decision on a command: its plan, or a write that needs what its keys hold first.
pub(super) enum Draft {
    Ready(Plan),
    Pending(Pending),
}

impl Pending {
    /// The keys whose deadline in Redis the decision needs.
    pub(super) fn asks(&self) -> impl Iterator<Item = &str> {
        let asked = if self.scripted.is_some() {
            &[][..]
        } else {
            &self.written[..]
        };
        asked.iter().map(|&i| self.names[i].as_str())
    }

    /// The plan, given the deadline each key of `asks` holds (`None` for a key that does not
    /// exist, `Some(None)` for one without a deadline).
    pub(super) fn decide(self, asked: &[Option<Option<DateTime<Utc>>>]) -> Result<Plan, Reply> {
        let stamps = self.stamps(asked)?;
        let Pending {
            args,
            names,
            written,
            effect,
            scripted,
            ..
        } = self;
        if effect == Effect::Take {
            // It adds nothing, so its keys' deadlines stand; sent alone, for a transaction
            // would not wait.
            return Ok(Plan::forward(args));
        }
        let written_stamps: Vec<(String, Stamp)> = written
            .iter()
            .filter_map(|&i| stamps.iter().find(|(k, _)| *k == names[i]).cloned())
            .collect();
        if let Some(digest) = scripted
            && written_stamps.len() == 1
        {
            return scripted_write(args, digest, written_stamps);
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

    /// The stamp each key is written with, decided over the deadline it holds in Redis
    /// (`asked`, for the written keys): refused when any is refused.
    fn stamps(
        &self,
        asked: &[Option<Option<DateTime<Utc>>>],
    ) -> Result<Vec<(String, Stamp)>, Reply> {
        let (tenant, view) = (&self.policy.tenant, &self.policy.view);
        let mut held = vec![None; self.names.len()];
        for (&i, deadline) in self.written.iter().zip(asked) {
            held[i] = *deadline;
        }
        let mut stamps = Vec::new();
        for (i, owner) in self.owners.iter().enumerate() {
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
            let decided = decide_write_over(view, &facts, held, Overwrite::Allowed, self.now)
                .map_err(refused)?;
            if let Some(stamp) = decided {
                stamps.push((self.names[i].clone(), stamp));
            }
        }
        Ok(stamps)
    }
}

/// A write of one key in one trip: the script checks the key's deadline (refusing an
/// unstamped one), runs the command and sets the stamp's deadline.
fn scripted_write(
    args: Vec<Vec<u8>>,
    digest: Vec<u8>,
    written_stamps: Vec<(String, Stamp)>,
) -> Result<Plan, Reply> {
    let refusal = refused(Refusal::UnstampedItem);
    let Reply::Error(refusal) = refusal else {
        return Err(refusal);
    };
    let Some((key, stamp)) = written_stamps.first() else {
        return Err(Reply::Error(refusal));
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
    Ok(Plan {
        send: vec![send],
        answer: Answer::Scripted,
        written: written_stamps,
        proof: Proof::Scripted,
        deleted: Vec::new(),
    })
}

/// What writing a key of `owner` (its subject, purpose and category) in `tenant` stores.
pub(super) fn stored<'a>(
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

/// May `subject`'s key (kept for `purpose` and `category`) be read by the caller of `tenant`
/// (bound to `bound`, if its token is), from route `store`?
pub(super) fn readable(
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
pub(super) fn stamp_of(
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
pub(super) fn lost_script(replies: &[Reply]) -> bool {
    matches!(replies, [Reply::Error(e)] if e.starts_with("NOSCRIPT"))
}

/// `SET key value`, without options: it replaces its key whatever it held.
pub(super) fn plain_set(args: &[Vec<u8>]) -> bool {
    args.len() == 3 && args[0].eq_ignore_ascii_case(b"SET")
}

/// Whether `WRITE_SCRIPT` carries the write `args`: a plain `SET`, or one of `ONE_TRIP` within
/// `ONE_TRIP_ARGS` (its arity is Redis' to check).
pub(super) fn one_trip(args: &[Vec<u8>]) -> bool {
    let named = |name: &[u8]| args.first().is_some_and(|a| a.eq_ignore_ascii_case(name));
    plain_set(args) || (args.len() <= ONE_TRIP_ARGS && ONE_TRIP.iter().any(|name| named(name)))
}

impl Connection<'_> {
    /// Lethe's decision on one command, as what to send Redis.
    pub(super) async fn plan(&mut self, command: Command, args: &[Vec<u8>]) -> Result<Plan, Reply> {
        match self.draft(command, args).await? {
            Draft::Ready(plan) => Ok(plan),
            Draft::Pending(write) => {
                let held = self.held(&write.asks().collect::<Vec<_>>()).await?;
                write.decide(&held)
            }
        }
    }

    /// Lethe's decision on one command, but for a write the deadlines its keys hold in Redis.
    pub(super) async fn draft(
        &mut self,
        command: Command,
        args: &[Vec<u8>],
    ) -> Result<Draft, Reply> {
        match command {
            Command::Keyed(effect, keys) => self.draft_keyed(effect, keys, args).await,
            other => self.draft_unkeyed(other, args).await,
        }
    }

    /// A command that names no key: answered here, forwarded as it is, or refused.
    async fn draft_unkeyed(&mut self, command: Command, args: &[Vec<u8>]) -> Result<Draft, Reply> {
        match command {
            Command::Ping => Ok(Draft::Ready(Plan::local(Reply::Simple(b"PONG".to_vec())))),
            Command::Echo => match args.get(1) {
                Some(text) if args.len() == 2 => {
                    Ok(Draft::Ready(Plan::local(Reply::Bulk(text.clone()))))
                }
                _ => Err(Reply::error(
                    "ERR wrong number of arguments for 'echo' command",
                )),
            },
            Command::Select => match args.get(1).map(Vec::as_slice) {
                Some(b"0") if args.len() == 2 => Ok(Draft::Ready(Plan::local(Reply::ok()))),
                _ => Err(refused_with(
                    "forbidden",
                    "the route's database is set by its upstream URL",
                )),
            },
            Command::ClientName => Ok(Draft::Ready(Plan::local(Reply::ok()))),
            Command::Watch | Command::Unwatch if self.queue.is_some() => {
                Err(Reply::error("ERR WATCH inside MULTI is not allowed"))
            }
            Command::Watch => self.watch(args).await,
            Command::Unwatch => Ok(Draft::Ready(Plan::forward(args.to_vec()))),
            Command::Publish => self.publish(args).await,
            Command::Subscribe | Command::Unsubscribe => Err(Reply::error(format!(
                "ERR Command not allowed inside a transaction: {}",
                name_of(args)
            ))),
            Command::Server => match self.ctx()?.claims.role {
                Role::Admin => Ok(Draft::Ready(Plan::forward(args.to_vec()))),
                _ => Err(refused_with(
                    "forbidden",
                    &format!(
                        "{} describes the whole server: admin tokens only",
                        name_of(args)
                    ),
                )),
            },
            Command::Refused(why) => Err(refused_with(
                "forbidden",
                &format!("{} is refused: {why}", name_of(args)),
            )),
            Command::Scan => Err(refused_with("forbidden", "SCAN is not served inside MULTI")),
            _ => Err(refused_with(
                "unknown_endpoint",
                &format!("{} is not a command Lethe serves", name_of(args)),
            )),
        }
    }

    /// `WATCH` tells, at `EXEC`, whether its keys were written since: a read of them, decided as
    /// one (a key the caller may not read now is refused, not watched, for its changes would
    /// tell what a read hides).
    async fn watch(&mut self, args: &[Vec<u8>]) -> Result<Draft, Reply> {
        let keys: Vec<&str> = utf8_keys(args, &(1..args.len()).collect::<Vec<_>>())?;
        let owners = self.owners(&keys)?;
        let policy = self.decided_policy(&owners).await?;
        let now = crate::now();
        for owner in &owners {
            let bound = policy.bound.as_deref();
            readable(
                &policy.view,
                &policy.tenant,
                &self.route.name,
                bound,
                owner,
                now,
            )
            .map_err(refused)?;
        }
        Ok(Draft::Ready(Plan::forward(args.to_vec())))
    }

    /// A message carries its subject's data to the subscribers: the subject must be active, with
    /// `store` consent, as for any write (nothing is kept, so no deadline is set).
    async fn publish(&mut self, args: &[Vec<u8>]) -> Result<Draft, Reply> {
        if args.len() != 3 {
            return Err(wrong_arity(args));
        }
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
        Ok(Draft::Ready(Plan::forward(args.to_vec())))
    }

    /// A command on keys: each key's owner decides what of it is read, and whether it is written.
    async fn draft_keyed(
        &mut self,
        effect: Effect,
        keys: Keys,
        args: &[Vec<u8>],
    ) -> Result<Draft, Reply> {
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
                    // Its answer tells something of what was stored: the caller must be allowed
                    // to read it too.
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
}

#[cfg(test)]
mod tests;

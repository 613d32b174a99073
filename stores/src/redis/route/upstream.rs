//! Redis spoken to: the client's own connection to the route's Redis (made on first use), a
//! pipeline's run sent in as few round trips as its decisions allow, and `SCAN` narrowed to the
//! caller's keys.

use chrono::{DateTime, Utc};

use super::plan::{Answer, Draft, Plan, Proof, WRITE_SCRIPT, lost_script, readable};
use super::{Connection, UPSTREAM_TIMEOUT, unavailable};
use crate::redis::client::{Client, Server, Wait};
use crate::redis::commands::classify;
use crate::redis::resp::Reply;

/// The most keys one `SCAN` may ask Redis to walk.
const MAX_SCAN_COUNT: u64 = 1_000;

impl Connection<'_> {
    /// The deadline each key already has in Redis (`PEXPIRETIME`): `None` for a key that does
    /// not exist, `Some(None)` for one without a deadline (written around Lethe).
    pub(super) async fn held(
        &mut self,
        keys: &[&str],
    ) -> Result<Vec<Option<Option<DateTime<Utc>>>>, Reply> {
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
    pub(super) async fn call(&mut self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Reply>, Reply> {
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
    pub(super) async fn connect(&self) -> Result<Client, Reply> {
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
    pub(super) async fn write_script(&mut self) -> Result<Option<Vec<u8>>, Reply> {
        self.upstream().await?;
        Ok(self.write_script.clone())
    }

    pub(super) async fn upstream(&mut self) -> Result<&mut Client, Reply> {
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
    pub(super) async fn run(
        &mut self,
        run: Vec<Vec<Vec<u8>>>,
        wait: Wait,
    ) -> Result<Vec<Reply>, Reply> {
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
    pub(super) async fn scan(&mut self, mut args: Vec<Vec<u8>>) -> Result<Reply, Reply> {
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

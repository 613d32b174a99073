//! `MULTI`/`EXEC`: a client's transaction, held by Lethe until `EXEC` and sent whole. Each
//! command is decided when it is queued (a refusal then discards the transaction, as Redis does
//! with an error) and again at `EXEC`, with the policy of that moment: a flip or a withdrawn
//! consent between the two reaches the answer `EXEC` gives.

use super::{Connection, Limits, bytes_of, unavailable};
use crate::redis::commands::classify;
use crate::redis::resp::{Args, Reply};

/// A transaction the client opened with `MULTI`: its commands, or that one was refused.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) commands: Vec<Args>,
    /// The bytes of their arguments.
    pub(super) bytes: usize,
    pub(super) failed: bool,
}

impl Connection<'_> {
    /// The bound `queue` would pass with `args` queued too, if it would.
    pub(super) fn over_queue(&self, queue: &Queue, args: &[Vec<u8>]) -> Option<String> {
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

    /// Runs a client's transaction: every command decided again now, then all their plans in
    /// one `MULTI`/`EXEC`. A command refused now refuses the whole transaction, and nothing of
    /// it is sent. `Err` when the connection to Redis is lost.
    pub(super) async fn exec(&mut self, commands: Vec<Args>) -> Result<Reply, Reply> {
        // Decided at one moment, as a pipeline's run is.
        self.run_policy = Some(None);
        let mut plans = Vec::with_capacity(commands.len());
        for args in &commands {
            match self.plan(classify(args), args).await {
                Ok(plan) => plans.push(plan),
                Err(refusal) => {
                    self.run_policy = None;
                    return Ok(refusal);
                }
            }
        }
        self.run_policy = None;
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
}

//! Whose keys a command names and what the caller's policy says of them, decided when asked
//! and, for a waiting command's answer, again when it is sent.

use std::sync::Arc;

use lethe_policy::Refusal;

use super::plan::readable;
use super::{Connection, Policy, invalid, name_of, refused, refused_with, unavailable};
use crate::redis::keys::owner;
use crate::redis::resp::Reply;

impl Connection<'_> {
    /// Whose each of `keys` is; refused when a key matches no pattern, or names another
    /// tenant or (for a token bound to one) another subject, or a subject not in its one
    /// spelling.
    pub(super) fn owners(&self, keys: &[&str]) -> Result<Vec<(String, String, String)>, Reply> {
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

    /// The policy the caller's decisions on keys of `owners` take: its tenant, the subject its
    /// token binds, and the subjects' policy.
    pub(super) async fn policy(
        &self,
        owners: &[(String, String, String)],
    ) -> Result<Policy, Reply> {
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

    /// `policy`, reused within a pipeline's run while it holds every subject of `owners`.
    pub(super) async fn decided_policy(
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

    /// A waiting command's answer, as it may be given now: what it names of a subject that may
    /// no longer be read (a flip, a withdrawn consent since it was asked) is answered as Redis
    /// answers a wait that found nothing. A `BLPOP` that took her element leaves it taken: it
    /// is hers, and being erased.
    pub(super) async fn still_readable(&self, args: &[Vec<u8>], answer: Reply) -> Reply {
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
    pub(super) async fn readable_now(&self, keys: &[&str]) -> Result<bool, Reply> {
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
}

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

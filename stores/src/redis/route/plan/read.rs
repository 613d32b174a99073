//! A read's plan: what is sent for it given which of its keys are hidden, and what a hidden
//! key reads as (missing, as Redis answers for a key that does not exist).

use super::{Answer, Plan, Proof};
use crate::redis::client::Wait;
use crate::redis::commands::{Combine, Effect, Keys, Missing, waits};
use crate::redis::resp::Reply;
use crate::redis::route::invalid;

/// What a hidden key reads as, for the command `args`.
pub(super) fn missing(kind: Missing, args: &[Vec<u8>]) -> Reply {
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

/// What a read sends, given which of its keys are hidden.
pub(super) fn read_plan(
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
pub(super) fn combine_plan(
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
pub(super) fn without_hidden(
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
pub(super) fn streams_plan(
    args: &[Vec<u8>],
    positions: &[usize],
    hidden: &[bool],
) -> Result<Plan, Reply> {
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

pub(super) fn plain_read_plan(
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

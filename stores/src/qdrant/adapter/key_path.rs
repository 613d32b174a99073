//! Payload key paths as Qdrant reads them, so that every check Lethe makes on a client's key is
//! made on the key Qdrant will touch, never on its spelling: `"lethe_subject"` (quoted) is the
//! stamp's `lethe_subject`, as are `lethe_subject[]` and `"lethe_subject".x` under it.
//!
//! The grammar is Qdrant's own (`lib/segment/src/json_path/parse.rs`, `JsonPath::from_str`; the
//! same from 1.16.3, the server the tests run, to 1.19):
//!
//! ```text
//! path   = first step*                   the whole text: nothing before, between or after
//! first  = raw | quoted
//! step   = "." raw | "." quoted | "[" digits "]" | "[]"
//! raw    = (alphanumeric | "_" | "-")+    Unicode `char::is_alphanumeric`
//! quoted = '"' (any char but '"' and '\')* '"'     no escapes; may be empty
//! digits = ASCII 0-9, one or more, fitting a usize (leading zeros allowed)
//! ```
//!
//! No whitespace, no escapes, no normalisation: the top-level key Qdrant sets, removes or reads
//! under is `first`, byte for byte, without the quotes of a quoted key. A path Qdrant refuses is
//! refused here too.

use serde_json::{Map, Value};

/// One step after a path's top-level key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// `.key` or `."key"`: a key of an object.
    Key(&'a str),
    /// `[n]`: one element of an array.
    Index(usize),
    /// `[]`: every element of an array.
    Wildcard,
}

/// A path as Qdrant reads it. Qdrant has no escapes, so every key is a slice of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path<'a> {
    /// The top-level payload key: what the path sets, removes or reads under.
    pub first: &'a str,
    pub rest: Vec<Item<'a>>,
}

/// A path Qdrant would refuse; `at` is the byte offset of the first step it cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathError {
    pub at: usize,
}

fn is_raw(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

/// A key at the start of `s`, raw or quoted: the key, and how many bytes it takes.
fn key(s: &str) -> Option<(&str, usize)> {
    if let Some(body) = s.strip_prefix('"') {
        let end = body.find(['"', '\\'])?;
        return body[end..]
            .starts_with('"')
            .then_some((&body[..end], end + 2));
    }
    let len = s
        .char_indices()
        .find(|&(_, c)| !is_raw(c))
        .map_or(s.len(), |(i, _)| i);
    (len > 0).then_some((&s[..len], len))
}

/// An index at the start of `s` (just after its `[`): the index, and how many bytes it takes
/// with its `]`.
fn index(s: &str) -> Option<(usize, usize)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n = s.get(..digits)?.parse::<usize>().ok()?;
    s.get(digits..)?.starts_with(']').then_some((n, digits + 1))
}

/// Reads a path as Qdrant does, or refuses it where Qdrant would.
pub fn parse(text: &str) -> Result<Path<'_>, PathError> {
    let (first, mut at) = key(text).ok_or(PathError { at: 0 })?;
    let mut rest = Vec::new();
    while let Some(s) = text.get(at..).filter(|s| !s.is_empty()) {
        let step = if let Some(after) = s.strip_prefix('.') {
            key(after).map(|(k, n)| (Item::Key(k), n + 1))
        } else if s.starts_with("[]") {
            Some((Item::Wildcard, 2))
        } else if let Some(after) = s.strip_prefix('[') {
            index(after).map(|(i, n)| (Item::Index(i), n + 1))
        } else {
            None
        };
        let (item, taken) = step.ok_or(PathError { at })?;
        rest.push(item);
        at += taken;
    }
    Ok(Path { first, rest })
}

/// The top-level payload key a path sets, removes or reads under, as Qdrant reads the path.
pub fn first_segment(text: &str) -> Result<&str, PathError> {
    parse(text).map(|p| p.first)
}

/// A key Qdrant reads as itself without quotes (letters, digits, `_`, `-`): the top-level key
/// and the path to it are then the same text.
pub fn is_plain_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(is_raw)
}

fn same(a: &Item<'_>, b: &Item<'_>) -> bool {
    match (a, b) {
        (Item::Key(a), Item::Key(b)) => a == b,
        (Item::Index(a), Item::Index(b)) => a == b,
        (Item::Wildcard, Item::Wildcard) => true,
        _ => false,
    }
}

/// Whether the value at `first` then `trail` is kept by `with_payload: [paths]`: Qdrant's
/// include rule (`check_include_pattern`), one path a prefix of the other.
fn wanted(paths: &[Path<'_>], first: &str, trail: &[Item<'_>]) -> bool {
    paths
        .iter()
        .any(|p| p.first == first && p.rest.iter().zip(trail).all(|(a, b)| same(a, b)))
}

/// Qdrant's `run_filter`: objects keep the keys wanted, arrays all or none of their elements.
fn keep<'v>(paths: &[Path<'_>], first: &str, trail: &mut Vec<Item<'v>>, value: &'v Value) -> Value {
    match value {
        Value::Array(items) => {
            trail.push(Item::Wildcard);
            let kept = if wanted(paths, first, trail) {
                items.iter().map(|v| keep(paths, first, trail, v)).collect()
            } else {
                Vec::new()
            };
            trail.pop();
            Value::Array(kept)
        }
        Value::Object(map) => {
            let mut kept = Map::new();
            for (key, v) in map {
                trail.push(Item::Key(key.as_str()));
                if wanted(paths, first, trail) {
                    kept.insert(key.clone(), keep(paths, first, trail, v));
                }
                trail.pop();
            }
            Value::Object(kept)
        }
        other => other.clone(),
    }
}

/// A payload cut to `with_payload: [paths]`, as Qdrant's `PayloadSelector::Include` cuts it.
pub fn include(payload: &Map<String, Value>, paths: &[Path<'_>]) -> Map<String, Value> {
    let mut trail = Vec::new();
    payload
        .iter()
        .filter(|(key, _)| wanted(paths, key, &[]))
        .map(|(key, value)| (key.clone(), keep(paths, key, &mut trail, value)))
        .collect()
}

/// The values a path finds in a payload, as Qdrant's `JsonPath::value_get` finds them: a key of
/// an object, an element of an array, every element for `[]`; nothing where the shape differs.
pub fn values_at<'v>(payload: &'v Map<String, Value>, path: &Path<'_>) -> Vec<&'v Value> {
    let mut found = Vec::new();
    if let Some(value) = payload.get(path.first) {
        collect(&path.rest, value, &mut found);
    }
    found
}

fn collect<'v>(rest: &[Item<'_>], value: &'v Value, found: &mut Vec<&'v Value>) {
    let Some((head, tail)) = rest.split_first() else {
        found.push(value);
        return;
    };
    match (head, value) {
        (Item::Key(k), Value::Object(map)) => {
            if let Some(v) = map.get(*k) {
                collect(tail, v, found);
            }
        }
        (Item::Index(i), Value::Array(items)) => {
            if let Some(v) = items.get(*i) {
                collect(tail, v, found);
            }
        }
        (Item::Wildcard, Value::Array(items)) => {
            items.iter().for_each(|v| collect(tail, v, found));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;

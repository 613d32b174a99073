//! The values sections share: secrets, durations, and reading a table reporting every unknown key.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Where a secret comes from: `{ env = "NAME" }`, `{ file = "PATH" }` or `{ value = "..." }`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Secret {
    Env(String),
    File(PathBuf),
    Value(String),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Env(name) => write!(f, "Secret::Env({name:?})"),
            Secret::File(path) => write!(f, "Secret::File({path:?})"),
            Secret::Value(_) => f.write_str("Secret::Value(<redacted>)"),
        }
    }
}

impl Secret {
    /// The secret's bytes; a trailing newline in a file is not part of it.
    pub fn resolve(&self) -> Result<Vec<u8>, String> {
        match self {
            Secret::Env(name) => std::env::var(name)
                .map(String::into_bytes)
                .map_err(|_| format!("environment variable {name} is not set")),
            Secret::File(path) => std::fs::read(path)
                .map(|mut bytes| {
                    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                        bytes.pop();
                    }
                    bytes
                })
                .map_err(|e| format!("cannot read {}: {e}", path.display())),
            Secret::Value(value) => Ok(value.clone().into_bytes()),
        }
    }
}

/// A duration written `500ms`, `30s`, `5m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(ConfigDuration)
            .map_err(serde::de::Error::custom)
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 30s, 5m or 1h");
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if duration.is_zero() {
        Err(format!("{text:?}: must be greater than zero"))
    } else {
        Ok(duration)
    }
}

/// The key serde names in an "unknown field" error.
pub(super) fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split_once('`')?.0.to_owned())
}

/// Deserialises `T` from a table of keys, reporting every unknown key (serde stops at the
/// first: each is taken out and the rest read again) and then the first other problem.
pub fn read_all<T: serde::de::DeserializeOwned>(mut keys: toml::Table) -> Result<T, Vec<String>> {
    let mut problems = Vec::new();
    loop {
        match T::deserialize(toml::Value::Table(keys.clone())) {
            Ok(read) if problems.is_empty() => return Ok(read),
            Ok(_) => return Err(problems),
            Err(e) => {
                let message = e.to_string().trim().to_owned();
                let unknown = unknown_field(&message);
                problems.push(message);
                match unknown {
                    Some(field) if keys.remove(&field).is_some() => {}
                    _ => return Err(problems),
                }
            }
        }
    }
}

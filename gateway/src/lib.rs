//! The `lethe` gateway: state store, control plane, CLI.

#![forbid(unsafe_code)]

pub mod auth;
pub mod cli;
#[cfg(test)]
mod closed_lists;
pub mod config;
pub mod control;
pub mod data;
pub mod erasure;
pub mod error_shape;
pub mod governed;
pub mod keys;
pub mod metrics;
pub mod purge;
pub mod revocations;
pub mod state;
pub mod stores;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use chrono::{DateTime, SubsecRound, Utc};

/// The current time at the precision both state stores keep (microseconds), so that what is
/// written, read back and hashed is the same instant.
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

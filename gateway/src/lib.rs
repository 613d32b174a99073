//! The `lethe` gateway: the data plane, the stores, erasure, the control plane, the CLI.

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
pub mod stores;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

/// The state store is its own crate, a layer below everything here; named as before.
pub use lethe_state as state;
pub use lethe_state::now;

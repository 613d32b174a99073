//! The `lethe` command: the CLI and the composition root (`cli/serve.rs`), which puts the layers
//! together; everything it serves lives in the crates below (ARCHITECTURE.md draws them).

#![forbid(unsafe_code)]

pub mod cli;
#[cfg(test)]
mod closed_lists;
pub mod keys;

// The layers below, named as before.
use lethe_control as control;
use lethe_data as data;
#[cfg(feature = "testing")]
pub use lethe_data::testing;
use lethe_data::{auth, config};
use lethe_erasure as erasure;
use lethe_erasure::governed;
use lethe_state as state;
use lethe_state::now;
use lethe_stores as stores;

//! `lethe`: see `lethe --help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use lethe::cli::{Cli, run};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("LETHE_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    run(Cli::parse()).await
}

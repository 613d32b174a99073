//! `lethe`: see `lethe --help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use lethe::cli::{Cli, run};
use lethe_data::config::LogFormat;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    use std::io::IsTerminal;
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("LETHE_LOG").unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format() {
        // One event per line, its fields at the top level, for a log pipeline to read.
        LogFormat::Json => logs.json().flatten_event(true).init(),
        // Colours only where a person reads them.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    run(cli).await
}

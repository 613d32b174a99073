//! The `lethe` command line.

mod audit;
mod calls;
pub mod control_api;
mod login;
mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use hyper::Method;
use serde_json::json;

use crate::auth::Role;
use crate::config::{Config, Overrides};
use crate::state::{self, Store};

use audit::{audit_head, audit_verify, key_chain, keyed_chain, replay};
use calls::{certificate, consent, control_call, encode, token};

#[derive(Debug, Parser)]
#[command(
    name = "lethe",
    version,
    about = "Lethe: a gateway that makes an AI agent's memory governable (consent, retention, erasure, audit).",
    after_help = "Every global option can also be set with its environment variable (LETHE_CONFIG, LETHE_DATA_LISTEN,\nLETHE_CONTROL_LISTEN, LETHE_ADMIN_LISTEN, LETHE_STATE_URL); LETHE_UPSTREAM_<NAME> overrides a route's upstream."
)]
pub struct Cli {
    /// Configuration file [default: config/lethe.toml, else the built-in default]
    #[arg(long, env = "LETHE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Data-plane listen address (overrides data_plane.listen)
    #[arg(long, env = "LETHE_DATA_LISTEN", global = true)]
    data_listen: Option<SocketAddr>,
    /// Control-plane listen address (overrides control_plane.listen)
    #[arg(long, env = "LETHE_CONTROL_LISTEN", global = true)]
    control_listen: Option<SocketAddr>,
    /// Admin listen address: probes and metrics (overrides admin.listen)
    #[arg(long, env = "LETHE_ADMIN_LISTEN", global = true)]
    admin_listen: Option<SocketAddr>,
    /// State store URL: sqlite://PATH or postgres://... (overrides state.url)
    #[arg(long = "state", env = "LETHE_STATE_URL", global = true)]
    state: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway. On SQLite the migrations are applied first; on PostgreSQL `lethe
    /// migrate` must have run (a schema behind this version is refused).
    Serve,
    /// Apply the state store's migrations and exit.
    Migrate,
    /// Validate configuration files; reports every problem of every file. Exit 1 if any.
    CheckConfig {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also connect to every governed PostgreSQL database and check its tables' expressions
        /// and keys against the live schema.
        #[arg(long)]
        connect: bool,
    },
    /// Mint a token with the development HS256 key, for development only (not possible with
    /// public keys): people sign in with `lethe login`.
    Token(TokenArgs),
    /// Sign in as yourself through the organisation's provider (`[auth.oidc]`): a code to enter
    /// in a browser (device authorization), else a browser sent back to this machine. Every
    /// verb then acts as you, until `lethe logout`.
    Login {
        /// Sign in with a browser on this machine even where the provider offers device codes.
        #[arg(long)]
        browser: bool,
    },
    /// Forget the sign-in `lethe login` kept.
    Logout,
    /// Grant, revoke and list consent, through the control plane.
    #[command(subcommand)]
    Consent(ConsentCommand),
    /// File an erasure request (or approve, review or resume one), through the control plane.
    Erase(EraseArgs),
    /// Show an erasure request: state, approvals, online latency, progress per store.
    Status {
        #[command(flatten)]
        control: ControlArgs,
        id: String,
    },
    /// Fetch the signed certificate of a completed erasure (canonical JSON on stdout), verify
    /// one, or print the public key certificates are signed with.
    Certificate(CertificateArgs),
    /// Apply every erasure completed since T again, to every store, as after restoring the
    /// stores from a backup taken at T; verifies each store is clean. Exit 1 if one is not.
    Replay {
        /// RFC 3339 time of the backup, e.g. 2026-11-01T00:00:00Z.
        #[arg(long)]
        since: String,
    },
    /// Work with the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// List the kinds of store this build can front on the data plane (`adapter = "..."`) and
    /// purge (`<kind>:<name>` erasure targets), one per line: `route chroma`, `target redis`.
    Stores,
    /// Governed PostgreSQL databases (`[[postgres]]`).
    #[command(subcommand)]
    Postgres(PostgresCommand),
}

#[derive(Debug, Subcommand)]
enum PostgresCommand {
    /// Print the SQL Lethe installs in the governed database NAME (run on every start).
    Plan { name: String },
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct CertificateArgs {
    #[command(subcommand)]
    command: Option<CertificateCommand>,
    /// The erasure request whose certificate to fetch.
    id: Option<String>,
    #[command(flatten)]
    control: ControlArgs,
}

#[derive(Debug, Subcommand)]
enum CertificateCommand {
    /// Check a certificate file with the issuer's public key (hex); exit 1 if it was altered.
    Verify {
        file: PathBuf,
        #[arg(long)]
        key: String,
    },
    /// Print the public key (hex) this deployment signs certificates with.
    PublicKey,
}

#[derive(Debug, Args)]
struct EraseArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// Approve this request instead of filing one.
    #[arg(long, group = "step", conflicts_with_all = ["subject", "alias", "ticket", "reason"])]
    approve: Option<String>,
    /// Take this request, which ran out of attempts, into manual review.
    #[arg(long, group = "step", conflicts_with_all = ["subject", "alias", "ticket", "reason"])]
    review: Option<String>,
    /// Resume this request after review: its failed stores are purged again.
    #[arg(long, group = "step", conflicts_with_all = ["subject", "alias", "ticket", "reason"])]
    resume: Option<String>,
    /// The subject's key.
    #[arg(long, required_unless_present = "step")]
    subject: Option<String>,
    /// Another key of the same person (repeatable).
    #[arg(long)]
    alias: Vec<String>,
    /// The data subject request's ticket.
    #[arg(long, required_unless_present = "step")]
    ticket: Option<String>,
    #[arg(long, required_unless_present = "step")]
    reason: Option<String>,
}

#[derive(Debug, Args)]
struct TokenArgs {
    #[arg(long, value_enum)]
    role: Role,
    #[arg(long)]
    tenant: String,
    /// Bind the token to one data subject.
    #[arg(long)]
    subject: Option<String>,
    /// Who the token speaks for (the `sub` claim) [default: <role>-cli]
    #[arg(long)]
    actor: Option<String>,
    /// Lifetime: 30s, 15m, 1h, ...
    #[arg(long, default_value = "1h")]
    ttl: String,
}

/// Where and as whom the control plane is called.
#[derive(Debug, Args)]
struct ControlArgs {
    /// Control-plane URL [default: http://<control_plane.listen>]
    #[arg(long, env = "LETHE_CONTROL_URL")]
    url: Option<String>,
    /// Bearer token [default: yours after `lethe login`; without [auth.oidc], a development
    /// token minted for the tenant, role compliance]
    #[arg(long, env = "LETHE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Tenant [default: the token's]
    #[arg(long)]
    tenant: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ConsentCommand {
    /// Record a consent grant.
    Grant {
        #[command(flatten)]
        control: ControlArgs,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        purpose: String,
        #[arg(long)]
        category: String,
        /// Comma-separated consent actions
        #[arg(long, value_delimiter = ',', required = true, value_parser = action_parser())]
        actions: Vec<lethe_policy::Action>,
        /// RFC 3339 end of the grant
        #[arg(long)]
        expires_at: Option<String>,
        /// Where the consent was given (form, ticket)
        #[arg(long)]
        source: String,
        /// Version of the consent text agreed to
        #[arg(long, default_value_t = 1)]
        policy_version: i64,
    },
    /// Revoke a grant by id.
    Revoke {
        #[command(flatten)]
        control: ControlArgs,
        id: String,
    },
    /// List a subject's grants.
    List {
        #[command(flatten)]
        control: ControlArgs,
        #[arg(long)]
        subject: String,
    },
}

/// The policy crate's consent actions, each by its name (`--help` lists them).
pub(crate) fn action_parser() -> impl clap::builder::TypedValueParser<Value = lethe_policy::Action>
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(lethe_policy::Action::ALL.iter().map(|a| a.as_str()))
        .try_map(|name| name.parse::<lethe_policy::Action>())
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Verify the keyed chain in the state store (the whole chain, or one tenant's with
    /// `--tenant`): every link, and every head signed and kept for it; with `--head FILE` (a head
    /// printed by `lethe audit head`, or a downloaded certificate) that the chain still holds it.
    /// Exit 1 and name the first bad row if not.
    Verify {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, value_name = "FILE")]
        head: Option<std::path::PathBuf>,
    },
    /// Sign the chain's current head (or a tenant's, with `--tenant`), keep it, and print it as
    /// JSON, to be saved somewhere the state store's writers cannot reach.
    Head {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Once, after upgrading from a version whose chain links were not keyed: verify the chain
    /// as it was written and seal it again with the audit key (Lethe serves nothing before). An
    /// `audit.chain_keyed` event names the head it had; heads certified before still verify.
    KeyChain,
}

/// A command's failure: what to print, and the exit code.
#[derive(Debug)]
struct Failure(String, u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string(), 2)
    }
}

impl Cli {
    /// How logs are written: the configuration's `[log] format`, else JSON when standard error
    /// is no terminal (a file, a container's log) and text on one.
    pub fn log_format(&self) -> crate::config::LogFormat {
        use std::io::IsTerminal;
        let configured = Config::load(self.config.as_deref(), &Overrides::default())
            .ok()
            .and_then(|config| config.log.format);
        configured.unwrap_or(if std::io::stderr().is_terminal() {
            crate::config::LogFormat::Text
        } else {
            crate::config::LogFormat::Json
        })
    }
}

pub async fn run(cli: Cli) -> ExitCode {
    match dispatch(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, code)) => {
            eprintln!("lethe: {message}");
            ExitCode::from(code)
        }
    }
}

async fn dispatch(cli: Cli) -> Result<(), Failure> {
    let overrides = Overrides {
        data_listen: cli.data_listen,
        control_listen: cli.control_listen,
        admin_listen: cli.admin_listen,
        state_url: cli.state.clone(),
    };
    let load = || Config::load(cli.config.as_deref(), &overrides);
    match cli.command {
        Command::CheckConfig { files, connect } => check_config(&files, connect).await,
        Command::Serve => serve::serve(load()?).await,
        Command::Migrate => {
            let config = load()?;
            let applied = connect(&config).await?.migrate().await?;
            println!(
                "state store {}: applied migrations {applied:?}",
                redact_url(&config.state.url)
            );
            Ok(())
        }
        Command::Token(args) => token(&load()?, args).await,
        Command::Login { browser } => login::login(&load()?, browser).await,
        Command::Logout => login::logout(),
        Command::Consent(command) => consent(&load()?, command).await,
        Command::Erase(args) => {
            let step = [
                ("approve", &args.approve),
                ("review", &args.review),
                ("resume", &args.resume),
            ]
            .into_iter()
            .find_map(|(step, id)| Some((step, id.as_deref()?)));
            let (path, body) = match step {
                Some((step, id)) => (format!("/v1/erasures/{}/{step}", encode(id)), None),
                None => (
                    "/v1/erasures".to_owned(),
                    Some(
                        json!({"tenant": args.control.tenant, "subject": args.subject, "aliases": args.alias,
                                "ticket": args.ticket, "reason": args.reason}),
                    ),
                ),
            };
            control_call(&load()?, &args.control, Method::POST, &path, body).await
        }
        Command::Certificate(args) => certificate(&load, args).await,
        Command::Replay { since } => replay(&load()?, &since).await,
        Command::Status { control, id } => {
            control_call(
                &load()?,
                &control,
                Method::GET,
                &format!("/v1/erasures/{}", encode(&id)),
                None,
            )
            .await
        }
        Command::Audit(AuditCommand::Verify { tenant, head }) => {
            audit_verify(&load()?, tenant.as_deref(), head.as_deref()).await
        }
        Command::Audit(AuditCommand::Head { tenant }) => {
            audit_head(&load()?, tenant.as_deref()).await
        }
        Command::Audit(AuditCommand::KeyChain) => key_chain(&load()?).await,
        Command::Postgres(PostgresCommand::Plan { name }) => {
            let config = load()?;
            let db = config
                .postgres
                .iter()
                .find(|d| d.name == name)
                .ok_or_else(|| Failure(format!("no [[postgres]] named {name:?}"), 2))?;
            for statement in crate::governed::plan::plan(db, &config.folding()) {
                println!("{statement};\n");
            }
            Ok(())
        }
        Command::Stores => {
            for kind in crate::stores::KINDS {
                println!("route {}", kind.name);
            }
            for kind in crate::stores::TARGET_KINDS {
                println!("target {}", kind.name);
            }
            Ok(())
        }
    }
}

async fn check_config(files: &[PathBuf], connect: bool) -> Result<(), Failure> {
    let mut failed = false;
    for file in files {
        let mut result = std::fs::read_to_string(file)
            .map_err(|e| e.to_string())
            .and_then(|text| check(&text).map_err(|e| e.to_string()));
        if connect && let Ok(config) = &result {
            let problems = crate::governed::check_live(config).await;
            if !problems.is_empty() {
                result = Err(problems.join("\n"));
            }
        }
        match result {
            Ok(_) => println!("{}: ok", file.display()),
            Err(problems) => {
                failed = true;
                println!("{}:", file.display());
                for line in problems.lines() {
                    println!("  - {line}");
                }
            }
        }
    }
    if failed {
        Err(Failure("configuration has problems".into(), 1))
    } else {
        Ok(())
    }
}

/// The state store, its schema ready (see [`schema_ready`]), given the key of subject
/// references and of the audit chain's links.
async fn open(config: &Config) -> Result<Arc<dyn Store>, Failure> {
    let store = connect(config).await?;
    schema_ready(store.as_ref()).await?;
    store.use_subject_key(&crate::keys::audit_key(config, store.as_ref()).await?);
    Ok(store)
}

/// Brings the schema up to date where one process owns the store (SQLite); on PostgreSQL, shared
/// by replicas, only `lethe migrate` changes it: a schema behind this Lethe's is refused with
/// what to run, and one ahead (a newer Lethe migrated it, during a rolling upgrade) is served,
/// as migrations only add what the version before can ignore.
async fn schema_ready(store: &dyn Store) -> Result<(), Failure> {
    if store.backend() == "sqlite" {
        let applied = store.migrate().await?;
        if !applied.is_empty() {
            tracing::info!(?applied, "applied state store migrations");
        }
        return Ok(());
    }
    let schema = store.schema().await?;
    if schema.applied < schema.latest {
        return Err(Failure(
            format!(
                "the state store's schema is at version {}, and this Lethe needs {}: run `lethe migrate` (once, from one place), then start again",
                schema.applied, schema.latest
            ),
            2,
        ));
    }
    if schema.applied > schema.latest {
        tracing::warn!(
            applied = schema.applied,
            known = schema.latest,
            "the state store's schema is newer than this Lethe's: a newer Lethe migrated it; serving (migrations only add)"
        );
    }
    Ok(())
}

/// The state store the configuration names, told how erasures reach derivatives and which
/// governed databases a flip must hold in.
async fn connect(config: &Config) -> Result<Arc<dyn Store>, Failure> {
    let store = state::connect(&config.state.url).await.map_err(|e| {
        Failure(
            format!("state store {}: {e}", redact_url(&config.state.url)),
            2,
        )
    })?;
    store.use_closure(
        match (config.lineage.derivatives, config.lineage.cross_subject) {
            (false, _) => state::Closure::Off,
            (true, crate::config::CrossSubject::Review) => state::Closure::Review,
            (true, crate::config::CrossSubject::Erase) => state::Closure::Erase,
        },
    );
    // A flip holds only once every governed database has it, whichever process files it.
    store.use_governed(config.postgres.iter().map(|db| db.name.clone()).collect());
    Ok(store)
}

/// The URL without its password, for messages.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].split_once(':') {
            Some((user, _password)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

/// A configuration text checked whole, as `lethe check-config` does: its own problems, its
/// routes' stores' and its erasure-only stores', all at once (no secret is resolved).
pub fn check(text: &str) -> Result<Config, crate::config::ConfigErrors> {
    let (config, mut problems) = Config::checked(text)?;
    problems.extend(crate::stores::problems(&config));
    problems.extend(crate::erasure::problems(
        &config,
        crate::stores::TARGET_KINDS,
    ));
    match problems.is_empty() {
        true => Ok(config),
        false => Err(crate::config::ConfigErrors { problems }),
    }
}

/// What a configuration puts in front of the purge besides `[erasure]`: its routes, with their
/// stores, and the purge targets of its governed databases.
fn purge_sources(
    config: &Config,
) -> Result<
    (
        Vec<crate::data::forward::Route>,
        Vec<crate::erasure::PostgresTarget>,
    ),
    Failure,
> {
    let routes =
        crate::stores::routes(config).map_err(|problems| Failure(problems.join("\n"), 2))?;
    let governed = config
        .postgres
        .iter()
        .map(crate::governed::plan::erasure_target);
    Ok((routes, governed.collect()))
}

#[cfg(test)]
mod check_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("postgres://lethe:hunter2@db/lethe"),
            "postgres://lethe:***@db/lethe"
        );
        assert_eq!(
            redact_url("postgres://lethe@db/lethe"),
            "postgres://lethe@db/lethe"
        );
        assert_eq!(
            redact_url("sqlite://.lethe/state.db"),
            "sqlite://.lethe/state.db"
        );
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("a b&c/d"), "a%20b%26c%2Fd");
    }
}

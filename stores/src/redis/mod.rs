//! Redis (`adapter = "redis"`): a route with a listener of its own that speaks RESP, so that
//! agent frameworks keep their plain Redis clients (`redis-py`, LangChain's chat histories).
//! Keys name their subject through the route's `[[routes.keys]]` patterns; every command is
//! decided on them (`route.rs`), and the purge scans and unlinks them, on the route's Redis.

mod client;
pub mod commands;
pub(crate) mod connector;
pub mod keys;
pub mod resp;
pub(crate) mod route;

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;

use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::DataState;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::{ConnectionRoute, RouteStore, Serving, Timeouts};
use crate::purge::Connector;
use keys::{KeyRule, Pattern};

pub const KIND: Kind = Kind::of::<RedisSettings>("redis");

/// The largest command a client may send, by default.
const MAX_COMMAND_BYTES: usize = 1024 * 1024;
/// The most commands one transaction may queue, by default.
const MAX_TRANSACTION_COMMANDS: usize = 10_000;

/// A Redis route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// What each key is: the first pattern that matches a key names its tenant and subject,
    /// and the purpose and category it is kept for. A key no pattern matches is refused.
    pub keys: Vec<KeyRule>,
    /// The largest command (all its arguments) a client may send; larger ones are refused and
    /// the connection closed. Default 1 MiB.
    pub max_command_bytes: Option<usize>,
    /// The most commands one `MULTI` may queue (Lethe holds them until `EXEC`); one more
    /// discards the transaction. A pipeline needs no bound: each command is answered before
    /// the next is read. Default 10 000.
    pub max_transaction_commands: Option<usize>,
}

impl Settings for RedisSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        let mut problems = Vec::new();
        if self.keys.is_empty() {
            problems.push("keys: name at least one [[routes.keys]] pattern".to_owned());
        }
        let patterns: Vec<Pattern> = self
            .keys
            .iter()
            .filter_map(|rule| Pattern::of(rule).map_err(|p| problems.push(p)).ok())
            .collect();
        for (key, value) in [
            ("max_command_bytes", self.max_command_bytes),
            ("max_transaction_commands", self.max_transaction_commands),
        ] {
            if value == Some(0) {
                problems.push(format!("{key}: at least 1"));
            }
        }
        match problems.is_empty() {
            true => Ok(Arc::new(Redis {
                patterns,
                recorded: route::Recorded::new(),
                limits: route::Limits {
                    command_bytes: self.max_command_bytes.unwrap_or(MAX_COMMAND_BYTES),
                    queued: self
                        .max_transaction_commands
                        .unwrap_or(MAX_TRANSACTION_COMMANDS),
                },
            })),
            false => Err(problems),
        }
    }
}

#[derive(Debug)]
pub struct Redis {
    patterns: Vec<Pattern>,
    recorded: route::Recorded,
    limits: route::Limits,
}

impl RouteStore for Redis {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn serving(&self) -> Serving<'_> {
        Serving::Connections(self)
    }

    fn upstream_problem(&self, upstream: &str) -> Option<String> {
        client::Server::of_url(upstream, None)
            .err()
            .map(|e| format!("upstream: {e}"))
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        _erasure: &ErasureConfig,
        _audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector> {
        // A route's upstream was checked when the configuration was read (upstream_problem);
        // were it not, the purge reaches no server and says so, never that it found nothing.
        let servers = client::Server::of_route(&route).into_iter().collect();
        Arc::new(connector::RedisConnector::new(
            &route.name,
            servers,
            self.patterns.clone(),
            upstreams.tls(),
        ))
    }
}

#[async_trait]
impl ConnectionRoute for Redis {
    async fn serve(
        &self,
        route: &Route,
        state: &Arc<DataState>,
        connection: tokio::net::TcpStream,
        _peer: SocketAddr,
        timeouts: Timeouts,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        route::serve(
            route,
            state,
            &self.patterns,
            &self.recorded,
            self.limits,
            timeouts,
            connection,
            stopping,
        )
        .await;
    }

    fn refusal(&self, why: &str) -> Vec<u8> {
        let mut out = Vec::new();
        resp::Reply::error(format!("ERR lethe:overloaded {why}"))
            .write(resp::Proto::Resp2, &mut out);
        out
    }
}

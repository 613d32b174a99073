//! The stores a data-plane route can front, one folder each: its pure adapter (`adapter.rs`),
//! its data-plane handler (`route.rs`), its erasure connector (`connector.rs`) and, in its
//! `mod.rs`, its typed route settings and the [`RouteStore`] that ties them together.
//!
//! Adding a store: a folder like the others, its `mod` line here, and one line in [`KINDS`]
//! (the checklist is in `ARCHITECTURE.md`). Configuration
//! (`adapter = "..."` and the kind's own keys), dispatch, erasure targets, the conformance suite
//! and `lethe stores` all follow from that line.

// The layers below, named as before.
use lethe_data as data;
#[cfg(test)]
use lethe_data::testing;
use lethe_data::{auth, config, error_shape, purge, revocations};
use lethe_erasure as erasure;
use lethe_state as state;
use lethe_state::now;

pub mod azure_search;
pub mod chroma;
pub(crate) mod http;
pub mod kit;
pub mod langgraph;
pub mod namespace;
pub mod openai;
pub mod otlp;
pub mod qdrant;
pub mod redis;

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::data::forward::Route;
use crate::data::route::{RouteStore, Serving};

/// Every kind of store a route can front.
pub const KINDS: &[Kind] = &[
    azure_search::KIND,
    chroma::KIND,
    langgraph::KIND,
    openai::KIND,
    otlp::KIND,
    qdrant::KIND,
    redis::KIND,
];

/// Every kind of store only erasure reaches (`[[erasure.<kind>]]`): PostgreSQL tables outside
/// a governed database, Redis deployments no route fronts, SQLite files.
pub const TARGET_KINDS: &[crate::erasure::TargetKind] = &[
    crate::erasure::postgres::KIND,
    redis::connector::TARGET_KIND,
    crate::erasure::sqlite_file::KIND,
];

/// Every route of a configuration, its store built through [`KINDS`] from the route's own keys
/// and its credential resolved; or every problem at once.
pub fn routes(config: &Config) -> Result<Vec<Route>, Vec<String>> {
    let stores = stores_of(config)?;
    let (routes, problems): (Vec<_>, Vec<_>) = config
        .routes
        .iter()
        .zip(stores)
        .map(|(route, store)| Route::from_config(route, store))
        .partition(Result::is_ok);
    match problems.is_empty() {
        true => Ok(routes.into_iter().flatten().collect()),
        false => Err(problems.into_iter().filter_map(Result::err).collect()),
    }
}

/// The store of every route of a configuration, in its order; or every problem of every route
/// at once (an unknown kind, the kind's keys, routes to one store that disagree on whether
/// tenants share its collections).
fn stores_of(config: &Config) -> Result<Vec<Arc<dyn RouteStore>>, Vec<String>> {
    let mut stores = Vec::new();
    let mut problems = Vec::new();
    let mut upstreams = std::collections::BTreeMap::new();
    for (i, route) in config.routes.iter().enumerate() {
        let at = format!("[[routes]] #{} ({})", i + 1, route.name);
        let store = match kind(&route.adapter) {
            Some(kind) => (kind.settings)(route.settings.clone()),
            None => Err(vec![format!(
                "adapter {:?}: no such store (known: {})",
                route.adapter,
                kind_names()
            )]),
        };
        let store = match store {
            Ok(store) => store,
            Err(found) => {
                problems.extend(found.into_iter().map(|p| format!("{at}: {p}")));
                continue;
            }
        };
        problems.extend(reach_problems(route, store.as_ref()).map(|p| format!("{at}: {p}")));
        // A shared route to a store whose collections another route keeps per tenant would
        // list every tenant's.
        let isolation = store.isolation();
        let address = crate::config::store_address(&route.upstream);
        match upstreams.insert(address, (isolation, &route.name)) {
            Some((other, name)) if other != isolation => problems.push(format!(
                "{at}: route {name} has the same upstream and another isolation: routes to one store must agree"
            )),
            _ => {}
        }
        stores.push(store);
    }
    match problems.is_empty() {
        true => Ok(stores),
        false => Err(problems),
    }
}

/// What is wrong with how a route says its clients reach it and where it sends them, for its
/// store: HTTP needs a `prefix`, a protocol of its own a `listen` address, and the upstream a
/// scheme the store speaks.
fn reach_problems(
    route: &crate::config::RouteConfig,
    store: &dyn RouteStore,
) -> impl Iterator<Item = String> {
    let serving = store.serving();
    let (given, missing) = match serving {
        Serving::Http(_) => (route.listen.is_some(), route.prefix.is_none()),
        Serving::Connections(_) => (route.prefix.is_some(), route.listen.is_none()),
    };
    let other = if serving.key() == "prefix" {
        "listen"
    } else {
        "prefix"
    };
    let kind = store.kind();
    [
        given.then(|| format!("{kind} is reached by {}, not {other}", serving.key())),
        missing.then(|| format!("{}: missing; {kind} is reached by it", serving.key())),
        store.upstream_problem(&route.upstream),
    ]
    .into_iter()
    .flatten()
}

/// Every problem of a configuration's routes' stores (credentials are not resolved).
pub fn problems(config: &Config) -> Vec<String> {
    stores_of(config).err().unwrap_or_default()
}

/// The kind named `adapter = "name"`.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// The names of every kind, for messages.
pub fn kind_names() -> String {
    KINDS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// A kind of store: its name, and how a route's own settings of it are read.
pub struct Kind {
    /// `adapter = "..."`, and the first half of its erasure targets' names (`chroma:<route>`).
    pub name: &'static str,
    /// Reads a route's keys of this kind (every key but the common ones), refusing unknown keys
    /// and reporting every problem at once, into what serves and purges the route.
    pub settings: ReadSettings,
}

/// Reads a route's own keys into its store, or every problem with them.
pub type ReadSettings = fn(toml::Table) -> Result<Arc<dyn RouteStore>, Vec<String>>;

impl Kind {
    /// The kind whose route settings are `S`.
    pub const fn of<S: Settings>(name: &'static str) -> Kind {
        Kind {
            name,
            settings: read::<S>,
        }
    }
}

/// A kind's route settings, as written in the configuration (`#[serde(deny_unknown_fields)]`).
pub trait Settings: DeserializeOwned {
    /// Checks them (every problem at once) and makes the route's store.
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>>;
}

/// Reads a kind's settings `S` from a route's own keys (every problem at once) into its store.
fn read<S: Settings>(keys: toml::Table) -> Result<Arc<dyn RouteStore>, Vec<String>> {
    crate::config::read_all::<S>(keys)?.store()
}

/// An answer with its body rewritten by `rewrite` (given whether it is a success), when that
/// answers a new one; its length follows the new body.
pub(crate) async fn rewritten(
    answer: Response<http_body_util::Full<Bytes>>,
    rewrite: impl FnOnce(bool, &[u8]) -> Option<Vec<u8>>,
) -> Response<http_body_util::Full<Bytes>> {
    let (mut head, body) = answer.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let bytes = rewrite(head.status.is_success(), &bytes).map_or(bytes, Bytes::from);
    head.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(head, http_body_util::Full::new(bytes))
}

#[cfg(test)]
mod plane_tests;

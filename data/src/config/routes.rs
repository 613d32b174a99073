//! `[[routes]]`: the keys every route has; the rest is its store kind's (`stores::routes`).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde::Deserialize;

use super::values::{ConfigDuration, Secret};

/// A data-plane route: its common keys, the kind of store behind it (`adapter = "..."`) and that
/// kind's own keys, which `stores::routes` reads into the route's store.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `chroma`, `langgraph`, ...: names the route in logs and in `LETHE_UPSTREAM_<NAME>`.
    pub name: String,
    /// Path prefix on the data plane, e.g. `/chroma`: a store spoken to in HTTP.
    pub prefix: Option<String>,
    /// The route's own listener: a store spoken to in a protocol of its own (Redis).
    pub listen: Option<SocketAddr>,
    pub upstream: String,
    /// The upstream's own credential, sent on every forwarded request.
    pub credential: Option<CredentialConfig>,
    /// How long the upstream may take to answer (a whole answer, or the first byte of a
    /// stream); then `upstream_unavailable`. Erasure connectors use 30 s when it is unset.
    pub timeout: Option<ConfigDuration>,
    /// The purpose and category of requests that name none (`X-Lethe-Purpose`,
    /// `X-Lethe-Category`): for clients that cannot send Lethe's headers.
    pub purpose: Option<String>,
    pub category: Option<String>,
    /// The kind of store behind the route.
    pub adapter: String,
    /// Every key of the route but the common ones: the kind's own settings.
    pub settings: toml::Table,
}

/// The keys every route has, whatever its store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommonRoute {
    name: String,
    prefix: Option<String>,
    listen: Option<SocketAddr>,
    upstream: String,
    credential: Option<CredentialConfig>,
    timeout: Option<ConfigDuration>,
    purpose: Option<String>,
    category: Option<String>,
}

/// A purpose or category as the control plane takes one: 1 to 200 bytes, no control characters,
/// no `/`.
pub(super) fn valid_name(value: &str) -> bool {
    !value.trim().is_empty()
        && value.len() <= 200
        && !value.chars().any(|c| c.is_control() || c == '/')
}

impl RouteConfig {
    /// The erasure target that purges the route's store.
    pub fn erasure_target(&self) -> String {
        route_target(&self.adapter, &self.name)
    }

    /// Reads one `[[routes]]` table: the common keys, `adapter`, and the rest kept as the kind's
    /// settings; every problem of the common keys at once.
    pub(super) fn read(item: toml::Value) -> Result<RouteConfig, Vec<String>> {
        let toml::Value::Table(mut table) = item else {
            return Err(vec!["must be a table".to_owned()]);
        };
        let mut common = toml::Table::new();
        for key in [
            "name",
            "prefix",
            "listen",
            "upstream",
            "credential",
            "timeout",
            "purpose",
            "category",
        ] {
            if let Some(value) = table.remove(key) {
                common.insert(key.to_owned(), value);
            }
        }
        let common = CommonRoute::deserialize(toml::Value::Table(common))
            .map_err(|e| e.to_string().trim().to_owned());
        let adapter = match table.remove("adapter") {
            Some(toml::Value::String(name)) => Ok(name),
            _ => Err("adapter: missing; name the kind of store behind the route".to_owned()),
        };
        match (common, adapter) {
            (Ok(c), Ok(adapter)) => Ok(RouteConfig {
                name: c.name,
                prefix: c.prefix,
                listen: c.listen,
                upstream: c.upstream,
                credential: c.credential,
                timeout: c.timeout,
                purpose: c.purpose,
                category: c.category,
                adapter,
                settings: table,
            }),
            (common, adapter) => Err(common.err().into_iter().chain(adapter.err()).collect()),
        }
    }
}

/// The erasure target of a route: `<kind>:<route name>`.
pub fn route_target(kind: &str, route: &str) -> String {
    format!("{kind}:{route}")
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub header: String,
    pub value: Secret,
}

/// One spelling of an upstream's address, so that two routes to one store are seen as one:
/// scheme and host in lowercase, the port written, every loopback name as one, no trailing `/`.
/// (Two DNS names of one host are not found out.)
pub fn store_address(upstream: &str) -> String {
    let Ok(uri) = upstream.parse::<hyper::Uri>() else {
        return upstream.to_owned();
    };
    let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let host = if loopback { "loopback" } else { &host };
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!(
        "{scheme}://{host}:{port}{}",
        uri.path().trim_end_matches('/')
    )
}

impl RouteConfig {
    /// The problems of each route's common keys, and between routes (names, prefixes, listeners).
    pub(super) fn problems_of(routes: &[RouteConfig]) -> Vec<String> {
        let mut problems = Vec::new();
        let mut names = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        let mut listeners = BTreeSet::new();
        for (i, route) in routes.iter().enumerate() {
            let at = format!("[[routes]] #{} ({})", i + 1, route.name);
            if !names.insert(&route.name) {
                problems.push(format!("{at}: another route already has this name"));
            }
            if let Some(prefix) = &route.prefix
                && !prefixes.insert(prefix)
            {
                problems.push(format!("{at}: another route already has prefix {prefix}"));
            }
            if let Some(listen) = route.listen
                && !listeners.insert(listen)
            {
                problems.push(format!("{at}: another route already listens on {listen}"));
            }
            problems.extend(route.problems().into_iter().map(|p| format!("{at}: {p}")));
        }
        problems
    }

    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            problems.push("name must be lowercase letters, digits and _".to_owned());
        }
        match (&self.prefix, self.listen) {
            (Some(_), Some(_)) => problems.push(
                "prefix (HTTP on the data plane) or listen (a listener of its own), not both"
                    .to_owned(),
            ),
            (None, None) => problems.push(
                "prefix or listen: say where clients reach the route (as its store needs)"
                    .to_owned(),
            ),
            (Some(prefix), None) => {
                let prefix_ok = prefix.len() > 1
                    && prefix.starts_with('/')
                    && !prefix.ends_with('/')
                    && !prefix.contains("//");
                if !prefix_ok {
                    problems
                        .push("prefix must look like /name (leading /, no trailing /)".to_owned());
                }
            }
            (None, Some(_)) => {}
        }
        for (key, value) in [("purpose", &self.purpose), ("category", &self.category)] {
            if value.as_deref().is_some_and(|v| !valid_name(v)) {
                problems.push(format!(
                    "{key}: must be 1 to 200 bytes without control characters or '/'"
                ));
            }
        }
        if !is_url(&self.upstream) {
            problems.push(format!(
                "upstream {:?} is not a URL with a host",
                self.upstream
            ));
        }
        if let Some(credential) = &self.credential
            && hyper::header::HeaderName::from_bytes(credential.header.as_bytes()).is_err()
        {
            problems.push(format!(
                "credential.header {:?} is not a header name",
                credential.header
            ));
        }
        problems
    }
}

/// A URL with a scheme and a host (which schemes a route may use is its store's to say).
fn is_url(text: &str) -> bool {
    text.parse::<hyper::Uri>()
        .is_ok_and(|uri| uri.scheme().is_some() && uri.host().is_some_and(|h| !h.is_empty()))
}

/// `LETHE_UPSTREAM_<NAME>`: overrides the upstream URL of the route named `name`.
pub fn upstream_env_var(name: &str) -> String {
    format!("LETHE_UPSTREAM_{}", name.to_ascii_uppercase())
}

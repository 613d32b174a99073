//! The data plane's metrics, in Prometheus' text format and named after OpenTelemetry's HTTP
//! semantic conventions: requests served and upstream calls made, by route, with their duration;
//! connections open per listener. Every label is bounded: route and listener names come from
//! the configuration, methods from a closed list, statuses are numbers and error types the one
//! enum's codes. Never a subject, a key, a collection or a tenant.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The buckets of every duration histogram (seconds): from half a millisecond, where a decision
/// served from the cache lands, to ten seconds, past any request timeout worth having.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Observations at or under each bucket's bound (not yet cumulative).
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(self.counts) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// What a served request's series is told apart by, besides its route.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    method: &'static str,
    status: Status,
    /// The error code Lethe answered with, empty for an answer that is no error of Lethe's.
    error: &'static str,
}

/// An upstream call's series, besides its route: the status the upstream answered, or the way
/// the call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Called {
    status: Option<Status>,
    error: &'static str,
}

/// A status as a label: a status HTTP defines, else `_OTHER` (an upstream's answers pass through
/// with their status, and an upstream may invent hundreds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Known(u16),
    Other,
}

impl Status {
    fn of(status: u16) -> Status {
        let known = hyper::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .is_some();
        if known {
            Status::Known(status)
        } else {
            Status::Other
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Known(status) => write!(f, "{status}"),
            Status::Other => f.write_str("_OTHER"),
        }
    }
}

/// A listener's count of open connections.
pub trait OpenConnections: Send + Sync {
    fn open(&self) -> usize;
}

/// Series per route: a few methods, statuses and errors each, so a short list is scanned.
type ByRoute<K> = HashMap<String, Vec<(K, Histogram)>>;

#[derive(Default)]
pub struct DataMetrics {
    served: Mutex<ByRoute<Served>>,
    called: Mutex<ByRoute<Called>>,
    listeners: Mutex<Vec<(String, Arc<dyn OpenConnections>)>>,
    /// Retention sweeps that reached the state store and those that did not, and the items
    /// they deleted.
    sweeps: [AtomicU64; 2],
    swept: AtomicU64,
}

fn observe<K: PartialEq>(series: &Mutex<ByRoute<K>>, route: &str, key: K, took: Duration) {
    let mut series = series.lock().unwrap_or_else(|p| p.into_inner());
    let of_route = match series.get_mut(route) {
        Some(of_route) => of_route,
        None => series.entry(route.to_owned()).or_default(),
    };
    let histogram = match of_route.iter().position(|(k, _)| *k == key) {
        Some(i) => &mut of_route[i].1,
        None => {
            of_route.push((key, Histogram::default()));
            &mut of_route.last_mut().expect("just pushed").1
        }
    };
    histogram.observe(took.as_secs_f64());
}

impl DataMetrics {
    /// A request the data plane answered on `route` (`-` when it matched none).
    pub fn served(
        &self,
        route: &str,
        method: &hyper::Method,
        status: u16,
        error: &'static str,
        took: Duration,
    ) {
        let method = method_label(method);
        let key = Served {
            method,
            status: Status::of(status),
            error,
        };
        observe(&self.served, route, key, took);
    }

    /// A call to `route`'s upstream: the status it answered, or `error` when it gave none.
    pub fn called(&self, route: &str, status: Option<u16>, error: &'static str, took: Duration) {
        let status = status.map(Status::of);
        observe(&self.called, route, Called { status, error }, took);
    }

    /// A retention sweep: the items it deleted, or `None` when it could not reach the state store.
    pub fn swept(&self, deleted: Option<u64>) {
        self.sweeps[usize::from(deleted.is_none())].fetch_add(1, Ordering::Relaxed);
        self.swept
            .fetch_add(deleted.unwrap_or(0), Ordering::Relaxed);
    }

    /// Counts `listener`'s open connections from now on.
    pub fn listener(&self, name: &str, open: Arc<dyn OpenConnections>) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.push((name.to_owned(), open));
    }

    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP http_server_request_duration_seconds Data-plane requests answered, by route, method, status and Lethe's error code (error_type).\n# TYPE http_server_request_duration_seconds histogram\n");
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        for (route, series) in sorted(&served) {
            for (key, histogram) in series {
                let labels = format!(
                    "lethe_route=\"{route}\",http_request_method=\"{}\",http_response_status_code=\"{}\",error_type=\"{}\"",
                    key.method, key.status, key.error
                );
                histogram.render(out, "http_server_request_duration_seconds", &labels);
            }
        }
        drop(served);
        out.push_str("# HELP http_client_request_duration_seconds Calls to upstreams until their answer's head, by route and the status answered (or error_type when none was).\n# TYPE http_client_request_duration_seconds histogram\n");
        let called = self.called.lock().unwrap_or_else(|p| p.into_inner());
        for (route, series) in sorted(&called) {
            for (key, histogram) in series {
                let status = key.status.map(|s| s.to_string()).unwrap_or_default();
                let labels = format!(
                    "lethe_route=\"{route}\",http_response_status_code=\"{status}\",error_type=\"{}\"",
                    key.error
                );
                histogram.render(out, "http_client_request_duration_seconds", &labels);
            }
        }
        drop(called);
        let [ok, failed] = &self.sweeps;
        let _ = write!(
            out,
            "# HELP lethe_retention_sweeps_total Retention sweeps, by whether they reached the state store.\n# TYPE lethe_retention_sweeps_total counter\nlethe_retention_sweeps_total{{result=\"ok\"}} {}\nlethe_retention_sweeps_total{{result=\"failed\"}} {}\n# HELP lethe_retention_swept_items_total Expired or revoked items the retention sweeps deleted.\n# TYPE lethe_retention_swept_items_total counter\nlethe_retention_swept_items_total {}\n",
            ok.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            self.swept.load(Ordering::Relaxed)
        );
        out.push_str("# HELP lethe_open_connections Client connections open, by listener.\n# TYPE lethe_open_connections gauge\n");
        let listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        for (name, open) in listeners.iter() {
            let _ = writeln!(
                out,
                "lethe_open_connections{{listener=\"{name}\"}} {}",
                open.open()
            );
        }
    }
}

fn sorted<K>(series: &ByRoute<K>) -> Vec<(&String, &Vec<(K, Histogram)>)> {
    let mut sorted: Vec<_> = series.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    sorted
}

/// A request's method as a label: one of the methods HTTP defines, or `_OTHER` (as
/// OpenTelemetry's conventions say), so that a client inventing methods cannot grow the series.
pub fn method_label(method: &hyper::Method) -> &'static str {
    use hyper::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "_OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_series_stay_bounded() {
        let metrics = DataMetrics::default();
        let invented = hyper::Method::from_bytes(b"BREW").unwrap();
        for (method, took) in [
            (hyper::Method::GET, 0.0004),
            (hyper::Method::GET, 0.003),
            (hyper::Method::GET, 20.0),
            (invented.clone(), 0.001),
            (hyper::Method::from_bytes(b"STEEP").unwrap(), 0.001),
        ] {
            metrics.served("chroma", &method, 200, "", Duration::from_secs_f64(took));
        }
        metrics.served(
            "chroma",
            &hyper::Method::POST,
            403,
            "scope_violation",
            Duration::ZERO,
        );
        metrics.called("chroma", None, "unavailable", Duration::from_millis(2));
        for invented in [299, 599, 777] {
            metrics.served("chroma", &hyper::Method::GET, invented, "", Duration::ZERO);
            metrics.called("chroma", Some(invented), "", Duration::ZERO);
        }
        metrics.swept(Some(3));
        metrics.swept(None);
        let mut out = String::new();
        metrics.render(&mut out);
        let get = "lethe_route=\"chroma\",http_request_method=\"GET\",http_response_status_code=\"200\",error_type=\"\"";
        for line in [
            format!("http_server_request_duration_seconds_bucket{{{get},le=\"0.0005\"}} 1"),
            format!("http_server_request_duration_seconds_bucket{{{get},le=\"0.005\"}} 2"),
            format!("http_server_request_duration_seconds_bucket{{{get},le=\"10\"}} 2"),
            format!("http_server_request_duration_seconds_bucket{{{get},le=\"+Inf\"}} 3"),
            format!("http_server_request_duration_seconds_count{{{get}}} 3"),
            "http_server_request_duration_seconds_count{lethe_route=\"chroma\",http_request_method=\"_OTHER\",http_response_status_code=\"200\",error_type=\"\"} 2".to_owned(),
            "http_server_request_duration_seconds_count{lethe_route=\"chroma\",http_request_method=\"POST\",http_response_status_code=\"403\",error_type=\"scope_violation\"} 1".to_owned(),
            "http_client_request_duration_seconds_count{lethe_route=\"chroma\",http_response_status_code=\"\",error_type=\"unavailable\"} 1".to_owned(),
            "lethe_retention_sweeps_total{result=\"ok\"} 1".to_owned(),
            "lethe_retention_sweeps_total{result=\"failed\"} 1".to_owned(),
            "lethe_retention_swept_items_total 3".to_owned(),
        ] {
            assert!(out.lines().any(|l| l == line), "{line} not in\n{out}");
        }
        assert!(!out.contains("BREW") && !out.contains("STEEP"));
        // Statuses HTTP does not define are one series, however many an upstream invents.
        let other = "http_server_request_duration_seconds_count{lethe_route=\"chroma\",http_request_method=\"GET\",http_response_status_code=\"_OTHER\",error_type=\"\"} 3";
        assert!(out.lines().any(|l| l == other), "{out}");
        assert!(!out.contains("\"777\"") && !out.contains("\"299\""));
    }
}

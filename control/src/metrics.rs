//! Request metrics in the Prometheus text format, and the access log (no bodies, no subject ids).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

#[derive(Debug, Default)]
struct RouteStats {
    count: u64,
    seconds: f64,
}

/// Counts per (route template, method, status).
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), RouteStats>>,
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let mut requests = self
            .requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let stats = requests
            .entry((route.to_owned(), method.to_owned(), status))
            .or_default();
        stats.count += 1;
        stats.seconds += seconds;
    }

    pub fn render(&self) -> String {
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut out = String::new();
        out.push_str("# HELP lethe_control_requests_total Control-plane requests by route, method and status.\n");
        out.push_str("# TYPE lethe_control_requests_total counter\n");
        for ((route, method, status), stats) in requests.iter() {
            let _ = writeln!(
                out,
                "lethe_control_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {}",
                stats.count
            );
        }
        out.push_str("# HELP lethe_control_request_seconds_total Time spent answering control-plane requests.\n");
        out.push_str("# TYPE lethe_control_request_seconds_total counter\n");
        for ((route, method, status), stats) in requests.iter() {
            let _ = writeln!(
                out,
                "lethe_control_request_seconds_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {}",
                stats.seconds
            );
        }
        out
    }
}

/// Layer: records the request under its route template (never the raw path, which may hold a
/// subject id) and logs one line per request.
pub async fn record(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = lethe_data::metrics::method_label(request.method()).to_owned();
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    metrics.observe(
        &route,
        &method,
        response.status().as_u16(),
        elapsed.as_secs_f64(),
    );
    tracing::info!(%method, %route, status = response.status().as_u16(), micros = elapsed.as_micros() as u64, "control request");
    response
}

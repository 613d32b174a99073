//! The list of the tenant's erasure requests: how many are open and late, the latencies of the
//! last 30 days, the filters, and a page of requests with their deadlines.

use std::collections::HashMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use lethe_policy::ErasureState;

use super::page::{Badge, Frame, deadline_badge, message, render};
use super::{Session, StartForm, request_uri, urlencoding};
use crate::ControlState;
use crate::state::{DueWindow, ErasureFilter, ErasureRecord, ErasureStats};

/// The requests one page of the list shows.
const LIST_LIMIT: u32 = 100;

/// An option of a filter, and whether it is the one chosen.
struct Choice {
    value: String,
    label: String,
    selected: bool,
}

/// The options `(value, label)`, the one whose value is `chosen` selected.
fn choices<'a>(options: impl Iterator<Item = (String, &'a str)>, chosen: &str) -> Vec<Choice> {
    options
        .map(|(value, label)| Choice {
            selected: value == chosen,
            label: label.to_owned(),
            value,
        })
        .collect()
}

/// One request, as its row shows it.
struct Row {
    href: String,
    id: String,
    subject_ref: String,
    ticket: String,
    state: String,
    requested: String,
    due: String,
    extended: bool,
    badge: Badge,
}

#[derive(Template)]
#[template(path = "console/requests.html")]
struct RequestsPage {
    frame: Frame,
    csrf: String,
    tenant: String,
    stats: ErasureStats,
    online: String,
    completion: String,
    start: StartForm,
    states: Vec<Choice>,
    dues: Vec<Choice>,
    rows: Vec<Row>,
    older: Option<String>,
}

/// The median of `xs`, with its unit, or that there is none yet.
fn median(xs: &mut [i64], unit: &str) -> String {
    xs.sort_unstable();
    xs.get(xs.len() / 2)
        .map_or("none yet".to_owned(), |m| format!("{m} {unit}"))
}

/// The requests whose deadline falls in the window `chosen` names (`overdue`, `week`), open
/// ones only; any request for anything else.
fn due_filter(chosen: &str, now: DateTime<Utc>) -> ErasureFilter {
    let due = match chosen {
        "overdue" => Some(DueWindow {
            from: None,
            to: Some(now),
        }),
        "week" => Some(DueWindow {
            from: Some(now),
            to: Some(now + chrono::TimeDelta::days(7)),
        }),
        _ => None,
    };
    ErasureFilter {
        state: None,
        open: due.is_some(),
        due,
    }
}

/// The choices of the list's two filters, the chosen ones selected.
fn filter_choices(state: Option<ErasureState>, due: &str) -> (Vec<Choice>, Vec<Choice>) {
    let names: Vec<String> = ErasureState::ALL.iter().map(|s| s.to_string()).collect();
    let states = choices(
        std::iter::once((String::new(), "every state"))
            .chain(names.iter().map(|s| (s.clone(), s.as_str()))),
        &state.map(|s| s.to_string()).unwrap_or_default(),
    );
    let dues = choices(
        [
            ("", "any deadline"),
            ("overdue", "overdue"),
            ("week", "due within 7 days"),
        ]
        .into_iter()
        .map(|(value, label)| (value.to_owned(), label)),
        due,
    );
    (states, dues)
}

impl Row {
    fn of(session: &Session, r: &ErasureRecord, now: DateTime<Utc>) -> Self {
        Row {
            href: request_uri(&r.id),
            id: r.id.clone(),
            subject_ref: session
                .caller
                .subject_ref(&r.tenant, &r.subject)
                .chars()
                .take(12)
                .collect(),
            ticket: r.ticket.clone(),
            state: r.state.to_string(),
            requested: r.requested_at.format("%Y-%m-%d").to_string(),
            due: r.deadline.format("%Y-%m-%d").to_string(),
            extended: r.extension.is_some(),
            badge: deadline_badge(r.deadline, now, r.state.is_final()),
        }
    }
}

/// Every erasure request of the caller's tenant, with its deadline, newest first.
pub(super) async fn requests(
    State(state): State<ControlState>,
    Query(query): Query<HashMap<String, String>>,
    session: Session,
) -> Response {
    let tenant = session.caller.claims.tenant.clone();
    let now = crate::now();
    let state_filter = query
        .get("state")
        .and_then(|s| ErasureState::ALL.into_iter().find(|e| e.to_string() == *s));
    let chosen_due = query.get("due").cloned().unwrap_or_default();
    let filter = ErasureFilter {
        state: state_filter,
        ..due_filter(&chosen_due, now)
    };
    let page_number: u32 = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
    let listed = state
        .store
        .erasures(
            &tenant,
            &filter,
            page_number.saturating_mul(LIST_LIMIT),
            LIST_LIMIT + 1,
        )
        .await;
    let stats = state
        .store
        .erasure_stats(&tenant, now, now - chrono::TimeDelta::days(30))
        .await;
    let (mut records, mut stats) = match (listed, stats) {
        (Ok(records), Ok(stats)) => (records, stats),
        _ => {
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                session.frame("Unavailable"),
                "The state store cannot be read.",
                true,
            );
        }
    };
    let older = (records.len() > LIST_LIMIT as usize).then(|| {
        let mut next: Vec<String> = query
            .iter()
            .filter(|(k, _)| *k != "page")
            .map(|(k, v)| format!("{}={}", urlencoding(k), urlencoding(v)))
            .collect();
        next.push(format!("page={}", page_number + 1));
        format!("/console/requests?{}", next.join("&"))
    });
    records.truncate(LIST_LIMIT as usize);
    let rows = records.iter().map(|r| Row::of(&session, r, now)).collect();
    let (states, dues) = filter_choices(state_filter, &chosen_due);
    let page = RequestsPage {
        frame: session.frame("Erasure requests"),
        csrf: session.csrf.clone(),
        online: median(&mut stats.online_ms, "ms"),
        completion: median(&mut stats.completion_s, "s"),
        stats,
        start: StartForm::of(&session, None),
        states,
        dues,
        rows,
        older,
        tenant,
    };
    render(StatusCode::OK, &page)
}

//! What every console page shares: the frame (title and the signed-in navigation), rendering a
//! page into a response, the plain message page, and the parts several pages show (where a
//! request stands, its deadline's badge). The HTML itself is in `control/templates/console/`,
//! one file per page, and askama escapes every value placed in it. No script, no external
//! asset: every page works offline and without JavaScript.

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use lethe_policy::ErasureState;

/// The page's title, and the signed-in navigation (with the sign-out form), if any.
pub struct Frame {
    pub title: String,
    pub nav: Option<Nav>,
}

/// Who is signed in, and the CSRF token the sign-out form carries.
pub struct Nav {
    pub actor: String,
    pub csrf: String,
}

impl Frame {
    /// A page for someone not signed in (or whose session could not be read).
    pub fn bare(title: &str) -> Frame {
        Frame {
            title: title.to_owned(),
            nav: None,
        }
    }
}

/// A page as the answer, never cached.
pub fn render(status: StatusCode, page: &impl Template) -> Response {
    match page.render() {
        Ok(body) => (
            status,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response(),
        // A value a template could not format: nothing of the page is sent.
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CACHE_CONTROL, "no-store")],
            "the page could not be rendered",
        )
            .into_response(),
    }
}

/// A page that only says something: a refusal (an `alert`, with its details) or a notice.
#[derive(Template)]
#[template(path = "console/message.html")]
pub struct Message {
    pub frame: Frame,
    pub text: String,
    pub details: Vec<String>,
    pub alert: bool,
}

/// A message page: `alert` for what went wrong, plain for a notice.
pub fn message(status: StatusCode, frame: Frame, text: &str, alert: bool) -> Response {
    render(
        status,
        &Message {
            frame,
            text: text.to_owned(),
            details: Vec::new(),
            alert,
        },
    )
}

/// One step on a request's way; `class` is `done`, `now`, `now detour` or empty.
pub struct Step {
    pub label: String,
    pub class: &'static str,
}

impl Step {
    pub fn current(&self) -> bool {
        self.class.starts_with("now")
    }
}

/// Where a request stands on the way from receipt to completion: the steps behind it, the one
/// it is at, those ahead; a detour (a hold, a failure, a rejection) is shown where it leaves it.
/// A request `propagating` its flip to governed databases (not `flipped` yet) is still at
/// `suppressed`: that step is not behind it before the flip holds everywhere.
pub fn steps(state: ErasureState, flipped: bool) -> Vec<Step> {
    use ErasureState as S;
    const WAY: [ErasureState; 6] = [
        S::Requested,
        S::Authorized,
        S::Suppressed,
        S::Propagating,
        S::Verifying,
        S::Completed,
    ];
    let at = match state {
        S::Rejected => 1,
        S::Held => 2,
        S::Retrying | S::Exception | S::ManualReview => 3,
        S::Propagating if !flipped => 2,
        s => WAY.iter().position(|w| *w == s).unwrap_or(0),
    };
    let mut shown: Vec<(ErasureState, &'static str)> = WAY
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let class = match i.cmp(&at) {
                std::cmp::Ordering::Less => "done",
                std::cmp::Ordering::Equal => "now",
                std::cmp::Ordering::Greater => "",
            };
            (*step, class)
        })
        .collect();
    let detour = (state, "now detour");
    match state {
        S::Rejected => {
            shown.truncate(at);
            shown.push(detour);
        }
        S::Held => {
            shown[at].1 = "";
            shown.insert(at, detour);
        }
        S::Retrying | S::Exception | S::ManualReview => shown[at] = detour,
        _ => {}
    }
    shown
        .into_iter()
        .map(|(step, class)| Step {
            label: step.to_string(),
            class,
        })
        .collect()
}

/// The statutory deadline's badge: days left, due today, or days overdue (`class` colours it).
pub struct Badge {
    pub class: &'static str,
    pub text: String,
}

pub fn deadline_badge(deadline: DateTime<Utc>, now: DateTime<Utc>, closed: bool) -> Badge {
    let badge = |class, text: String| Badge { class, text };
    if closed {
        return badge("ok", "closed".to_owned());
    }
    match (deadline - now).num_days() {
        d if d < 0 || deadline < now => badge(
            "late",
            format!("{} overdue", days_text((now - deadline).num_days().max(1))),
        ),
        0 => badge("due", "due today".to_owned()),
        d if d <= 7 => badge("due", format!("{} left", days_text(d))),
        d => badge("ok", format!("{} left", days_text(d))),
    }
}

fn days_text(n: i64) -> String {
    if n == 1 {
        "1 day".to_owned()
    } else {
        format!("{n} days")
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn every_value_placed_in_a_page_is_escaped() {
        let hostile = "<script>alert('x')</script>\"&";
        let page = Message {
            frame: Frame {
                title: hostile.to_owned(),
                nav: Some(Nav {
                    actor: hostile.to_owned(),
                    csrf: hostile.to_owned(),
                }),
            },
            text: hostile.to_owned(),
            details: vec![hostile.to_owned()],
            alert: true,
        }
        .render()
        .unwrap();
        assert!(
            !page.contains("<script>") && !page.contains("'x'"),
            "{page}"
        );
        assert_eq!(
            page.matches("&#60;script&#62;alert(&#39;x&#39;)&#60;/script&#62;&#34;&#38;")
                .count(),
            6,
            "title twice, actor, CSRF token, text and detail: {page}"
        );
    }

    #[test]
    fn the_deadline_badge_counts_days_left_and_overdue() {
        let now = Utc::now();
        let cases = [
            (
                now + TimeDelta::days(20) + TimeDelta::hours(1),
                "20 days left",
            ),
            (
                now + TimeDelta::days(3) + TimeDelta::hours(1),
                "3 days left",
            ),
            (now + TimeDelta::hours(5), "due today"),
            (now - TimeDelta::hours(5), "1 day overdue"),
            (
                now - TimeDelta::days(4) - TimeDelta::hours(1),
                "4 days overdue",
            ),
        ];
        for (deadline, want) in cases {
            assert_eq!(deadline_badge(deadline, now, false).text, want);
        }
        assert_eq!(
            deadline_badge(now - TimeDelta::days(9), now, true).text,
            "closed"
        );
    }

    #[test]
    fn the_steps_show_where_a_request_stands_and_its_detours() {
        let shown = |state, flipped| {
            steps(state, flipped)
                .iter()
                .map(|s| match s.class {
                    "done" => format!("+{}", s.label),
                    "now" | "now detour" => format!("[{}]", s.label),
                    _ => s.label.clone(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let cases = [
            (
                ErasureState::Requested,
                "[requested] authorized suppressed propagating verifying completed",
            ),
            (
                ErasureState::Propagating,
                "+requested +authorized +suppressed [propagating] verifying completed",
            ),
            (
                ErasureState::Held,
                "+requested +authorized [held] suppressed propagating verifying completed",
            ),
            (
                ErasureState::Exception,
                "+requested +authorized +suppressed [exception] verifying completed",
            ),
            (ErasureState::Rejected, "+requested [rejected]"),
            (
                ErasureState::Completed,
                "+requested +authorized +suppressed +propagating +verifying [completed]",
            ),
        ];
        for (state, want) in cases {
            let flipped = state.is_suppressed();
            assert_eq!(shown(state, flipped), want, "{state}");
        }
        assert_eq!(
            shown(ErasureState::Propagating, false),
            "+requested +authorized [suppressed] propagating verifying completed",
            "a flip still on its way to a governed database"
        );
        assert_eq!(
            steps(ErasureState::Verifying, true)
                .iter()
                .filter(|s| s.current())
                .count(),
            1
        );
    }
}

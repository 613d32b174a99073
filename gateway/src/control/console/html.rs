//! The console's HTML: one page layout, escaping, and the small parts pages share. No script,
//! no external asset: every page works offline and without JavaScript.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use lethe_policy::ErasureState;

/// Text made safe to place in HTML, in an element or a quoted attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body{font:16px/1.5 system-ui,sans-serif;margin:0;color:#1a1a1a;background:#fff}
header{background:#1f3a5f;color:#fff;padding:.6rem 1.5rem;display:flex;gap:1.5rem;align-items:center}
header a{color:#fff}header form{margin-left:auto}header button{border-color:#fff}
main{padding:1.5rem;max-width:72rem}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.4rem .6rem;border-bottom:1px solid #ccc}
.badge{padding:.1rem .5rem;border-radius:.8rem;font-size:.85rem;white-space:nowrap}
.ok{background:#e3f1e5;color:#13521d}.due{background:#fff1d6;color:#6b4500}.late{background:#fde2e2;color:#8a1111}
button{font:inherit;padding:.35rem .9rem;border:1px solid #1f3a5f;background:#1f3a5f;color:#fff;border-radius:.25rem;cursor:pointer}
button:focus,a:focus,input:focus,select:focus,textarea:focus,summary:focus{outline:3px solid #f0a500;outline-offset:2px}
select{font:inherit;padding:.3rem}summary{cursor:pointer;margin:.6rem 0}time{white-space:nowrap}.id{overflow-wrap:anywhere}
label{display:block;margin:.6rem 0 .2rem}input{font:inherit;padding:.35rem;width:100%;max-width:40rem}
.steps{display:flex;flex-wrap:wrap;gap:.3rem;list-style:none;padding:0}.steps li{padding:.2rem .6rem;border:1px solid #ccc;border-radius:.8rem;color:#555}
.steps .done{color:#13521d;border-color:#13521d}.steps .now{color:#fff;background:#1f3a5f;border-color:#1f3a5f;font-weight:600}.steps .detour{background:#8a1111;border-color:#8a1111}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f4f4f4;padding:.6rem}
.error{color:#8a1111}dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}dt{font-weight:600}
";

/// A whole page. `nav` carries the signed-in navigation (with the sign-out form), if any.
pub fn page(title: &str, nav: Option<&str>, body: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{} · Lethe</title><style>{STYLE}</style></head><body><header><strong>Lethe compliance console</strong>{}</header><main><h1>{}</h1>{body}</main></body></html>",
        escape(title),
        nav.unwrap_or(""),
        escape(title),
    );
    out
}

/// The navigation of a signed-in person, with the sign-out form (it carries the CSRF token).
pub fn nav(actor: &str, csrf: &str) -> String {
    format!(
        "<nav aria-label=\"main\"><a href=\"/console/requests\">Requests</a> <a href=\"/console/subjects\">Subjects</a> <a href=\"/console/policy\">Policy</a> <a href=\"/console/audit\">Audit</a></nav><form method=\"post\" action=\"/console/sign-out\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><span>{}</span> <button type=\"submit\">Sign out</button></form>",
        escape(csrf),
        escape(actor)
    )
}

/// Where a request stands on the way from receipt to completion: the steps behind it, the one
/// it is at, those ahead; a detour (a hold, a failure, a rejection) is shown where it leaves it.
/// A request `propagating` its flip to governed databases (not `flipped` yet) is still at
/// `suppressed`: that step is not behind it before the flip holds everywhere.
pub fn steps(state: ErasureState, flipped: bool) -> String {
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
    let mut shown: Vec<(ErasureState, &str)> = WAY
        .iter()
        .enumerate()
        .map(|(i, step)| {
            (
                *step,
                if i < at {
                    "done"
                } else if i == at {
                    "now"
                } else {
                    ""
                },
            )
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
    let mut out = String::from("<ol class=\"steps\" aria-label=\"Where the request stands\">");
    for (step, class) in shown {
        let current = if class.starts_with("now") {
            " aria-current=\"step\""
        } else {
            ""
        };
        let _ = write!(out, "<li class=\"{class}\"{current}>{step}</li>");
    }
    out.push_str("</ol>");
    out
}

/// The statutory deadline's badge: days left, due today, or days overdue.
pub fn deadline_badge(deadline: DateTime<Utc>, now: DateTime<Utc>, closed: bool) -> String {
    if closed {
        return "<span class=\"badge ok\">closed</span>".to_owned();
    }
    let days = (deadline - now).num_days();
    match days {
        d if d < 0 || deadline < now => format!(
            "<span class=\"badge late\">{} overdue</span>",
            days_text((now - deadline).num_days().max(1))
        ),
        0 => "<span class=\"badge due\">due today</span>".to_owned(),
        d if d <= 7 => format!("<span class=\"badge due\">{} left</span>", days_text(d)),
        d => format!("<span class=\"badge ok\">{} left</span>", days_text(d)),
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
    fn text_is_escaped_everywhere_it_goes() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        let page = page("<script>", None, "");
        assert!(!page.contains("<script>") && page.contains("&lt;script&gt;"));
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
            assert!(
                deadline_badge(deadline, now, false).contains(want),
                "{want}"
            );
        }
        assert!(deadline_badge(now - TimeDelta::days(9), now, true).contains("closed"));
    }

    #[test]
    fn the_steps_show_where_a_request_stands_and_its_detours() {
        let shown = |state, flipped| {
            let html = steps(state, flipped);
            html.split("<li ")
                .skip(1)
                .map(|li| {
                    let class = li.split('"').nth(1).unwrap_or("");
                    let label = li.split('>').nth(1).unwrap_or("").trim_end_matches("</li");
                    match class {
                        "done" => format!("+{label}"),
                        "now" | "now detour" => format!("[{label}]"),
                        _ => label.to_owned(),
                    }
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
                .matches("aria-current=\"step\"")
                .count(),
            1
        );
    }
}

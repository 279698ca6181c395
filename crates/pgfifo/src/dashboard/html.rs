//! The page frame, the embedded assets and the small pieces pages share.

use std::time::{Duration, SystemTime};

use axum::http::header;
use axum::response::IntoResponse;
use maud::{html, Markup, DOCTYPE};

use crate::admin::{self, GroupState, JobStatus};

const STYLESHEET: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// `GET /assets/dashboard.css`.
pub(crate) async fn stylesheet() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        STYLESHEET,
    )
}

/// `GET /assets/dashboard.js`.
pub(crate) async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        SCRIPT,
    )
}

/// A whole page: `base` is the path the dashboard is mounted at (`""` at
/// the root).
pub(crate) fn layout(base: &str, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · pgfifo" }
                link rel="stylesheet" href={ (base) "/assets/dashboard.css" };
            }
            body {
                header {
                    a.brand href={ (base) "/" } { "pgfifo" }
                    nav { a href={ (base) "/" } { "Overview" } " " a href={ (base) "/batches" } { "Batches" } }
                    label { input #auto-refresh type="checkbox"; " auto-refresh" }
                }
                main { (body) }
                script src={ (base) "/assets/dashboard.js" } {}
            }
        }
    }
}

/// `s` as one path segment or query value: everything but unreserved
/// characters percent-encoded.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The link to a queue's groups.
pub(crate) fn queue_href(base: &str, queue: &str) -> String {
    format!("{base}/queues/{}", enc(queue))
}

/// The link to a group's page.
pub(crate) fn group_href(base: &str, queue: &str, group: &str) -> String {
    format!("{base}/queues/{}/groups/{}", enc(queue), enc(group))
}

/// The link to a job's page.
pub(crate) fn job_href(base: &str, id: i64) -> String {
    format!("{base}/jobs/{id}")
}

/// A duration for people: "3 s", "4 min", "2 h 5 min".
pub(crate) fn ago(d: Duration) -> String {
    admin::human(d)
}

/// `n` with thousands separated: 100,000.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

/// "1 job", "3 jobs".
pub(crate) fn jobs(n: i64) -> String {
    if n == 1 {
        "1 job".to_owned()
    } else {
        format!("{} jobs", thousands(n))
    }
}

/// An instant, as RFC 3339 in UTC.
pub(crate) fn at(t: SystemTime) -> String {
    admin::rfc3339(t)
}

/// How long until `t` (zero if past).
pub(crate) fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now()).unwrap_or_default()
}

/// A group state as a coloured badge.
pub(crate) fn group_badge(state: GroupState) -> Markup {
    let name = match state {
        GroupState::Idle => "idle",
        GroupState::Ready => "ready",
        GroupState::Running => "running",
        GroupState::Scheduled => "scheduled",
        GroupState::Waiting => "waiting",
        GroupState::Retrying => "retrying",
        GroupState::Held => "held",
        GroupState::Paused => "paused",
        GroupState::Snoozed => "snoozed",
        GroupState::RateLimited => "rate-limited",
    };
    html! { span class={ "badge " (name) } { (name) } }
}

/// A job status as a coloured badge.
pub(crate) fn job_badge(status: JobStatus) -> Markup {
    let name = match status {
        JobStatus::Queued => "queued",
        JobStatus::Scheduled => "scheduled",
        JobStatus::Waiting => "waiting",
        JobStatus::Running => "running",
        JobStatus::Retrying => "retrying",
        JobStatus::Succeeded => "succeeded",
        JobStatus::Failed => "failed",
        JobStatus::Cancelled => "cancelled",
    };
    html! { span class={ "badge " (name) } { (name) } }
}

/// An action button: a POST form to `/actions/{action}` with the CSRF
/// token and `fields`, confirmed in the browser with `question`. Nothing
/// when the dashboard is read-only.
pub(crate) struct ActionForm<'a> {
    pub base: &'a str,
    pub token: &'a str,
    pub read_only: bool,
}

impl ActionForm<'_> {
    pub(crate) fn button(
        &self,
        action: &str,
        fields: &[(&str, String)],
        label: &str,
        question: &str,
        danger: bool,
    ) -> Markup {
        if self.read_only {
            return html! {};
        }
        html! {
            form method="post" action={ (self.base) "/actions/" (action) } data-confirm=(question) {
                input type="hidden" name="csrf" value=(self.token);
                @for (name, value) in fields {
                    input type="hidden" name=(name) value=(value);
                }
                button type="submit" class=[danger.then_some("danger")] { (label) }
            }
        }
    }
}

/// JSON pretty-printed for a `<pre>` (escaped by maud when written).
pub(crate) fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_are_written_for_people_and_urls() {
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
        assert_eq!(jobs(1), "1 job");
        assert_eq!(jobs(2_000), "2,000 jobs");
        assert_eq!(enc("a/b c?<é>"), "a%2Fb%20c%3F%3C%C3%A9%3E");
    }
}

//! `POST /actions/{action}`: what the buttons do. Each action checks the
//! CSRF token first, refuses in read-only mode, calls one admin function,
//! and sends the browser back to the page of what it changed (303). An
//! action the database refuses (the job ran meanwhile, the head is running)
//! changes nothing and answers with the reason.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::fail::Fail;
use super::html::{group_href, job_href, queue_href};
use super::pages::{conn, Ctx};
use super::security::{check_action, CsrfToken};
use super::Shared;
use crate::admin::{self, RetryResult};

/// Why an action leaves its mark.
const REASON: &str = "from the pgfifo dashboard";

/// An action's form fields, in order (`id` may repeat).
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(body: &str) -> Result<Fields, Fail> {
        let mut out = Vec::new();
        for pair in body.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.push((decode(k)?, decode(v)?));
        }
        Ok(Fields(out))
    }

    fn one(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, Fail> {
        self.one(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Fail::bad_request(format!("the form has no {name}")))
    }

    fn ids(&self) -> Result<Vec<i64>, Fail> {
        let ids: Vec<i64> = self
            .0
            .iter()
            .filter(|(k, _)| k == "id")
            .map(|(_, v)| {
                v.parse()
                    .map_err(|_| Fail::bad_request(format!("{v:?} is not a job id")))
            })
            .collect::<Result<_, _>>()?;
        if ids.is_empty() {
            return Err(Fail::bad_request("no job chosen"));
        }
        Ok(ids)
    }
}

/// `application/x-www-form-urlencoded` decoding of one key or value.
fn decode(s: &str) -> Result<String, Fail> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| Fail::bad_request("malformed form encoding"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| Fail::bad_request("the form is not UTF-8"))
}

fn see_other(location: String) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

pub(crate) async fn act(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path(action): Path<String>,
    Extension(token): Extension<CsrfToken>,
    headers: HeaderMap,
    body: String,
) -> Result<Response, Fail> {
    if shared.read_only {
        return Err(Fail::forbidden("this dashboard is read-only"));
    }
    let fields = Fields::parse(&body)?;
    check_action(&headers, &token, fields.one("csrf").unwrap_or(""))?;
    let base = &ctx.base;
    let mut conn = conn(&shared).await?;
    let conn = &mut *conn;
    match action.as_str() {
        "retry" => {
            let ids = fields.ids()?;
            let report = admin::retry_jobs(conn, &ids).await?;
            let (retried, refused): (Vec<_>, Vec<_>) = report
                .iter()
                .partition(|r| r.result == RetryResult::Retried);
            if !refused.is_empty() {
                // Some lost a race: say which, and what was done.
                let refused: Vec<String> = refused
                    .iter()
                    .map(|r| format!("job {}: {}", r.id, retry_refusal(r.result)))
                    .collect();
                let done = if retried.is_empty() {
                    "nothing was retried".to_owned()
                } else {
                    let ids: Vec<String> = retried.iter().map(|r| r.id.to_string()).collect();
                    format!("retried: {}", ids.join(", "))
                };
                return Err(Fail {
                    status: StatusCode::CONFLICT,
                    message: format!("{done}; not retried: {}", refused.join("; ")),
                });
            }
            Ok(see_other(
                match (fields.one("queue"), fields.one("group")) {
                    (Some(q), Some(g)) => group_href(base, q, g),
                    (Some(q), None) => format!("{}/failed", queue_href(base, q)),
                    _ => job_href(base, ids[0]),
                },
            ))
        }
        "retry-failed" => {
            let queue = fields.required("queue")?;
            admin::retry_failed(conn, queue, None).await?;
            Ok(see_other(format!("{}/failed", queue_href(base, queue))))
        }
        "cancel" => {
            let id = fields.ids()?[0];
            admin::cancel_job(conn, id, Some(REASON)).await?;
            Ok(see_other(job_href(base, id)))
        }
        "skip-head" => {
            let (queue, group) = (fields.required("queue")?, fields.required("group")?);
            if admin::skip_head(conn, queue, group, Some(REASON))
                .await?
                .is_none()
            {
                return Err(Fail {
                    status: StatusCode::CONFLICT,
                    message: format!("group {group} has no head to skip"),
                });
            }
            Ok(see_other(group_href(base, queue, group)))
        }
        "pause-group" | "resume-group" => {
            let (queue, group) = (fields.required("queue")?, fields.required("group")?);
            if action == "pause-group" {
                admin::pause_group(conn, queue, group).await?;
            } else {
                admin::resume_group(conn, queue, group).await?;
            }
            Ok(see_other(group_href(base, queue, group)))
        }
        "pause-queue" | "resume-queue" => {
            let queue = fields.required("queue")?;
            if action == "pause-queue" {
                admin::pause_queue(conn, queue).await?;
            } else {
                admin::resume_queue(conn, queue).await?;
            }
            Ok(see_other(format!("{base}/")))
        }
        other => Err(Fail::not_found(format!("no action {other:?}"))),
    }
}

fn retry_refusal(result: RetryResult) -> &'static str {
    match result {
        RetryResult::Retried => "retried",
        RetryResult::NotFailed => "it is not failed (it ran, or was retried already)",
        RetryResult::UniqueKeyTaken => "another queued job holds its unique key",
        RetryResult::Missing => "no such job",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_repeated_ids_and_escapes() {
        let f = Fields::parse("csrf=ab&id=1&id=22&group=a%2Fb+c&queue=%E2%9C%93").unwrap();
        assert_eq!(f.ids().unwrap(), vec![1, 22]);
        assert_eq!(f.one("group"), Some("a/b c"));
        assert_eq!(f.one("queue"), Some("✓"));
        assert!(Fields::parse("id=%zz").is_err());
        assert!(Fields::parse("id=x").unwrap().ids().is_err());
    }
}

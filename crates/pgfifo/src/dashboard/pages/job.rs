//! `GET /jobs/{id}`: one job: its payload, attempts with their errors and
//! times, its result, its batch, and the actions that fit its state.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, State};
use maud::{html, Markup};

use super::batches::batch_href;
use super::{conn, Ctx};
use crate::admin::{self, JobStatus};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{ago, at, group_href, job_badge, job_href, pretty, queue_href};
use crate::dashboard::Shared;

fn took(from: SystemTime, to: Option<SystemTime>) -> String {
    match to.and_then(|t| t.duration_since(from).ok()) {
        Some(d) if d.as_secs() == 0 => format!("{} ms", d.as_millis()),
        Some(d) => ago(d),
        None => "–".to_owned(),
    }
}

pub(crate) async fn page(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path(id): Path<i64>,
) -> Result<Markup, Fail> {
    let mut conn = conn(&shared).await?;
    let Some(job) = admin::job(&mut conn, id).await? else {
        return Err(Fail::not_found(format!("no job with id {id}")));
    };
    let batch = crate::batch::of_job(&mut conn, id).await?;
    drop(conn);
    let s = &job.summary;
    let form = ctx.actions();
    let body = html! {
        p {
            a href=(queue_href(&ctx.base, &s.queue)) { "← queue " (s.queue) }
            @if let Some(g) = &s.group { " · " a href=(group_href(&ctx.base, &s.queue, g)) { "group " (g) } }
        }
        h1 { "Job " (s.id) " " (job_badge(s.status)) }
        div.actions {
            @if s.status == JobStatus::Failed {
                (form.button("retry", &[("id", s.id.to_string())], "Retry",
                    &format!("Retry job {}? It runs again, first in its group.", s.id), false))
            }
            @if matches!(s.status, JobStatus::Queued | JobStatus::Scheduled | JobStatus::Waiting | JobStatus::Retrying) {
                (form.button("cancel", &[("id", s.id.to_string())], "Cancel",
                    &format!("Cancel job {}? It will not run.", s.id), true))
            }
        }
        dl.facts {
            dt { "kind" } dd { (s.kind) }
            dt { "queue" } dd { (s.queue) }
            dt { "group" } dd { (s.group.as_deref().unwrap_or("(none: runs on its own)")) }
            dt { "attempts" } dd { (s.attempts) " of " (s.max_attempts) }
            dt { "priority" } dd { (job.priority) }
            @if let Some(k) = &job.unique_key { dt { "unique key" } dd { (k) } }
            dt { "enqueued" } dd { (at(s.created_at)) }
            @if let Some(w) = &job.dependency_wait {
                dt { "waiting" } dd #dependency-wait {
                    (w.to_string())
                    @for id in &w.jobs { " · " a href=(job_href(&ctx.base, *id)) { "job " (id) } }
                    @for id in &w.batches { " · " a href=(batch_href(&ctx.base, *id)) { "batch " (id) } }
                }
            } @else {
                dt { "runs after" } dd { (at(s.run_after)) }
            }
            dt { "finished" } dd { @if let Some(t) = s.finished_at { (at(t)) " (" (took(s.created_at, Some(t))) " after enqueue)" } @else { "–" } }
            dt { "group head" } dd { @if job.is_head { "yes: the next job of its group" } @else { "no" } }
            @if let Some(b) = batch { dt { "batch" } dd { a href=(batch_href(&ctx.base, b)) { "batch " (b) } } }
        }
        h2 { "Payload" }
        pre #payload { (pretty(&job.payload)) }
        @if let Some(result) = &job.result {
            h2 { "Result" }
            pre #result { (pretty(result)) }
        }
        h2 { "Attempts" }
        @if job.attempt_log.is_empty() { p.muted { "Not started yet." } } @else {
            table #attempts {
                thead { tr { th.num { "#" } th { "runner" } th { "started" } th { "took" } th { "error" } } }
                tbody { @for a in &job.attempt_log { tr {
                    td.num { (a.attempt) }
                    td { (a.runner) }
                    td { (at(a.started_at)) }
                    td { (took(a.started_at, a.finished_at)) }
                    td.error { @if let Some(e) = &a.error { (e) } }
                } } }
            }
        }
        @if let Some(e) = &s.last_error {
            h2 { "Last error" }
            pre.error { (e) }
        }
    };
    Ok(ctx.page(&format!("Job {id}"), body))
}

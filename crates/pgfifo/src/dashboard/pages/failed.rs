//! `GET /queues/{queue}/failed`: a queue's failed jobs, newest first, with
//! retry for the chosen ones and for all (which keeps each group's order).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::{conn, first_line, Ctx};
use crate::admin::{self, JobQuery, JobStateFilter};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{at, group_href, job_href, queue_href};
use crate::dashboard::Shared;

const PAGE: i64 = 50;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// The page after this job id.
    after: Option<i64>,
}

pub(crate) async fn page(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path(queue): Path<String>,
    Query(params): Query<Params>,
) -> Result<Markup, Fail> {
    let query = JobQuery {
        queue: Some(queue.clone()),
        group: None,
        state: Some(JobStateFilter::Failed),
        oldest_first: false,
        after: params.after,
        limit: Some(PAGE + 1),
    };
    let mut conn = conn(&shared).await?;
    let mut jobs = admin::jobs(&mut conn, &query).await?;
    drop(conn);
    let more = jobs.len() as i64 > PAGE;
    jobs.truncate(PAGE as usize);
    let href = queue_href(&ctx.base, &queue);
    let form = ctx.actions();
    let body = html! {
        p { a href=(href) { "← queue " (queue) } }
        h1 { "Failed jobs of " (queue) }
        @if jobs.is_empty() { p.muted { "No failed job." } } @else {
            div.actions {
                (form.button("retry-failed", &[("queue", queue.clone())], "Retry all failed jobs of this queue",
                    &format!("Retry every failed job of queue {queue}? Each group gets them back in their order."), false))
            }
            @if !ctx.read_only {
                form #retry-selected method="post" action={ (ctx.base) "/actions/retry" }
                    data-confirm="Retry the selected jobs? Each runs next in its group, in id order." {
                    input type="hidden" name="csrf" value=(ctx.token);
                    input type="hidden" name="queue" value=(queue);
                    button type="submit" { "Retry selected" }
                }
            }
            table #failed {
                thead { tr {
                    @if !ctx.read_only { th { "" } }
                    th { "job" } th { "group" } th { "kind" } th.num { "attempts" } th { "failed at" } th { "error" }
                } }
                tbody { @for j in &jobs { tr {
                    @if !ctx.read_only {
                        td { input type="checkbox" name="id" value=(j.id) form="retry-selected"; }
                    }
                    td { a href=(job_href(&ctx.base, j.id)) { (j.id) } }
                    td { @if let Some(g) = &j.group { a href=(group_href(&ctx.base, &queue, g)) { (g) } } }
                    td { (j.kind) }
                    td.num { (j.attempts) "/" (j.max_attempts) }
                    td { @if let Some(t) = j.finished_at { (at(t)) } }
                    td.error { @if let Some(e) = &j.last_error { (first_line(e)) } }
                } } }
            }
            @if more { @if let Some(last) = jobs.last() {
                p.pager { a href={ (href) "/failed?after=" (last.id) } { "Older failed jobs →" } }
            } }
        }
    };
    Ok(ctx.page(&format!("Failed jobs of {queue}"), body))
}

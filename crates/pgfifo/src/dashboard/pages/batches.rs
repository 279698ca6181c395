//! `GET /batches`: batches, newest first, with their progress; and
//! `GET /batches/{id}`: one batch, its counts, callbacks and the jobs that
//! did not succeed (docs/batches.md). Read-only.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::{conn, Ctx};
use crate::admin;
use crate::batch::{BatchProgress, BatchState};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{at, group_href, job_href, queue_href};
use crate::dashboard::Shared;

/// Batches per page.
const PAGE: u32 = 50;
/// The most jobs a batch's page lists (those that did not succeed first).
const LISTED: usize = 200;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// The page of batches older than this id.
    before: Option<i64>,
    /// Only batches that have not completed.
    unfinished: Option<bool>,
}

/// The link to a batch's page.
pub(crate) fn batch_href(base: &str, id: i64) -> String {
    format!("{base}/batches/{id}")
}

fn state_badge(state: BatchState) -> Markup {
    let class = match state {
        BatchState::Open => "badge scheduled",
        BatchState::Running => "badge running",
        BatchState::Completed => "badge succeeded",
    };
    html! { span class=(class) { (state.as_str()) } }
}

/// "7 of 10 ended: 5 succeeded, 1 failed, 1 cancelled".
fn progress_line(p: &BatchProgress) -> String {
    format!(
        "{} of {} ended: {} succeeded, {} failed, {} cancelled",
        p.total - p.pending.min(p.total),
        p.total,
        p.succeeded,
        p.failed,
        p.cancelled
    )
}

pub(crate) async fn list(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Result<Markup, Fail> {
    let unfinished = params.unfinished.unwrap_or(false);
    let mut conn = conn(&shared).await?;
    let mut batches = admin::batches(&mut conn, params.before, PAGE + 1, unfinished).await?;
    drop(conn);
    let more = batches.len() > PAGE as usize;
    batches.truncate(PAGE as usize);
    let base = &ctx.base;
    let body = html! {
        h1 { "Batches" }
        p {
            @if unfinished {
                "Showing batches that have not completed · " a href={ (base) "/batches" } { "show all" }
            } @else {
                a href={ (base) "/batches?unfinished=true" } { "Only batches that have not completed" }
            }
        }
        @if batches.is_empty() { p.muted { "No batch." } } @else {
            table #batches {
                thead { tr {
                    th { "batch" } th { "state" } th { "description" } th.num { "jobs" }
                    th.num { "succeeded" } th.num { "failed" } th.num { "cancelled" } th.num { "pending" }
                    th { "created" } th { "completed" }
                } }
                tbody { @for b in &batches { tr {
                    td { a href=(batch_href(base, b.id)) { (b.id) } }
                    td { (state_badge(b.state)) }
                    td { (b.description.as_deref().unwrap_or("")) }
                    td.num { (b.total) }
                    td.num { (b.succeeded) }
                    td.num { (b.failed) }
                    td.num { (b.cancelled) }
                    td.num { (b.pending) }
                    td { (at(b.created_at)) }
                    td { @if let Some(t) = b.completed_at { (at(t)) } @else { "–" } }
                } } }
            }
            @if more { @if let Some(last) = batches.last() {
                p.pager { a href={ (base) "/batches?before=" (last.id) @if unfinished { "&unfinished=true" } } { "Older batches →" } }
            } }
        }
    };
    Ok(ctx.page("Batches", body))
}

pub(crate) async fn page(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path(id): Path<i64>,
) -> Result<Markup, Fail> {
    let mut conn = conn(&shared).await?;
    let Some(batch) = admin::batch(&mut conn, id).await? else {
        return Err(Fail::not_found(format!("no batch with id {id}")));
    };
    drop(conn);
    let p = &batch.progress;
    let base = &ctx.base;
    // Jobs that did not succeed first (what an operator looks for), then
    // the rest, up to LISTED.
    let mut listed: Vec<_> = batch
        .jobs
        .iter()
        .filter(|j| j.state.as_deref() != Some("succeeded"))
        .chain(
            batch
                .jobs
                .iter()
                .filter(|j| j.state.as_deref() == Some("succeeded")),
        )
        .take(LISTED)
        .collect();
    listed.sort_by_key(|j| (j.state.as_deref() == Some("succeeded"), j.id));
    let body = html! {
        p { a href={ (base) "/batches" } { "← batches" } }
        h1 { "Batch " (p.id) " " (state_badge(p.state)) }
        p #progress { (progress_line(p)) }
        dl.facts {
            @if let Some(d) = &p.description { dt { "description" } dd { (d) } }
            dt { "created" } dd { (at(p.created_at)) }
            dt { "closed" } dd { @if let Some(t) = p.closed_at { (at(t)) } @else { "open: jobs may still be added" } }
            dt { "completed" } dd { @if let Some(t) = p.completed_at { (at(t)) } @else { "–" } }
            dt { "first failure" } dd { @if let Some(t) = p.first_failed_at { (at(t)) } @else { "–" } }
        }
        h2 { "Callbacks" }
        @if batch.callbacks.is_empty() { p.muted { "None." } } @else {
            table #callbacks {
                thead { tr { th { "event" } th { "kind" } th { "queue" } th { "group" } th { "job" } } }
                tbody { @for c in &batch.callbacks { tr {
                    td { (c.event) }
                    td { (c.kind) }
                    td { a href=(queue_href(base, &c.queue)) { (c.queue) } }
                    td { @if let Some(g) = &c.group { a href=(group_href(base, &c.queue, g)) { (g) } } }
                    td { @if let Some(j) = c.job_id { a href=(job_href(base, j)) { (j) } } @else { span.muted { "not fired" } } }
                } } }
            }
        }
        h2 { "Jobs" }
        @if batch.jobs.is_empty() { p.muted { "No job yet." } } @else {
            @if batch.jobs.len() > listed.len() {
                p.muted { (listed.len()) " of " (batch.jobs.len()) " jobs: those that did not succeed first." }
            }
            table #jobs {
                thead { tr { th { "job" } th { "state" } } }
                tbody { @for j in &listed { tr {
                    td { a href=(job_href(base, j.id)) { (j.id) } }
                    td { (j.state.as_deref().unwrap_or("purged")) }
                } } }
            }
        }
    };
    Ok(ctx.page(&format!("Batch {id}"), body))
}

//! `GET /`: the queues, their counts and lag, and the live runners.

use std::sync::Arc;

use axum::extract::State;
use maud::{html, Markup};

use super::{conn, Ctx};
use crate::admin::{self, Count, QueueStatus};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{ago, queue_href};
use crate::dashboard::{chart, Shared};

fn count(c: &Count) -> Markup {
    html! {
        (c.value)
        @if !c.exact { span.muted title="estimate" { "~" } }
    }
}

pub(crate) async fn page(ctx: Ctx, State(shared): State<Arc<Shared>>) -> Result<Markup, Fail> {
    let mut conn = conn(&shared).await?;
    let queues = admin::status(&mut conn, None, 3).await?;
    let runners = admin::runners(&mut conn).await?;
    let finished = admin::throughput(&mut conn).await?;
    drop(conn);
    let minutes = chart::per_minute(&finished, std::time::SystemTime::now());
    let last_hour = |queue: &str| -> (i64, i64) {
        finished
            .iter()
            .filter(|c| c.queue == queue)
            .fold((0, 0), |(s, f), c| (s + c.succeeded, f + c.failed))
    };
    let running: i64 = runners.iter().map(|r| r.running).sum();
    let blocked: i64 = queues.iter().map(|q| q.blocked_groups.total()).sum();
    let failed: i64 = queues.iter().map(|q| q.failed.value).sum();
    let body = html! {
        h1 { "Overview" }
        div.cards {
            div.card { div.k { "queues" } div.v { (queues.len()) } }
            div.card { div.k { "runners alive" } div.v { (runners.len()) } }
            div.card { div.k { "jobs running" } div.v { (running) } }
            div.card { div.k { "blocked groups" } div.v { (blocked) } }
            div.card { div.k { "failed jobs" } div.v { (failed) } }
        }
        h2 { "Jobs finished per minute" }
        (chart::chart(&minutes))
        h2 { "Queues" }
        @if queues.is_empty() {
            p.muted { "No queue yet: enqueue a job, or start a runner." }
        } @else {
            table #queues {
                thead { tr {
                    th { "queue" } th { "state" } th.num { "waiting" } th.num { "running" }
                    th.num { "retrying" } th.num { "failed" } th.num { "succeeded" }
                    th.num { "last hour" } th { "lag (oldest waiting)" } th { "blocked groups" }
                    th { "policy" } th { "" }
                } }
                tbody { @for q in &queues { (queue_row(&ctx, q, last_hour(&q.queue))) } }
            }
        }
        h2 { "Runners" }
        @if runners.is_empty() {
            p.muted { "No runner has sent a heartbeat lately." }
        } @else {
            table #runners {
                thead { tr {
                    th { "runner" } th { "queues" } th.num { "jobs running" }
                    th { "last heartbeat" } th { "up since" } th { "release" }
                } }
                tbody { @for r in &runners { tr {
                    td { (r.name) }
                    td { (r.queues.join(", ")) }
                    td.num { (r.running) }
                    td { (ago(r.heartbeat_age)) " ago" }
                    td { (crate::dashboard::html::at(r.started_at)) }
                    td { (r.release.as_deref().unwrap_or("0.1.0")) }
                } } }
            }
        }
    };
    Ok(ctx.page("Overview", body))
}

fn queue_row(ctx: &Ctx, q: &QueueStatus, (ok, failed): (i64, i64)) -> Markup {
    let href = queue_href(&ctx.base, &q.queue);
    let b = &q.blocked_groups;
    let actions = ctx.actions();
    html! {
        tr {
            td { a href=(href) { (q.queue) } }
            td { @if q.paused { span.badge.paused { "paused" } } @else { span.badge.running { "active" } } }
            td.num { (count(&q.queued)) }
            td.num { (q.running) }
            td.num { (count(&q.retrying)) }
            td.num { a href={ (href) "/failed" } { (count(&q.failed)) } }
            td.num { @if let Some(s) = &q.succeeded { (count(s)) } @else { "–" } }
            td.num title="succeeded / failed in the last hour" { (ok) " / " (failed) }
            td { @if let Some(age) = q.oldest_queued_age { (ago(age)) } @else { "–" } }
            td {
                @if b.total() == 0 { span.muted { "none" } } @else {
                    a href={ (href) "?blocked=1" } {
                        (b.paused) " paused, " (b.held) " held, " (b.retrying) " retrying, " (b.snoozed) " snoozed"
                    }
                }
            }
            td { (q.failure_policy.as_str()) }
            td {
                @if q.paused {
                    (actions.button("resume-queue", &[("queue", q.queue.clone())], "Resume",
                        &format!("Resume queue {}?", q.queue), false))
                } @else {
                    (actions.button("pause-queue", &[("queue", q.queue.clone())], "Pause",
                        &format!("Pause queue {}? No job of it starts until it is resumed.", q.queue), true))
                }
            }
        }
    }
}

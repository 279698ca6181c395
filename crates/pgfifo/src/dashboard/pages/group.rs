//! `GET /queues/{queue}/groups/{group}`: one group: where it stands and
//! why, its head, its limits, the jobs that wait behind it, its recent
//! history, and the actions that move it.

use std::sync::Arc;

use axum::extract::{Path, State};
use maud::{html, Markup};

use super::{conn, first_line, queue_usage, reason, Ctx};
use crate::admin::{
    self, GroupInfo, GroupState, JobQuery, JobStateFilter, JobSummary, QueueUsage, SetLimits,
};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{
    ago, at, group_badge, job_badge, job_href, jobs, queue_href, thousands, until,
};
use crate::dashboard::Shared;

/// Jobs shown waiting, and finished.
const SHOWN: i64 = 10;

pub(crate) async fn page(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path((queue, group)): Path<(String, String)>,
) -> Result<Markup, Fail> {
    let mut conn = conn(&shared).await?;
    let Some(info) = admin::group(&mut conn, &queue, &group).await? else {
        return Err(Fail::not_found(format!(
            "queue {queue} has no group {group}"
        )));
    };
    let listing = |state, oldest_first| JobQuery {
        queue: Some(queue.clone()),
        group: Some(group.clone()),
        state: Some(state),
        oldest_first,
        after: None,
        limit: Some(SHOWN),
    };
    let waiting = admin::jobs(&mut conn, &listing(JobStateFilter::Queued, true)).await?;
    let history = admin::group_history(&mut conn, &queue, &group, SHOWN).await?;
    let own = admin::limits_of(&mut conn, &queue, Some(&group)).await?;
    let defaults = admin::limits_of(&mut conn, &queue, None).await?;
    let usage = admin::queue_usage(&mut conn, &queue).await?;
    drop(conn);
    let body = html! {
        p { a href=(queue_href(&ctx.base, &queue)) { "← queue " (queue) } }
        h1 { "Group " (group) " " (group_badge(info.state)) }
        p.reason #reason { (reason(&info)) }
        (actions(&ctx, &queue, &info))
        dl.facts {
            dt { "backlog" } dd { (jobs(info.backlog)) " waiting" }
            dt { "head" } dd { @if let Some(id) = info.head { a href=(job_href(&ctx.base, id)) { "job " (id) } } @else { "–" } }
            dt { "lag" } dd { @if let Some(age) = info.head_age { (ago(age)) } @else { "–" } }
            @if let Some(t) = info.waiting_until { dt { "waits until" } dd { (at(t)) } }
            @if let Some(t) = info.paused_at { dt { "paused at" } dd { (at(t)) } }
            @if let Some(e) = &info.head_error { dt { "head's last error" } dd.error { (e) } }
        }
        h2 { "Limits" }
        (limits(&ctx, &info, own.as_ref(), defaults.as_ref(), usage.as_ref()))
        h2 { "Next jobs" }
        (job_table(&ctx, &waiting, "No job waiting."))
        h2 { "Recent history" }
        p.muted { "Finished jobs of this group among the newest " (thousands(admin::HISTORY_WINDOW)) " jobs of all queues." }
        (job_table(&ctx, &history, "No finished job among them."))
    };
    Ok(ctx.page(&format!("Group {group}"), body))
}

/// The buttons that fit the group's state.
fn actions(ctx: &Ctx, queue: &str, info: &GroupInfo) -> Markup {
    let form = ctx.actions();
    let fields = [("queue", queue.to_owned()), ("group", info.group.clone())];
    let head = info.head.map(|id| id.to_string()).unwrap_or_default();
    html! {
        div.actions {
            @if info.state == GroupState::Held {
                (form.button("retry", &[("id", head.clone()), ("queue", queue.to_owned()), ("group", info.group.clone())],
                    "Retry head", &format!("Retry job {head}? It runs next in its group."), false))
            }
            @if matches!(info.state, GroupState::Held | GroupState::Retrying) {
                (form.button("skip-head", &fields, "Skip head",
                    &format!("Skip job {head}? It is marked failed (kept, and retryable later) and the group goes on with its next job."), true))
            }
            @if info.state == GroupState::Paused {
                (form.button("resume-group", &fields, "Resume group", &format!("Resume group {}?", info.group), false))
            } @else {
                (form.button("pause-group", &fields, "Pause group",
                    &format!("Pause group {}? Its running job finishes; no other starts until it is resumed.", info.group), true))
            }
        }
    }
}

/// The limits that apply to the group now, each with where it comes from
/// (the group's own setting, the queue's default, or neither), its tokens,
/// its snooze, and its whole queue's limits if it has any.
fn limits(
    ctx: &Ctx,
    info: &GroupInfo,
    own: Option<&SetLimits>,
    defaults: Option<&SetLimits>,
    queue: Option<&QueueUsage>,
) -> Markup {
    // Where a setting comes from: `otherwise` when neither row sets it.
    let from = |set: fn(&SetLimits) -> bool, otherwise: &'static str| {
        if own.is_some_and(set) {
            "set for this group"
        } else if defaults.is_some_and(set) {
            "the queue's default"
        } else {
            otherwise
        }
    };
    let burst = info.burst.or(info.rate.map(|r| r.count()));
    html! {
        dl.facts #limits {
            dt { "concurrency" }
            dd {
                (info.concurrency) " at a time, " (info.running) " running now"
                span.muted { " · " (from(|l| l.concurrency.is_some(), "not set: the default")) }
            }
            dt { "rate" }
            dd {
                @if let Some(rate) = info.rate {
                    (rate)
                    span.muted { " · " (from(|l| l.rate.is_some(), "not set")) }
                } @else {
                    "no rate limit"
                }
            }
            @if let (Some(_), Some(burst)) = (info.rate, burst) {
                dt { "burst" }
                dd {
                    (burst)
                    span.muted { " · " (from(|l| l.burst.is_some(), "not set: the rate's count")) }
                }
            }
            @if let Some(tokens) = info.tokens {
                dt { "tokens now" }
                dd { (format!("{:.1}", tokens.max(0.0))) span.muted { " · a start takes one" } }
            }
            dt { "weight" }
            dd {
                (info.weight)
                span.muted { " · " (from(|l| l.weight.is_some(), "not set: the default")) }
            }
            @if let Some(usage) = queue {
                dt { "whole queue" }
                dd {
                    (queue_usage(usage))
                    span.muted { " · shared by all its groups" }
                }
            }
            @if let Some(t) = info.snoozed_until {
                dt { "snoozed until" }
                dd {
                    (at(t)) " (in " (ago(until(t))) ")"
                    @if let Some(id) = info.head {
                        ", by " a href=(job_href(&ctx.base, id)) { "job " (id) }
                    }
                }
            }
        }
    }
}

/// A table of jobs, or `empty`.
pub(crate) fn job_table(ctx: &Ctx, jobs: &[JobSummary], empty: &str) -> Markup {
    html! {
        @if jobs.is_empty() { p.muted { (empty) } } @else {
            table.jobs {
                thead { tr {
                    th { "job" } th { "kind" } th { "state" } th.num { "attempts" }
                    th { "enqueued" } th { "finished" } th { "last error" }
                } }
                tbody { @for j in jobs { tr {
                    td { a href=(job_href(&ctx.base, j.id)) { (j.id) } }
                    td { (j.kind) }
                    td { (job_badge(j.status)) }
                    td.num { (j.attempts) "/" (j.max_attempts) }
                    td { (at(j.created_at)) }
                    td { @if let Some(t) = j.finished_at { (at(t)) } }
                    td.error { @if let Some(e) = &j.last_error { (first_line(e)) } }
                } } }
            }
        }
    }
}

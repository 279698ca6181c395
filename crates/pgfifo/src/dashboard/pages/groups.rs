//! `GET /queues/{queue}`: a queue's figures, its largest backlogs, and its
//! groups by name or longest waiting first, searchable by prefix, with
//! keyset pagination (`after`, `after_head`) so a page costs the same at
//! 100,000 groups as at ten.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{html, Markup};
use serde::Deserialize;

use super::{conn, queue_usage, reason, Ctx};
use crate::admin::{self, GroupOrder, GroupQuery};
use crate::dashboard::fail::Fail;
use crate::dashboard::html::{ago, enc, group_badge, group_href, job_href, queue_href};
use crate::dashboard::Shared;

/// Groups per page.
pub(crate) const PAGE: i64 = 50;
/// Largest backlogs shown.
const BACKLOGS: usize = 10;

/// The page's parameters; anything else in the query is a 400.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// Groups whose name starts with this.
    #[serde(default)]
    q: String,
    /// Only blocked groups (`1`).
    #[serde(default)]
    blocked: Option<u8>,
    /// `name` (the default) or `lag` (oldest head first).
    #[serde(default)]
    sort: Sort,
    /// The page after this group (by name).
    after: Option<String>,
    /// The page after this head job (by lag).
    after_head: Option<i64>,
    /// The page after the group with this backlog (and `after`'s name).
    after_backlog: Option<i64>,
}

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Sort {
    #[default]
    Name,
    Lag,
    Backlog,
}

impl Sort {
    fn as_str(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::Lag => "lag",
            Sort::Backlog => "backlog",
        }
    }
}

pub(crate) async fn page(
    ctx: Ctx,
    State(shared): State<Arc<Shared>>,
    Path(queue): Path<String>,
    Query(params): Query<Params>,
) -> Result<Markup, Fail> {
    let blocked = match params.blocked {
        None | Some(0) => false,
        Some(1) => true,
        Some(other) => {
            return Err(Fail::bad_request(format!(
                "blocked must be 0 or 1, not {other}"
            )))
        }
    };
    let query = GroupQuery {
        order: match params.sort {
            Sort::Name => GroupOrder::Name,
            Sort::Lag => GroupOrder::OldestHead,
            Sort::Backlog => GroupOrder::Backlog,
        },
        after_head: params.after_head,
        after_backlog: params.after_backlog,
        blocked_only: blocked,
        after: params.after.clone(),
        prefix: (!params.q.is_empty()).then(|| params.q.clone()),
        limit: Some(PAGE + 1),
    };
    let mut conn = conn(&shared).await?;
    let mut groups = admin::groups(&mut conn, &queue, &query).await?;
    let status = admin::queue_status(&mut conn, &queue, BACKLOGS).await?;
    let usage = admin::queue_usage(&mut conn, &queue).await?;
    drop(conn);
    let more = groups.len() as i64 > PAGE;
    groups.truncate(PAGE as usize);
    let href = queue_href(&ctx.base, &queue);
    let here = format!(
        "{href}?q={}&blocked={}&sort={}",
        enc(&params.q),
        u8::from(blocked),
        params.sort.as_str()
    );
    let next = groups.last().filter(|_| more).map(|g| match params.sort {
        Sort::Name => format!("{here}&after={}", enc(&g.group)),
        Sort::Lag => format!("{here}&after_head={}", g.head.unwrap_or_default()),
        Sort::Backlog => format!("{here}&after_backlog={}&after={}", g.backlog, enc(&g.group)),
    });
    let sort_link = |sort: Sort, label: &str| {
        let link = format!(
            "{href}?q={}&blocked={}&sort={}",
            enc(&params.q),
            u8::from(blocked),
            sort.as_str()
        );
        html! {
            @if sort == params.sort { strong { (label) } } @else { a href=(link) { (label) } }
        }
    };
    let body = html! {
        h1 { "Queue " (queue) @if status.paused { " " span.badge.paused { "paused" } } }
        div.cards {
            div.card { div.k { "waiting" } div.v { (status.queued.value) } }
            div.card { div.k { "running" } div.v { (status.running) } }
            div.card { div.k { "retrying" } div.v { (status.retrying.value) } }
            div.card { div.k { "failed" } div.v { a href={ (href) "/failed" } { (status.failed.value) } } }
            div.card { div.k { "lag" } div.v { @if let Some(a) = status.oldest_queued_age { (ago(a)) } @else { "–" } } }
            div.card { div.k { "failure policy" } div.v { (status.failure_policy.as_str()) } }
            @if let Some(usage) = &usage {
                div.card #queue-limits { div.k { "queue limits" } div.v { (queue_usage(usage)) } }
            }
        }
        @if !status.largest_backlogs.is_empty() {
            h2 { "Largest backlogs" }
            p {
                @for (i, b) in status.largest_backlogs.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href=(group_href(&ctx.base, &queue, &b.group)) { (b.group) } " (" (b.backlog) ")"
                }
            }
        }
        h2 { "Groups" }
        form.search method="get" action=(href) {
            input type="text" name="q" value=(params.q) placeholder="group name starts with…";
            label { input type="checkbox" name="blocked" value="1" checked[blocked]; " blocked only" }
            input type="hidden" name="sort" value=(params.sort.as_str());
            button type="submit" { "Search" }
            span.muted {
                "sort: " (sort_link(Sort::Name, "name")) " · " (sort_link(Sort::Lag, "longest waiting"))
                " · " (sort_link(Sort::Backlog, "largest backlog"))
            }
        }
        @if groups.is_empty() {
            p.muted { "No group matches." }
        } @else {
            table #groups {
                thead { tr {
                    th { "group" } th { "state" } th { "why" } th.num { "backlog" }
                    th { "head" } th { "lag" }
                } }
                tbody { @for g in &groups { tr {
                    td { a href=(group_href(&ctx.base, &queue, &g.group)) { (g.group) } }
                    td { (group_badge(g.state)) }
                    td.reason { (reason(g)) }
                    td.num { (g.backlog) }
                    td { @if let Some(id) = g.head { a href=(job_href(&ctx.base, id)) { (id) } } }
                    td { @if let Some(age) = g.head_age { (ago(age)) } }
                } } }
            }
        }
        @if let Some(next) = next {
            p.pager { a href=(next) { "Next " (PAGE) " groups →" } }
        }
    };
    Ok(ctx.page(&format!("Queue {queue}"), body))
}

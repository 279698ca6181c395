//! Listing a queue's groups, with where each stands. Read-only: nothing
//! here takes a lock or changes a row.

use std::time::{Duration, SystemTime};

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::controls::{rate_of, ser_opt_rate};
use super::dependencies::{dependency_waits, DependencyWait, WAIT_AT_US};
use super::queue_usage::{self, QueueWait};
use crate::db;
use crate::db::admin::group_list::{GroupFilter, GroupRow};
use crate::db::pooler::pinned;
use crate::names::{validate_group, validate_queue};
use crate::time::{age_from_micros, from_micros, ser_opt_secs, ser_opt_time};
use crate::{Error, JobId, Rate, Result};

/// Where a group stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// No job to run.
    Idle,
    /// Its head may start now.
    Ready,
    /// Its head is running (an attempt started and has no outcome yet; after
    /// a crash, until the job runs again).
    Running,
    /// Its head was enqueued to run later.
    Scheduled,
    /// Its head waits for its dependencies ([`GroupInfo::dependency_wait`]
    /// says which).
    Waiting,
    /// Blocked: its head failed and waits for its next retry.
    Retrying,
    /// Blocked: its head failed for good and the queue's failure policy is
    /// `hold`. Retry or skip the head to release it.
    Held,
    /// Blocked: paused by an operator.
    Paused,
    /// Blocked: its head snoozed the group ([`JobError::snooze`](crate::JobError::snooze))
    /// until [`GroupInfo::snoozed_until`].
    Snoozed,
    /// Its head may start when the group's next token is due
    /// ([`GroupInfo::waiting_until`]): its rate limit's bucket is empty.
    RateLimited,
}

impl GroupState {
    /// Whether the group has jobs that cannot run now.
    pub fn is_blocked(self) -> bool {
        matches!(
            self,
            GroupState::Retrying | GroupState::Held | GroupState::Paused | GroupState::Snoozed
        )
    }
}

/// One group of a queue (see [`groups`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupInfo {
    /// The group.
    pub group: String,
    /// Where it stands.
    pub state: GroupState,
    /// Its queued jobs (including a running head).
    pub backlog: i64,
    /// Its head: the job that runs next, or is running, or holds it.
    pub head: Option<JobId>,
    /// How long ago the head was enqueued.
    #[serde(serialize_with = "ser_opt_secs", rename = "head_age_secs")]
    pub head_age: Option<Duration>,
    /// Until when the head waits (scheduled or retrying).
    #[serde(serialize_with = "ser_opt_time")]
    pub waiting_until: Option<SystemTime>,
    /// The head's last error (retrying or held).
    pub head_error: Option<String>,
    /// The head's attempts so far (started ones that had an outcome).
    pub head_attempts: Option<i32>,
    /// The head's attempt limit.
    pub head_max_attempts: Option<i32>,
    /// When the group was paused.
    #[serde(serialize_with = "ser_opt_time")]
    pub paused_at: Option<SystemTime>,
    /// Until when its head snoozed it (while it sleeps); the head is the
    /// job that snoozed.
    #[serde(serialize_with = "ser_opt_time")]
    pub snoozed_until: Option<SystemTime>,
    /// Its rate limit: its own, else its queue's default (`None`: none).
    #[serde(serialize_with = "ser_opt_rate")]
    pub rate: Option<Rate>,
    /// Its burst (with a rate limit).
    pub burst: Option<u32>,
    /// Tokens in its bucket now (with a rate limit): a start takes one.
    pub tokens: Option<f64>,
    /// How many of its jobs may run at once (1 unless set).
    pub concurrency: u32,
    /// Its weight among groups with backlog (1 unless set).
    pub weight: u32,
    /// Its jobs running now: an attempt started and has no outcome yet
    /// (after a crash, until the job runs again).
    pub running: i64,
    /// Whether limits of its own are set (`pgfifo group set`), rather than
    /// only its queue's defaults.
    pub own_limits: bool,
    /// Why its head, ready, cannot start now because of its queue's limits
    /// (only in state [`Ready`](GroupState::Ready); `None`: the queue would
    /// let it start, and it waits for a runner's turn). Read at the moment
    /// of the listing: a slot or token can come free the next moment.
    pub queue_wait: Option<QueueWait>,
    /// Why its head waits for its dependencies (only in state
    /// [`Waiting`](GroupState::Waiting)): "waiting for jobs 17 and 18".
    pub dependency_wait: Option<DependencyWait>,
}

/// The order [`groups`] lists groups in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GroupOrder {
    /// By name (the default); page with [`GroupQuery::after`].
    #[default]
    Name,
    /// Oldest head first: the groups that have waited longest (groups
    /// without a head are left out); page with [`GroupQuery::after_head`].
    OldestHead,
    /// Largest backlog first, then by name (groups without waiting jobs
    /// are left out); page with [`GroupQuery::after_backlog`] and
    /// [`GroupQuery::after`] (the last group's backlog and name). Counts the
    /// queue's waiting jobs on each call.
    Backlog,
}

/// Which groups [`groups`] lists.
#[derive(Debug, Clone, Default)]
pub struct GroupQuery {
    /// The order.
    pub order: GroupOrder,
    /// With [`GroupOrder::OldestHead`]: groups whose head is newer than
    /// this job (for paging).
    pub after_head: Option<JobId>,
    /// With [`GroupOrder::Backlog`]: groups after the one with this backlog
    /// and the name in [`after`](Self::after) (for paging).
    pub after_backlog: Option<i64>,
    /// Only groups that are blocked (paused, held, retrying, snoozed).
    pub blocked_only: bool,
    /// Groups after this one in name order (for paging).
    pub after: Option<String>,
    /// Only groups whose name starts with this.
    pub prefix: Option<String>,
    /// At most this many (default 50).
    pub limit: Option<i64>,
}

/// Where a group stands, from its row.
fn state_of(row: &GroupRow) -> GroupState {
    if row.paused_at_us.is_some() {
        return GroupState::Paused;
    }
    match (row.head_id, row.active) {
        (None, _) => GroupState::Idle,
        (Some(_), false) => GroupState::Held,
        (Some(_), true) if row.head_started => GroupState::Running,
        (Some(_), true) if row.waiting && row.snoozed_until_us.is_some() => GroupState::Snoozed,
        (Some(_), true) if row.waiting && row.ready_at_us.is_some_and(|at| at >= WAIT_AT_US) => {
            GroupState::Waiting
        }
        (Some(_), true) if row.waiting && row.head_attempts.unwrap_or(0) > 0 => {
            GroupState::Retrying
        }
        // (Tokens a hair under one: the next is due within a microsecond.)
        (Some(_), true) if row.waiting && row.tokens.is_some_and(|t| t < 1.0 - 1e-9) => {
            GroupState::RateLimited
        }
        (Some(_), true) if row.waiting => GroupState::Scheduled,
        (Some(_), true) => GroupState::Ready,
    }
}

/// Lists the groups of `queue` in name order (or oldest head first), with
/// backlog, head and state.
/// Includes paused groups that have no job yet, and new groups that no
/// runner has activated yet (shown idle, with their backlog).
pub async fn groups(
    conn: &mut AsyncPgConnection,
    queue: &str,
    query: &GroupQuery,
) -> Result<Vec<GroupInfo>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        let limit = query.limit.unwrap_or(50);
        if limit < 1 {
            return Err(Error::InvalidArgument(format!(
                "limit must be at least 1 (got {limit})"
            )));
        }
        let filter = GroupFilter {
            after: query.after.as_deref(),
            prefix: query.prefix.as_deref().unwrap_or(""),
            blocked_only: query.blocked_only,
            limit,
        };
        let layout = db::citus::layout(conn).await?;
        let rows = match query.order {
            GroupOrder::Name => db::admin::group_list::groups(conn, layout, queue, filter).await?,
            GroupOrder::OldestHead => {
                db::admin::group_list::groups_by_lag(conn, layout, queue, query.after_head, filter)
                    .await?
            }
            GroupOrder::Backlog => {
                let after = query.after_backlog;
                db::admin::group_list::groups_by_backlog(conn, layout, queue, after, filter).await?
            }
        };
        let wait = queue_wait(conn, queue).await?;
        with_dependency_waits(conn, rows.into_iter().map(|row| info(row, wait)).collect()).await
    })
    .await
}

/// One group of `queue`, as [`groups`] lists it; `None` when the queue has
/// no such group (no row, pause or pending wake-up).
pub async fn group(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> Result<Option<GroupInfo>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        validate_group(group)?;
        let filter = GroupFilter {
            after: None,
            prefix: group,
            blocked_only: false,
            limit: 1,
        };
        let layout = db::citus::layout(conn).await?;
        let rows = db::admin::group_list::groups(conn, layout, queue, filter).await?;
        let wait = queue_wait(conn, queue).await?;
        let found: Vec<GroupInfo> = rows
            .into_iter()
            .filter(|row| row.group_id == group)
            .map(|row| info(row, wait))
            .collect();
        Ok(with_dependency_waits(conn, found).await?.pop())
    })
    .await
}

/// Why a ready head of `queue` waits for the queue now, if it does (read
/// after the groups: a slot freed in between shows no reason).
async fn queue_wait(conn: &mut AsyncPgConnection, queue: &str) -> Result<Option<QueueWait>> {
    Ok(queue_usage::read(conn, queue)
        .await?
        .and_then(|usage| usage.wait()))
}

/// `groups` with why their heads wait for dependencies, in one query.
async fn with_dependency_waits(
    conn: &mut AsyncPgConnection,
    mut groups: Vec<GroupInfo>,
) -> Result<Vec<GroupInfo>> {
    let heads: Vec<JobId> = groups
        .iter()
        .filter(|g| g.state == GroupState::Waiting)
        .filter_map(|g| g.head)
        .collect();
    if heads.is_empty() {
        return Ok(groups);
    }
    let waits = dependency_waits(conn, &heads).await?;
    for group in &mut groups {
        group.dependency_wait = waits.iter().find(|w| Some(w.job) == group.head).cloned();
    }
    Ok(groups)
}

/// A listed group, from its row, with `wait` if its head is ready.
fn info(row: GroupRow, wait: Option<QueueWait>) -> GroupInfo {
    let state = state_of(&row);
    let has_head = row.head_state.is_some();
    GroupInfo {
        waiting_until: matches!(
            state,
            GroupState::Retrying | GroupState::Scheduled | GroupState::RateLimited
        )
        .then(|| row.ready_at_us.map(from_micros))
        .flatten(),
        snoozed_until: row.snoozed_until_us.map(from_micros),
        rate: rate_of(row.rate_count, row.rate_period_ms),
        burst: row.burst.map(|b| b as u32),
        tokens: row.tokens,
        concurrency: row.concurrency as u32,
        weight: row.weight as u32,
        running: row.running,
        own_limits: row.own_limits,
        queue_wait: wait.filter(|_| state == GroupState::Ready),
        dependency_wait: None,
        head_error: matches!(state, GroupState::Retrying | GroupState::Held)
            .then(|| row.head_error.clone())
            .flatten(),
        head: row.head_id.filter(|_| has_head),
        head_age: row.head_age_us.map(age_from_micros),
        head_attempts: row.head_attempts.filter(|_| has_head),
        head_max_attempts: row.head_max_attempts.filter(|_| has_head),
        paused_at: row.paused_at_us.map(from_micros),
        backlog: row.backlog,
        group: row.group_id,
        state,
    }
}

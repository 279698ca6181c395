//! Listing a queue's groups, with where each stands. Read-only: nothing
//! here takes a lock or changes a row.

use std::time::{Duration, SystemTime};

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::time::{age_from_micros, from_micros, ser_opt_secs, ser_opt_time};
use crate::db;
use crate::db::admin::inspect::GroupRow;
use crate::db::pooler::pinned;
use crate::names::validate_queue;
use crate::{Error, JobId, Result};

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
    /// Blocked: its head failed and waits for its next retry.
    Retrying,
    /// Blocked: its head failed for good and the queue's failure policy is
    /// `hold`. Retry or skip the head to release it.
    Held,
    /// Blocked: paused by an operator.
    Paused,
}

impl GroupState {
    /// Whether the group has jobs that cannot run now.
    pub fn is_blocked(self) -> bool {
        matches!(
            self,
            GroupState::Retrying | GroupState::Held | GroupState::Paused
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
    /// When the group was paused.
    #[serde(serialize_with = "ser_opt_time")]
    pub paused_at: Option<SystemTime>,
}

/// Which groups [`groups`] lists.
#[derive(Debug, Clone, Default)]
pub struct GroupQuery {
    /// Only groups that are blocked (paused, held, retrying).
    pub blocked_only: bool,
    /// Groups after this one in name order (for paging).
    pub after: Option<String>,
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
        (Some(_), true) if row.waiting && row.head_attempts.unwrap_or(0) > 0 => {
            GroupState::Retrying
        }
        (Some(_), true) if row.waiting => GroupState::Scheduled,
        (Some(_), true) => GroupState::Ready,
    }
}

/// Lists the groups of `queue` in name order, with backlog, head and state.
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
        let rows = db::admin::inspect::groups(
            conn,
            queue,
            query.after.as_deref(),
            query.blocked_only,
            limit,
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let state = state_of(&row);
                GroupInfo {
                    waiting_until: matches!(state, GroupState::Retrying | GroupState::Scheduled)
                        .then(|| row.ready_at_us.map(from_micros))
                        .flatten(),
                    head_error: matches!(state, GroupState::Retrying | GroupState::Held)
                        .then(|| row.head_error.clone())
                        .flatten(),
                    head: row.head_id.filter(|_| row.head_state.is_some()),
                    head_age: row.head_age_us.map(age_from_micros),
                    paused_at: row.paused_at_us.map(from_micros),
                    backlog: row.backlog,
                    group: row.group_id,
                    state,
                }
            })
            .collect())
    })
    .await
}

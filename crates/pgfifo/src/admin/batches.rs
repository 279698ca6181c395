//! Batches' progress: the listing ([`batches`]) and one batch with its jobs
//! and callbacks ([`batch`]). Read-only (docs/batches.md).

use std::time::SystemTime;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::time::{from_micros, ser_opt_time, ser_time};
use crate::db::batch::{BatchRow, CallbackRow, MemberRow};
use crate::db::{self, pooler::pinned};
use crate::{BatchId, Error, JobId, Result};

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Jobs may still be added ([`batch::close`](crate::batch::close) ends this).
    Open,
    /// Closed, with jobs that have not ended.
    Running,
    /// Every job has ended (or, after an operator's retry, had: see
    /// [`BatchProgress::completed_at`]).
    Completed,
}

impl BatchState {
    /// Its name as the CLI and the dashboard show it.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "open",
            BatchState::Running => "running",
            BatchState::Completed => "completed",
        }
    }
}

/// A batch's counts (see [`batches`]). A job counts once it has a terminal
/// outcome; a failed job an operator retries stops counting as failed
/// until it ends again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchProgress {
    /// The batch's id.
    pub id: BatchId,
    /// Its description, if it was given one.
    pub description: Option<String>,
    /// Open, running or completed.
    pub state: BatchState,
    /// When it was created.
    #[serde(serialize_with = "ser_time")]
    pub created_at: SystemTime,
    /// When it was closed (`None`: open).
    #[serde(serialize_with = "ser_opt_time")]
    pub closed_at: Option<SystemTime>,
    /// When every job first had a terminal outcome (the `complete` event).
    /// Stays set when an operator retries a failed job later.
    #[serde(serialize_with = "ser_opt_time")]
    pub completed_at: Option<SystemTime>,
    /// When a job of it first failed for good.
    #[serde(serialize_with = "ser_opt_time")]
    pub first_failed_at: Option<SystemTime>,
    /// Its jobs.
    pub total: u32,
    /// Jobs that succeeded.
    pub succeeded: u32,
    /// Jobs that failed for good (a skipped head, a head held by the `hold`
    /// failure policy included).
    pub failed: u32,
    /// Jobs cancelled (by their handler or an operator).
    pub cancelled: u32,
    /// Jobs without a terminal outcome yet (queued, waiting for a retry,
    /// running, or retried by an operator).
    pub pending: u32,
}

/// One job of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchMember {
    /// The job's id.
    pub id: JobId,
    /// Its state (`queued`, `succeeded`, `failed`, `cancelled`); `None`
    /// when retention has purged the job.
    pub state: Option<String>,
}

/// One callback of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchCallback {
    /// `success`, `complete` or `failure`.
    pub event: String,
    /// The callback job's type.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Its group (`None`: ungrouped).
    pub group: Option<String>,
    /// The id of the job enqueued when the event fired (`None`: not yet).
    pub job_id: Option<JobId>,
}

/// A batch with its jobs and callbacks (see [`batch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchSummary {
    /// Its counts.
    #[serde(flatten)]
    pub progress: BatchProgress,
    /// Its jobs, in id order.
    pub jobs: Vec<BatchMember>,
    /// Its callbacks, in the order they are enqueued when they fire at once
    /// (failure, success, complete).
    pub callbacks: Vec<BatchCallback>,
}

impl BatchSummary {
    /// The ids of its jobs whose state is `state`.
    pub fn job_ids(&self, state: &str) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|j| j.state.as_deref() == Some(state))
            .map(|j| j.id)
            .collect()
    }
}

fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

fn progress(row: BatchRow) -> BatchProgress {
    let done = row.succeeded + row.failed + row.cancelled;
    let state = if row.closed_at_us.is_none() {
        BatchState::Open
    } else if row.completed_at_us.is_some() {
        BatchState::Completed
    } else {
        BatchState::Running
    };
    BatchProgress {
        id: row.id,
        description: row.description,
        state,
        created_at: from_micros(row.created_at_us),
        closed_at: row.closed_at_us.map(from_micros),
        completed_at: row.completed_at_us.map(from_micros),
        first_failed_at: row.first_failed_at_us.map(from_micros),
        total: count(row.total),
        succeeded: count(row.succeeded),
        failed: count(row.failed),
        cancelled: count(row.cancelled),
        pending: count(row.total - done),
    }
}

fn member(row: MemberRow) -> BatchMember {
    BatchMember {
        id: row.job_id,
        state: row.state,
    }
}

fn callback(row: CallbackRow) -> BatchCallback {
    BatchCallback {
        event: row.event,
        kind: row.kind,
        queue: row.queue,
        group: row.group_id,
        job_id: row.job_id,
    }
}

/// The newest batches first: at most `limit` (1 to 1,000), with ids below
/// `before` (`None`: from the newest; pass the last id shown to page on),
/// only those not completed when `unfinished_only`.
pub async fn batches(
    conn: &mut AsyncPgConnection,
    before: Option<BatchId>,
    limit: u32,
    unfinished_only: bool,
) -> Result<Vec<BatchProgress>> {
    if !(1..=1_000).contains(&limit) {
        return Err(Error::InvalidArgument(format!(
            "limit must be between 1 and 1000, got {limit}"
        )));
    }
    let rows = db::batch::batches(conn, before, i64::from(limit), unfinished_only).await?;
    Ok(rows.into_iter().map(progress).collect())
}

/// Batch `id` with its counts, its jobs and its callbacks; `None` if no
/// batch has this id.
pub async fn batch(conn: &mut AsyncPgConnection, id: BatchId) -> Result<Option<BatchSummary>> {
    pinned(conn, async |conn| {
        let Some(row) = db::batch::batch(conn, id).await? else {
            return Ok(None);
        };
        let jobs = db::batch::members(conn, id).await?;
        let callbacks = db::batch::callbacks(conn, id).await?;
        Ok(Some(BatchSummary {
            progress: progress(row),
            jobs: jobs.into_iter().map(member).collect(),
            callbacks: callbacks.into_iter().map(callback).collect(),
        }))
    })
    .await
}

//! Operations that change jobs and groups: retry, cancel, skip a head, pause
//! and resume, failure policy, purge. Each is one call of a schema function
//! (`src/db/functions/`, where the locking of each is described) and none
//! waits for a running job.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::db;
use crate::db::admin::ops::RetryRow;
use crate::db::error::{refusal, Refusal};
use crate::db::pooler::pinned;
use crate::names::{validate_group, validate_queue};
use crate::{Error, JobId, Result};

/// What a queue's permanently failed head does to its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// The failed job is kept as `failed` and the group goes on (the default).
    #[default]
    Continue,
    /// The group stops at the failed job until an operator retries it
    /// ([`retry_jobs`]) or skips it ([`skip_head`]).
    Hold,
}

impl FailurePolicy {
    /// The name stored in the schema (`continue` or `hold`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Continue => "continue",
            FailurePolicy::Hold => "hold",
        }
    }
}

impl std::str::FromStr for FailurePolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "continue" => Ok(FailurePolicy::Continue),
            "hold" => Ok(FailurePolicy::Hold),
            other => Err(Error::InvalidArgument(format!(
                "unknown failure policy {other:?}: expected \"continue\" or \"hold\""
            ))),
        }
    }
}

/// What [`retry_jobs`] did with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryResult {
    /// Queued again; it runs next in its group.
    Retried,
    /// The job is not failed (queued, running, succeeded or cancelled): left alone.
    NotFailed,
    /// Another queued job of the queue holds its unique key: left failed.
    UniqueKeyTaken,
    /// No job has this id.
    Missing,
}

/// One job's line in a retry report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retried {
    /// The job.
    pub id: JobId,
    /// What happened to it.
    pub result: RetryResult,
}

fn retry_report(rows: Vec<RetryRow>) -> Vec<Retried> {
    let mut report: Vec<Retried> = rows
        .into_iter()
        .map(|row| Retried {
            id: row.id,
            result: match row.result.as_str() {
                "retried" => RetryResult::Retried,
                "unique_key_taken" => RetryResult::UniqueKeyTaken,
                "missing" => RetryResult::Missing,
                _ => RetryResult::NotFailed,
            },
        })
        .collect();
    report.sort_by_key(|r| r.id);
    report.dedup_by_key(|r| r.id);
    report
}

/// Puts failed jobs back in their queues, each with a fresh budget of its
/// `max_attempts`. A retried job runs before every job enqueued after it
/// (ids keep the original order); if a job of its group is running now, it
/// runs after that one (usually right after). Retrying the failed head of a
/// held group releases it; other retried jobs of a held group wait behind
/// its head, in order.
///
/// Returns one line per distinct id, in id order; ids that were not failed
/// are reported and left alone.
pub async fn retry_jobs(conn: &mut AsyncPgConnection, ids: &[JobId]) -> Result<Vec<Retried>> {
    pinned(conn, async |conn| {
        Ok(retry_report(db::admin::ops::retry_jobs(conn, ids).await?))
    })
    .await
}

/// Retries every failed job of `queue` (of one group if `group` is given),
/// in their original order, in one transaction. Returns a line per job.
pub async fn retry_failed(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> Result<Vec<Retried>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        if let Some(group) = group {
            validate_group(group)?;
        }
        Ok(retry_report(
            db::admin::ops::retry_failed(conn, queue, group).await?,
        ))
    })
    .await
}

/// Cancels a job that has not run to an outcome yet (waiting, scheduled, or
/// between retries), recording `reason` as its last error. A cancelled head
/// is replaced by the next job of its group.
///
/// Errors: [`Error::JobNotFound`], [`Error::JobRunning`] (nothing changed),
/// [`Error::JobState`] when it already finished.
pub async fn cancel_job(
    conn: &mut AsyncPgConnection,
    id: JobId,
    reason: Option<&str>,
) -> Result<()> {
    pinned(conn, async |conn| {
        match db::admin::ops::cancel_job(conn, id, reason).await?.as_str() {
            "cancelled" => Ok(()),
            "missing" => Err(Error::JobNotFound(id)),
            "running" => Err(Error::JobRunning(id)),
            _ => match db::admin::ops::job_state(conn, id).await? {
                Some(state) => Err(Error::JobState {
                    id,
                    state,
                    needed: "only a job that has not finished can be cancelled".into(),
                }),
                None => Err(Error::JobNotFound(id)),
            },
        }
    })
    .await
}

/// Marks the head of a group failed (a held head is failed already), with
/// `reason` as its last error, and lets the group go on. Returns the skipped
/// job, or `None` when the group has no head: it is idle, or it is paused
/// and a runner has parked it already (its jobs wait for [`resume_group`]; a
/// paused group that still shows a head has it skipped).
///
/// Errors: [`Error::GroupBusy`] when the head is running.
pub async fn skip_head(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
    reason: Option<&str>,
) -> Result<Option<JobId>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        validate_group(group)?;
        match db::admin::ops::skip_head(conn, queue, group, reason).await {
            Ok(skipped) => Ok(skipped),
            Err(err) if refusal(&err) == Some(Refusal::GroupBusy) => Err(Error::GroupBusy {
                queue: queue.into(),
                group: group.into(),
            }),
            Err(err) => Err(err.into()),
        }
    })
    .await
}

/// Pauses one group: no job of it starts until [`resume_group`]. A job of
/// it that is running now finishes normally; the group's jobs stay queued and
/// new ones are accepted. Returns `false` if it was paused already.
pub async fn pause_group(conn: &mut AsyncPgConnection, queue: &str, group: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        validate_group(group)?;
        Ok(db::admin::ops::pause_group(conn, queue, group).await?)
    })
    .await
}

/// Resumes a paused group: its oldest queued job runs next. Returns `false`
/// if it was not paused.
pub async fn resume_group(conn: &mut AsyncPgConnection, queue: &str, group: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        validate_group(group)?;
        Ok(db::admin::ops::resume_group(conn, queue, group).await?)
    })
    .await
}

/// Pauses a whole queue: no job of it starts until [`resume_queue`]; jobs
/// running now finish, new jobs are accepted. Returns `false` if it was
/// paused already.
pub async fn pause_queue(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        Ok(!set_queue_paused(conn, queue, true).await?)
    })
    .await
}

/// Resumes a paused queue. Returns `false` if it was not paused.
pub async fn resume_queue(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        set_queue_paused(conn, queue, false).await
    })
    .await
}

/// Sets the paused flag; returns the previous one.
async fn set_queue_paused(conn: &mut AsyncPgConnection, queue: &str, paused: bool) -> Result<bool> {
    validate_queue(queue)?;
    Ok(db::admin::ops::set_queue_paused(conn, queue, paused).await?)
}

/// Sets what a permanently failed head does to its group in `queue` (every
/// runner follows it from the next failure on). Switching to
/// [`FailurePolicy::Continue`] releases the groups held now; returns how
/// many.
pub async fn set_failure_policy(
    conn: &mut AsyncPgConnection,
    queue: &str,
    policy: FailurePolicy,
) -> Result<u64> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        let released = db::admin::ops::set_failure_policy(conn, queue, policy.as_str()).await?;
        Ok(released.unsigned_abs())
    })
    .await
}

/// The final states [`purge`] may delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishedState {
    /// Jobs that succeeded.
    Succeeded,
    /// Jobs that failed for good (a held group's failed head is always kept).
    Failed,
    /// Jobs that were cancelled.
    Cancelled,
}

impl std::str::FromStr for FinishedState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        FinishedState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown finished state {s:?}: expected succeeded, failed or cancelled"
                ))
            })
    }
}

impl FinishedState {
    /// Every final state.
    pub const ALL: [FinishedState; 3] = [
        FinishedState::Succeeded,
        FinishedState::Failed,
        FinishedState::Cancelled,
    ];

    /// The state's name in the schema.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishedState::Succeeded => "succeeded",
            FinishedState::Failed => "failed",
            FinishedState::Cancelled => "cancelled",
        }
    }
}

/// The default number of rows [`purge`] looks at per transaction.
pub const PURGE_BATCH: i32 = 1_000;

/// What one [`purge_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeBatch {
    /// Jobs deleted.
    pub deleted: u64,
    /// The last id looked at: where the next batch continues.
    pub last_id: JobId,
    /// Whether the walk is over (end of the table, or jobs too young to
    /// qualify).
    pub done: bool,
    /// The first id looked at that a later walk may still have to delete
    /// (unfinished, finished too recently, or kept as a held head); a walk
    /// that starts again can start just before it.
    pub first_pending: Option<JobId>,
}

/// One batch of a purge: deletes jobs in `states` that finished more than
/// `older_than` ago among the `batch` jobs after `after_id` (in id order),
/// with their attempt records, in one short transaction. [`purge`] loops
/// over it; the runner's retention does too, with pauses.
pub async fn purge_batch(
    conn: &mut AsyncPgConnection,
    older_than: Duration,
    states: &[FinishedState],
    after_id: JobId,
    batch: i32,
) -> Result<PurgeBatch> {
    pinned(conn, async |conn| {
        if batch < 1 {
            return Err(Error::InvalidArgument(format!(
                "purge batch size must be at least 1 (got {batch})"
            )));
        }
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let row = db::admin::ops::purge_batch(conn, older_than, &states, after_id, batch).await?;
        Ok(PurgeBatch {
            deleted: row.deleted.unsigned_abs(),
            last_id: row.last_id,
            done: row.done,
            first_pending: row.first_pending,
        })
    })
    .await
}

/// Deletes jobs in `states` that finished more than `older_than` ago, with
/// their attempt records, in batches of short transactions (queued and
/// running jobs are never touched). Returns how many were deleted.
pub async fn purge(
    conn: &mut AsyncPgConnection,
    older_than: Duration,
    states: &[FinishedState],
) -> Result<u64> {
    // Not pinned as a whole: each batch is a short transaction of its own
    // (`purge_batch` pins itself through a transaction-mode pooler).
    let mut total = 0;
    let mut after = 0;
    loop {
        let batch = purge_batch(conn, older_than, states, after, PURGE_BATCH).await?;
        total += batch.deleted;
        after = batch.last_id;
        if batch.done {
            return Ok(total);
        }
    }
}

/// Deletes up to `limit` de-duplication window rows that hold nothing any
/// more: unique and throttle windows that ended, debounce windows whose job
/// has started or finished (docs/dedup-windows.md). Returns how many.
pub async fn clean_windows(conn: &mut AsyncPgConnection, limit: i32) -> Result<u64> {
    pinned(conn, async |conn| {
        Ok(db::admin::ops::clean_windows(conn, limit)
            .await?
            .unsigned_abs())
    })
    .await
}

/// Deletes up to `limit` `queue_group` rows idle for more than `idle_for`
/// (groups come back by themselves with their next job), and the slots,
/// token buckets and snooze marks of deleted groups (limits set for a group
/// stay). Returns how many groups.
pub async fn clean_groups(
    conn: &mut AsyncPgConnection,
    idle_for: Duration,
    limit: i32,
) -> Result<u64> {
    pinned(conn, async |conn| {
        let cleaned = db::admin::ops::clean_groups(conn, idle_for, limit).await?;
        db::admin::ops::clean_group_controls(conn, limit).await?;
        Ok(cleaned.unsigned_abs())
    })
    .await
}

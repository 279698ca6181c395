//! Listing and inspecting jobs. Read-only: nothing here takes a lock or
//! changes a row.

use std::time::SystemTime;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::db;
use crate::db::admin::inspect::{JobFilter, JobRow};
use crate::db::pooler::pinned;
use crate::names::{validate_group, validate_queue};
use crate::time::{from_micros, ser_opt_time, ser_time};
use crate::{Error, JobId, Result};

/// A job's stored state, and what a queued one is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting to start (ready, or its group is busy or paused).
    Queued,
    /// Enqueued to run later.
    Scheduled,
    /// Waits for its dependencies ([`JobDetail::dependency_wait`] says which).
    Waiting,
    /// An attempt started and has no outcome yet (after a crash, until the
    /// job runs again).
    Running,
    /// Failed an attempt; waits for its next one.
    Retrying,
    /// Ran successfully.
    Succeeded,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// The stored states [`jobs`] can filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStateFilter {
    /// Not finished: queued, scheduled, running or retrying.
    Queued,
    /// Succeeded.
    Succeeded,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl std::str::FromStr for JobStateFilter {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "queued" => Ok(JobStateFilter::Queued),
            "succeeded" => Ok(JobStateFilter::Succeeded),
            "failed" => Ok(JobStateFilter::Failed),
            "cancelled" => Ok(JobStateFilter::Cancelled),
            other => Err(Error::InvalidArgument(format!(
                "unknown job state {other:?}: expected queued, succeeded, failed or cancelled"
            ))),
        }
    }
}

impl JobStateFilter {
    fn as_str(self) -> &'static str {
        match self {
            JobStateFilter::Queued => "queued",
            JobStateFilter::Succeeded => "succeeded",
            JobStateFilter::Failed => "failed",
            JobStateFilter::Cancelled => "cancelled",
        }
    }
}

/// Which jobs [`jobs`] lists.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this group (needs `queue`).
    pub group: Option<String>,
    /// Only jobs in this state.
    pub state: Option<JobStateFilter>,
    /// Oldest first (default: newest first).
    pub oldest_first: bool,
    /// Continue after this id (in the listing's order), for paging.
    pub after: Option<JobId>,
    /// At most this many (default 50).
    pub limit: Option<i64>,
}

/// A job in a listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its group (`None`: ungrouped).
    pub group: Option<String>,
    /// Its type name.
    pub kind: String,
    /// Where it stands.
    pub status: JobStatus,
    /// Attempts made, including one running now.
    pub attempts: i32,
    /// The attempts it may make (a manual retry adds a fresh budget).
    pub max_attempts: i32,
    /// Its last error.
    pub last_error: Option<String>,
    /// When it was enqueued.
    #[serde(serialize_with = "ser_time")]
    pub created_at: SystemTime,
    /// When it may run (scheduled, or its next retry).
    #[serde(serialize_with = "ser_time")]
    pub run_after: SystemTime,
    /// When it finished.
    #[serde(serialize_with = "ser_opt_time")]
    pub finished_at: Option<SystemTime>,
}

/// A job with everything stored about it (see [`job`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobDetail {
    /// The listing fields.
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The payload.
    pub payload: serde_json::Value,
    /// The handler's result, if it stored one.
    pub result: Option<serde_json::Value>,
    /// Its priority.
    pub priority: i16,
    /// Its unique key.
    pub unique_key: Option<String>,
    /// Whether it is its group's head (runs next, is running, or holds it).
    pub is_head: bool,
    /// The de-duplication window it carries, if any (docs/dedup-windows.md).
    pub window: Option<JobWindow>,
    /// Every recorded attempt, oldest first.
    pub attempt_log: Vec<AttemptInfo>,
    /// Why it waits for its dependencies (status
    /// [`Waiting`](JobStatus::Waiting)): "waiting for jobs 17 and 18".
    pub dependency_wait: Option<super::DependencyWait>,
}

/// The de-duplication window a job carries (while its key row is kept:
/// retention deletes it some time after the window ends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobWindow {
    /// The key (per queue).
    pub key: String,
    /// `unique`, `debounce` or `throttle`.
    pub mode: String,
    /// The window's period (debounce: the quiet period), in microseconds.
    pub period_us: i64,
    /// When the window ends (debounce: the job's start time).
    #[serde(serialize_with = "ser_time")]
    pub until: SystemTime,
    /// Whether the key still leads to this job: the window has not ended
    /// (debounce: the job has not started).
    pub holds: bool,
}

/// One recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptInfo {
    /// Its number, from 1.
    pub attempt: i32,
    /// The runner that made it.
    pub runner: String,
    /// When it started.
    #[serde(serialize_with = "ser_time")]
    pub started_at: SystemTime,
    /// When it failed; successes are not timed here.
    #[serde(serialize_with = "ser_opt_time")]
    pub finished_at: Option<SystemTime>,
    /// Its error.
    pub error: Option<String>,
}

impl From<JobRow> for JobSummary {
    fn from(row: JobRow) -> Self {
        JobSummary {
            id: row.id,
            queue: row.queue,
            group: row.group_id,
            kind: row.kind,
            status: match row.status.as_str() {
                "running" => JobStatus::Running,
                "retrying" => JobStatus::Retrying,
                "scheduled" => JobStatus::Scheduled,
                "waiting" => JobStatus::Waiting,
                "succeeded" => JobStatus::Succeeded,
                "failed" => JobStatus::Failed,
                "cancelled" => JobStatus::Cancelled,
                _ => JobStatus::Queued,
            },
            attempts: row.attempts,
            max_attempts: row.max_attempts,
            last_error: row.last_error,
            created_at: from_micros(row.created_us),
            run_after: from_micros(row.run_after_us),
            finished_at: row.finished_us.map(from_micros),
        }
    }
}

/// Lists jobs, newest first unless `oldest_first`. Served by the job
/// table's indexes: by queue and group for unfinished and failed jobs, by id
/// otherwise.
pub async fn jobs(conn: &mut AsyncPgConnection, query: &JobQuery) -> Result<Vec<JobSummary>> {
    pinned(conn, async |conn| {
        if let Some(queue) = &query.queue {
            validate_queue(queue)?;
        }
        if let Some(group) = &query.group {
            validate_group(group)?;
            if query.queue.is_none() {
                return Err(Error::InvalidArgument(
                    "a group is named within a queue: give the queue too".into(),
                ));
            }
        }
        let limit = query.limit.unwrap_or(50);
        if limit < 1 {
            return Err(Error::InvalidArgument(format!(
                "limit must be at least 1 (got {limit})"
            )));
        }
        let filter = JobFilter {
            queue: query.queue.as_deref(),
            group: query.group.as_deref(),
            state: query.state.map(JobStateFilter::as_str),
            after: query.after,
            limit,
        };
        let layout = db::citus::layout(conn).await?;
        let rows = db::admin::inspect::jobs(conn, layout, filter, query.oldest_first).await?;
        Ok(rows.into_iter().map(JobSummary::from).collect())
    })
    .await
}

/// How far back [`group_history`] looks: the newest this many job ids.
pub const HISTORY_WINDOW: i64 = 100_000;

/// The newest finished jobs (succeeded, failed or cancelled) of `group`,
/// at most `limit`, among the newest [`HISTORY_WINDOW`] jobs of the whole
/// table: cheap at any table size, and blind to older history (use
/// [`jobs`] with a state for that).
pub async fn group_history(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
    limit: i64,
) -> Result<Vec<JobSummary>> {
    pinned(conn, async |conn| {
        validate_queue(queue)?;
        validate_group(group)?;
        let layout = db::citus::layout(conn).await?;
        let rows =
            db::admin::inspect::group_history(conn, layout, queue, group, HISTORY_WINDOW, limit)
                .await?;
        Ok(rows.into_iter().map(JobSummary::from).collect())
    })
    .await
}

/// Everything stored about one job, with its attempts. `None` if no job has
/// this id.
pub async fn job(conn: &mut AsyncPgConnection, id: JobId) -> Result<Option<JobDetail>> {
    pinned(conn, async |conn| {
        let layout = db::citus::layout(conn).await?;
        let Some(row) = db::admin::inspect::job(conn, layout, id).await? else {
            return Ok(None);
        };
        let attempt_log = db::admin::inspect::attempts(conn, id)
            .await?
            .into_iter()
            .map(|a| AttemptInfo {
                attempt: a.attempt,
                runner: a.runner,
                started_at: from_micros(a.started_us),
                finished_at: a.finished_us.map(from_micros),
                error: a.error,
            })
            .collect();
        let window = db::admin::window::window_of_job(conn, id)
            .await?
            .map(|w| JobWindow {
                key: w.key,
                mode: w.mode,
                period_us: w.period_us,
                until: from_micros(w.until_us),
                holds: w.holds,
            });
        let summary: JobSummary = row.job.into();
        let dependency_wait = if summary.status == JobStatus::Waiting {
            super::dependency_waits(conn, &[id]).await?.pop()
        } else {
            None
        };
        Ok(Some(JobDetail {
            summary,
            payload: row.payload,
            result: row.result,
            priority: row.priority,
            unique_key: row.unique_key,
            is_head: row.is_head,
            window,
            attempt_log,
            dependency_wait,
        }))
    })
    .await
}

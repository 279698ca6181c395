//! Listing and inspecting groups and jobs. Read-only: nothing here takes a
//! lock or changes a row.

use std::time::{Duration, SystemTime};

use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use super::time::{age_from_micros, from_micros, ser_opt_secs, ser_opt_time, ser_time};
use crate::enqueue::{validate_group, validate_queue};
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

#[derive(QueryableByName)]
struct GroupRow {
    #[diesel(sql_type = Text)]
    group_id: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    head_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    head_state: Option<String>,
    #[diesel(sql_type = Bool)]
    active: bool,
    #[diesel(sql_type = Bool)]
    waiting: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    ready_at_us: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    head_attempts: Option<i32>,
    #[diesel(sql_type = Bool)]
    head_started: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    head_age_us: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    head_error: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    paused_at_us: Option<i64>,
    #[diesel(sql_type = BigInt)]
    backlog: i64,
}

impl GroupRow {
    fn state(&self) -> GroupState {
        if self.paused_at_us.is_some() {
            return GroupState::Paused;
        }
        match (self.head_id, self.active) {
            (None, _) => GroupState::Idle,
            (Some(_), false) => GroupState::Held,
            (Some(_), true) if self.head_started => GroupState::Running,
            (Some(_), true) if self.waiting && self.head_attempts.unwrap_or(0) > 0 => {
                GroupState::Retrying
            }
            (Some(_), true) if self.waiting => GroupState::Scheduled,
            (Some(_), true) => GroupState::Ready,
        }
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
    validate_queue(queue)?;
    let limit = query.limit.unwrap_or(50);
    if limit < 1 {
        return Err(Error::InvalidArgument(format!(
            "limit must be at least 1 (got {limit})"
        )));
    }
    let rows: Vec<GroupRow> = diesel::sql_query(
        "WITH k AS (
             SELECT group_id FROM pgfifo.queue_group
             WHERE queue = $1 AND group_id > coalesce($2, '')
             UNION
             SELECT group_id FROM pgfifo.group_pause
             WHERE queue = $1 AND group_id > coalesce($2, '')
             UNION
             SELECT group_id FROM pgfifo.group_wake
             WHERE queue = $1 AND group_id > coalesce($2, ''))
         SELECT k.group_id, g.head_id, j.state AS head_state,
                g.ready_at IS NOT NULL AS active,
                coalesce(g.ready_at > now(), false) AS waiting,
                (extract(epoch FROM g.ready_at) * 1e6)::bigint AS ready_at_us,
                j.attempts AS head_attempts,
                coalesce(j.state = 'queued' AND EXISTS (
                    SELECT 1 FROM pgfifo.job_attempt AS a
                    WHERE a.job_id = j.id AND a.attempt > j.attempts), false) AS head_started,
                (extract(epoch FROM now() - j.created_at) * 1e6)::bigint AS head_age_us,
                j.last_error AS head_error,
                (extract(epoch FROM p.paused_at) * 1e6)::bigint AS paused_at_us,
                (SELECT count(*) FROM pgfifo.job AS b
                 WHERE b.queue = $1 AND b.group_id = k.group_id AND b.state = 'queued') AS backlog
         FROM k
         LEFT JOIN pgfifo.queue_group AS g ON g.queue = $1 AND g.group_id = k.group_id
         LEFT JOIN pgfifo.job AS j ON j.id = g.head_id
         LEFT JOIN pgfifo.group_pause AS p ON p.queue = $1 AND p.group_id = k.group_id
         WHERE NOT $3
            OR p.paused_at IS NOT NULL
            OR (g.head_id IS NOT NULL AND g.ready_at IS NULL)
            OR (g.ready_at > now() AND j.state = 'queued' AND j.attempts > 0)
         ORDER BY k.group_id
         LIMIT $4",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(query.after.as_deref())
    .bind::<Bool, _>(query.blocked_only)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let state = row.state();
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
}

/// A job's stored state, and what a queued one is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting to start (ready, or its group is busy or paused).
    Queued,
    /// Enqueued to run later.
    Scheduled,
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
    /// Every recorded attempt, oldest first.
    pub attempt_log: Vec<AttemptInfo>,
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

#[derive(QueryableByName)]
struct AttemptRow {
    #[diesel(sql_type = Integer)]
    attempt: i32,
    #[diesel(sql_type = Text)]
    runner: String,
    #[diesel(sql_type = BigInt)]
    started_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    finished_us: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
}

#[derive(QueryableByName)]
struct JobRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    group_id: Option<String>,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Integer)]
    max_attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = BigInt)]
    created_us: i64,
    #[diesel(sql_type = BigInt)]
    run_after_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    finished_us: Option<i64>,
}

/// The columns of a [`JobRow`] from `pgfifo.job AS j`.
const JOB_COLUMNS: &str = "
    j.id, j.queue, j.group_id, j.kind,
    CASE WHEN j.state <> 'queued' THEN j.state
         WHEN EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                      WHERE a.job_id = j.id AND a.attempt > j.attempts) THEN 'running'
         WHEN j.run_after > now() AND j.attempts > 0 THEN 'retrying'
         WHEN j.run_after > now() THEN 'scheduled'
         ELSE 'queued' END AS status,
    greatest(j.attempts, coalesce((SELECT max(a.attempt) FROM pgfifo.job_attempt AS a
                                   WHERE a.job_id = j.id), 0)) AS attempts,
    j.max_attempts + j.attempt_base AS max_attempts,
    j.last_error,
    (extract(epoch FROM j.created_at) * 1e6)::bigint AS created_us,
    (extract(epoch FROM j.run_after) * 1e6)::bigint AS run_after_us,
    (extract(epoch FROM j.finished_at) * 1e6)::bigint AS finished_us";

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
    let (order, cmp) = if query.oldest_first {
        ("ASC", ">")
    } else {
        ("DESC", "<")
    };
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM pgfifo.job AS j
         WHERE ($1::text IS NULL OR j.queue = $1)
           AND ($2::text IS NULL OR j.group_id = $2)
           AND ($3::text IS NULL OR j.state = $3)
           AND ($4::bigint IS NULL OR j.id {cmp} $4)
         ORDER BY j.id {order}
         LIMIT $5"
    );
    let rows: Vec<JobRow> = diesel::sql_query(sql)
        .bind::<Nullable<Text>, _>(query.queue.as_deref())
        .bind::<Nullable<Text>, _>(query.group.as_deref())
        .bind::<Nullable<Text>, _>(query.state.map(JobStateFilter::as_str))
        .bind::<Nullable<BigInt>, _>(query.after)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(JobSummary::from).collect())
}

#[derive(QueryableByName)]
struct DetailRow {
    #[diesel(embed)]
    job: JobRow,
    #[diesel(sql_type = Jsonb)]
    payload: serde_json::Value,
    #[diesel(sql_type = Nullable<Jsonb>)]
    result: Option<serde_json::Value>,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    priority: i16,
    #[diesel(sql_type = Nullable<Text>)]
    unique_key: Option<String>,
    #[diesel(sql_type = Bool)]
    is_head: bool,
}

/// Everything stored about one job, with its attempts. `None` if no job has
/// this id.
pub async fn job(conn: &mut AsyncPgConnection, id: JobId) -> Result<Option<JobDetail>> {
    let sql = format!(
        "SELECT {JOB_COLUMNS}, j.payload, j.result, j.priority, j.unique_key,
                EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                        WHERE g.queue = j.queue AND g.group_id = j.group_id
                          AND g.head_id = j.id) AS is_head
         FROM pgfifo.job AS j WHERE j.id = $1"
    );
    let Some(row) = diesel::sql_query(sql)
        .bind::<BigInt, _>(id)
        .get_result::<DetailRow>(conn)
        .await
        .map(Some)
        .or_else(|err| match err {
            diesel::result::Error::NotFound => Ok(None),
            err => Err(err),
        })?
    else {
        return Ok(None);
    };
    let attempts: Vec<AttemptRow> = diesel::sql_query(
        "SELECT attempt, runner,
                (extract(epoch FROM started_at) * 1e6)::bigint AS started_us,
                (extract(epoch FROM finished_at) * 1e6)::bigint AS finished_us,
                error
         FROM pgfifo.job_attempt WHERE job_id = $1 ORDER BY attempt",
    )
    .bind::<BigInt, _>(id)
    .load(conn)
    .await?;
    let attempt_log = attempts
        .into_iter()
        .map(|a| AttemptInfo {
            attempt: a.attempt,
            runner: a.runner,
            started_at: from_micros(a.started_us),
            finished_at: a.finished_us.map(from_micros),
            error: a.error,
        })
        .collect();
    Ok(Some(JobDetail {
        summary: row.job.into(),
        payload: row.payload,
        result: row.result,
        priority: row.priority,
        unique_key: row.unique_key,
        is_head: row.is_head,
        attempt_log,
    }))
}

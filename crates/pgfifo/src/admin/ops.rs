//! Operations that change jobs and groups: retry, cancel, skip a head, pause
//! and resume, failure policy, purge. Each is one call of a schema function
//! (`migrations/0002_operate/up.sql`, where the locking of each is described)
//! and none waits for a running job.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::enqueue::{validate_group, validate_queue};
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

#[derive(QueryableByName)]
struct RetryRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    result: String,
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
    let rows: Vec<RetryRow> = diesel::sql_query("SELECT id, result FROM pgfifo.retry_jobs($1)")
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)
        .await?;
    Ok(retry_report(rows))
}

/// Retries every failed job of `queue` (of one group if `group` is given),
/// in their original order, in one transaction. Returns a line per job.
pub async fn retry_failed(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> Result<Vec<Retried>> {
    validate_queue(queue)?;
    if let Some(group) = group {
        validate_group(group)?;
    }
    let rows: Vec<RetryRow> = diesel::sql_query(
        "SELECT id, result FROM pgfifo.retry_jobs(ARRAY(
             SELECT j.id FROM pgfifo.job AS j
             WHERE j.queue = $1 AND j.state = 'failed'
               AND ($2::text IS NULL OR j.group_id = $2)
             ORDER BY j.id))",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(group)
    .load(conn)
    .await?;
    Ok(retry_report(rows))
}

#[derive(QueryableByName)]
struct TextRow {
    #[diesel(sql_type = Text)]
    value: String,
}

#[derive(QueryableByName)]
struct StateRow {
    #[diesel(sql_type = Text)]
    state: String,
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
    let row: TextRow = diesel::sql_query("SELECT pgfifo.cancel_job($1, $2) AS value")
        .bind::<BigInt, _>(id)
        .bind::<Nullable<Text>, _>(reason)
        .get_result(conn)
        .await?;
    match row.value.as_str() {
        "cancelled" => Ok(()),
        "missing" => Err(Error::JobNotFound(id)),
        "running" => Err(Error::JobRunning(id)),
        _ => {
            let state: StateRow = diesel::sql_query("SELECT state FROM pgfifo.job WHERE id = $1")
                .bind::<BigInt, _>(id)
                .get_result(conn)
                .await?;
            Err(Error::JobState {
                id,
                state: state.state,
                needed: "only a job that has not finished can be cancelled".into(),
            })
        }
    }
}

#[derive(QueryableByName)]
struct OptIdRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
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
    validate_queue(queue)?;
    validate_group(group)?;
    let result = diesel::sql_query("SELECT pgfifo.skip_head($1, $2, $3) AS id")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .bind::<Nullable<Text>, _>(reason)
        .get_result::<OptIdRow>(conn)
        .await;
    match result {
        Ok(row) => Ok(row.id),
        Err(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains("is running") =>
        {
            Err(Error::GroupBusy {
                queue: queue.into(),
                group: group.into(),
            })
        }
        Err(err) => Err(err.into()),
    }
}

#[derive(QueryableByName)]
struct BoolRow {
    #[diesel(sql_type = Nullable<Bool>)]
    value: Option<bool>,
}

/// Pauses one group: no job of it starts until [`resume_group`]. A job of
/// it that is running now finishes normally; the group's jobs stay queued and
/// new ones are accepted. Returns `false` if it was paused already.
pub async fn pause_group(conn: &mut AsyncPgConnection, queue: &str, group: &str) -> Result<bool> {
    group_call(
        conn,
        "SELECT pgfifo.pause_group($1, $2) AS value",
        queue,
        group,
    )
    .await
}

/// Resumes a paused group: its oldest queued job runs next. Returns `false`
/// if it was not paused.
pub async fn resume_group(conn: &mut AsyncPgConnection, queue: &str, group: &str) -> Result<bool> {
    group_call(
        conn,
        "SELECT pgfifo.resume_group($1, $2) AS value",
        queue,
        group,
    )
    .await
}

async fn group_call(
    conn: &mut AsyncPgConnection,
    sql: &str,
    queue: &str,
    group: &str,
) -> Result<bool> {
    validate_queue(queue)?;
    validate_group(group)?;
    let row: BoolRow = diesel::sql_query(sql)
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .get_result(conn)
        .await?;
    Ok(row.value.unwrap_or(false))
}

/// Pauses a whole queue: no job of it starts until [`resume_queue`]; jobs
/// running now finish, new jobs are accepted. Returns `false` if it was
/// paused already.
pub async fn pause_queue(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    Ok(!set_queue_paused(conn, queue, true).await?)
}

/// Resumes a paused queue. Returns `false` if it was not paused.
pub async fn resume_queue(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    set_queue_paused(conn, queue, false).await
}

/// Sets the paused flag; returns the previous one.
async fn set_queue_paused(conn: &mut AsyncPgConnection, queue: &str, paused: bool) -> Result<bool> {
    validate_queue(queue)?;
    let row: BoolRow = diesel::sql_query("SELECT pgfifo.set_queue_paused($1, $2) AS value")
        .bind::<Text, _>(queue)
        .bind::<Bool, _>(paused)
        .get_result(conn)
        .await?;
    Ok(row.value.unwrap_or(false))
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
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
    validate_queue(queue)?;
    let row: CountRow = diesel::sql_query("SELECT pgfifo.set_failure_policy($1, $2)::bigint AS n")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(policy.as_str())
        .get_result(conn)
        .await?;
    Ok(row.n.unsigned_abs())
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

#[derive(QueryableByName)]
struct PurgeRow {
    #[diesel(sql_type = BigInt)]
    deleted: i64,
    #[diesel(sql_type = BigInt)]
    last_id: i64,
    #[diesel(sql_type = Bool)]
    done: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    first_pending: Option<i64>,
}

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
    if batch < 1 {
        return Err(Error::InvalidArgument(format!(
            "purge batch size must be at least 1 (got {batch})"
        )));
    }
    let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    let row: PurgeRow = diesel::sql_query(
        "SELECT deleted, last_id, done, first_pending FROM pgfifo.purge_jobs(
             now() - make_interval(secs => $1), $2, $3, $4)",
    )
    .bind::<Double, _>(older_than.as_secs_f64())
    .bind::<Array<Text>, _>(states)
    .bind::<BigInt, _>(after_id)
    .bind::<Integer, _>(batch)
    .get_result(conn)
    .await?;
    Ok(PurgeBatch {
        deleted: row.deleted.unsigned_abs(),
        last_id: row.last_id,
        done: row.done,
        first_pending: row.first_pending,
    })
}

/// Deletes jobs in `states` that finished more than `older_than` ago, with
/// their attempt records, in batches of short transactions (queued and
/// running jobs are never touched). Returns how many were deleted.
pub async fn purge(
    conn: &mut AsyncPgConnection,
    older_than: Duration,
    states: &[FinishedState],
) -> Result<u64> {
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

/// Deletes up to `limit` `queue_group` rows idle for more than `idle_for`
/// (groups come back by themselves with their next job). Returns how many.
pub async fn clean_groups(
    conn: &mut AsyncPgConnection,
    idle_for: Duration,
    limit: i32,
) -> Result<u64> {
    let row: CountRow =
        diesel::sql_query("SELECT pgfifo.clean_groups(now() - make_interval(secs => $1), $2) AS n")
            .bind::<Double, _>(idle_for.as_secs_f64())
            .bind::<Integer, _>(limit)
            .get_result(conn)
            .await?;
    Ok(row.n.unsigned_abs())
}

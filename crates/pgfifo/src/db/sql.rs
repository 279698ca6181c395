//! Every SQL statement the runtime sends, with the rows they return.
//!
//! Most of the logic is in the schema's functions (`migrations/*/up.sql`), so
//! that enqueue, pick and completion are one round trip each and their locking
//! contracts sit next to the tables they lock.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::JobId;

/// A raw SQL statement that may be kept prepared on the connection.
///
/// diesel treats every `sql_query` as unsafe to cache, so each call would be
/// parsed and planned again by the server, after an extra round trip to
/// prepare it. pgfifo's statements are static strings with fixed bind types,
/// which is exactly what the statement cache keys on (SQL text and bind
/// types), so they are safe to keep.
#[derive(Debug, Clone)]
struct Prepared<T>(T);

impl<T: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<T> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<T> QueryId for Prepared<T> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<T: Query> Query for Prepared<T> {
    type SqlType = T::SqlType;
}

/// The arguments of `pgfifo.enqueue`, one array element per job.
#[derive(Debug, Default)]
pub(crate) struct EnqueueArrays {
    pub queue: Vec<String>,
    pub group: Vec<Option<String>>,
    pub kind: Vec<String>,
    pub payload: Vec<serde_json::Value>,
    pub priority: Vec<i16>,
    pub max_attempts: Vec<i32>,
    pub unique_key: Vec<Option<String>>,
    pub run_at_us: Vec<Option<i64>>,
    pub delay_us: Vec<Option<i64>>,
}

#[derive(QueryableByName)]
struct IdsRow {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

/// Inserts a batch of jobs; returns their ids in input order.
pub(crate) async fn enqueue(
    conn: &mut AsyncPgConnection,
    jobs: EnqueueArrays,
) -> diesel::QueryResult<Vec<JobId>> {
    let any_unique = jobs.unique_key.iter().any(Option::is_some);
    let row: IdsRow = Prepared(
        diesel::sql_query("SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS ids")
            .bind::<Array<Text>, _>(jobs.queue)
            .bind::<Array<Nullable<Text>>, _>(jobs.group)
            .bind::<Array<Text>, _>(jobs.kind)
            .bind::<Array<Jsonb>, _>(jobs.payload)
            .bind::<Array<SmallInt>, _>(jobs.priority)
            .bind::<Array<Integer>, _>(jobs.max_attempts)
            .bind::<Nullable<Array<Nullable<Text>>>, _>(any_unique.then_some(jobs.unique_key))
            .bind::<Array<Nullable<BigInt>>, _>(jobs.run_at_us)
            .bind::<Array<Nullable<BigInt>>, _>(jobs.delay_us),
    )
    .get_result(conn)
    .await?;
    Ok(row.ids)
}

/// A job locked by `pgfifo.pick`, with the backend pid of the connection that
/// holds it (to cancel a runaway query of a timed-out handler).
#[derive(Debug)]
pub(crate) struct PickedJob {
    pub id: i64,
    pub queue: String,
    pub group_id: Option<String>,
    pub kind: String,
    pub payload: serde_json::Value,
    pub max_attempts: i32,
    /// The group's place in the pick's round-robin order (`None`: ungrouped).
    pub slot: Option<i32>,
    pub backend_pid: i32,
}

/// What a pick found.
#[derive(Debug)]
pub(crate) enum Picked {
    /// Jobs to run, of different groups, each locked.
    Jobs {
        jobs: Vec<PickedJob>,
        /// The pick stopped before it ran out of candidates (at its limit or
        /// its cap): more groups may be free and ready now.
        more: bool,
    },
    /// A group was locked that turned out to have nothing to run (it changed
    /// after the candidate read): commit to release it and pick again. Carries
    /// the group's slot.
    Retry(Option<i32>),
    /// Nothing to run.
    Nothing,
}

#[derive(QueryableByName)]
struct PickRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    group_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    kind: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    payload: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Integer>)]
    max_attempts: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    slot: Option<i32>,
    #[diesel(sql_type = Nullable<Bool>)]
    more: Option<bool>,
    #[diesel(sql_type = Integer)]
    backend_pid: i32,
}

/// Locks and returns up to `limit` jobs of `queues`, of different groups, in
/// the caller's transaction. See `pgfifo.pick` for the locking contract.
///
/// Takes a shared reference so that it can be pipelined behind the previous
/// job's `COMMIT; BEGIN` (see the worker).
pub(crate) async fn pick(
    mut conn: &AsyncPgConnection,
    queues: &[String],
    turn: i32,
    slot: i32,
    idle: &IdleBounds,
    limit: i32,
    held: &[i64],
) -> diesel::QueryResult<Picked> {
    let rows: Vec<PickRow> = Prepared(
        diesel::sql_query(
            "SELECT id, queue, group_id, kind, payload, max_attempts, slot, more, \
                pg_backend_pid() AS backend_pid \
         FROM pgfifo.pick($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind::<Array<Text>, _>(queues)
        .bind::<Integer, _>(turn)
        .bind::<Integer, _>(slot)
        .bind::<Array<Text>, _>(&idle.kinds)
        .bind::<Array<Integer>, _>(&idle.idle_ms)
        .bind::<Integer, _>(idle.default_idle_ms)
        .bind::<Integer, _>(limit)
        .bind::<Array<BigInt>, _>(held),
    )
    .load(&mut conn)
    .await?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut more = false;
    for row in rows {
        more |= row.more.unwrap_or(false);
        match (row.id, row.kind, row.payload, row.max_attempts) {
            (Some(id), Some(kind), Some(payload), Some(max_attempts)) => jobs.push(PickedJob {
                id,
                queue: row.queue,
                group_id: row.group_id,
                kind,
                payload,
                max_attempts,
                slot: row.slot,
                backend_pid: row.backend_pid,
            }),
            // pick returns such a row only alone.
            _ => return Ok(Picked::Retry(row.slot)),
        }
    }
    Ok(if jobs.is_empty() {
        Picked::Nothing
    } else {
        Picked::Jobs { jobs, more }
    })
}

/// How long a job's transaction may sit idle, per job type, before the server
/// ends the session (see `pgfifo.pick`): the type's timeout plus a grace.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdleBounds {
    pub kinds: Vec<String>,
    pub idle_ms: Vec<i32>,
    pub default_idle_ms: i32,
}

#[derive(QueryableByName)]
struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

/// Records the start of an attempt for each job (autocommit, outside the jobs'
/// transactions). Returns `(job id, attempt number)` for the jobs that still
/// had attempts left.
pub(crate) async fn start_attempts(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
    max_attempts: &[i32],
    runner: &str,
) -> diesel::QueryResult<Vec<(i64, i32)>> {
    let rows: Vec<AttemptRow> = Prepared(
        diesel::sql_query("SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, $3)")
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Array<Integer>, _>(max_attempts)
            .bind::<Text, _>(runner),
    )
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.job_id, r.attempt)).collect())
}

/// Deletes the records of attempts that never ran their handler (handed back,
/// or aborted by shutdown), so they do not use up the jobs' attempts.
pub(crate) async fn forget_attempts(
    conn: &mut AsyncPgConnection,
    job_ids: &[i64],
    attempts: &[i32],
) -> diesel::QueryResult<usize> {
    Prepared(
        diesel::sql_query(
            "DELETE FROM pgfifo.job_attempt AS a USING unnest($1, $2) AS t(job_id, attempt) \
             WHERE a.job_id = t.job_id AND a.attempt = t.attempt",
        )
        .bind::<Array<BigInt>, _>(job_ids)
        .bind::<Array<Integer>, _>(attempts),
    )
    .execute(conn)
    .await
}

/// Notes the error of an attempt whose transaction could not record it (its
/// connection was lost or had to be discarded).
pub(crate) async fn note_attempt_error(
    conn: &mut AsyncPgConnection,
    job_id: i64,
    attempt: i32,
    error: &str,
) -> diesel::QueryResult<usize> {
    Prepared(
        diesel::sql_query(
            "UPDATE pgfifo.job_attempt SET error = $3, finished_at = clock_timestamp() \
         WHERE job_id = $1 AND attempt = $2",
        )
        .bind::<BigInt, _>(job_id)
        .bind::<Integer, _>(attempt)
        .bind::<Text, _>(error),
    )
    .execute(conn)
    .await
}

/// Asks the server to cancel the statement running on backend `pid`.
pub(crate) async fn cancel_backend(
    conn: &mut AsyncPgConnection,
    pid: i32,
) -> diesel::QueryResult<usize> {
    Prepared(diesel::sql_query("SELECT pg_cancel_backend($1)").bind::<Integer, _>(pid))
        .execute(conn)
        .await
}

/// The outcome of one attempt, as `pgfifo.complete` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded,
    Retry,
    Failed,
    Cancelled,
}

impl Outcome {
    fn as_sql(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry => "retry",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The outcome of one job's attempt, to be written by [`complete`].
#[derive(Debug)]
pub(crate) struct Completion<'a> {
    pub job: &'a PickedJob,
    pub attempt: i32,
    pub outcome: Outcome,
    pub error: Option<&'a str>,
    pub result: Option<&'a serde_json::Value>,
    pub retry_delay_us: Option<i64>,
}

#[derive(QueryableByName)]
struct ReadyRow {
    #[diesel(sql_type = Bool)]
    ready_now: bool,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    ready_later_us: Option<Vec<i64>>,
}

/// The work a pick's jobs left that nobody is woken for (a group's next job,
/// a retry; see `pgfifo.complete`).
#[derive(Debug, Clone, Default)]
pub(crate) struct LeftWork {
    /// Some is ready now.
    pub now: bool,
    /// How soon each of the rest is ready.
    pub later: Vec<Duration>,
}

/// Counts of microseconds from the server (never negative there; NULL: none).
fn micros_each(us: Option<Vec<i64>>) -> Vec<Duration> {
    us.unwrap_or_default()
        .into_iter()
        .map(|us| Duration::from_micros(us.max(0) as u64))
        .collect()
}

/// Writes the outcomes of a pick's jobs in their transaction (which then
/// commits), in one statement, and reports the work they left.
///
/// Takes a shared reference so it can be pipelined behind a simple query.
pub(crate) async fn complete(
    mut conn: &AsyncPgConnection,
    done: &[Completion<'_>],
) -> diesel::QueryResult<LeftWork> {
    let row: ReadyRow = Prepared(
        diesel::sql_query(
            "SELECT ready_now, ready_later_us \
             FROM pgfifo.complete($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind::<Array<BigInt>, _>(done.iter().map(|d| d.job.id).collect::<Vec<_>>())
        .bind::<Array<Integer>, _>(done.iter().map(|d| d.attempt).collect::<Vec<_>>())
        .bind::<Array<Text>, _>(done.iter().map(|d| d.outcome.as_sql()).collect::<Vec<_>>())
        .bind::<Array<Nullable<Text>>, _>(done.iter().map(|d| d.error).collect::<Vec<_>>())
        .bind::<Array<Nullable<Jsonb>>, _>(done.iter().map(|d| d.result).collect::<Vec<_>>())
        .bind::<Array<Nullable<BigInt>>, _>(
            done.iter().map(|d| d.retry_delay_us).collect::<Vec<_>>(),
        )
        .bind::<Array<Text>, _>(
            done.iter()
                .map(|d| d.job.queue.as_str())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(
            done.iter()
                .map(|d| d.job.group_id.as_deref())
                .collect::<Vec<_>>(),
        ),
    )
    .get_result(&mut conn)
    .await?;
    Ok(LeftWork {
        now: row.ready_now,
        later: micros_each(row.ready_later_us),
    })
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = Integer)]
    n: i32,
}

#[derive(QueryableByName)]
struct PromotedRow {
    #[diesel(sql_type = Integer)]
    promoted: i32,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    ready_later_us: Option<Vec<i64>>,
}

/// What a promote did (see `pgfifo.promote`).
#[derive(Debug, Clone)]
pub(crate) struct Promoted {
    /// The wake rows it consumed: how many groups became active, at most.
    pub groups: i32,
    /// How soon each head it set that is not ready yet is ready.
    pub later: Vec<Duration>,
}

/// Makes groups that enqueuers woke active (autocommit, its own short
/// transaction; never inside a job's transaction).
pub(crate) async fn promote(
    conn: &mut AsyncPgConnection,
    queues: &[String],
    limit: i32,
) -> diesel::QueryResult<Promoted> {
    let row: PromotedRow = Prepared(
        diesel::sql_query("SELECT promoted, ready_later_us FROM pgfifo.promote($1, $2)")
            .bind::<Array<Text>, _>(queues)
            .bind::<Integer, _>(limit),
    )
    .get_result(conn)
    .await?;
    Ok(Promoted {
        groups: row.promoted,
        later: micros_each(row.ready_later_us),
    })
}

/// The backend process id of this connection (the sender's id in the
/// notifications it sends).
pub(crate) async fn backend_pid(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i32> {
    let row: CountRow = diesel::sql_query("SELECT pg_backend_pid() AS n")
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// Tells other runners of `queues` that work is ready there (autocommit: sent
/// at once), on [`CHANNEL`].
pub(crate) async fn announce(
    conn: &mut AsyncPgConnection,
    queues: &[String],
) -> diesel::QueryResult<()> {
    Prepared(
        diesel::sql_query("SELECT pg_notify('pgfifo', q) FROM unnest($1::text[]) AS q")
            .bind::<Array<Text>, _>(queues),
    )
    .execute(conn)
    .await
    .map(drop)
}

/// Subscribes this connection to both wake-up channels.
pub(crate) const LISTEN: &str = "LISTEN pgfifo; LISTEN pgfifo_groups";

/// Work may be ready in a queue (payload: the queue name): an ungrouped job,
/// a group an operator released. A runner wakes a lane for it.
pub(crate) const CHANNEL: &str = "pgfifo";

/// Enqueuers woke groups of a queue (payload: the queue name): they become
/// pickable once promoted, and a runner wakes a lane per group it promoted.
pub(crate) const GROUPS_CHANNEL: &str = "pgfifo_groups";

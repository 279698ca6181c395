//! The runner's statements: its job transactions, the pick, the attempt
//! bookkeeping, completion, promotion and wake-ups.
//!
//! Most of the logic is in the schema's functions (`db/functions/`), so that
//! pick and completion are one round trip each and their locking contracts
//! sit next to the tables they lock. The calls on the hot path are
//! [`Cached`](super::statement::Cached): prepared once per connection.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::pooler::pinned;
use super::statement::{bind, cached};

pub(crate) use super::pick::*;
pub(crate) use super::session_sql::*;

#[derive(QueryableByName)]
struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

const START_ATTEMPTS: &str = "SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, $3)";

/// On the distributed layout, for the jobs of one shard (see below).
const START_ATTEMPTS_ON: &str =
    "SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, $3, $4::integer[])";

/// Records the start of an attempt for each job (autocommit, outside the jobs'
/// transactions). Returns `(job id, attempt number)` for the jobs that still
/// had attempts left. On the distributed layout, `parts` names the parts of
/// the one shard the jobs were picked from (PostgreSQL's text of an array,
/// as the pick left it in `pgfifo.pick_parts`), and the statements are
/// routed there; `None` on a plain database.
pub(crate) async fn start_attempts(
    conn: &mut AsyncPgConnection,
    parts: Option<&str>,
    ids: &[i64],
    max_attempts: &[i32],
    runner: &str,
) -> diesel::QueryResult<Vec<(i64, i32)>> {
    pinned(conn, async |conn| {
        let ids = bind::<Array<BigInt>, _>(ids);
        let max_attempts = bind::<Array<Integer>, _>(max_attempts);
        let runner = bind::<Text, _>(runner);
        let rows: Vec<AttemptRow> = match parts {
            None => {
                cached(START_ATTEMPTS, (ids, max_attempts, runner))
                    .load(conn)
                    .await?
            }
            Some(parts) => {
                let parts = bind::<Text, _>(parts);
                cached(START_ATTEMPTS_ON, (ids, max_attempts, runner, parts))
                    .load(conn)
                    .await?
            }
        };
        Ok(rows.into_iter().map(|r| (r.job_id, r.attempt)).collect())
    })
    .await
}

const FORGET_ATTEMPTS: &str = "DELETE FROM pgfifo.job_attempt AS a \
                               USING unnest($1, $2) AS t(job_id, attempt) \
                               WHERE a.job_id = t.job_id AND a.attempt = t.attempt";

/// Forgets attempts and gives their rate-limited groups their tokens back.
const FORGET_UNSTARTED: &str = "SELECT pgfifo.forget_attempts($1, $2)";

/// Deletes the records of attempts that do not count, so they do not use up
/// the jobs' attempts: `unstarted`, their handlers never ran (handed back:
/// their tokens are given back too); otherwise they were aborted by
/// shutdown (their starts still count against rate limits).
pub(crate) async fn forget_attempts(
    conn: &mut AsyncPgConnection,
    job_ids: &[i64],
    attempts: &[i32],
    unstarted: bool,
) -> diesel::QueryResult<usize> {
    let text = if unstarted {
        FORGET_UNSTARTED
    } else {
        FORGET_ATTEMPTS
    };
    pinned(conn, async |conn| {
        cached(
            text,
            (
                bind::<Array<BigInt>, _>(job_ids),
                bind::<Array<Integer>, _>(attempts),
            ),
        )
        .execute(conn)
        .await
    })
    .await
}

#[derive(QueryableByName)]
struct MicrosRow {
    #[diesel(sql_type = BigInt)]
    us: i64,
}

const NEXT_TOKEN_IN: &str = "SELECT pgfifo.next_token_in($1, $2) AS us";

/// How soon the group's next token is due (zero: it has one, or no limit).
pub(crate) async fn next_token_in(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> diesel::QueryResult<Duration> {
    pinned(conn, async |conn| {
        let row: MicrosRow = cached(
            NEXT_TOKEN_IN,
            (bind::<Text, _>(queue), bind::<Text, _>(group)),
        )
        .get_result(conn)
        .await?;
        Ok(Duration::from_micros(row.us.max(0) as u64))
    })
    .await
}

/// (`now()`, the statement's start in autocommit: Citus refuses a volatile
/// function such as `clock_timestamp()` in an update of a distributed
/// table.)
const NOTE_ATTEMPT_ERROR: &str = "UPDATE pgfifo.job_attempt SET error = $1, finished_at = now() \
                                  WHERE job_id = $2 AND attempt = $3";

/// Notes the error of an attempt whose transaction could not record it (its
/// connection was lost or had to be discarded). On the distributed layout
/// the update looks for the attempt on every shard (a rare path).
pub(crate) async fn note_attempt_error(
    conn: &mut AsyncPgConnection,
    job_id: i64,
    attempt: i32,
    error: &str,
) -> diesel::QueryResult<usize> {
    pinned(conn, async |conn| {
        cached(
            NOTE_ATTEMPT_ERROR,
            (
                bind::<Text, _>(error),
                bind::<BigInt, _>(job_id),
                bind::<Integer, _>(attempt),
            ),
        )
        .execute(conn)
        .await
    })
    .await
}

const CANCEL_BACKEND: &str = "SELECT pg_cancel_backend($1)";

/// Asks the server to cancel the statement running on backend `pid`.
pub(crate) async fn cancel_backend(
    conn: &mut AsyncPgConnection,
    pid: i32,
) -> diesel::QueryResult<usize> {
    pinned(conn, async |conn| {
        cached(CANCEL_BACKEND, (bind::<Integer, _>(pid),))
            .execute(conn)
            .await
    })
    .await
}

/// The state `pgfifo.complete` writes for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completed {
    Succeeded,
    /// Failed an attempt; stays its group's head until the retry is due.
    Retry,
    Failed,
    Cancelled,
    /// Snoozed its group; stays its head, the attempt forgotten.
    Snoozed,
}

impl Completed {
    fn as_sql(self) -> &'static str {
        match self {
            Completed::Succeeded => "succeeded",
            Completed::Retry => "retry",
            Completed::Failed => "failed",
            Completed::Cancelled => "cancelled",
            Completed::Snoozed => "snoozed",
        }
    }
}

/// The outcome of one job's attempt, as [`complete`] writes it.
#[derive(Debug)]
pub(crate) struct Completion<'a> {
    pub job: &'a PickedJob,
    pub attempt: i32,
    pub state: Completed,
    pub error: Option<&'a str>,
    pub result: Option<&'a serde_json::Value>,
    /// For a retry or a snooze: in how many microseconds it is due.
    pub retry_delay_us: Option<i64>,
}

#[derive(QueryableByName)]
struct LeftRow {
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

/// The jobs' batches (`$1`, an array's text, `{}` when none is in a batch)
/// go to `complete` in the transaction-local setting
/// `pgfifo.complete_batches` (0.2.0's runners call the same function
/// without it, and it looks them up), set in this statement: `complete`'s
/// last argument depends on the setting's value, so the call cannot come
/// before it.
const COMPLETE: &str = "SELECT c.ready_now, c.ready_later_us \
                        FROM (SELECT set_config('pgfifo.complete_batches', $1, true) AS batches) AS s \
                        CROSS JOIN LATERAL pgfifo.complete($2, $3, $4, $5, $6, $7, $8, \
                            CASE WHEN s.batches IS NOT NULL THEN $9 END) AS c";

/// The batches of `done`'s jobs as the text of an array, one per job
/// (`NULL` for a job of none), or `{}` when none is in a batch (the common
/// case, which `complete` skips at once).
fn batches_text(done: &[Completion<'_>]) -> String {
    if done.iter().all(|d| d.job.batch_id.is_none()) {
        return "{}".to_owned();
    }
    let items: Vec<String> = done
        .iter()
        .map(|d| {
            d.job
                .batch_id
                .map_or_else(|| "NULL".to_owned(), |b| b.to_string())
        })
        .collect();
    format!("{{{}}}", items.join(","))
}

/// Writes the outcomes of a pick's jobs in their transaction (which then
/// commits), in one statement, and reports the work they left.
///
/// Takes a shared reference so it can be pipelined behind a simple query.
pub(crate) async fn complete(
    mut conn: &AsyncPgConnection,
    done: &[Completion<'_>],
) -> diesel::QueryResult<LeftWork> {
    let ids: Vec<i64> = done.iter().map(|d| d.job.id).collect();
    let attempts: Vec<i32> = done.iter().map(|d| d.attempt).collect();
    let states: Vec<&str> = done.iter().map(|d| d.state.as_sql()).collect();
    let errors: Vec<Option<&str>> = done.iter().map(|d| d.error).collect();
    let results: Vec<Option<&serde_json::Value>> = done.iter().map(|d| d.result).collect();
    let delays: Vec<Option<i64>> = done.iter().map(|d| d.retry_delay_us).collect();
    let queues: Vec<&str> = done.iter().map(|d| d.job.queue.as_str()).collect();
    let groups: Vec<Option<&str>> = done.iter().map(|d| d.job.group_id.as_deref()).collect();
    let row: LeftRow = cached(
        COMPLETE,
        (
            bind::<Text, _>(batches_text(done)),
            bind::<Array<BigInt>, _>(ids),
            bind::<Array<Integer>, _>(attempts),
            bind::<Array<Text>, _>(states),
            bind::<Array<Nullable<Text>>, _>(errors),
            bind::<Array<Nullable<Jsonb>>, _>(results),
            bind::<Array<Nullable<BigInt>>, _>(delays),
            bind::<Array<Text>, _>(queues),
            bind::<Array<Nullable<Text>>, _>(groups),
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

const PROMOTE: &str = "SELECT promoted, ready_later_us FROM pgfifo.promote($1, $2)";

/// Makes groups that enqueuers woke active (autocommit, its own short
/// transaction; never inside a job's transaction).
pub(crate) async fn promote(
    conn: &mut AsyncPgConnection,
    queues: &[String],
    limit: i32,
) -> diesel::QueryResult<Promoted> {
    let row: PromotedRow = cached(
        PROMOTE,
        (bind::<Array<Text>, _>(queues), bind::<Integer, _>(limit)),
    )
    .get_result(conn)
    .await?;
    Ok(Promoted {
        groups: row.promoted,
        later: micros_each(row.ready_later_us),
    })
}

#[derive(QueryableByName)]
struct PidRow {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// The backend process id of this connection (the sender's id in the
/// notifications it sends).
pub(crate) async fn backend_pid(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i32> {
    let row: PidRow = diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result(conn)
        .await?;
    Ok(row.pid)
}

const ANNOUNCE: &str = "SELECT pg_notify('pgfifo', q) FROM unnest($1::text[]) AS q";

/// Tells other runners of `queues` that work is ready there (autocommit: sent
/// at once), on [`CHANNEL`].
pub(crate) async fn announce(
    conn: &mut AsyncPgConnection,
    queues: &[String],
) -> diesel::QueryResult<()> {
    pinned(conn, async |conn| {
        cached(ANNOUNCE, (bind::<Array<Text>, _>(queues),))
            .execute(conn)
            .await
            .map(drop)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{batches_text, Completed, Completion, COMPLETE};
    use crate::db::pick::PickedJob;
    use crate::db::statement::placeholders_in_order;

    fn job(id: i64, batch_id: Option<i64>) -> PickedJob {
        PickedJob {
            id,
            queue: "q".into(),
            group_id: None,
            kind: "k".into(),
            payload: serde_json::Value::Null,
            max_attempts: 1,
            sweep_slot: None,
            backend_pid: 1,
            batch_id,
            under_queue_slot: false,
            shard_parts: None,
            trace: None,
        }
    }

    fn done(job: &PickedJob) -> Completion<'_> {
        Completion {
            job,
            attempt: 1,
            state: Completed::Succeeded,
            error: None,
            result: None,
            retry_delay_us: None,
        }
    }

    /// The batches come first, in a setting, then complete's eight arrays.
    #[test]
    fn the_completion_binds_the_batches_and_eight_arrays_in_order() {
        assert!(placeholders_in_order(COMPLETE, 9), "{COMPLETE}");
    }

    /// One batch per job, in the jobs' order, when any is in a batch; `{}`
    /// (nothing to count) when none is.
    #[test]
    fn the_batches_are_sent_per_job_or_not_at_all() {
        let (a, b, c) = (job(1, None), job(2, Some(7)), job(3, None));
        assert_eq!(batches_text(&[done(&a), done(&c)]), "{}");
        assert_eq!(batches_text(&[]), "{}");
        assert_eq!(
            batches_text(&[done(&a), done(&b), done(&c)]),
            "{NULL,7,NULL}"
        );
    }
}

//! One worker slot: pick a job, run it in its transaction, write the outcome,
//! commit; repeat while picks find work, then wait for a wake-up or the poll.
//!
//! The job's transaction (depth 1) is opened before the pick and holds the
//! group and job row locks until the outcome commits. The handler runs inside
//! a savepoint (depth 2): on failure, the savepoint is rolled back, which
//! discards the handler's writes but keeps the locks, and the failure is
//! written in the same transaction. Handlers' own `transaction` calls nest as
//! further savepoints.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection, TransactionManager};
use futures_util::FutureExt;
use tracing::Instrument;

use super::{JobEvent, JobOutcome, Shared};
use crate::db::sql::{self, Outcome, Picked, PickedJob};
use crate::db::PooledConnection;
use crate::job::{FailureKind, JobContext};
use crate::registry::{Registration, RunFailure};

type Tm = <AsyncPgConnection as AsyncConnection>::TransactionManager;

/// How long the rollback of a timed-out handler may wait for the handler's
/// last statement before that statement is cancelled on the server.
const ROLLBACK_PATIENCE: Duration = Duration::from_secs(2);
/// How long to wait after cancelling before giving the connection up.
const CANCEL_PATIENCE: Duration = Duration::from_secs(5);
/// How long a prefetched job may wait for a free slot before it is handed
/// back. Long enough to cover the normal wait for a handler to finish, short
/// enough that a group does not sit locked behind a long job.
const SLOT_PATIENCE: Duration = Duration::from_secs(2);
/// A wait for a pooled connection longer than this is logged.
const SLOW_POOL: Duration = Duration::from_secs(1);

/// What went wrong with the worker's connection; the worker drops it (the
/// pool discards it, the server aborts its transaction) and starts over.
#[derive(Debug)]
struct ConnectionLost(String);

impl From<diesel::result::Error> for ConnectionLost {
    fn from(err: diesel::result::Error) -> Self {
        ConnectionLost(err.to_string())
    }
}

pub(super) async fn run(shared: Arc<Shared>, slot: usize) {
    let mut turn = slot as i32;
    // Where this worker's round-robin sweep over the groups continues (see
    // `pgfifo.pick`); workers start at random places.
    let mut cursor = random_fraction().mul_add(4_294_967_295.0, -2_147_483_648.0) as i32;
    let mut failures = 0u32;
    'slot: while !shared.stop.is_cancelled() {
        // Register for wake-ups before looking, so that a notification which
        // arrives while this slot picks is not lost.
        let mut notified = pin!(shared.wake.notified());
        notified.as_mut().enable();

        let Some(mut conn) = connection(&shared).await else {
            continue;
        };
        // Drain: keep picking while picks return work; never wait for a timer
        // while there is work. A finished job's outcome is written but its
        // COMMIT travels with the next pick (`pending`).
        let mut pending: Option<JobEvent> = None;
        loop {
            turn = turn.wrapping_add(1);
            let step = if shared.stop.is_cancelled() {
                commit_pending(&shared, &mut conn, &mut pending)
                    .await
                    .map(|()| false)
            } else {
                run_one(&shared, &mut conn, turn, &mut cursor, &mut pending).await
            };
            match step {
                Ok(true) => failures = 0,
                Ok(false) => break,
                Err(ConnectionLost(err)) => {
                    failures += 1;
                    tracing::warn!(error = %err, slot, "pgfifo worker: database connection failed; retrying");
                    drop(conn);
                    tokio::select! {
                        () = tokio::time::sleep(super::bookkeeper::backoff(failures)) => {}
                        () = shared.stop.cancelled() => {}
                    }
                    continue 'slot;
                }
            }
        }
        drop(conn);
        let poll = jittered(shared.config.poll_interval);
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(poll) => {}
            () = shared.stop.cancelled() => {}
        }
    }
}

/// Takes a connection from the pool, or `None` when stopping or the pool
/// failed (logged; the caller loops).
async fn connection(shared: &Shared) -> Option<PooledConnection> {
    let started = Instant::now();
    let result = tokio::select! {
        result = shared.pool.get_owned() => result,
        () = shared.stop.cancelled() => return None,
    };
    let waited = started.elapsed();
    match result {
        Ok(conn) => {
            if waited > SLOW_POOL {
                tracing::warn!(
                    waited_ms = waited.as_millis() as u64,
                    "pgfifo worker waited for a pooled connection: the pool is exhausted \
                     (size it at least concurrency + prefetch + 2 plus the application's needs)"
                );
            }
            Some(conn)
        }
        Err(err) => {
            tracing::warn!(error = %err, waited_ms = waited.as_millis() as u64,
                "pgfifo worker: no pooled connection; jobs wait until one is free");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = shared.stop.cancelled() => {}
            }
            None
        }
    }
}

/// Picks and runs one job. `Ok(false)`: nothing to do.
async fn run_one(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    turn: i32,
    cursor: &mut i32,
    pending: &mut Option<JobEvent>,
) -> Result<bool, ConnectionLost> {
    let picked = match pending.take() {
        // One round trip: commit the previous job, open the next transaction
        // and pick. The simple-query COMMIT; BEGIN is written to the socket
        // before the pick. If the COMMIT fails, PostgreSQL skips the BEGIN and
        // pick refuses to run outside a transaction block, so no job ever
        // runs without its locks.
        Some(done) => {
            let (committed, picked) = {
                let mut shared_conn: &AsyncPgConnection = conn;
                tokio::join!(
                    shared_conn.batch_execute(COMMIT_AND_BEGIN),
                    sql::pick(conn, &shared.queues, turn, *cursor, &shared.idle_bounds)
                )
            };
            if let Err(err) = committed {
                Tm::transaction_manager_status_mut(conn).set_in_error();
                return Err(ConnectionLost(format!(
                    "commit of job {} failed: {err}",
                    done.id
                )));
            }
            set_depth(conn, 1)?;
            shared.emit(done);
            picked
        }
        None => {
            if depth(conn) != Some(1) {
                if let Err(err) = conn.batch_execute(BEGIN_JOB).await {
                    Tm::transaction_manager_status_mut(conn).set_in_error();
                    return Err(err.into());
                }
                set_depth(conn, 1)?;
            }
            sql::pick(conn, &shared.queues, turn, *cursor, &shared.idle_bounds).await
        }
    };
    let job = match picked {
        Ok(Picked::Job(job)) => {
            if let Some(slot) = job.slot {
                *cursor = slot.wrapping_add(1);
            }
            job
        }
        Ok(Picked::Retry(slot)) => {
            // A group changed under the pick: release it and look again.
            if let Some(slot) = slot {
                *cursor = slot.wrapping_add(1);
            }
            Tm::commit_transaction(conn).await?;
            return Ok(true);
        }
        Ok(Picked::Nothing) => {
            // Commit, not roll back: an empty pick may have repaired a stale
            // group head (see pgfifo.pick), and a read-only commit is free.
            Tm::commit_transaction(conn).await?;
            // Groups that enqueuers woke become pickable once promoted. The
            // listener does it on notifications; doing it here too means a
            // lost notification or a dead LISTEN connection only costs a poll.
            let promoted = super::listener::promote_all(shared, conn)
                .await
                .map_err(ConnectionLost)?;
            return Ok(promoted > 0);
        }
        Err(err) => {
            let _ = Tm::rollback_transaction(conn).await;
            return Err(err.into());
        }
    };
    let span = tracing::info_span!(
        "pgfifo.job",
        id = job.id,
        kind = %job.kind,
        queue = %job.queue,
        group = job.group_id.as_deref().unwrap_or(""),
        attempt = tracing::field::Empty,
    );
    *pending = execute(shared, conn, job).instrument(span).await?;
    Ok(true)
}

/// Commits the outcome written last, if any, and emits its event.
async fn commit_pending(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    pending: &mut Option<JobEvent>,
) -> Result<(), ConnectionLost> {
    if let Some(done) = pending.take() {
        if let Err(err) = conn.batch_execute("COMMIT").await {
            Tm::transaction_manager_status_mut(conn).set_in_error();
            return Err(ConnectionLost(format!(
                "commit of job {} failed: {err}",
                done.id
            )));
        }
        set_depth(conn, 0)?;
        shared.emit(done);
    }
    Ok(())
}

/// How a handler run ended.
enum Ran {
    Ok(Option<serde_json::Value>),
    Failed(crate::JobError),
    BadPayload(serde_json::Error),
    Panicked(String),
    TimedOut(Duration),
    Aborted,
}

/// Runs a picked job to its outcome. Returns the outcome's event when the
/// outcome is written and awaits its COMMIT, `None` when the transaction was
/// rolled back (an aborted run), `Err` when the connection must be dropped.
async fn execute(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: PickedJob,
) -> Result<Option<JobEvent>, ConnectionLost> {
    // The handler's savepoint is named as diesel names depth 1's savepoint, so
    // diesel's rollback at depth 2 returns to it. When a slot is free at once,
    // it is set while the bookkeeper records the attempt on its own
    // connection: one round trip for both.
    let slot_now = shared.slots.try_acquire().ok();
    let (savepoint, recorded) = if slot_now.is_some() {
        let mut shared_conn: &AsyncPgConnection = conn;
        let (savepoint, recorded) = tokio::join!(
            shared_conn.batch_execute(SAVEPOINT),
            shared.bookkeeper.start_attempt(job.id, job.max_attempts)
        );
        (Some(savepoint), recorded)
    } else {
        (
            None,
            shared
                .bookkeeper
                .start_attempt(job.id, job.max_attempts)
                .await,
        )
    };
    match savepoint {
        Some(Err(err)) => {
            let _ = Tm::rollback_transaction(conn).await;
            return Err(err.into());
        }
        Some(Ok(())) => set_depth(conn, 2)?,
        None => {}
    }
    let attempt = match recorded {
        Ok(Some(attempt)) => attempt,
        Ok(None) => {
            let error = format!(
                "attempt {0} of {0} never finished (its worker crashed, was killed or lost its \
                 connection); no attempts left",
                job.max_attempts
            );
            return finish_failed(shared, conn, &job, job.max_attempts, error).await;
        }
        Err(err) => {
            let _ = Tm::rollback_transaction(conn).await;
            return Err(ConnectionLost(err));
        }
    };
    tracing::Span::current().record("attempt", attempt);
    let Some(registration) = shared.registry.get(&job.kind) else {
        let error = format!(
            "unknown job type {:?}: no handler is registered for it in this runner",
            job.kind
        );
        return finish_failed(shared, conn, &job, attempt, error).await;
    };
    // Otherwise wait for a free slot: at most `concurrency` handlers run at
    // once. Lanes beyond that have their next job picked, locked and its
    // attempt recorded meanwhile. A job that waits too long is handed back
    // (and its attempt forgotten) rather than sit on its group.
    let permit = match slot_now {
        Some(permit) => permit,
        None => {
            let waited = tokio::select! {
                permit = shared.slots.acquire() => permit.ok(),
                () = tokio::time::sleep(SLOT_PATIENCE) => None,
                () = shared.stop.cancelled() => None,
            };
            let Some(permit) = waited else {
                return hand_back(shared, conn, &job, attempt).await;
            };
            // The job's connection may have died while it waited (a killed
            // backend, a restart, the idle bound): another runner may
            // already run the job. Setting the savepoint now proves that the
            // transaction, and so its locks, is alive before the handler
            // starts.
            if let Err(err) = conn.batch_execute(SAVEPOINT).await {
                shared.bookkeeper.forget_attempt(job.id, attempt).await;
                return Err(ConnectionLost(format!(
                    "the connection of prefetched job {} failed before it started: {err}",
                    job.id
                )));
            }
            set_depth(conn, 2)?;
            permit
        }
    };
    tracing::debug!("job started");

    let timeout = registration
        .timeout
        .unwrap_or(shared.config.default_timeout);
    let ran = run_handler(shared, conn, &job, attempt, registration, timeout).await;
    // The slot is free as soon as the handler is done; writing the outcome and
    // committing overlap with the next handler.
    drop(permit);

    let failure = match ran {
        Ran::Ok(result) => match depth(conn) {
            Some(2) => {
                // Still inside the handler's savepoint: check the handler's
                // deferred constraints now (a violation fails this attempt,
                // with its error, instead of the COMMIT) and write the
                // outcome, in one round trip. No RELEASE: COMMIT releases it.
                let written = {
                    let mut shared_conn: &AsyncPgConnection = conn;
                    let (checked, completed) = tokio::join!(
                        shared_conn.batch_execute(CHECK_CONSTRAINTS),
                        sql::complete(
                            conn,
                            &job,
                            attempt,
                            Outcome::Succeeded,
                            None,
                            result.as_ref(),
                            None
                        )
                    );
                    checked.and(completed)
                };
                match written {
                    Ok(()) => {
                        return Ok(Some(outcome_event(
                            &job,
                            attempt,
                            Outcome::Succeeded,
                            None,
                            None,
                        )))
                    }
                    Err(err) if is_connection_error(&err) => {
                        return Err(ConnectionLost(format!(
                            "writing the outcome of job {}: {err}",
                            job.id
                        )))
                    }
                    Err(err) => FailureText::retry(format!(
                        "the job's transaction failed when its success was written \
                         (a database error the handler did not return?): {err}"
                    )),
                }
            }
            Some(d) if d > 2 => {
                FailureText::retry("the handler returned with a transaction of its own still open")
            }
            // The handler committed or rolled back the job's transaction (or
            // its savepoint) itself: the locks may be gone. Drop the
            // connection; the job runs again.
            _ => {
                shared.bookkeeper.note_error(
                    job.id,
                    attempt,
                    "the handler ended the job's transaction itself (COMMIT or ROLLBACK on ctx.conn())".into(),
                );
                return Err(ConnectionLost(format!(
                    "the handler of job {} ended the job's transaction itself",
                    job.id
                )));
            }
        },
        Ran::Failed(err) => FailureText::from_job_error(err),
        Ran::BadPayload(err) => FailureText::permanent(format!(
            "the payload does not deserialize into {}: {err}",
            (registration.type_name)()
        )),
        Ran::Panicked(message) => FailureText::retry(format!("the handler panicked: {message}")),
        Ran::TimedOut(limit) => {
            FailureText::retry(format!("the handler timed out after {limit:?}"))
        }
        Ran::Aborted => return abort(shared, conn, &job, attempt).await,
    };

    // Discard the handler's writes, keep the locks.
    if !rollback_to(shared, conn, 1, job.backend_pid).await {
        shared
            .bookkeeper
            .note_error(job.id, attempt, failure.message.clone());
        return Err(ConnectionLost(format!(
            "could not roll back the handler of job {} after: {}",
            job.id, failure.message
        )));
    }
    let (outcome, delay) = match failure.kind {
        FailureKind::Retry { after } if attempt < job.max_attempts => (
            Outcome::Retry,
            Some(after.unwrap_or_else(|| backoff(shared, registration, attempt))),
        ),
        FailureKind::Cancel => (Outcome::Cancelled, None),
        _ => (Outcome::Failed, None),
    };
    let message = if outcome == Outcome::Failed && matches!(failure.kind, FailureKind::Retry { .. })
    {
        format!(
            "{} (attempt {attempt} of {}, no attempts left)",
            failure.message, job.max_attempts
        )
    } else {
        failure.message
    };
    finish(shared, conn, &job, attempt, outcome, &message, delay).await
}

/// Runs the handler with its timeout, catching panics, until done or aborted.
async fn run_handler(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
    registration: &Registration,
    timeout: Duration,
) -> Ran {
    let mut ctx = JobContext {
        id: job.id,
        queue: &job.queue,
        group: job.group_id.as_deref(),
        attempt: attempt as u32,
        max_attempts: job.max_attempts as u32,
        conn,
        result: None,
    };
    let outcome = {
        let run = AssertUnwindSafe((registration.run)(&job.payload, &mut ctx)).catch_unwind();
        tokio::select! {
            ran = tokio::time::timeout(timeout, run) => match ran {
                Ok(Ok(Ok(()))) => None,
                Ok(Ok(Err(RunFailure::Handler(err)))) => Some(Ran::Failed(err)),
                Ok(Ok(Err(RunFailure::BadPayload(err)))) => Some(Ran::BadPayload(err)),
                Ok(Err(panic)) => Some(Ran::Panicked(panic_message(&*panic))),
                Err(_) => Some(Ran::TimedOut(timeout)),
            },
            () = shared.abort.cancelled() => Some(Ran::Aborted),
        }
    };
    outcome.unwrap_or(Ran::Ok(ctx.result.take()))
}

/// A failure's message and what to do about it.
struct FailureText {
    kind: FailureKind,
    message: String,
}

impl FailureText {
    fn retry(message: impl Into<String>) -> Self {
        Self {
            kind: FailureKind::Retry { after: None },
            message: message.into(),
        }
    }

    fn permanent(message: String) -> Self {
        Self {
            kind: FailureKind::Permanent,
            message,
        }
    }

    fn from_job_error(err: crate::JobError) -> Self {
        Self {
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// Writes a failure outcome in the job's transaction (at depth 1: the
/// handler's writes are already rolled back); the caller commits it and then
/// emits the returned event. If the database refuses the outcome (an SQL
/// error, not a lost connection), the error is noted on the attempt and the
/// transaction rolled back: the job runs again, its attempt counted.
async fn finish(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
    outcome: Outcome,
    error: &str,
    delay: Option<Duration>,
) -> Result<Option<JobEvent>, ConnectionLost> {
    let delay_us = delay.map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    match sql::complete(conn, job, attempt, outcome, Some(error), None, delay_us).await {
        Ok(()) => Ok(Some(outcome_event(
            job,
            attempt,
            outcome,
            Some(error),
            delay,
        ))),
        Err(err) if is_connection_error(&err) => Err(err.into()),
        Err(err) => {
            let message = format!("{error}; then writing this outcome failed: {err}");
            tracing::error!(error = %message, "could not write the outcome of a job; it will run again");
            shared.bookkeeper.note_error(job.id, attempt, message);
            if rollback_to(shared, conn, 0, job.backend_pid).await {
                Ok(None)
            } else {
                Err(err.into())
            }
        }
    }
}

/// Logs an outcome and builds its event (emitted once it is committed).
fn outcome_event(
    job: &PickedJob,
    attempt: i32,
    outcome: Outcome,
    error: Option<&str>,
    delay: Option<Duration>,
) -> JobEvent {
    let error = error.unwrap_or_default().to_owned();
    let outcome = match outcome {
        Outcome::Succeeded => {
            tracing::debug!("job succeeded");
            JobOutcome::Succeeded
        }
        Outcome::Retry => {
            let delay = delay.unwrap_or_default();
            tracing::warn!(error = %error, retry_in_ms = delay.as_millis() as u64, "job failed; will retry");
            JobOutcome::Retrying { error, delay }
        }
        Outcome::Failed => {
            tracing::error!(error = %error, "job failed for good; kept as failed");
            JobOutcome::Failed { error }
        }
        Outcome::Cancelled => {
            tracing::info!(reason = %error, "job cancelled by its handler");
            JobOutcome::Cancelled { reason: error }
        }
    };
    event(job, attempt, outcome)
}

/// Whether a database error means the connection is gone (as opposed to an
/// SQL error on a working connection).
fn is_connection_error(err: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    !matches!(err, Error::DatabaseError(kind, _) if !matches!(kind, DatabaseErrorKind::ClosedConnection))
}

async fn finish_failed(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
    error: String,
) -> Result<Option<JobEvent>, ConnectionLost> {
    finish(shared, conn, job, attempt, Outcome::Failed, &error, None).await
}

/// Gives back a job that was taken but not started (no free slot in time, or
/// the runner is stopping): forget its attempt and roll back, releasing its
/// group at once.
async fn hand_back(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
) -> Result<Option<JobEvent>, ConnectionLost> {
    shared.bookkeeper.forget_attempt(job.id, attempt).await;
    tracing::debug!("job handed back before it started");
    if !rollback_to(shared, conn, 0, job.backend_pid).await {
        return Err(ConnectionLost(
            "could not roll back a job handed back".into(),
        ));
    }
    // Every slot is busy with long jobs: take nothing until one frees up,
    // rather than lock and hand back job after job.
    tokio::select! {
        permit = shared.slots.acquire() => drop(permit),
        () = shared.stop.cancelled() => {}
    }
    Ok(None)
}

/// Shutdown deadline: forget the attempt (a graceful stop must not use up
/// attempts), roll the whole transaction back; the job runs again later.
async fn abort(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
) -> Result<Option<JobEvent>, ConnectionLost> {
    shared.bookkeeper.forget_attempt(job.id, attempt).await;
    let reason = "aborted by runner shutdown".to_owned();
    tracing::warn!("job aborted by shutdown; it will run again");
    let rolled_back = rollback_to(shared, conn, 0, job.backend_pid).await;
    shared.emit(event(
        job,
        attempt,
        JobOutcome::Aborted {
            reason: reason.clone(),
        },
    ));
    if rolled_back {
        Ok(None)
    } else {
        Err(ConnectionLost(reason))
    }
}

fn event(job: &PickedJob, attempt: i32, outcome: JobOutcome) -> JobEvent {
    JobEvent {
        id: job.id,
        kind: job.kind.clone(),
        queue: job.queue.clone(),
        group: job.group_id.clone(),
        attempt: attempt as u32,
        outcome,
    }
}

/// The handler's savepoint: diesel's name for the savepoint of depth 1.
const SAVEPOINT: &str = "SAVEPOINT diesel_savepoint_1";
/// Ends a job's transaction and opens the next one.
const COMMIT_AND_BEGIN: &str =
    "COMMIT; BEGIN; SELECT set_config('pgfifo.job_transaction', 'on', true)";
/// Opens a job transaction, marked so that `pgfifo.pick` and
/// `pgfifo.complete` can tell it from autocommit (see `pgfifo.pick`).
const BEGIN_JOB: &str = "BEGIN; SELECT set_config('pgfifo.job_transaction', 'on', true)";
/// Checks the handler's deferred constraints before its success is written.
const CHECK_CONSTRAINTS: &str = "SET CONSTRAINTS ALL IMMEDIATE";

/// Tells diesel's transaction manager the depth after transaction statements
/// pgfifo sent itself, so handlers' nested `transaction` calls still become
/// savepoints and pooled connections are judged correctly.
fn set_depth(conn: &mut AsyncPgConnection, target: u32) -> Result<(), ConnectionLost> {
    use diesel::connection::TransactionDepthChange::{DecreaseDepth, IncreaseDepth};
    let status = Tm::transaction_manager_status_mut(conn).transaction_state()?;
    loop {
        let current = status.transaction_depth().map_or(0, |d| d.get());
        match current.cmp(&target) {
            std::cmp::Ordering::Equal => return Ok(()),
            std::cmp::Ordering::Less => status.change_transaction_depth(IncreaseDepth)?,
            std::cmp::Ordering::Greater => status.change_transaction_depth(DecreaseDepth)?,
        }
    }
}

/// The transaction depth diesel tracks (0: none), or `None` if its state is broken.
fn depth(conn: &mut AsyncPgConnection) -> Option<u32> {
    Tm::transaction_manager_status_mut(conn)
        .transaction_depth()
        .ok()
        .map(|d| d.map_or(0, |d| d.get()))
}

/// Rolls back to transaction depth `target` after a handler ended in any way
/// (including a dropped future whose statement may still run on the server:
/// after a while that statement is cancelled). `false`: the connection is
/// unusable and must be dropped, which aborts the transaction on the server.
async fn rollback_to(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    target: u32,
    backend_pid: i32,
) -> bool {
    let unwind = AssertUnwindSafe(async {
        loop {
            match depth(conn) {
                Some(d) if d > target => Tm::rollback_transaction(conn).await?,
                Some(d) if d == target => return Ok(true),
                _ => return Ok::<_, diesel::result::Error>(false),
            }
        }
    })
    // diesel asserts (in debug builds) when a transaction statement of the
    // handler was cut off mid-flight; treat that as a broken connection.
    .catch_unwind();
    let mut unwind = pin!(unwind);
    let result = tokio::select! {
        result = &mut unwind => result,
        () = tokio::time::sleep(ROLLBACK_PATIENCE) => {
            tracing::warn!(backend_pid, "the handler's statement is still running; cancelling it");
            shared.bookkeeper.cancel_backend(backend_pid).await;
            match tokio::time::timeout(CANCEL_PATIENCE, &mut unwind).await {
                Ok(result) => result,
                Err(_) => return false,
            }
        }
    };
    matches!(result, Ok(Ok(true)))
}

/// Exponential backoff from the type's base delay, capped, with jitter (half
/// fixed, half random) so retries of many jobs spread out.
fn backoff(shared: &Shared, registration: &Registration, attempt: i32) -> Duration {
    let exponent = (attempt.max(1) - 1).min(30) as u32;
    let full = registration
        .backoff
        .saturating_mul(1u32 << exponent)
        .min(shared.config.max_backoff);
    full / 2 + full.mul_f64(random_fraction() / 2.0)
}

/// Spreads polls of idle workers over ±25 % of the interval.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.75 + random_fraction() / 2.0)
}

/// A random number in [0, 1) from the standard library's per-instance random
/// hash keys; enough for jitter.
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

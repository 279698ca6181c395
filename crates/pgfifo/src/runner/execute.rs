//! Running one picked job: record its attempt, wait for a slot, run its
//! handler in a savepoint (with its timeout, catching panics), and write the
//! outcome in the job's transaction. The worker commits it.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection, TransactionManager};
use futures_util::FutureExt;

use super::metrics::Run;
use super::txn::{
    depth, is_connection_error, rollback_to, set_depth, ConnectionLost, Tm, CHECK_CONSTRAINTS,
    SAVEPOINT,
};
use super::worker::random_fraction;
use super::{JobEvent, JobOutcome, Shared};
use crate::db::sql::{self, Outcome, PickedJob};
use crate::job::{FailureKind, JobContext};
use crate::registry::{Registration, RunFailure};

/// The longest delay `JobError::retry_after` may ask for (a year): longer
/// ones are cut to it rather than overflow the database's interval type.
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a prefetched job may wait for a free slot before it is handed
/// back. Long enough to cover the normal wait for a handler to finish, short
/// enough that a group does not sit locked behind a long job.
const SLOT_PATIENCE: Duration = Duration::from_secs(2);
/// How a handler run ended.
enum Ran {
    Ok(Option<serde_json::Value>),
    Failed(crate::JobError),
    BadPayload(serde_json::Error),
    Panicked(String),
    TimedOut(Duration),
    Aborted,
}

/// A job whose outcome is written and awaits its COMMIT.
pub(super) struct Done {
    /// The event to broadcast once committed.
    pub event: JobEvent,
    /// The handler's run, if it ran: counted as running until the commit,
    /// and as aborted if the commit fails.
    pub run: Option<Run>,
}

/// Runs a picked job to its outcome. Returns it when the outcome is written
/// and awaits its COMMIT, `None` when the transaction was rolled back (an
/// aborted run), `Err` when the connection must be dropped.
pub(super) async fn execute(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: PickedJob,
) -> Result<Option<Done>, ConnectionLost> {
    // The handler's run, for metrics: dropped here without an outcome (an
    // abort, a lost connection), it counts as aborted.
    let mut run = None;
    let event = run_job(shared, conn, job, &mut run).await?;
    Ok(event.map(|event| Done { event, run }))
}

/// [`execute`], with the handler's run put in `run` when it starts.
async fn run_job(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: PickedJob,
    run: &mut Option<Run>,
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
    *run = shared.metrics.start(&job.queue, &job.kind);

    let timeout = registration
        .timeout
        .unwrap_or(shared.config.default_timeout);
    let ran = run_handler(shared, conn, &job, attempt, registration, timeout).await;
    if let Some(run) = run.as_mut() {
        run.handler_finished();
    }
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
        Ran::Aborted => {
            // Counted as aborted before the event is broadcast.
            drop(run.take());
            return abort(shared, conn, &job, attempt).await;
        }
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
            Some(
                after
                    .map(|delay| delay.min(LONGEST_RETRY_DELAY))
                    .unwrap_or_else(|| backoff(shared, registration, attempt)),
            ),
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

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

//! One attempt of one job of a batch: its handler run, in the handlers'
//! savepoint, with its timeout, panics caught, to a decided outcome.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::batching::Batching;
use super::conn::{ConnectionLost, JobConn};
use super::Lanes;
use crate::context::JobContext;
use crate::db::runner::PickedJob;
use crate::registry::Registration;
use crate::runner::events::JobOutcome;
use crate::runner::metrics::Run;
use crate::runner::outcome::{event, Backoff, Done};
use crate::JobError;

/// An attempt whose outcome is decided.
pub(super) struct Decided {
    pub(super) done: Done,
    /// The handler took the connection: no other job runs in this
    /// transaction after it.
    pub(super) ends_batch: bool,
}

/// How a handler's run ended.
pub(super) enum Ended {
    /// It returned `Ok`, with the result it stored.
    Returned(Option<serde_json::Value>),
    /// It returned an error, or its payload did not deserialize.
    Failed(JobError),
    /// It panicked (the panic's message).
    Panicked(String),
    /// It ran out of time.
    TimedOut(Duration),
    /// Shutdown's deadline passed.
    Aborted,
    /// Another round trip to the server of the job's connection got no
    /// answer in time (see `runner/hung.rs`).
    ServerHung,
}

/// Runs one job of a batch to its outcome: `None` when shutdown aborted it
/// (its attempt is forgotten, its writes discarded); `Err` when the
/// connection must be given up.
pub(super) async fn run_attempt(
    lanes: &Lanes,
    conn: &mut JobConn,
    job: PickedJob,
    attempt: Option<i32>,
    batching: &mut Batching,
) -> Result<Option<Decided>, ConnectionLost> {
    let decided = |done| {
        Ok(Some(Decided {
            done,
            ends_batch: false,
        }))
    };
    let Some(attempt) = attempt else {
        let error = format!(
            "attempt {0} of {0} never finished (its runner crashed, was killed or lost its \
             connection); no attempts left",
            job.max_attempts
        );
        let attempt = job.max_attempts;
        return decided(Done::failed(job, attempt, error));
    };
    let Some(registration) = lanes.registry.get(&job.kind) else {
        let error = format!(
            "unknown job type {:?}: no handler is registered for it in this runner",
            job.kind
        );
        return decided(Done::failed(job, attempt, error));
    };
    tracing::debug!("job started");
    let mut run = lanes.metrics.start(&job.queue, &job.kind);
    let timeout = registration
        .timeout
        .unwrap_or(lanes.settings.default_timeout);
    let handler_started = Instant::now();
    let (ended, used_conn) = run_handler(
        lanes,
        conn,
        &job,
        attempt,
        registration,
        timeout,
        Guard {
            warn_after: lanes.settings.long_transaction_warning,
            run: run.as_ref(),
        },
    )
    .await;
    if let Some(run) = run.as_mut() {
        run.handler_finished();
    }
    let took = handler_started.elapsed();
    lanes.board.handler_ran(took);
    if used_conn {
        batching.single();
    } else {
        batching.ran(took);
    }

    let (failure, cut_off) = match ended {
        Ended::Returned(result) => {
            let mut done = Done::succeeded(job, attempt, result);
            // A handler that wrote: its deferred constraints are checked
            // before the outcome is written (see `write`).
            done.wrote = used_conn;
            done.run = run;
            return Ok(Some(Decided {
                done,
                ends_batch: used_conn,
            }));
        }
        Ended::Failed(err) => (err, false),
        Ended::Panicked(message) => (
            JobError::retry(format!("the handler panicked: {message}")),
            true,
        ),
        Ended::TimedOut(limit) => (
            JobError::retry(format!("the handler timed out after {limit:?}")),
            true,
        ),
        Ended::ServerHung => {
            drop(run);
            conn.mark_hung();
            return Err(ConnectionLost(format!(
                "the database server of job {}'s connection stopped answering; the job runs again",
                job.id
            )));
        }
        Ended::Aborted => {
            // Counted as aborted before the event is broadcast.
            drop(run);
            lanes
                .bookkeeper
                .forget_attempts(vec![(job.id, attempt)], false)
                .await;
            tracing::warn!("job aborted by shutdown; it will run again");
            let discarded = !used_conn
                || conn
                    .discard_handler_writes(lanes, true, job.backend_pid)
                    .await;
            let reason = "aborted by runner shutdown".to_owned();
            lanes
                .events
                .send(event(&job, attempt, JobOutcome::Aborted { reason }));
            return if discarded {
                Ok(None)
            } else {
                Err(ConnectionLost("aborted by runner shutdown".into()))
            };
        }
    };
    // Discard the handler's writes, keep the locks.
    if used_conn
        && !conn
            .discard_handler_writes(lanes, cut_off, job.backend_pid)
            .await
    {
        let message = failure.to_string();
        lanes
            .bookkeeper
            .note_error(job.id, attempt, message.clone());
        return Err(ConnectionLost(format!(
            "could not roll back the handler of job {} after: {message}",
            job.id
        )));
    }
    let backoff = Backoff {
        base: registration.backoff,
        max: lanes.settings.max_backoff,
    };
    let mut done = Done::failure(job, attempt, failure, backoff);
    done.run = run;
    Ok(Some(Decided {
        done,
        ends_batch: used_conn,
    }))
}

/// The default mode's guard against long transactions: warn once after
/// `warn_after`, counting it in `run`'s metrics.
pub(super) struct Guard<'r> {
    pub(super) warn_after: Option<Duration>,
    pub(super) run: Option<&'r Run>,
}

/// Runs the handler with its timeout, catching panics, until done or aborted.
/// Also says whether the handler took the job's connection. Warns once if
/// the job's transaction stays open past the guard's age.
pub(super) async fn run_handler(
    lanes: &Lanes,
    conn: &mut JobConn,
    job: &PickedJob,
    attempt: i32,
    registration: &Registration,
    timeout: Duration,
    guard: Guard<'_>,
) -> (Ended, bool) {
    let host = conn.host();
    let started = Instant::now();
    let mut ctx = JobContext {
        id: job.id,
        queue: &job.queue,
        group: job.group_id.as_deref(),
        attempt: attempt as u32,
        max_attempts: job.max_attempts as u32,
        conn: conn.get(),
        used_conn: false,
        result: None,
    };
    let ended = {
        let run_fut = AssertUnwindSafe((registration.run)(&job.payload, &mut ctx)).catch_unwind();
        let ran = tokio::time::timeout(timeout, run_fut);
        tokio::pin!(ran);
        let mut warn_at = guard.warn_after;
        loop {
            let warn = async {
                match warn_at {
                    Some(age) => tokio::time::sleep(age).await,
                    None => std::future::pending().await,
                }
            };
            break tokio::select! {
                ran = &mut ran => match ran {
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(err))) => Some(Ended::Failed(err)),
                    Ok(Err(panic)) => Some(Ended::Panicked(panic_message(&*panic))),
                    Err(_) => Some(Ended::TimedOut(timeout)),
                },
                () = lanes.abort.cancelled() => Some(Ended::Aborted),
                () = lanes.board.hung.wait_for(&host, started) => Some(Ended::ServerHung),
                () = warn => {
                    warn_long_transaction(job, warn_at.take().unwrap_or_default(), guard.run);
                    continue;
                }
            };
        }
    };
    let ended = ended.unwrap_or_else(|| Ended::Returned(ctx.result.take()));
    (ended, ctx.used_conn)
}

/// The default mode's guard: a job whose transaction has been open for
/// `age` holds back VACUUM's horizon for the whole server. Said once per
/// run, in the job's span.
fn warn_long_transaction(job: &PickedJob, age: Duration, run: Option<&Run>) {
    tracing::warn!(
        kind = %job.kind,
        age = ?age,
        "job of type {:?} has held its transaction open for over {age:?}, which holds back \
         VACUUM for the whole database server; if it runs this long normally, mark \
         the type #[job(long)] (it then runs without an open transaction; see \
         docs/failure-model.md), otherwise shorten it or split the work into steps",
        job.kind
    );
    if let Some(run) = run {
        run.long_transaction();
    }
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

//! Running a pick's jobs: record their attempts, wait for a slot, run their
//! handlers one after another in the pick's transaction (each in the
//! handler's savepoint, with its timeout, catching panics), and write their
//! outcomes. The worker commits them.
//!
//! # Several jobs in one transaction
//!
//! A pick may lock the heads of several groups (see [`Batching`]). Their
//! handlers then run one after another on the pick's connection, and one
//! `pgfifo.complete` and one `COMMIT` serve them all, which divides the
//! per-transaction cost of the queue by the batch size. Every job keeps its
//! own outcome, and nothing of one handler can leak into another's:
//!
//! * a batch goes on past a handler only if that handler never took the
//!   job's connection ([`JobContext::conn`](crate::JobContext::conn)): it
//!   wrote nothing in the transaction, so the next handler starts in the same
//!   clean savepoint. A handler that took it ends the batch; the jobs after
//!   it are handed back unstarted (their attempts forgotten) and picked again
//!   by the next pick;
//! * no handler starts once the batch has run for [`Batching::window`]:
//!   a group whose job finished waits at most that long (plus the handler
//!   then running) for its commit, and so for its next job;
//! * a lane sizes its next pick from what its handlers took: handlers that
//!   use the connection, or take about the window, get one job per pick.
//!
//! Attempts are recorded for the whole pick before the first handler
//! starts (one statement), as for a single job: a crash mid-batch counts an
//! attempt for each job picked, which can cost a job that never started one
//! attempt, never a lost or a duplicated run.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection, TransactionManager};
use futures_util::FutureExt;
use tracing::Instrument;

use super::batching::Batching;
use super::outcome::{event, Done, FailureText};
use super::txn::{
    depth, heard, is_connection_error, rollback_to, set_depth, ConnectionLost, Heard, Tm,
    CHECK_CONSTRAINTS, RELEASE, SAVEPOINT,
};
use super::{JobOutcome, Shared};
use crate::db::sql::{self, Completion, PickedJob};
use crate::job::JobContext;
use crate::registry::{Registration, RunFailure};

/// How long a prefetched pick may wait for a free slot before its jobs are
/// handed back. Long enough to cover the normal wait for a handler to
/// finish, short enough that groups do not sit locked behind a long job.
const SLOT_PATIENCE: Duration = Duration::from_secs(2);

/// What running a pick's jobs left for the worker.
pub(super) struct Finished {
    /// The outcomes written, awaiting their COMMIT (none when the
    /// transaction was rolled back).
    pub(super) done: Vec<Done>,
    /// Whether the worker must pick again at once rather than wait for a
    /// wake-up: a group of these jobs has its next job ready (enqueues into
    /// an active group wake nobody), jobs were handed back, or the
    /// transaction was rolled back.
    pub(super) again: bool,
    /// How soon work these jobs left becomes ready by itself (a retry's
    /// delay, a group's delayed next job): nobody is woken for it, so the
    /// worker notes it for the timer once the outcomes commit.
    pub(super) soon: Vec<Duration>,
}

impl Finished {
    fn rolled_back() -> Self {
        Finished {
            done: Vec::new(),
            again: true,
            soon: Vec::new(),
        }
    }

    /// The outcomes are written, and they left `left`.
    fn written(done: Vec<Done>, left: sql::LeftWork) -> Self {
        Finished {
            done,
            again: left.now,
            soon: left.later,
        }
    }
}

/// Runs a pick's jobs (picked by lane `lane`) to their outcomes (see
/// [`Finished`]); `Err` when the connection must be dropped.
pub(super) async fn execute(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    jobs: Vec<PickedJob>,
    lane: usize,
    batching: &mut Batching,
) -> Result<Finished, ConnectionLost> {
    let backend_pid = jobs[0].backend_pid;
    // The handlers' savepoint is named as diesel names depth 1's savepoint,
    // so diesel's rollback at depth 2 returns to it. It is set while the
    // bookkeeper records the attempts on its own connection: one round trip
    // for both.
    let request = jobs.iter().map(|j| (j.id, j.max_attempts)).collect();
    let (savepoint, recorded) = {
        let mut shared_conn: &AsyncPgConnection = conn;
        tokio::join!(
            shared_conn.batch_execute(SAVEPOINT),
            shared.bookkeeper.start_attempts(request)
        )
    };
    if let Err(err) = savepoint {
        if let Ok(attempts) = &recorded {
            let started = jobs.iter().zip(attempts);
            forget(shared, started.map(|(job, attempt)| (job.id, *attempt))).await;
        }
        let _ = Tm::rollback_transaction(conn).await;
        return Err(err.into());
    }
    set_depth(conn, 2)?;
    let attempts = match recorded {
        Ok(attempts) => attempts,
        Err(err) => {
            let _ = Tm::rollback_transaction(conn).await;
            return Err(ConnectionLost(err));
        }
    };
    let mut jobs: Vec<(PickedJob, Option<i32>)> = jobs.into_iter().zip(attempts).collect();
    // A job on its last attempt must not have it counted while it waits
    // behind other handlers: if the process died meanwhile, it would fail
    // without having run. Its record is taken back now and made again just
    // before its handler starts.
    let mut deferred = Vec::new();
    for (job, attempt) in jobs.iter_mut().skip(1) {
        if *attempt == Some(job.max_attempts) {
            deferred.push((job.id, job.max_attempts));
            *attempt = None;
        }
    }
    shared.bookkeeper.forget_attempts(deferred.clone()).await;

    // Otherwise wait for a free slot: at most `concurrency` handlers run at
    // once. Lanes beyond that have their next jobs picked, locked and their
    // attempts recorded meanwhile. Jobs that wait too long are handed back
    // (and their attempts forgotten) rather than sit on their groups.
    let permit = match shared.slots.try_acquire().ok() {
        Some(permit) => permit,
        None => {
            let waited = tokio::select! {
                permit = shared.slots.acquire() => permit.ok(),
                () = tokio::time::sleep(SLOT_PATIENCE) => None,
                () = shared.stop.cancelled() => None,
            };
            let Some(permit) = waited else {
                hand_back(shared, jobs).await;
                if !rollback_to(shared, conn, 0, backend_pid).await {
                    return Err(ConnectionLost(
                        "could not roll back jobs handed back".into(),
                    ));
                }
                // Their groups are free again: work left for the other lanes.
                shared.hold(lane, []);
                // Every slot is busy with long jobs: take nothing until one
                // frees up, rather than lock and hand back pick after pick.
                tokio::select! {
                    permit = shared.slots.acquire() => drop(permit),
                    () = shared.stop.cancelled() => {}
                }
                return Ok(Finished::rolled_back());
            };
            // The connection may have died while it waited (a killed
            // backend, a restart, the idle bound): another runner may already
            // run these jobs. No handler starts unless the connection is
            // known to be alive: by what its driver heard (no round trip),
            // or else by a round trip. Yielding first lets the runtime read
            // the sockets, so an error already in this one is heard.
            tokio::task::yield_now().await;
            let alive = match heard(conn) {
                Heard::Nothing => Ok(()),
                Heard::Closed => Err("the connection closed".to_owned()),
                Heard::Unsure => conn
                    .batch_execute("SELECT 1")
                    .await
                    .map_err(|e| e.to_string()),
            };
            if let Err(err) = alive {
                hand_back(shared, jobs).await;
                return Err(ConnectionLost(format!(
                    "the connection of prefetched jobs failed before they started: {err}"
                )));
            }
            permit
        }
    };

    let picked = jobs.len();
    let mut done: Vec<Done> = Vec::with_capacity(picked);
    let started = Instant::now();
    let mut rest = jobs.drain(..);
    while let Some((job, mut attempt)) = rest.next() {
        if !done.is_empty()
            && (started.elapsed() >= batching.window() || shared.stop.is_cancelled())
        {
            hand_back(shared, std::iter::once((job, attempt)).chain(rest)).await;
            break;
        }
        if deferred.contains(&(job.id, job.max_attempts)) {
            match shared
                .bookkeeper
                .start_attempts(vec![(job.id, job.max_attempts)])
                .await
            {
                Ok(recorded) => attempt = recorded.first().copied().flatten(),
                Err(err) => {
                    hand_back(shared, rest).await;
                    return Err(ConnectionLost(err));
                }
            }
        }
        let span = tracing::info_span!(
            "pgfifo.job",
            id = job.id,
            kind = %job.kind,
            queue = %job.queue,
            group = job.group_id.as_deref().unwrap_or(""),
            attempt = attempt,
        );
        let step = match run_job(shared, conn, job, attempt, batching)
            .instrument(span.clone())
            .await
        {
            Ok(step) => step,
            Err(lost) => {
                // The process goes on: the jobs that did not start keep no
                // attempt (they run again elsewhere once the connection is
                // gone and the transaction with it).
                hand_back(shared, rest).await;
                return Err(lost);
            }
        };
        match step {
            Step::Next(one) => {
                span.in_scope(|| one.log());
                done.push(one);
            }
            Step::Last(one) => {
                span.in_scope(|| one.log());
                done.push(one);
                hand_back(shared, rest).await;
                break;
            }
            Step::Aborted => {
                hand_back(shared, rest).await;
                break;
            }
        }
    }
    // The slot is free as soon as the handlers are done; writing the
    // outcomes and committing overlap with the next handler.
    drop(permit);
    let handed_back = done.len() < picked;
    let mut finished = write(shared, conn, done, backend_pid, batching).await?;
    finished.again |= handed_back;
    Ok(finished)
}

/// What a job's run means for the rest of its pick.
enum Step {
    /// Decided; the next job may run in the same transaction.
    Next(Done),
    /// Decided; the handler took the connection, so the batch ends here.
    Last(Done),
    /// Aborted by shutdown: its attempt is forgotten, its writes discarded.
    Aborted,
}

/// Runs one job of a pick (in the handlers' savepoint) to its outcome.
async fn run_job(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: PickedJob,
    attempt: Option<i32>,
    batching: &mut Batching,
) -> Result<Step, ConnectionLost> {
    let Some(attempt) = attempt else {
        let error = format!(
            "attempt {0} of {0} never finished (its worker crashed, was killed or lost its \
             connection); no attempts left",
            job.max_attempts
        );
        let attempt = job.max_attempts;
        return Ok(Step::Next(Done::failed(job, attempt, error)));
    };
    let Some(registration) = shared.registry.get(&job.kind) else {
        let error = format!(
            "unknown job type {:?}: no handler is registered for it in this runner",
            job.kind
        );
        return Ok(Step::Next(Done::failed(job, attempt, error)));
    };
    tracing::debug!("job started");
    let mut run = shared.metrics.start(&job.queue, &job.kind);
    let timeout = registration
        .timeout
        .unwrap_or(shared.config.default_timeout);
    let handler_started = Instant::now();
    let (ran, used_conn) = run_handler(shared, conn, &job, attempt, registration, timeout).await;
    if let Some(run) = run.as_mut() {
        run.handler_finished();
    }
    let took = handler_started.elapsed();
    shared.handler_ran(took);
    if used_conn {
        batching.single();
    } else {
        batching.ran(took);
    }

    let failure = match ran {
        Ran::Ok(result) if !used_conn => {
            let mut one = Done::succeeded(job, attempt, result);
            one.run = run;
            return Ok(Step::Next(one));
        }
        Ran::Ok(result) => match depth(conn) {
            // Still inside the handlers' savepoint: the outcome is written
            // after its deferred constraints are checked (see `write`).
            Some(2) => {
                let mut one = Done::succeeded(job, attempt, result);
                one.wrote = true;
                one.run = run;
                return Ok(Step::Last(one));
            }
            Some(d) if d > 2 => {
                FailureText::retry("the handler returned with a transaction of its own still open")
            }
            // The handler committed or rolled back the job's transaction (or
            // its savepoint) itself: the locks may be gone. Drop the
            // connection; the jobs run again.
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
            drop(run);
            shared
                .bookkeeper
                .forget_attempts(vec![(job.id, attempt)])
                .await;
            tracing::warn!("job aborted by shutdown; it will run again");
            let discarded = !used_conn || rollback_to(shared, conn, 1, job.backend_pid).await;
            let reason = "aborted by runner shutdown".to_owned();
            shared.emit(event(&job, attempt, JobOutcome::Aborted { reason }));
            return if discarded {
                Ok(Step::Aborted)
            } else {
                Err(ConnectionLost("aborted by runner shutdown".into()))
            };
        }
    };
    // Discard the handler's writes, keep the locks.
    if used_conn && !rollback_to(shared, conn, 1, job.backend_pid).await {
        shared
            .bookkeeper
            .note_error(job.id, attempt, failure.message.clone());
        return Err(ConnectionLost(format!(
            "could not roll back the handler of job {} after: {}",
            job.id, failure.message
        )));
    }
    let mut one = Done::failure(shared, registration, job, attempt, failure);
    one.run = run;
    Ok(if used_conn {
        Step::Last(one)
    } else {
        Step::Next(one)
    })
}

/// Writes the outcomes of a pick's jobs in their transaction; the worker
/// commits them. A handler that took the connection and succeeded is always
/// the last: its deferred constraints are checked in the same round trip,
/// and if they (or the outcome's write) fail, its writes are rolled back and
/// the failure is written instead. If the database refuses the outcomes
/// otherwise (an SQL error, not a lost connection), the error is noted on
/// each attempt and the transaction rolled back: the jobs run again, their
/// attempts counted (one job per pick for a while, so that a job whose
/// outcome cannot be written does not take others down with it).
async fn write(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    mut done: Vec<Done>,
    backend_pid: i32,
    batching: &mut Batching,
) -> Result<Finished, ConnectionLost> {
    if done.is_empty() {
        return if rollback_to(shared, conn, 0, backend_pid).await {
            Ok(Finished::rolled_back())
        } else {
            Err(ConnectionLost(
                "could not roll back a pick that ran no job".into(),
            ))
        };
    }
    let check = done.last().is_some_and(|d| d.wrote) && depth(conn) == Some(2);
    // Not pipelined with the COMMIT that follows: diesel prepares a statement
    // in a round trip of its own the first time, which would let the COMMIT
    // overtake the outcomes and release the jobs unfinished.
    let written = if check {
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        let mut shared_conn: &AsyncPgConnection = conn;
        let (checked, completed) = tokio::join!(
            shared_conn.batch_execute(CHECK_CONSTRAINTS),
            sql::complete(conn, &completions)
        );
        checked.and(completed)
    } else if depth(conn) == Some(2) {
        // No handler wrote anything: release the savepoint first, in the same
        // round trip. An update inside a savepoint of a row its transaction
        // locked outside it makes PostgreSQL record both in a multixact,
        // which every later reader of the row version must look up; the
        // job's and the group's rows would each get one per job.
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        let mut shared_conn: &AsyncPgConnection = conn;
        let (released, completed) = tokio::join!(
            shared_conn.batch_execute(RELEASE),
            sql::complete(conn, &completions)
        );
        if released.is_ok() {
            set_depth(conn, 1)?;
        }
        released.and(completed)
    } else {
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        sql::complete(conn, &completions).await
    };
    let err = match written {
        Ok(left) => return Ok(Finished::written(done, left)),
        Err(err) if is_connection_error(&err) => return Err(err.into()),
        Err(err) => err,
    };
    if check && rollback_to(shared, conn, 1, backend_pid).await {
        let last = done.pop().expect("checked above");
        let registration = shared
            .registry
            .get(&last.job.kind)
            .expect("the job's handler ran");
        let failure = FailureText::retry(format!(
            "the job's transaction failed when its success was written \
             (a database error the handler did not return?): {err}"
        ));
        let run = last.run;
        let mut failed = Done::failure(shared, registration, last.job, last.attempt, failure);
        failed.run = run;
        tracing::info_span!("pgfifo.job", id = failed.job.id).in_scope(|| failed.log());
        done.push(failed);
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        match sql::complete(conn, &completions).await {
            Ok(left) => return Ok(Finished::written(done, left)),
            Err(err) if is_connection_error(&err) => return Err(err.into()),
            Err(err) => return refused(shared, conn, done, &err, backend_pid, batching).await,
        }
    }
    refused(shared, conn, done, &err, backend_pid, batching).await
}

/// The database refused the outcomes: note the error on each attempt, roll
/// back; the jobs run again. Dropping their runs counts them as aborted.
async fn refused(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    done: Vec<Done>,
    err: &diesel::result::Error,
    backend_pid: i32,
    batching: &mut Batching,
) -> Result<Finished, ConnectionLost> {
    batching.single();
    for one in done {
        let message = match &one.error {
            Some(error) => format!("{error}; then writing this outcome failed: {err}"),
            None => format!("the job succeeded, then writing its outcome failed: {err}"),
        };
        tracing::error!(id = one.job.id, error = %message,
            "could not write the outcome of a job; it will run again");
        shared
            .bookkeeper
            .note_error(one.job.id, one.attempt, message);
    }
    if rollback_to(shared, conn, 0, backend_pid).await {
        Ok(Finished::rolled_back())
    } else {
        Err(ConnectionLost(err.to_string()))
    }
}

/// Forgets the attempts of jobs that were picked but not started; they are
/// released when the transaction ends and picked again.
async fn hand_back(shared: &Shared, jobs: impl IntoIterator<Item = (PickedJob, Option<i32>)>) {
    forget(
        shared,
        jobs.into_iter().map(|(job, attempt)| (job.id, attempt)),
    )
    .await;
}

/// Deletes the recorded attempts `(job id, attempt)` of jobs that did not
/// start.
async fn forget(shared: &Shared, attempts: impl Iterator<Item = (i64, Option<i32>)>) {
    let attempts: Vec<(i64, i32)> = attempts
        .filter_map(|(id, attempt)| Some((id, attempt?)))
        .collect();
    if !attempts.is_empty() {
        tracing::debug!(
            jobs = attempts.len(),
            "jobs handed back before they started"
        );
    }
    shared.bookkeeper.forget_attempts(attempts).await;
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

/// Runs the handler with its timeout, catching panics, until done or aborted.
/// Also says whether the handler took the job's connection.
async fn run_handler(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
    registration: &Registration,
    timeout: Duration,
) -> (Ran, bool) {
    let mut ctx = JobContext {
        id: job.id,
        queue: &job.queue,
        group: job.group_id.as_deref(),
        attempt: attempt as u32,
        max_attempts: job.max_attempts as u32,
        conn,
        used_conn: false,
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
    let ran = outcome.unwrap_or_else(|| Ran::Ok(ctx.result.take()));
    (ran, ctx.used_conn)
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

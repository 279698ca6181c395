//! One attempt of a drained job, as a runner's lane makes it: in the job's
//! transaction under the handlers' savepoint, or, for a type in long mode,
//! claimed (`pgfifo.claim_long_run`) and run without a transaction, its
//! outcome written fenced by the claim.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::FutureExt;

use crate::context::JobContext;
use crate::db::long_run;
use crate::db::runner::{self as sql, PickedJob};
use crate::registry::Registration;
use crate::runner::outcome::{Backoff, Done};
use crate::{Error, JobError, Result};

/// The runner settings a drain's attempts follow.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// The timeout of types that set none.
    pub default_timeout: Duration,
    /// The longest retry backoff.
    pub max_backoff: Duration,
    /// A long run's lease.
    pub long_lease: Duration,
}

/// How a handler's call ended: its result, and whether it took the
/// connection.
type Called = (
    std::result::Result<Option<serde_json::Value>, JobError>,
    bool,
);

/// Calls the registered handler of `job` on `conn` with its timeout; a
/// panic or a timeout is a retryable failure, as in the runner.
async fn call(
    conn: &mut AsyncPgConnection,
    job: &PickedJob,
    attempt: i32,
    registration: &Registration,
    limits: &Limits,
) -> Called {
    let timeout = registration.timeout.unwrap_or(limits.default_timeout);
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
    let run = AssertUnwindSafe((registration.run)(&job.payload, &mut ctx)).catch_unwind();
    let ended = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(Ok(()))) => Ok(ctx.result.take()),
        Ok(Ok(Err(err))) => Err(err),
        Ok(Err(panic)) => Err(JobError::retry(format!(
            "the handler panicked: {}",
            panic_message(&*panic)
        ))),
        Err(_) => Err(JobError::retry(format!(
            "the handler timed out after {timeout:?}"
        ))),
    };
    (ended, ctx.used_conn)
}

/// The decided outcome of a call.
fn decide(
    job: PickedJob,
    attempt: i32,
    registration: &Registration,
    limits: &Limits,
    ended: std::result::Result<Option<serde_json::Value>, JobError>,
) -> Done {
    match ended {
        Ok(result) => Done::succeeded(job, attempt, result),
        Err(failure) => {
            let backoff = Backoff {
                base: registration.backoff,
                max: limits.max_backoff,
            };
            Done::failure(job, attempt, failure, backoff)
        }
    }
}

/// Runs `job` in its open job transaction under the handlers' savepoint:
/// a failed handler's writes are rolled back, a successful one's deferred
/// constraints checked. The caller writes the outcome and commits.
pub(super) async fn run_in_transaction(
    conn: &mut AsyncPgConnection,
    job: PickedJob,
    attempt: i32,
    registration: &Registration,
    limits: &Limits,
) -> Result<Done> {
    conn.batch_execute(sql::HANDLER_SAVEPOINT).await?;
    let (ended, used_conn) = call(conn, &job, attempt, registration, limits).await;
    let ended = match ended {
        Ok(result) if used_conn => match conn.batch_execute(sql::CHECK_CONSTRAINTS).await {
            Ok(()) => Ok(result),
            Err(err) => Err(JobError::retry(err)),
        },
        other => other,
    };
    if ended.is_err() {
        conn.batch_execute(sql::ROLLBACK_TO_HANDLER_SAVEPOINT)
            .await?;
    }
    conn.batch_execute(sql::RELEASE_HANDLER_SAVEPOINT).await?;
    Ok(decide(job, attempt, registration, limits, ended))
}

/// Runs `job`, of a type in long mode, as a runner does: claims it in its
/// job transaction, which commits at once; runs the handler with the
/// connection in autocommit (its writes commit as they go); then writes
/// the outcome in a short transaction fenced by the claim, and releases
/// the claim's lock. `None`: the claim was refused (its lock is taken), the
/// attempt forgotten, the job handed back.
pub(super) async fn run_long(
    conn: &mut AsyncPgConnection,
    book: &mut AsyncPgConnection,
    job: PickedJob,
    attempt: i32,
    registration: &Registration,
    limits: &Limits,
) -> Result<Option<Done>> {
    let lease_ms = i32::try_from(limits.long_lease.as_millis()).unwrap_or(i32::MAX);
    let claim = long_run::claim(
        conn,
        job.id,
        &job.queue,
        job.group_id.as_deref(),
        attempt,
        super::DRAIN_RUNNER,
        lease_ms,
    )
    .await?;
    let Some(claim) = claim else {
        conn.batch_execute(sql::ROLLBACK).await?;
        sql::forget_attempts(book, &[job.id], &[attempt], true).await?;
        return Ok(None);
    };
    conn.batch_execute(sql::COMMIT).await?;
    let (ended, _) = call(conn, &job, attempt, registration, limits).await;
    let done = decide(job, attempt, registration, limits, ended);
    conn.batch_execute(sql::BEGIN_JOB).await?;
    if !long_run::end(conn, done.job.id, claim.token).await? {
        conn.batch_execute(sql::ROLLBACK).await?;
        return Err(Error::InvalidArgument(format!(
            "the long run of job {} was reclaimed while the drain ran it (its handler ran \
             longer than the lease, {:?}, and something picked its group)",
            done.job.id, limits.long_lease
        )));
    }
    sql::complete(conn, &[done.completion()]).await?;
    conn.batch_execute(sql::COMMIT).await?;
    long_run::unlock(conn, claim.lock_key).await?;
    Ok(Some(done))
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

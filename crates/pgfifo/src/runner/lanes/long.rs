//! Jobs of types in long mode (`#[job(long)]`): their group is held without
//! an open transaction.
//!
//! A long job is picked like any other, in a job transaction `T` that locks
//! its group row and its job row. Instead of running the handler in `T`,
//! the lane *claims* the job (`pgfifo.claim_long_run`): a committed row of
//! `pgfifo.job_run` with a fencing token, the group marked as held, and a
//! session-level advisory lock taken on the lane's connection. `T` then
//! commits at once, so the connection holds no transaction id and no
//! snapshot while the handler runs: VACUUM's horizon is not held back.
//!
//! * **Crash.** The advisory lock dies with the session. The next pick that
//!   meets the group finds the lock free, deletes the run's row and runs
//!   the job again (`pgfifo.long_run_free`).
//! * **Freeze.** While the handler runs, a task renews the run's lease every
//!   third of [`RunnerConfig::long_lease`](crate::RunnerConfig::long_lease).
//!   A frozen process renews nothing; once the lease has passed, the next
//!   pick that meets the group ends the holder's backend, and the pick after
//!   that reclaims the job.
//! * **Completion** is a short transaction on the same connection that first
//!   deletes the run's row *with its token* (`pgfifo.end_long_run`): if the
//!   run was reclaimed, that finds nothing and nothing is written. Then the
//!   outcome is written by `pgfifo.complete` as for any job, the
//!   transaction commits, and only then is the advisory lock released.
//!
//! What the handler writes through `ctx.conn()` is in autocommit and
//! commits as it goes: long mode gives up atomic completion.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use tokio::sync::SemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::attempt::{run_handler, Ended, Guard};
use super::conn::{ConnectionLost, JobConn};
use super::write::Finished;
use super::Lanes;
use crate::db::error::is_connection_error;
use crate::db::long_run::{self, Claim};
use crate::db::runner::{self as sql, LeftWork, PickedJob, BEGIN_JOB, COMMIT, ROLLBACK};
use crate::db::Pool;
use crate::runner::events::JobOutcome;
use crate::runner::outcome::{event, Backoff, Done};
use crate::JobError;

/// How soon a job whose claim found its lock taken is looked at again.
const LOCK_TAKEN: Duration = Duration::from_millis(50);

/// Whether `job` runs in long mode: its type says so and it has a group.
/// (An ungrouped job of a long type runs in the default mode.)
pub(super) fn is_long(lanes: &Lanes, job: &PickedJob) -> bool {
    job.group_id.is_some() && lanes.registry.get(&job.kind).is_some_and(|r| r.long)
}

/// Says once per process that long mode is unavailable on this pool.
pub(super) fn warn_pooled() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "jobs of types in long mode run in the default mode (an open transaction): \
             the pool goes through a transaction-mode pooler, which cannot keep the \
             session-level lock that long mode needs"
        );
    }
}

/// Runs picked job `job` (attempt `attempt`, recorded) in long mode: claims
/// it in the pick's transaction and commits, runs its handler outside any
/// transaction, and writes its outcome fenced by the claim. Holds `permit`
/// while the handler runs. `Err` when the lane's connection must be given up.
pub(super) async fn run_long(
    lanes: &Lanes,
    conn: &mut JobConn,
    job: PickedJob,
    attempt: i32,
    lane: usize,
    permit: SemaphorePermit<'_>,
) -> Result<Finished, ConnectionLost> {
    let registration = lanes.registry.get(&job.kind).expect("checked by is_long");
    let lease_ms = millis(lanes.settings.long_lease);
    let claimed = conn
        .bounded_on(async |c| {
            long_run::claim(
                c,
                job.id,
                &job.queue,
                job.group_id.as_deref(),
                attempt,
                &lanes.settings.runner,
                lease_ms,
            )
            .await
        })
        .await;
    let claim = match claimed {
        Ok(Some(claim)) => claim,
        Ok(None) => {
            // Its lock is held by a session that is still ending (or a
            // hash collision): hand it back, look again in a moment.
            lanes
                .bookkeeper
                .forget_attempts(vec![(job.id, attempt)], true)
                .await;
            conn.rollback().await?;
            lanes.board.note_locked(lane, []);
            lanes.timer.add(LOCK_TAKEN);
            return Ok(Finished::rolled_back());
        }
        Err(err) => {
            lanes
                .bookkeeper
                .forget_attempts(vec![(job.id, attempt)], true)
                .await;
            let _ = conn.rollback().await;
            return Err(err.into());
        }
    };
    // The claim commits: from here on the connection is in autocommit.
    conn.commit().await?;
    lanes.board.note_locked(lane, []);
    tracing::debug!(token = claim.token, "long job claimed");

    let renewing = CancellationToken::new();
    tokio::spawn(renew(
        lanes.pool.clone(),
        claim.token,
        lanes.settings.long_lease,
        renewing.clone(),
    ));
    let mut run = lanes.metrics.start(&job.queue, &job.kind);
    let timeout = registration
        .timeout
        .unwrap_or(lanes.settings.default_timeout);
    let started = std::time::Instant::now();
    let (ended, used_conn) = run_handler(
        lanes,
        conn,
        &job,
        attempt,
        registration,
        timeout,
        Guard {
            warn_after: None,
            run: None,
        },
    )
    .await;
    renewing.cancel();
    drop(permit);
    if let Some(run) = run.as_mut() {
        run.handler_finished();
    }
    lanes.board.handler_ran(started.elapsed());
    let (failure, cut_off) = match ended {
        Ended::Returned(result) => {
            let mut done = Done::succeeded(job, attempt, result);
            done.run = run;
            return finish(lanes, conn, done, claim, false).await;
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
                "the database server of long job {}'s connection stopped answering; the job runs again",
                job.id
            )));
        }
        Ended::Aborted => {
            drop(run);
            lanes
                .bookkeeper
                .forget_attempts(vec![(job.id, attempt)], false)
                .await;
            tracing::warn!("long job aborted by shutdown; it will run again");
            let reason = "aborted by runner shutdown".to_owned();
            lanes
                .events
                .send(event(&job, attempt, JobOutcome::Aborted { reason }));
            return give_up(lanes, conn, job.id, claim, used_conn).await;
        }
    };
    // (The attempt's span is the current one: see `batch::attempt_span`.)
    #[cfg(feature = "otel")]
    crate::otel::attempt_failed(&tracing::Span::current());
    let backoff = Backoff {
        base: registration.backoff,
        max: lanes.settings.max_backoff,
    };
    let mut done = Done::failure(job, attempt, failure, backoff);
    done.run = run;
    // A handler cut off while it used the connection may have left a
    // statement running or a transaction open on it.
    finish(lanes, conn, done, claim, cut_off && used_conn).await
}

/// Writes the outcome of a long run, fenced by its claim, and releases the
/// claim's lock; `tainted`: the lane's connection may be mid-statement, so
/// the outcome goes through another connection and the lane's is retired
/// (which releases the lock with its session).
async fn finish(
    lanes: &Lanes,
    conn: &mut JobConn,
    done: Done,
    claim: Claim,
    tainted: bool,
) -> Result<Finished, ConnectionLost> {
    let written = if tainted {
        conn.retire();
        match lanes.pool.get().await {
            Ok(mut other) => write_fenced(&mut other, &done, claim).await,
            Err(err) => Err(diesel::result::Error::QueryBuilderError(
                err.to_string().into(),
            )),
        }
    } else {
        conn.bounded_on(async |c| write_fenced(c, &done, claim).await)
            .await
    };
    let left = match written {
        Ok(Some(left)) => left,
        Ok(None) => {
            tracing::warn!(
                id = done.job.id,
                "the long run was taken over by another runner (its lock was seen free): \
                 its outcome is not written"
            );
            return release_lock(conn, claim, tainted).await;
        }
        Err(err) if is_connection_error(&err) => return Err(err.into()),
        Err(err) => {
            // Refused: the run stays claimed until its lock goes, then the
            // job is reclaimed and runs again (its attempt counted).
            tracing::error!(id = done.job.id, error = %err,
                "could not write the outcome of a long job; it will run again");
            lanes
                .bookkeeper
                .note_error(done.job.id, done.attempt, err.to_string());
            return release_lock(conn, claim, tainted).await;
        }
    };
    done.log();
    let finished = Finished {
        done: Vec::new(),
        again: true,
        continues: left.now,
        soon: Vec::new(),
    };
    let event = done.event();
    lanes.metrics.committed(&event, done.run);
    lanes.events.send(event);
    for later in left.later {
        lanes.timer.add(later);
    }
    release_lock(conn, claim, tainted).await?;
    Ok(finished)
}

/// The outcome's transaction: `None` when the claim is no longer this
/// run's (nothing written).
async fn write_fenced(
    conn: &mut AsyncPgConnection,
    done: &Done,
    claim: Claim,
) -> diesel::QueryResult<Option<LeftWork>> {
    conn.batch_execute(BEGIN_JOB).await?;
    let written = async {
        if !long_run::end(conn, done.job.id, claim.token).await? {
            conn.batch_execute(ROLLBACK).await?;
            return Ok(None);
        }
        let left = sql::complete(conn, &[done.completion()]).await?;
        conn.batch_execute(COMMIT).await?;
        Ok(Some(left))
    }
    .await;
    if written.is_err() {
        let _ = conn.batch_execute(ROLLBACK).await;
    }
    written
}

/// Gives a run up without an outcome (shutdown): the job runs again.
async fn give_up(
    lanes: &Lanes,
    conn: &mut JobConn,
    job_id: i64,
    claim: Claim,
    used_conn: bool,
) -> Result<Finished, ConnectionLost> {
    let tainted = used_conn;
    let released = if tainted {
        conn.retire();
        match lanes.pool.get().await {
            Ok(mut other) => long_run::release(&mut other, job_id, claim.token).await,
            Err(_) => Ok(false),
        }
    } else {
        conn.bounded_on(async |c| long_run::release(c, job_id, claim.token).await)
            .await
    };
    if let Err(err) = released {
        tracing::warn!(error = %err, "could not give the long run up; its lock goes with the connection");
        conn.retire();
    }
    release_lock(conn, claim, tainted).await?;
    Ok(Finished::rolled_back())
}

/// Releases the claim's session-level lock, or leaves it to the session's
/// end when the connection is to be retired.
async fn release_lock(
    conn: &mut JobConn,
    claim: Claim,
    tainted: bool,
) -> Result<Finished, ConnectionLost> {
    if !tainted && !conn.must_retire() {
        conn.bounded_on(async |c| long_run::unlock(c, claim.lock_key).await)
            .await?;
    }
    Ok(Finished::rolled_back())
}

/// Renews the lease of run `token` every third of `lease` until `stop`.
async fn renew(pool: Pool, token: i64, lease: Duration, stop: CancellationToken) {
    let every = lease / 3;
    let lease_ms = millis(lease);
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        // Within the renewal period: a renewal stuck on a hung server is
        // given up (the next one takes another connection).
        let renewal = async {
            match pool.get().await {
                Ok(mut conn) => long_run::renew(&mut conn, &[token], lease_ms)
                    .await
                    .map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            }
        };
        let renewed = tokio::time::timeout(every, renewal)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {every:?}")));
        if let Err(err) = renewed {
            tracing::warn!(error = %err, token, "could not renew a long job's lease");
        }
    }
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

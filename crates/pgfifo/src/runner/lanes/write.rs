//! Writing a batch's outcomes in its transaction; the lane commits them
//! ([`Finished`] is what the batch leaves it).

use std::time::Duration;

use super::batching::Batching;
use super::conn::{ConnectionLost, JobConn};
use super::Lanes;
use crate::db::error::{is_connection_error, refusal, Refusal};
use crate::db::runner::{Completion, LeftWork};
use crate::runner::outcome::{Backoff, Done};
use crate::JobError;

/// What writing a batch's outcomes came to.
pub(super) enum Written {
    /// Written; they commit with the lane's next statement. `left`: the work
    /// they left that nobody is woken for.
    Outcomes { done: Vec<Done>, left: LeftWork },
    /// Nothing to write, or the database refused the outcomes: the
    /// transaction was rolled back and the jobs run again.
    RolledBack,
}

/// Writes the outcomes of a batch. A handler that took the connection and
/// succeeded is always the last: its deferred constraints are checked in the
/// same round trip, and if they (or the outcome's write) fail, its writes are
/// rolled back and the failure is written instead. If the database refuses
/// the outcomes otherwise (an SQL error, not a lost connection), the error is
/// noted on each attempt and the transaction rolled back: the jobs run
/// again, their attempts counted (one job per pick for a while, so that a
/// job whose outcome cannot be written does not take others down with it).
pub(super) async fn write(
    lanes: &Lanes,
    conn: &mut JobConn,
    mut done: Vec<Done>,
    backend_pid: i32,
    batching: &mut Batching,
) -> Result<Written, ConnectionLost> {
    if done.is_empty() {
        conn.rollback().await?;
        return Ok(Written::RolledBack);
    }
    let check = done.last().is_some_and(|d| d.wrote);
    // Not pipelined with the COMMIT that follows: diesel prepares a statement
    // in a round trip of its own the first time, which would let the COMMIT
    // overtake the outcomes and release the jobs unfinished.
    let written = {
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        if check {
            conn.check_and_complete(&completions).await
        } else {
            conn.release_and_complete(&completions).await
        }
    };
    let err = match written {
        Ok(left) => return Ok(Written::Outcomes { done, left }),
        Err(err) if is_connection_error(&err) => return Err(err.into()),
        Err(err) => err,
    };
    // A handler that ended the job's transaction itself (COMMIT on its
    // connection) left nothing to write the failure into.
    let transaction_gone = refusal(&err) == Some(Refusal::JobTransaction);
    if check && !transaction_gone && conn.discard_handler_writes(lanes, false, backend_pid).await {
        let last = done.pop().expect("checked above");
        let registration = lanes
            .registry
            .get(&last.job.kind)
            .expect("the job's handler ran");
        let failure = JobError::retry(format!(
            "the job's transaction failed when its success was written \
             (a database error the handler did not return?): {err}"
        ));
        let backoff = Backoff {
            base: registration.backoff,
            max: lanes.settings.max_backoff,
        };
        let run = last.run;
        let mut failed = Done::failure(last.job, last.attempt, failure, backoff);
        failed.run = run;
        tracing::info_span!("pgfifo.job", id = failed.job.id).in_scope(|| failed.log());
        done.push(failed);
        let completions: Vec<Completion<'_>> = done.iter().map(Done::completion).collect();
        match conn.release_and_complete(&completions).await {
            Ok(left) => return Ok(Written::Outcomes { done, left }),
            Err(err) if is_connection_error(&err) => return Err(err.into()),
            Err(err) => return refused(lanes, conn, done, &err, batching).await,
        }
    }
    refused(lanes, conn, done, &err, batching).await
}

/// The database refused the outcomes: note the error on each attempt, roll
/// back; the jobs run again. Dropping their runs counts them as aborted.
async fn refused(
    lanes: &Lanes,
    conn: &mut JobConn,
    done: Vec<Done>,
    err: &diesel::result::Error,
    batching: &mut Batching,
) -> Result<Written, ConnectionLost> {
    batching.single();
    for one in done {
        let message = match one.completion().error {
            Some(error) => format!("{error}; then writing this outcome failed: {err}"),
            None => format!("the job succeeded, then writing its outcome failed: {err}"),
        };
        tracing::error!(id = one.job.id, error = %message,
            "could not write the outcome of a job; it will run again");
        lanes
            .bookkeeper
            .note_error(one.job.id, one.attempt, message);
    }
    match conn.rollback().await {
        Ok(()) => Ok(Written::RolledBack),
        Err(rollback) => Err(ConnectionLost(format!(
            "{err}; then the rollback failed: {rollback}"
        ))),
    }
}

/// What running a pick's jobs left for the lane.
pub(super) struct Finished {
    /// The outcomes written, awaiting their COMMIT (none when the
    /// transaction was rolled back).
    pub(super) done: Vec<Done>,
    /// Whether the lane must pick again at once rather than wait for a
    /// wake-up: a group of these jobs has its next job ready (enqueues into
    /// an active group wake nobody), jobs were handed back, or the
    /// transaction was rolled back.
    pub(super) again: bool,
    /// Whether a group of these jobs has its next job ready now: the lane
    /// has work of its own to come (see `lane.rs`).
    pub(super) continues: bool,
    /// How soon work these jobs left becomes ready by itself (a retry's
    /// delay, a group's delayed next job): nobody is woken for it, so the
    /// lane notes it for the timer once the outcomes commit.
    pub(super) soon: Vec<Duration>,
}

impl Finished {
    pub(super) fn rolled_back() -> Self {
        Finished {
            done: Vec::new(),
            again: true,
            continues: false,
            soon: Vec::new(),
        }
    }
}

impl From<Written> for Finished {
    fn from(written: Written) -> Self {
        match written {
            Written::Outcomes { done, left } => Finished {
                done,
                again: left.now,
                continues: left.now,
                soon: left.later,
            },
            Written::RolledBack => Finished::rolled_back(),
        }
    }
}

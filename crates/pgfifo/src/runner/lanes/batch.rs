//! Running a pick's jobs: record their attempts, wait for a permit, run
//! their handlers one after another in the pick's transaction (each in the
//! handlers' savepoint; `attempt.rs`), and write their outcomes
//! (`write.rs`). The lane commits them.
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
//! * no handler starts once the batch has run for [`Batching::window_for`]
//!   (the batch window; under a queue's slot, [`Batching::slot_window`]): a group whose job
//!   finished waits at most that long (plus the handler then running) for
//!   its commit, and so for its next job;
//! * no handler after the first starts while another lane seeks work with
//!   a slot free: the rest of the batch is handed back for the lanes that
//!   stand idle, which take it side by side once this lane commits (not
//!   under a queue's slot: they would need that slot too, see
//!   `docs/queue-limits.md`);
//! * a lane sizes its next pick from what its handlers took: handlers that
//!   use the connection, or take about the window, get one job per pick.
//!
//! # Several jobs of one group
//!
//! A pick may take the next jobs of a group behind its head (followers,
//! see `pgfifo.pick`): a group with a backlog of quick jobs then runs a
//! batch of them per transaction instead of one, with its row locked
//! throughout. They run in their order, and strictly one after another:
//!
//! * a follower starts only after every earlier job of its group in the
//!   batch succeeded; after any other outcome (a retry, a snooze, a failure,
//!   which may hold the group) the rest of the batch is handed back
//!   unstarted, and `pgfifo.complete` makes the job that did not succeed the
//!   group's head, or moves the head to the first job handed back;
//! * a handler that took the connection ends the batch as above, so one
//!   job's writes never share the handlers' savepoint with a later job's,
//!   and a later job's failure cannot roll them back;
//! * the window bounds it like any batch; a lane that seeks work takes no
//!   follower's place (it could not start it while this lane holds the
//!   group), so followers are not handed back for it.
//!
//! Attempts are recorded for the whole pick before the first handler
//! starts (one statement), as for a single job: a crash mid-batch counts an
//! attempt for each job picked, which can cost a job that never started one
//! attempt, never a lost or a duplicated run.

use std::time::{Duration, Instant};

use tokio::sync::SemaphorePermit;
use tracing::Instrument;

use super::attempt::{run_attempt, Decided};
use super::batching::Batching;
use super::conn::{ConnectionLost, JobConn};
use super::long;
use super::write::{write, Finished};
use super::Lanes;
use crate::db::pooler::is_transaction_pooled;
use crate::db::runner::PickedJob;
use crate::runner::events::JobOutcome;
use crate::runner::outcome::Done;

/// How long a prefetched pick may wait for a free permit before its jobs are
/// handed back. Long enough to cover the normal wait for a handler to
/// finish, short enough that groups do not sit locked behind a long job.
const PERMIT_PATIENCE: Duration = Duration::from_secs(2);

/// A picked job and the attempt recorded for it (`None`: not recorded yet,
/// or the job has no attempts left).
type Slot = (PickedJob, Option<i32>);

/// Runs a pick's jobs (picked by lane `lane`, holding `reserved` if it took
/// a permit before the pick) to their outcomes (see [`Finished`]); `Err`
/// when the connection must be given up.
pub(super) async fn run_batch<'l>(
    lanes: &'l Lanes,
    conn: &mut JobConn,
    jobs: Vec<PickedJob>,
    (lane, reserved): (usize, Option<SemaphorePermit<'l>>),
    batching: &mut Batching,
) -> Result<Finished, ConnectionLost> {
    // A job in long mode runs alone: its pick's transaction commits as soon
    // as it is claimed. Jobs picked with it are handed back (their attempts
    // are not recorded yet): those before it run now, the rest later.
    let pooled = is_transaction_pooled(conn.get());
    let mut jobs = jobs;
    let mut split = false;
    if jobs.len() > 1 {
        if let Some(at) = jobs.iter().position(|j| long::is_long(lanes, j)) {
            let rest = jobs.split_off(at.max(1));
            hand_back(lanes, rest.into_iter().map(|j| (j, None))).await;
            split = true;
        }
    }
    let backend_pid = jobs[0].backend_pid;
    // The handlers' savepoint is set while the bookkeeper records the
    // attempts on its own connection: one round trip for both.
    let request = jobs.iter().map(|j| (j.id, j.max_attempts)).collect();
    let parts = jobs[0].shard_parts.clone();
    let (savepoint, recorded) = tokio::join!(
        conn.open_handler_savepoint(),
        lanes.bookkeeper.start_attempts(request, parts)
    );
    if let Err(err) = savepoint {
        if let Ok(attempts) = recorded {
            hand_back(lanes, jobs.into_iter().zip(attempts)).await;
        }
        let _ = conn.rollback().await;
        return Err(err.into());
    }
    let attempts = match recorded {
        Ok(attempts) => attempts,
        Err(err) => {
            let _ = conn.rollback().await;
            return Err(ConnectionLost(err));
        }
    };
    let mut jobs: Vec<Slot> = jobs.into_iter().zip(attempts).collect();
    // Jobs whose group's rate limit had no token left (attempt 0, nothing
    // recorded) do not start: handed back, looked at again with the
    // group's next token.
    if jobs.iter().any(|(_, attempt)| *attempt == Some(0)) {
        let (throttled, rest): (Vec<Slot>, Vec<Slot>) = jobs
            .into_iter()
            .partition(|(_, attempt)| *attempt == Some(0));
        jobs = rest;
        throttled_back(lanes, throttled).await;
        if jobs.is_empty() {
            let _ = conn.rollback().await;
            return Ok(Finished::rolled_back());
        }
    }
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
    lanes
        .bookkeeper
        .forget_attempts(deferred.clone(), true)
        .await;

    // Otherwise wait for a free permit: at most `concurrency` handlers run
    // at once. Lanes beyond that have their next jobs picked, locked and
    // their attempts recorded meanwhile. Jobs that wait too long are handed
    // back (and their attempts forgotten) rather than sit on their groups.
    let board = &*lanes.board;
    let permit = match reserved.or_else(|| board.permits.try_acquire().ok()) {
        Some(permit) => permit,
        None => {
            let waited = tokio::select! {
                permit = board.permits.acquire() => permit.ok(),
                () = tokio::time::sleep(PERMIT_PATIENCE) => None,
                () = lanes.stop.cancelled() => None,
            };
            let Some(permit) = waited else {
                hand_back(lanes, jobs).await;
                conn.rollback().await?;
                // Their groups are free again: work left for the other lanes.
                board.note_locked(lane, []);
                // Every permit is taken by long jobs: take nothing until one
                // frees up, rather than lock and hand back pick after pick.
                tokio::select! {
                    permit = board.permits.acquire() => drop(permit),
                    () = lanes.stop.cancelled() => {}
                }
                return Ok(Finished::rolled_back());
            };
            // The connection may have died while it waited (a killed
            // backend, a restart, the idle bound): another runner may already
            // run these jobs. No handler starts unless the connection is
            // known to be alive.
            if let Err(err) = conn.alive(true).await {
                hand_back(lanes, jobs).await;
                return Err(ConnectionLost(format!(
                    "the connection of prefetched jobs failed before they started: {err}"
                )));
            }
            permit
        }
    };

    if jobs.len() == 1 && long::is_long(lanes, &jobs[0].0) {
        if pooled {
            long::warn_pooled();
        } else if let Some(attempt) = jobs[0].1 {
            let (job, _) = jobs.pop().expect("one job");
            let span = attempt_span(&job, Some(attempt));
            return long::run_long(lanes, conn, job, attempt, lane, permit)
                .instrument(span)
                .await;
        }
    }
    let picked = jobs.len();
    let mut done: Vec<Done> = Vec::with_capacity(picked);
    batching.first_handler_starts();
    let started = Instant::now();
    let mut rest = jobs.drain(..);
    while let Some((job, mut attempt)) = rest.next() {
        // The rest goes back once the window is spent, on shutdown, and when
        // another lane seeks work with a slot free: a job that waits here
        // behind this lane's handlers could start there at once (the pick
        // that took it saw no lane seeking, but one may have since found
        // nothing, e.g. in a tail where lanes finish together).
        // (Not for a job of a group that ran here already: it could not
        // start in another lane before this one commits. Nor for a job
        // picked under a queue's slot: the lanes that seek could not start
        // it without that slot either, and the queue runs its jobs at the
        // rate its slots turn over.)
        let follows = done.iter().any(|d| d.job.same_group(&job));
        if !done.is_empty()
            && (started.elapsed() >= batching.window_for(job.under_queue_slot)
                || lanes.stop.is_cancelled()
                || (!follows && !job.under_queue_slot && board.others_seek(false)))
        {
            hand_back(lanes, std::iter::once((job, attempt)).chain(rest)).await;
            break;
        }
        // Nor after the connection died under the handlers before (its
        // backend was ended, the server restarted): the transaction is gone
        // with its locks, and another lane may be running this job's group
        // already, from its head.
        if !done.is_empty() {
            if let Err(err) = conn.alive(false).await {
                hand_back(lanes, std::iter::once((job, attempt)).chain(rest)).await;
                return Err(ConnectionLost(format!(
                    "the connection of a batch failed before its next job started: {err}"
                )));
            }
        }
        if deferred.contains(&(job.id, job.max_attempts)) {
            match lanes
                .bookkeeper
                .start_attempts(vec![(job.id, job.max_attempts)], job.shard_parts.clone())
                .await
            {
                Ok(recorded) => {
                    attempt = recorded.first().copied().flatten();
                    if attempt == Some(0) {
                        // Its group's token went to another start meanwhile.
                        throttled_back(lanes, vec![(job, None)]).await;
                        hand_back(lanes, rest).await;
                        break;
                    }
                }
                Err(err) => {
                    hand_back(lanes, rest).await;
                    return Err(ConnectionLost(err));
                }
            }
        }
        let span = attempt_span(&job, attempt);
        let ran = match run_attempt(lanes, conn, job, attempt, batching)
            .instrument(span.clone())
            .await
        {
            Ok(ran) => ran,
            Err(lost) => {
                // The process goes on: the jobs that did not start keep no
                // attempt (they run again elsewhere once the connection is
                // gone and the transaction with it).
                hand_back(lanes, rest).await;
                return Err(lost);
            }
        };
        match ran {
            Some(Decided {
                done: one,
                ends_batch,
            }) => {
                span.in_scope(|| one.log());
                #[cfg(feature = "otel")]
                if matches!(
                    one.outcome,
                    JobOutcome::Retrying { .. } | JobOutcome::Failed { .. }
                ) {
                    crate::otel::attempt_failed(&span);
                }
                // The next job of a group starts only once the one before
                // it has succeeded: after any other outcome (a retry, a
                // snooze, a failure that may hold the group), the rest goes
                // back unstarted, and the group's head is decided by this
                // job's outcome.
                let blocks = !matches!(one.outcome, JobOutcome::Succeeded)
                    && rest
                        .as_slice()
                        .iter()
                        .any(|(next, _)| next.same_group(&one.job));
                done.push(one);
                if ends_batch || blocks {
                    hand_back(lanes, rest).await;
                    break;
                }
            }
            None => {
                hand_back(lanes, rest).await;
                break;
            }
        }
    }
    // The permit is free as soon as the handlers are done; writing the
    // outcomes and committing overlap with the next handler. (A lane that
    // takes the permit meanwhile learns that these jobs' groups are about
    // to be free: see "Weights" in `pgfifo.pick`.)
    board.note_finishing(lane);
    drop(permit);
    batching.handlers_end();
    let handed_back = split || done.len() < picked;
    let mut finished = Finished::from(write(lanes, conn, done, backend_pid, batching).await?);
    finished.again |= handed_back;
    Ok(finished)
}

/// Jobs refused a start by their groups' rate limits: nothing to forget;
/// the timer wakes a lane when the first of their groups has a token again.
async fn throttled_back(lanes: &Lanes, jobs: Vec<Slot>) {
    tracing::debug!(jobs = jobs.len(), "jobs not started: no token left");
    let mut soonest: Option<Duration> = None;
    for (job, _) in jobs {
        if let Some(group) = job.group_id {
            if let Some(due) = lanes.bookkeeper.next_token_in(job.queue, group).await {
                soonest = Some(soonest.map_or(due, |s| s.min(due)));
            }
        }
    }
    lanes
        .timer
        .add(soonest.unwrap_or(Duration::from_millis(50)));
}

/// Forgets the attempts of jobs that were picked but not started; they are
/// released when the transaction ends and picked again.
async fn hand_back(lanes: &Lanes, jobs: impl IntoIterator<Item = Slot>) {
    let attempts: Vec<(i64, i32)> = jobs
        .into_iter()
        .filter_map(|(job, attempt)| Some((job.id, attempt?)))
        .collect();
    if !attempts.is_empty() {
        tracing::debug!(
            jobs = attempts.len(),
            "jobs handed back before they started"
        );
    }
    lanes.bookkeeper.forget_attempts(attempts, true).await;
}

/// The span of one attempt of `job`: with the `otel` feature, one that
/// continues the trace of the job's enqueue (see `crate::otel`).
fn attempt_span(job: &PickedJob, attempt: Option<i32>) -> tracing::Span {
    #[cfg(feature = "otel")]
    return crate::otel::attempt_span(job, attempt);
    #[cfg(not(feature = "otel"))]
    tracing::info_span!(
        "pgfifo.job",
        id = job.id,
        kind = %job.kind,
        queue = %job.queue,
        group = job.group_id.as_deref().unwrap_or(""),
        attempt = attempt,
    )
}

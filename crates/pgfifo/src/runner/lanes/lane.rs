//! One lane's loop: pick jobs, run them (`batch.rs`), commit their outcomes
//! together with the next pick; repeat while there may be work that no
//! wake-up will announce, then wait for a wake-up or the poll (see the
//! module documentation of `lanes`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use super::batch::run_batch;
use super::batching::Batching;
use super::conn::{ConnectionLost, Heard, JobConn};
use super::waiting::{connection, register, wait_for_work, Waiter};
use super::write::Finished;
use super::{promote_all, Lanes, Seeking};
use crate::db::runner::{PickRequest, Picked, PickedJob};
use crate::runner::jitter::{random_fraction, reconnect_backoff};
use crate::runner::outcome::Done;

/// How often a resting prefetch lane looks whether handlers got longer.
const REST: Duration = Duration::from_millis(100);

/// How soon a group that `pgfifo.pick` could not declare idle (an enqueue
/// into it was in flight) is ready again: `advance_head`'s 50 ms.
const PARKED: Duration = Duration::from_millis(50);

/// Outcomes written in a lane's transaction whose COMMIT is still to be
/// sent, and when the work they leave becomes ready by itself (noted for the
/// timer once they commit: a lane it woke before would find the groups still
/// locked, and nobody would look again).
#[derive(Default)]
struct Pending {
    done: Vec<Done>,
    soon: Vec<Duration>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// They committed: count them, emit their events, note what they left.
    fn committed(&mut self, lanes: &Lanes) {
        for done in self.done.drain(..) {
            let event = done.event();
            lanes.metrics.committed(&event, done.run);
            lanes.events.send(event);
        }
        for &soon in &self.soon {
            lanes.timer.add(soon);
        }
        self.soon.clear();
    }

    /// The error of a failed COMMIT of these outcomes (whose runs count as
    /// aborted when they are dropped).
    fn commit_failed(&self, err: &diesel::result::Error) -> ConnectionLost {
        let ids: Vec<i64> = self.done.iter().map(|done| done.job.id).collect();
        ConnectionLost(format!("commit of jobs {ids:?} failed: {err}"))
    }
}

/// What a lane keeps from one pick to the next.
struct Lane {
    /// The lane's number (its place on the board).
    index: usize,
    /// Rotates the queue and the kind of job a pick starts with.
    turn: i32,
    /// Where this lane's round-robin sweep over the groups continues (see
    /// `pgfifo.pick`); lanes start at random places.
    sweep_from: i32,
    batching: Batching,
    /// Whether the lane's last batch left one of its groups' next job ready:
    /// it has work of its own to come, and so do the other lanes of a
    /// backlog over many groups.
    own_work: bool,
}

impl Lane {
    /// The lane looks for work and has none in sight (see [`Seeking`]).
    fn seeks(&mut self, seeking: &mut Seeking<'_>) {
        seeking.set(true);
        self.own_work = false;
        self.batching.found_nothing();
    }
}

/// What one step of a lane's drain came to.
enum Step {
    /// There may be more work: pick again.
    Again,
    /// Nothing is left that a wake-up would not announce: wait.
    Wait,
    /// The connection must be retired (a handler was cut off); its outcomes
    /// are committed: pick again on another.
    Retire,
}

pub(super) async fn run(lanes: Arc<Lanes>, index: usize) {
    let board = &*lanes.board;
    let mut lane = Lane {
        index,
        turn: index as i32,
        sweep_from: random_fraction().mul_add(4_294_967_295.0, -2_147_483_648.0) as i32,
        batching: Batching::new(lanes.settings.max_batch, lanes.settings.batch_window),
        own_work: false,
    };
    let mut seeking = Seeking::new(board);
    lane.seeks(&mut seeking);
    let mut failures = 0u32;
    // Lanes beyond `concurrency` take jobs ahead of a free permit, which
    // only pays while handlers are long enough (see `Board::prefetch_rests`).
    let prefetch_lane = index >= board.concurrency;
    // Whether this lane's last wait ended with a wake-up.
    let mut woken = false;
    // The connection kept through a wait that a wake-up ended
    // (`waiting.rs`).
    let mut kept: Option<JobConn> = None;
    'connection: while !lanes.stop.is_cancelled() {
        if prefetch_lane && board.prefetch_rests() {
            if let Some(conn) = kept.take() {
                conn.release().await;
            }
            // Resting lanes do not wait for wake-ups: they would take them
            // from the lanes that work. A wake-up this lane took goes to a
            // lane that works.
            seeking.set(false);
            if std::mem::take(&mut woken) {
                board.wake(1);
            }
            tokio::select! {
                () = tokio::time::sleep(REST) => {}
                () = lanes.stop.cancelled() => {}
            }
            continue;
        }
        // A kept connection that its driver heard close (a restart, the
        // server's idle bound) goes, and the pool gives a checked one.
        let reused = kept.take().map(|mut conn| {
            (
                conn.reusable() && matches!(conn.heard(), Heard::Nothing),
                conn,
            )
        });
        let mut conn = match reused {
            Some((true, conn)) => conn,
            Some((false, conn)) => {
                conn.abandon().await;
                continue;
            }
            None => {
                let Some(pooled) = connection(&lanes).await else {
                    // No connection: it could not start a job now.
                    seeking.set(false);
                    continue;
                };
                JobConn::new(pooled, board)
            }
        };
        // Registered for wake-ups before each look, so that a notification
        // which arrives while this lane picks is not lost; dropped as soon as
        // a pick finds work, so that wake-ups go to lanes that are idle, not
        // to this one while it runs handlers.
        let mut waiter: Option<Waiter<'_>> = None;
        // Drain: keep picking while picks return work; never wait for a timer
        // while there is work. A finished job's outcome is written but its
        // COMMIT travels with the next pick (`pending`).
        let mut pending = Pending::default();
        // Whether the last pick asked to look again at once.
        let mut follow_up = false;
        loop {
            if waiter.is_none() {
                waiter = Some(register(&lanes));
            }
            lane.turn = lane.turn.wrapping_add(1);
            let resting = lanes.stop.is_cancelled() || (prefetch_lane && board.prefetch_rests());
            let step = if resting {
                commit_pending(&lanes, &mut conn, &mut pending, index)
                    .await
                    .map(|()| Step::Wait)
            } else {
                pick_and_run(
                    &lanes,
                    &mut conn,
                    &mut lane,
                    &mut seeking,
                    &mut pending,
                    &mut waiter,
                )
                .await
            };
            match step {
                Ok(Step::Again) => {
                    failures = 0;
                    follow_up = true;
                }
                Ok(Step::Wait) => {
                    follow_up &= resting;
                    break;
                }
                Ok(Step::Retire) => {
                    conn.release().await;
                    continue 'connection;
                }
                Err(ConnectionLost(err)) => {
                    board.note_locked(index, []);
                    seeking.set(false);
                    failures += 1;
                    tracing::warn!(error = %err, lane = index, "pgfifo lane: a database round trip failed; retrying on a new connection");
                    conn.abandon().await;
                    tokio::select! {
                        () = tokio::time::sleep(reconnect_backoff(failures)) => {}
                        () = lanes.stop.cancelled() => {}
                    }
                    continue 'connection;
                }
            }
        }
        if prefetch_lane && board.prefetch_rests() && !lanes.stop.is_cancelled() {
            conn.release().await;
            // Rest (above) without taking a wake-up meant for a working lane;
            // one this lane's registration took already goes on to the next,
            // and so does the work its last pick asked to look again for.
            if waiter.is_some_and(|notified| notified.now_or_never().is_some()) || follow_up {
                board.wake(1);
            }
            continue;
        }
        lane.seeks(&mut seeking);
        let notified = waiter.unwrap_or_else(|| register(&lanes));
        (woken, kept) = wait_for_work(&lanes, notified, conn).await;
    }
}

/// Opens the next job transaction (committing `pending`, and ending the
/// current one if `end_first`) and picks up to `limit` jobs of different
/// groups, `batch` in all with their groups' next jobs, in one round trip.
/// `start_at_once`: the lane holds a permit for its first handler, so the
/// pick may take a job that must begin at once (see `pgfifo.pick`).
async fn pick(
    lanes: &Lanes,
    conn: &mut JobConn,
    lane: &Lane,
    pending: &mut Pending,
    (limit, batch): (i32, i32),
    (end_first, start_at_once): (bool, bool),
) -> Result<diesel::QueryResult<Picked>, ConnectionLost> {
    let board = &*lanes.board;
    let (locked_elsewhere, finishing_elsewhere) = board.locked_elsewhere(lane.index);
    let request = PickRequest {
        queues: &lanes.queues,
        turn: lane.turn,
        sweep_from: lane.sweep_from,
        idle: &lanes.idle_bounds,
        limit,
        batch: batch.max(limit),
        slot_batch: lane.batching.slot_batch().max(batch).max(limit),
        held_elsewhere: &locked_elsewhere,
        finishing_elsewhere: &finishing_elsewhere,
        start_at_once,
    };
    let commit_first = end_first || !pending.is_empty();
    let (opened, picked) = conn.open_and_pick(commit_first, &request).await;
    if let Err(err) = opened {
        return Err(if pending.is_empty() {
            err.into()
        } else {
            pending.commit_failed(&err)
        });
    }
    pending.committed(lanes);
    Ok(picked)
}

/// Picks jobs and runs them.
async fn pick_and_run<'l>(
    lanes: &'l Lanes,
    conn: &mut JobConn,
    lane: &mut Lane,
    seeking: &mut Seeking<'_>,
    pending: &mut Pending,
    waiter: &mut Option<Waiter<'l>>,
) -> Result<Step, ConnectionLost> {
    let board = &*lanes.board;
    let spread = board.others_seek(seeking.now());
    let limit = lane.batching.limit(spread);
    let batch = lane.batching.batch();
    // A permit free now is taken before the pick, not after it: a pick
    // that may take a job which must begin at once (a job of a group of
    // concurrency above 1, whose younger jobs other slots could otherwise
    // begin and end first; the next share of a queue with weights) must
    // hold the permit it begins with. Looking at the count and taking the
    // permit later let two lanes both pass the look, and one job wait for
    // the other's handler. (A permit released while lanes wait for one goes
    // to them first: a prefetched job keeps its place.)
    let mut permit = board.permits.try_acquire().ok();
    let mut picked = pick(
        lanes,
        conn,
        lane,
        pending,
        (limit, batch),
        (false, permit.is_some()),
    )
    .await?;
    let mut handed_back = false;
    // A pick of several jobs that took every ready job it could see (no
    // `more`), by a lane with no work of its own to come, may leave other
    // slots, of this runner or another, without work while its jobs wait
    // behind one another; and the first of them may turn out slow, whatever
    // recent run times said. So its jobs are handed back (the transaction
    // ends: no attempt was recorded, no handler started) but one, picked
    // again, and lanes are woken for the rest. While a backlog lasts, picks
    // leave work for the other lanes, or the lane's groups have next jobs,
    // and batches stay whole.
    // (Jobs of one group count once: the next jobs of a group it took could
    // not run in another lane.)
    if let Ok(Picked::Jobs { jobs, more: false }) = &picked {
        let groups = heads(jobs);
        if groups > 1 && !lane.own_work {
            let others = groups - 1;
            tracing::debug!(
                target: "pgfifo::lanes::spread",
                lane = lane.index,
                picked = jobs.len(),
                "a pick took every ready job: keeping one, the rest go to other lanes"
            );
            lane.batching.picked(limit, groups);
            board.note_locked(lane.index, []);
            picked = pick(
                lanes,
                conn,
                lane,
                pending,
                (1, batch),
                (true, permit.is_some()),
            )
            .await?;
            handed_back = true;
            board.wake(others);
        }
    }
    // The jobs this lane has locked now: those picked, or none (anything it
    // had locked before committed with the pick).
    match &picked {
        Ok(Picked::Jobs { jobs, .. }) => board.note_locked(lane.index, jobs.iter().map(|j| j.id)),
        _ => board.note_locked(lane.index, []),
    }
    if !matches!(picked, Ok(Picked::Jobs { .. })) {
        // Nothing to begin: the permit goes back before anything else.
        permit = None;
    }
    let (jobs, more) = match picked {
        Ok(Picked::Jobs { jobs, more }) => {
            let groups = heads(&jobs);
            if !handed_back {
                lane.batching.picked(limit, groups);
            }
            seeking.set(false);
            // Not waiting while running these: a wake-up this lane got
            // passes on to the next waiting lane. A full pick of several
            // jobs means there may be more work: wake an idle lane (which
            // wakes the next if its pick is full too). A pick of one job is
            // always full, and at a few hundred jobs a second that woke a
            // lane for nothing after most jobs; new groups wake lanes
            // through the listener, one per group. A pick kept to one job
            // for the seeking lanes wakes one of them if work is left.
            *waiter = None;
            let full = !handed_back && limit > 1 && groups >= limit as usize;
            if full || (spread && more) {
                board.wake(1);
            }
            if let Some(slot) = jobs[..groups].iter().rev().find_map(|job| job.sweep_slot) {
                lane.sweep_from = slot.wrapping_add(1);
            }
            (jobs, more)
        }
        Ok(Picked::ReleaseAndPickAgain(slot)) => {
            // The group may have been left active for an enqueue in flight
            // (see `pgfifo.advance_head`): nobody is woken when it is ready.
            lanes.timer.add(PARKED);
            if let Some(slot) = slot {
                lane.sweep_from = slot.wrapping_add(1);
            }
            conn.commit().await?;
            return Ok(Step::Again);
        }
        Ok(Picked::Nothing) => {
            lane.seeks(seeking);
            // Commit, not roll back: an empty pick may have repaired a stale
            // group head (see pgfifo.pick), and a read-only commit is free.
            conn.commit().await?;
            // Groups that enqueuers woke become pickable once promoted. The
            // listener does it on notifications; doing it here too (when
            // nobody did lately) means a lost notification or a dead LISTEN
            // connection only costs a poll.
            if !board.promote_due() {
                return Ok(Step::Wait);
            }
            let promoted = promote_all(&lanes.queues, &lanes.timer, board, conn.get())
                .await
                .map_err(ConnectionLost)?;
            if promoted > 0 {
                // The other lanes may be asleep with work now pickable.
                board.wake(promoted as usize);
                return Ok(Step::Again);
            }
            return Ok(Step::Wait);
        }
        Err(err) => {
            let _ = conn.rollback().await;
            return Err(err.into());
        }
    };
    // Wake-ups sent from here on are not seen by this lane (it is not
    // registered while it runs the jobs): those that no waiting lane could
    // take are counted instead (see `Board::wake`).
    let missed = board.missed.load(Ordering::SeqCst);
    let Finished {
        done,
        again,
        continues,
        soon,
    } = run_batch(
        lanes,
        conn,
        jobs,
        (lane.index, permit.take()),
        &mut lane.batching,
    )
    .await?;
    lane.own_work = continues;
    pending.done = done;
    pending.soon = soon;
    if conn.must_retire() {
        commit_pending(lanes, conn, pending, lane.index).await?;
        return Ok(Step::Retire);
    }
    if pending.is_empty() || more || again {
        return Ok(Step::Again);
    }
    // Nothing is left that a wake-up would not announce: the pick walked
    // every candidate, and no group of these jobs has its next one ready.
    // Commit alone and wait, rather than pick again to find nothing (which
    // at low rates was most picks), unless a wake-up was sent meanwhile that
    // no waiting lane could take (a stored one is taken by the registration,
    // but several collapse into one, and `wake_all` reaches only lanes
    // already registered). Registered before the count is compared, so none
    // falls in between.
    *waiter = Some(register(lanes));
    if board.missed.load(Ordering::SeqCst) != missed {
        return Ok(Step::Again);
    }
    commit_pending(lanes, conn, pending, lane.index).await?;
    Ok(Step::Wait)
}

/// How many of a pick's jobs are heads of different groups: they come
/// first, their followers after them (see `pgfifo.pick`).
fn heads(jobs: &[PickedJob]) -> usize {
    jobs.iter()
        .enumerate()
        .position(|(i, job)| jobs[..i].iter().any(|head| head.same_group(job)))
        .unwrap_or(jobs.len())
}

/// Commits the outcomes written last, if any, and emits their events. The
/// lane has nothing locked afterwards (without outcomes to commit, it had no
/// transaction, or one that holds nothing: the last pick found nothing, or
/// its jobs were rolled back).
async fn commit_pending(
    lanes: &Lanes,
    conn: &mut JobConn,
    pending: &mut Pending,
    lane: usize,
) -> Result<(), ConnectionLost> {
    if let Err(err) = conn.commit().await {
        return Err(if pending.is_empty() {
            err.into()
        } else {
            pending.commit_failed(&err)
        });
    }
    lanes.board.note_locked(lane, []);
    pending.committed(lanes);
    Ok(())
}

//! One worker lane: pick jobs, run them (`execute`), commit their outcomes
//! together with the next pick; repeat while there may be work that no
//! wake-up will announce, then wait for a wake-up or the poll.
//!
//! The jobs' transaction (depth 1) is opened before the pick and holds the
//! group and job row locks until the outcomes commit. Handlers run inside a
//! savepoint (depth 2): on failure, the savepoint is rolled back, which
//! discards the handler's writes but keeps the locks, and the failure is
//! written in the same transaction. Handlers' own `transaction` calls nest as
//! further savepoints. A pick takes one job or, while handlers are short and
//! leave the connection alone, several (see `execute`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection, TransactionManager};
use futures_util::FutureExt;
use tokio::sync::futures::Notified;

use super::batching::Batching;
use super::execute::execute;
use super::outcome::Done;
use super::txn::{depth, set_depth, ConnectionLost, Tm, BEGIN_JOB, COMMIT_AND_BEGIN};
use super::Shared;
use crate::db::sql::{self, Picked};
use crate::db::PooledConnection;

/// How often a resting prefetch lane looks whether handlers got longer.
const REST: Duration = Duration::from_millis(100);

/// How soon a group that `pgfifo.pick` could not declare idle (an enqueue
/// into it was in flight) is ready again: `advance_head`'s 50 ms.
const PARKED: Duration = Duration::from_millis(50);

/// A lane's registration for wake-ups (`Shared::wake`).
type Registration<'a> = Pin<Box<Notified<'a>>>;

/// A wait for a pooled connection longer than this is logged.
const SLOW_POOL: Duration = Duration::from_secs(1);

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

    /// They committed: emit their events and note what they left.
    fn committed(&mut self, shared: &Shared) {
        for done in self.done.drain(..) {
            shared.committed(done);
        }
        for &soon in &self.soon {
            shared.due.add(soon);
        }
        self.soon.clear();
    }
}

/// What a lane keeps from one pick to the next.
struct Lane {
    /// The lane's number (its place in `Shared::held`).
    slot: usize,
    /// Rotates the queue and the kind of job a pick starts with.
    turn: i32,
    /// Where this lane's round-robin sweep over the groups continues (see
    /// `pgfifo.pick`); lanes start at random places.
    cursor: i32,
    batching: Batching,
}

pub(super) async fn run(shared: Arc<Shared>, slot: usize) {
    let mut lane = Lane {
        slot,
        turn: slot as i32,
        cursor: random_fraction().mul_add(4_294_967_295.0, -2_147_483_648.0) as i32,
        batching: Batching::new(shared.config.max_batch, shared.config.batch_window),
    };
    let mut failures = 0u32;
    // Lanes beyond `concurrency` take jobs ahead of a free slot, which only
    // pays while handlers are long enough (see `Shared::prefetch_rests`).
    let prefetch_lane = slot >= shared.config.concurrency;
    // Whether this lane's last wait ended with a wake-up.
    let mut woken = false;
    'slot: while !shared.stop.is_cancelled() {
        if prefetch_lane && shared.prefetch_rests() {
            // Resting lanes do not wait for wake-ups: they would take them
            // from the lanes that work. A wake-up this lane took goes to a
            // lane that works.
            if std::mem::take(&mut woken) {
                shared.wake_one();
            }
            tokio::select! {
                () = tokio::time::sleep(REST) => {}
                () = shared.stop.cancelled() => {}
            }
            continue;
        }
        let Some(mut conn) = connection(&shared).await else {
            continue;
        };
        // Registered for wake-ups before each look, so that a notification
        // which arrives while this lane picks is not lost; dropped as soon as
        // a pick finds work, so that wake-ups go to lanes that are idle, not
        // to this one while it runs handlers.
        let mut registration: Option<Registration<'_>> = None;
        // Drain: keep picking while picks return work; never wait for a timer
        // while there is work. A finished job's outcome is written but its
        // COMMIT travels with the next pick (`pending`).
        let mut pending = Pending::default();
        // Whether the last pick asked to look again at once.
        let mut follow_up = false;
        loop {
            if registration.is_none() {
                registration = Some(register(&shared));
            }
            lane.turn = lane.turn.wrapping_add(1);
            let resting = shared.stop.is_cancelled() || (prefetch_lane && shared.prefetch_rests());
            let step = if resting {
                commit_pending(&shared, &mut conn, &mut pending, slot)
                    .await
                    .map(|()| false)
            } else {
                run_pick(
                    &shared,
                    &mut conn,
                    &mut lane,
                    &mut pending,
                    &mut registration,
                )
                .await
            };
            match step {
                Ok(true) => {
                    failures = 0;
                    follow_up = true;
                }
                Ok(false) => {
                    follow_up &= resting;
                    break;
                }
                Err(ConnectionLost(err)) => {
                    shared.hold(slot, []);
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
        if prefetch_lane && shared.prefetch_rests() && !shared.stop.is_cancelled() {
            // Rest (above) without taking a wake-up meant for a working lane;
            // one this lane's registration took already goes on to the next,
            // and so does the work its last pick asked to look again for.
            if registration.is_some_and(|notified| notified.now_or_never().is_some()) || follow_up {
                shared.wake_one();
            }
            continue;
        }
        let notified = registration.unwrap_or_else(|| register(&shared));
        let poll = jittered(shared.config.poll_interval);
        shared.idle_lanes.fetch_add(1, Ordering::SeqCst);
        woken = tokio::select! {
            () = notified => true,
            () = tokio::time::sleep(poll) => false,
            () = shared.stop.cancelled() => false,
        };
        shared.idle_lanes.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Registers for the next wake-up (`Shared::wake`), or takes the one kept
/// for whoever registers next.
fn register(shared: &Shared) -> Registration<'_> {
    let mut notified = Box::pin(shared.wake.notified());
    notified.as_mut().enable();
    notified
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
                     (size it at least concurrency + prefetch + 4 plus the application's needs)"
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

/// Picks and runs jobs. `Ok(false)`: nothing to do.
async fn run_pick<'s>(
    shared: &'s Shared,
    conn: &mut AsyncPgConnection,
    lane: &mut Lane,
    pending: &mut Pending,
    registration: &mut Option<Registration<'s>>,
) -> Result<bool, ConnectionLost> {
    let limit = lane.batching.limit(shared.groups_scarce());
    // One round trip: end the previous jobs' transaction (if any), open the
    // next and pick. The simple-query `COMMIT; BEGIN` (or `BEGIN`) is written
    // to the socket before the pick. If the COMMIT fails, PostgreSQL skips
    // the BEGIN, and pick refuses to run outside a job transaction, so no job
    // ever runs without its locks.
    let opener = if !pending.is_empty() {
        Some(COMMIT_AND_BEGIN)
    } else if depth(conn) != Some(1) {
        Some(BEGIN_JOB)
    } else {
        None
    };
    let held = shared.held_by_others(lane.slot);
    let (opened, picked) = {
        let mut shared_conn: &AsyncPgConnection = conn;
        let pick = sql::pick(
            shared_conn,
            &shared.queues,
            lane.turn,
            lane.cursor,
            &shared.idle_bounds,
            limit,
            &held,
        );
        match opener {
            Some(opener) => {
                let (opened, picked) = tokio::join!(shared_conn.batch_execute(opener), pick);
                (Some(opened), picked)
            }
            None => (None, pick.await),
        }
    };
    match opened {
        Some(Err(err)) => {
            Tm::transaction_manager_status_mut(conn).set_in_error();
            return Err(if pending.is_empty() {
                err.into()
            } else {
                commit_failed(&pending.done, &err)
            });
        }
        Some(Ok(())) => set_depth(conn, 1)?,
        None => {}
    }
    pending.committed(shared);
    // The jobs this lane holds now: those picked, or none (anything it held
    // before committed with the pick).
    match &picked {
        Ok(Picked::Jobs { jobs, .. }) => shared.hold(lane.slot, jobs.iter().map(|job| job.id)),
        _ => shared.hold(lane.slot, []),
    }
    let (jobs, more) = match picked {
        Ok(Picked::Jobs { jobs, more }) => {
            lane.batching.picked(limit, jobs.len());
            // Not waiting while running these: a wake-up this lane got
            // passes on to the next waiting lane. A full pick of several
            // jobs means there may be more work: wake an idle lane (which
            // wakes the next if its pick is full too). A pick of one job is
            // always full, and at a few hundred jobs a second that woke a
            // lane for nothing after most jobs; new groups wake lanes
            // through the listener, one per group.
            *registration = None;
            if limit > 1 && jobs.len() >= limit as usize {
                shared.wake_one();
            }
            if let Some(slot) = jobs.iter().rev().find_map(|job| job.slot) {
                lane.cursor = slot.wrapping_add(1);
            }
            (jobs, more)
        }
        Ok(Picked::Retry(slot)) => {
            // The group may have been left active for an enqueue in flight
            // (see `pgfifo.advance_head`): nobody is woken when it is ready.
            shared.due.add(PARKED);
            // A group changed under the pick: release it and look again.
            if let Some(slot) = slot {
                lane.cursor = slot.wrapping_add(1);
            }
            Tm::commit_transaction(conn).await?;
            return Ok(true);
        }
        Ok(Picked::Nothing) => {
            // Commit, not roll back: an empty pick may have repaired a stale
            // group head (see pgfifo.pick), and a read-only commit is free.
            Tm::commit_transaction(conn).await?;
            // Groups that enqueuers woke become pickable once promoted. The
            // listener does it on notifications; doing it here too (when
            // nobody did lately) means a lost notification or a dead LISTEN
            // connection only costs a poll.
            if !shared.promote_due() {
                return Ok(false);
            }
            let promoted = super::listener::promote_all(shared, conn)
                .await
                .map_err(ConnectionLost)?;
            if promoted > 0 {
                // The other lanes may be asleep with work now pickable.
                shared.wake_lanes(promoted as usize);
            }
            return Ok(promoted > 0);
        }
        Err(err) => {
            let _ = Tm::rollback_transaction(conn).await;
            return Err(err.into());
        }
    };
    // Wake-ups sent from here on are not seen by this lane (it is not
    // registered while it runs the jobs): those that no waiting lane could
    // take are counted instead (see `Shared::wake_lanes`).
    let wakes = shared.wakes.load(Ordering::SeqCst);
    let finished = execute(shared, conn, jobs, lane.slot, &mut lane.batching).await?;
    pending.done = finished.done;
    pending.soon = finished.soon;
    if pending.is_empty() || more || finished.again {
        return Ok(true);
    }
    // Nothing is left that a wake-up would not announce: the pick walked
    // every candidate, and no group of these jobs has its next one ready.
    // Commit alone and wait, rather than pick again to find nothing (which
    // at low rates was most picks), unless a wake-up was sent meanwhile that
    // no waiting lane could take (a stored one is taken by the
    // registration, but several collapse into one, and `wake_all` reaches
    // only lanes already registered). Registered before the count is
    // compared, so none falls in between.
    *registration = Some(register(shared));
    if shared.wakes.load(Ordering::SeqCst) != wakes {
        return Ok(true);
    }
    commit_pending(shared, conn, pending, lane.slot).await?;
    Ok(false)
}

/// Commits the outcomes written last, if any, and emits their events. The
/// lane holds nothing afterwards (without outcomes to commit, it had no
/// transaction, or one that holds nothing: the last pick found nothing, or
/// its jobs were rolled back).
async fn commit_pending(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    pending: &mut Pending,
    lane: usize,
) -> Result<(), ConnectionLost> {
    if !pending.is_empty() {
        if let Err(err) = conn.batch_execute("COMMIT").await {
            Tm::transaction_manager_status_mut(conn).set_in_error();
            return Err(commit_failed(&pending.done, &err));
        }
        set_depth(conn, 0)?;
    }
    shared.hold(lane, []);
    pending.committed(shared);
    Ok(())
}

/// The error of a failed COMMIT of `pending` (whose runs count as aborted
/// when dropped with it).
fn commit_failed(pending: &[Done], err: &diesel::result::Error) -> ConnectionLost {
    let ids: Vec<i64> = pending.iter().map(|done| done.job.id).collect();
    ConnectionLost(format!("commit of jobs {ids:?} failed: {err}"))
}

/// Spreads polls of idle workers over ±25 % of the interval.
pub(super) fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.75 + random_fraction() / 2.0)
}

/// A random number in [0, 1) from the standard library's per-instance random
/// hash keys; enough for jitter.
pub(super) fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

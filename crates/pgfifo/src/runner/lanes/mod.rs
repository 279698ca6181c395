//! The lanes: the tasks that pick jobs, run their handlers and commit their
//! outcomes, and the protocol by which they wait for work and wake each
//! other.
//!
//! # Lanes, permits and prefetch
//!
//! A runner has `concurrency + prefetch` lanes. Each owns one pooled
//! connection while it works and loops: pick jobs in a job transaction, run
//! their handlers, write their outcomes, and send the COMMIT together with
//! the next pick (`lane.rs`). At most `concurrency` handlers run at once:
//! a lane takes a **permit** before its first handler and gives it back when
//! its handlers are done, so the `prefetch` extra lanes pick, lock and record
//! attempts ahead of a free permit (`batch.rs`). While recent handlers take
//! less than [`PREFETCH_BELOW`] on average, prefetch lanes **rest**: a permit
//! frees up faster than prefetching could help.
//!
//! # Waiting and waking
//!
//! A lane that finds nothing commits and **waits** for a wake-up or its
//! poll interval (jittered). It keeps its connection through a wait that a
//! wake-up ends (taking one from the pool costs the pool's check, a round
//! trip, per job at low rates) and gives it back when the poll ends it. A lane registers
//! for wake-ups before each look, so a wake-up sent while it picks is not
//! lost, and drops the registration while it runs handlers, so wake-ups go
//! to lanes that are idle. Who wakes lanes:
//!
//! * the listener, one lane per group it promoted after enqueuers' NOTIFYs,
//!   and one for ungrouped work (`listener.rs`);
//! * the timer, when work that becomes ready by itself is due (a retry, a
//!   delayed head; `timer.rs`);
//! * a lane whose pick was full: there may be more, so it wakes the next
//!   lane, which wakes the next if its pick is full too;
//! * shutdown, which wakes every lane.
//!
//! Waking every lane for every notification would send each to pick and all
//! but a few to find nothing. So [`Board::wake`] wakes as many lanes as
//! there is work for, and counts the wake-ups that no waiting lane could
//! take (`missed`): a lane that ran a batch without being registered compares
//! the count before it waits, and picks again if it moved.
//!
//! # Draining
//!
//! A lane keeps picking while there may be work that no wake-up announces:
//! the pick says `more` (it stopped at its limit or its cap), the completion
//! says a group's next job is ready now, or jobs were handed back. Otherwise
//! it commits and waits: at low rates most picks would find nothing.
//!
//! # Seeking lanes
//!
//! A lane **seeks** from when it waits for work, or a pick finds none, until
//! a pick finds some. While another lane seeks and a permit is free, a
//! pick takes one job (`batching.rs`): the jobs a batch holds while its
//! first handler runs could run at once in the seeking lanes, and recent
//! run times cannot tell that the next job is slow. A lane that seeks also
//! forgets how many jobs its last picks found, so the first pick of a
//! burst asks for as many as a batch may hold and shows whether it took
//! every ready job; `lane.rs` then keeps one.
//!
//! # Locked jobs
//!
//! Each lane notes on the board the jobs it has locked (picked, outcomes not
//! committed yet). A pick passes them to `pgfifo.pick`, which does not count
//! them as work left for later: their lanes look again after them.

mod attempt;
mod batch;
mod batching;
mod conn;
mod lane;
mod long;
mod waiting;
mod write;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::bookkeeper::Bookkeeper;
use super::events::Events;
use super::hung::HungSignal;
use super::metrics::Metrics;
use super::timer::Timer;
use diesel_async::AsyncPgConnection;

use crate::db::pooler::pinned_idle;
use crate::db::runner::{self as sql, IdleBounds};
use crate::db::Pool;
use crate::registry::Registry;

/// Wake rows promoted per statement.
const PROMOTE_BATCH: i32 = 1_000;

/// Prefetch lanes rest while handlers take less than this on average: a
/// permit then frees up again within a round trip or two, the lanes that run
/// the handlers keep up without help, and more lanes would only compete for
/// the same groups and rows.
const PREFETCH_BELOW: Duration = Duration::from_millis(1);

/// What the lanes and the tasks that wake them share: who waits, the permits,
/// which jobs each lane has locked, and when woken groups were last
/// promoted.
pub(crate) struct Board {
    concurrency: usize,
    prefetch: usize,
    poll_interval: Duration,
    /// How long the server gets to answer one of the runner's round trips
    /// ([`RunnerConfig::round_trip_timeout`](crate::RunnerConfig::round_trip_timeout)).
    pub(crate) round_trip: Duration,
    /// Where lanes say that a server did not answer in time.
    pub(crate) hung: HungSignal,
    /// One permit per handler allowed to run at once.
    permits: Semaphore,
    /// Wakes waiting lanes.
    wake: Notify,
    /// Lanes waiting for a wake-up or the poll.
    idle: AtomicUsize,
    /// Lanes that look for work: they wait, or have not found any since
    /// (see [`Seeking`]).
    seeking: AtomicUsize,
    /// Wake-ups that no waiting lane could take, and every `wake_all`.
    missed: AtomicU64,
    /// Per lane, the jobs it has locked (see the module documentation).
    locked: Vec<Mutex<Locked>>,
    /// Recent handlers' average run time, in µs (see `handler_ran`).
    handler_us: AtomicU64,
    /// When this runner started: the clock of `promoted_at`.
    epoch: Instant,
    /// When woken groups were last promoted (ms since `epoch`).
    promoted_at: AtomicU64,
}

impl Board {
    pub(crate) fn new(
        concurrency: usize,
        prefetch: usize,
        poll_interval: Duration,
        (round_trip, hung): (Duration, HungSignal),
    ) -> Self {
        Board {
            concurrency,
            prefetch,
            poll_interval,
            round_trip,
            hung,
            permits: Semaphore::new(concurrency),
            wake: Notify::new(),
            idle: AtomicUsize::new(0),
            seeking: AtomicUsize::new(0),
            missed: AtomicU64::new(0),
            locked: (0..concurrency + prefetch)
                .map(|_| Mutex::new(Locked::default()))
                .collect(),
            handler_us: AtomicU64::new(0),
            epoch: Instant::now(),
            promoted_at: AtomicU64::new(0),
        }
    }

    /// How many lanes there are.
    pub(crate) fn lanes(&self) -> usize {
        self.concurrency + self.prefetch
    }

    /// How many lanes wait for a wake-up now.
    pub(crate) fn idle_lanes(&self) -> usize {
        self.idle.load(Ordering::SeqCst)
    }

    /// Wakes up to `n` waiting lanes (at least one), for `n` pieces of work.
    /// A lane that finds work wakes the next one, so a burst still reaches
    /// every lane.
    ///
    /// A wake-up that no waiting lane may take is counted in `missed`: lanes
    /// busy with handlers compare it after their batch and pick again if it
    /// moved. Counting every wake-up sent most of them, at a few hundred
    /// enqueues a second, to pick again for work an idle lane had already
    /// taken. (`idle` is read before the lanes are notified; a lane counted
    /// there is registered, and a registration dropped while notified passes
    /// the wake-up on.)
    pub(crate) fn wake(&self, n: usize) {
        let n = n.clamp(1, self.lanes());
        if self.idle.load(Ordering::SeqCst) < n {
            self.missed.fetch_add(1, Ordering::SeqCst);
        }
        for _ in 0..n {
            self.wake.notify_one();
        }
    }

    /// Wakes every waiting lane (shutdown; the LISTEN connection lost or
    /// back).
    pub(crate) fn wake_all(&self) {
        self.missed.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// Notes that woken groups were just promoted.
    pub(crate) fn promoted_now(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.promoted_at.store(now, Ordering::Relaxed);
    }

    /// Whether a lane that found nothing should promote woken groups itself:
    /// only as the fallback for lost notifications, so not when anyone
    /// promoted within half a poll interval (the listener does on every
    /// notification). Each empty pick promoting too cost a second promote
    /// per job at a few hundred enqueues a second.
    fn promote_due(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.promoted_at.load(Ordering::Relaxed);
        now.saturating_sub(last) >= (self.poll_interval / 2).as_millis() as u64
    }

    /// Notes how long a handler ran (a moving average over all lanes).
    fn handler_ran(&self, took: Duration) {
        let took = took.as_micros().min(u64::MAX as u128) as u64;
        let average = self.handler_us.load(Ordering::Relaxed);
        // Lanes race here; losing an update now and then is fine.
        self.handler_us
            .store(average - average / 8 + took / 8, Ordering::Relaxed);
    }

    /// Whether prefetch lanes should rest (see [`PREFETCH_BELOW`]).
    fn prefetch_rests(&self) -> bool {
        self.handler_us.load(Ordering::Relaxed) < PREFETCH_BELOW.as_micros() as u64
    }

    /// Whether another lane than the caller (`seeking`: whether the caller
    /// counts itself among the seeking ones) looks for work while a slot is
    /// free: then a pick takes one job, and the seeking lanes take the rest
    /// side by side. Jobs one lane would run one after another, after one
    /// that turns out slow, could run at once in the other lanes, whatever
    /// recent run times said. While every lane has work (a backlog over many
    /// groups), no lane seeks, and batches fill the window.
    fn others_seek(&self, seeking: bool) -> bool {
        self.permits.available_permits() > 0
            && self.seeking.load(Ordering::SeqCst) > usize::from(seeking)
    }

    /// Notes the jobs lane `lane` has locked now (none: its last outcomes
    /// committed, or it lost its connection).
    fn note_locked(&self, lane: usize, jobs: impl IntoIterator<Item = i64>) {
        let mut locked = self.locked[lane].lock().unwrap_or_else(|e| e.into_inner());
        locked.jobs.clear();
        locked.jobs.extend(jobs);
        locked.finishing = false;
    }

    /// Notes that lane `lane`'s handlers are done: the jobs it has locked
    /// are free once its outcomes commit, with its next pick.
    fn note_finishing(&self, lane: usize) {
        let mut locked = self.locked[lane].lock().unwrap_or_else(|e| e.into_inner());
        locked.finishing = true;
    }

    /// The jobs the lanes other than `lane` have locked, and those of them
    /// whose handlers are done.
    fn locked_elsewhere(&self, lane: usize) -> (Vec<i64>, Vec<i64>) {
        let mut all = Vec::new();
        let mut finishing = Vec::new();
        for (other, locked) in self.locked.iter().enumerate() {
            if other != lane {
                let locked = locked.lock().unwrap_or_else(|e| e.into_inner());
                all.extend_from_slice(&locked.jobs);
                if locked.finishing {
                    finishing.extend_from_slice(&locked.jobs);
                }
            }
        }
        (all, finishing)
    }
}

/// The jobs one lane has locked (see [`Board::note_locked`]).
#[derive(Default)]
struct Locked {
    jobs: Vec<i64>,
    /// The lane's handlers are done and its outcomes wait for their COMMIT.
    finishing: bool,
}

/// Whether one lane counts among the board's seeking lanes: from when it
/// waits for work (or finds none) until a pick finds some. A lane that
/// rests, or has lost its connection, does not seek: it could not start a
/// job now.
pub(crate) struct Seeking<'b> {
    board: &'b Board,
    now: bool,
}

impl<'b> Seeking<'b> {
    pub(crate) fn new(board: &'b Board) -> Self {
        Seeking { board, now: false }
    }

    /// Whether the lane seeks now.
    pub(crate) fn now(&self) -> bool {
        self.now
    }

    /// Notes whether the lane seeks now.
    pub(crate) fn set(&mut self, seeking: bool) {
        if seeking != self.now {
            self.now = seeking;
            if seeking {
                self.board.seeking.fetch_add(1, Ordering::SeqCst);
            } else {
                self.board.seeking.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Seeking<'_> {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// How the lanes size and time their work (from [`RunnerConfig`](super::RunnerConfig)).
#[derive(Debug, Clone)]
pub(crate) struct LaneSettings {
    pub max_batch: usize,
    pub batch_window: Duration,
    pub poll_interval: Duration,
    pub default_timeout: Duration,
    pub max_backoff: Duration,
    pub long_transaction_warning: Option<Duration>,
    pub long_lease: Duration,
    /// The runner's name, recorded with each long run.
    pub runner: String,
}

/// Everything the lanes run jobs with, shared by all of them.
pub(crate) struct Lanes {
    pub board: Arc<Board>,
    pub pool: Pool,
    pub queues: Vec<String>,
    pub registry: &'static Registry,
    pub settings: LaneSettings,
    pub idle_bounds: IdleBounds,
    pub bookkeeper: Bookkeeper,
    pub timer: Timer,
    pub metrics: Arc<Metrics>,
    pub events: Events,
    /// Cancelled to stop picking new jobs.
    pub stop: CancellationToken,
    /// Cancelled to abort running handlers.
    pub abort: CancellationToken,
}

impl Lanes {
    /// Spawns every lane on `tracker`.
    pub(crate) fn spawn(self: Arc<Self>, tracker: &TaskTracker) {
        for lane in 0..self.board.lanes() {
            tracker.spawn(lane::run(self.clone(), lane));
        }
    }
}

/// Promotes woken groups of `queues` until no wake rows are left; returns
/// how many wake rows it consumed. The delayed heads it set are noted on the
/// timer. `conn` has no transaction open on the server; through a
/// transaction-mode pooler each promote gets one of its own. Each promote
/// has the board's round-trip deadline; past it the error says the server
/// did not answer, and the caller drops the connection.
pub(crate) async fn promote_all(
    queues: &[String],
    timer: &Timer,
    board: &Board,
    conn: &mut AsyncPgConnection,
) -> Result<i32, String> {
    let mut total = 0;
    loop {
        let promote = pinned_idle(conn, async |conn| {
            sql::promote(conn, queues, PROMOTE_BATCH).await
        });
        let promoted = match tokio::time::timeout(board.round_trip, promote).await {
            Ok(promoted) => promoted.map_err(|e| e.to_string())?,
            Err(_) => {
                board.hung.note(crate::db::pooler::host_of(conn));
                crate::db::discard(conn);
                return Err(crate::db::error::timed_out(board.round_trip).to_string());
            }
        };
        for &later in &promoted.later {
            timer.add(later);
        }
        let n = promoted.groups;
        total += n;
        if n < PROMOTE_BATCH {
            board.promoted_now();
            return Ok(total);
        }
    }
}

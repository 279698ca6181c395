//! The runner: picks the head job of each free group, runs its handler inside
//! the job's transaction, and commits the outcome.
//!
//! [`start`] validates the registry and the schema, then spawns:
//! * `concurrency` worker loops (`worker`), each with at most one job, its
//!   transaction and its pooled connection at a time;
//! * the bookkeeper (`bookkeeper`), which records attempt starts on its own
//!   connection, outside the jobs' transactions;
//! * the listener (`listener`), which promotes woken groups and wakes idle
//!   workers on the notifications of `pgfifo` and `pgfifo_groups`, with
//!   polling every [`RunnerConfig::poll_interval`] as the fallback;
//! * the timer (`timer`), which wakes idle workers when work the runner
//!   knows of becomes ready by itself (a retry, a delayed job);
//! * the periodic tasks (`maintenance`): the heartbeat row in `pgfifo.runner`,
//!   the sampled gauges of [`metrics`], and [`Retention`] when configured.
//!
//! Lifecycle: [`RunnerHandle::shutdown`] stops picking, lets running jobs
//! finish until the deadline, then aborts the rest (their transactions roll
//! back and the jobs run again later, without losing an attempt).

mod batching;
mod bookkeeper;
mod config;
mod execute;
mod listener;
mod maintenance;
pub mod metrics;
mod outcome;
mod timer;
mod txn;
mod worker;

pub use config::RunnerConfig;
pub use maintenance::Retention;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::db::sql::IdleBounds;
use crate::db::Pool;
use crate::enqueue::validate_queue;
use crate::registry::Registry;
use crate::{Error, JobId, Result};

/// Each job type's idle bound: its timeout plus the grace, in ms.
fn idle_bounds(registry: &Registry, config: &RunnerConfig) -> IdleBounds {
    let ms = |timeout: Duration| {
        i32::try_from((timeout + config.idle_grace).as_millis()).unwrap_or(i32::MAX)
    };
    let (kinds, idle_ms) = registry
        .iter()
        .map(|r| {
            (
                r.name.to_owned(),
                ms(r.timeout.unwrap_or(config.default_timeout)),
            )
        })
        .unzip();
    IdleBounds {
        kinds,
        idle_ms,
        default_idle_ms: ms(config.default_timeout),
    }
}

/// What happened to a job run, as broadcast by [`RunnerHandle::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvent {
    /// The job's id.
    pub id: JobId,
    /// The job's type name.
    pub kind: String,
    /// The queue.
    pub queue: String,
    /// The group, `None` for ungrouped jobs.
    pub group: Option<String>,
    /// The attempt number (from 1).
    pub attempt: u32,
    /// What the attempt came to.
    pub outcome: JobOutcome,
}

/// The result of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome {
    /// The handler succeeded and the job is done.
    Succeeded,
    /// The attempt failed; the job runs again after a delay.
    Retrying {
        /// The error.
        error: String,
        /// The delay before the next attempt.
        delay: Duration,
    },
    /// The job failed for good (permanent error, attempts used up, unknown
    /// type, bad payload). It is kept with its error.
    Failed {
        /// The error.
        error: String,
    },
    /// The handler cancelled the job.
    Cancelled {
        /// The reason.
        reason: String,
    },
    /// The run was aborted (shutdown deadline, lost connection) before an
    /// outcome could be written; the job runs again later.
    Aborted {
        /// Why.
        reason: String,
    },
}

/// Shared state of one runner's tasks.
pub(crate) struct Shared {
    pub pool: Pool,
    pub config: RunnerConfig,
    pub queues: Vec<String>,
    pub registry: &'static Registry,
    /// Wakes idle workers (a notification arrived, or groups were promoted).
    pub wake: Notify,
    /// Cancelled to stop picking new jobs.
    pub stop: CancellationToken,
    /// Cancelled to abort running handlers.
    pub abort: CancellationToken,
    pub events: broadcast::Sender<JobEvent>,
    pub bookkeeper: bookkeeper::Bookkeeper,
    pub idle_bounds: IdleBounds,
    /// Jobs taken ahead of a free slot (lanes beyond `concurrency`).
    pub prefetch: usize,
    /// One permit per job allowed to run at once.
    pub slots: Semaphore,
    /// Recent handlers' average run time, in µs (see `handler_ran`).
    pub handler_us: AtomicU64,
    /// Lanes waiting for a wake-up or the poll (see `Shared::groups_scarce`).
    pub idle_lanes: AtomicUsize,
    /// Counts the wake-ups that no waiting lane may take (see `wake_lanes`),
    /// and every `wake_all`: a lane that ran a batch without being registered
    /// for them compares it before it waits (see the worker).
    pub wakes: AtomicU64,
    /// Per lane, the jobs it holds locked: those of its batch whose outcomes
    /// have not committed yet (emptied when they commit or roll back). A
    /// pick does not count them as work left for later (see `pgfifo.pick`'s
    /// `more`).
    pub held: Vec<std::sync::Mutex<Vec<i64>>>,
    /// When this runner started: the clock of `promoted_at`.
    pub epoch: std::time::Instant,
    /// When woken groups were last promoted (ms since `epoch`).
    pub promoted_at: AtomicU64,
    /// When work that nobody is woken for becomes ready (see `timer`).
    due: timer::DueTimes,
    /// Metric handles and the running counts the heartbeat reports.
    pub metrics: metrics::Metrics,
}

/// Prefetch lanes rest while handlers take less than this on average: a
/// slot then frees up again within a round trip or two, the lanes that run
/// the handlers keep up without help, and more lanes would only compete for
/// the same groups and rows.
const PREFETCH_BELOW: Duration = Duration::from_millis(1);

impl Shared {
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

    /// Whether a lane should keep its next batch short: slots are free and
    /// some lane found nothing to do, so free groups are scarce, and jobs
    /// one lane ran one after another could have run side by side in the
    /// idle lanes. While every lane has work (a backlog over many groups),
    /// a short batch would only spend the server's time on transactions.
    fn groups_scarce(&self) -> bool {
        self.slots.available_permits() > 0 && self.idle_lanes.load(Ordering::Relaxed) > 0
    }

    /// Notes that woken groups were just promoted.
    fn promoted_now(&self) {
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
        now.saturating_sub(last) >= (self.config.poll_interval / 2).as_millis() as u64
    }

    /// Wakes up to `n` idle lanes (at least one). Waking every lane for every
    /// notification would send each one to pick, and all but a few to find
    /// nothing: at a few hundred enqueues a second that alone kept the
    /// server's cores busy. A lane that finds work wakes the next one (see
    /// the worker), so a burst still reaches every lane.
    ///
    /// `wakes` counts only the wake-ups that no waiting lane may take: lanes
    /// busy with handlers compare it after their batch and pick again if it
    /// moved. Counting every wake-up sent most of them, at a few hundred
    /// enqueues a second, to pick again for work an idle lane had already
    /// taken. (`idle_lanes` is read before the lanes are notified; a lane
    /// counted there is registered, and a registration dropped while
    /// notified passes the wake-up on.)
    fn wake_lanes(&self, n: usize) {
        let n = n.clamp(1, self.config.concurrency + self.prefetch);
        if self.idle_lanes.load(Ordering::SeqCst) < n {
            self.wakes.fetch_add(1, Ordering::SeqCst);
        }
        for _ in 0..n {
            self.wake.notify_one();
        }
    }

    /// Wakes one waiting lane (or the next to register).
    fn wake_one(&self) {
        self.wake_lanes(1);
    }

    /// Notes the jobs lane `lane` holds now (none: its last outcomes
    /// committed, or it lost its connection).
    fn hold(&self, lane: usize, jobs: impl IntoIterator<Item = i64>) {
        let mut held = self.held[lane].lock().unwrap_or_else(|e| e.into_inner());
        held.clear();
        held.extend(jobs);
    }

    /// The jobs the lanes other than `lane` hold (see `held`).
    fn held_by_others(&self, lane: usize) -> Vec<i64> {
        let mut all = Vec::new();
        for (other, held) in self.held.iter().enumerate() {
            if other != lane {
                all.extend_from_slice(&held.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
        all
    }

    /// Wakes every waiting lane.
    fn wake_all(&self) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    fn emit(&self, event: JobEvent) {
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    /// A job's outcome committed: count it and broadcast its event.
    fn committed(&self, done: outcome::Done) {
        let event = done.event();
        self.metrics.committed(&event, done.run);
        self.emit(event);
    }
}

/// A running runner. Stop it with [`shutdown`](Self::shutdown) (or
/// [`shutdown_on_signal`](Self::shutdown_on_signal)); dropping the handle
/// leaves it running until the Tokio runtime ends.
pub struct RunnerHandle {
    shared: Arc<Shared>,
    tracker: TaskTracker,
    service: CancellationToken,
}

impl std::fmt::Debug for RunnerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerHandle")
            .field("queues", &self.shared.queues)
            .field("concurrency", &self.shared.config.concurrency)
            .finish_non_exhaustive()
    }
}

/// Starts a runner on `pool` and returns its handle.
///
/// Fails, before running anything, when a job registration is invalid (every
/// problem listed), the configuration cannot work, the schema is not migrated
/// to this library's version, or the database cannot be reached.
pub async fn start(pool: Pool, config: RunnerConfig) -> Result<RunnerHandle> {
    let registry = Registry::global()?;
    config.validate()?;
    let mut queues = match &config.queues {
        Some(queues) => queues.clone(),
        None => registry.queues(),
    };
    // Each once, in the given order (a queue named twice would be visited
    // twice by every pick).
    let mut seen = std::collections::HashSet::new();
    queues.retain(|queue| seen.insert(queue.clone()));
    if queues.is_empty() {
        return Err(Error::InvalidConfig(
            "no queues to serve: no job type is registered and RunnerConfig::queues is unset"
                .into(),
        ));
    }
    for queue in &queues {
        validate_queue(queue)?;
    }
    {
        let mut conn = pool.get().await?;
        crate::migrate::check_current(&mut conn).await?;
    }

    let service = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (events, _) = broadcast::channel(4096);
    // The bookkeeper's connection is taken before any worker starts: workers
    // wait for it, so they must never hold every connection of the pool.
    let bookkeeping = pool.get_owned().await?;
    let bookkeeper = bookkeeper::Bookkeeper::spawn(
        pool.clone(),
        bookkeeping,
        config.name.clone(),
        service.clone(),
        &tracker,
    );
    let idle_bounds = idle_bounds(registry, &config);
    let prefetch = config.prefetch.unwrap_or((config.concurrency / 2).max(1));
    let shared = Arc::new(Shared {
        idle_bounds,
        prefetch,
        slots: Semaphore::new(config.concurrency),
        handler_us: AtomicU64::new(0),
        idle_lanes: AtomicUsize::new(0),
        wakes: AtomicU64::new(0),
        held: (0..config.concurrency + prefetch)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect(),
        epoch: std::time::Instant::now(),
        promoted_at: AtomicU64::new(0),
        due: timer::DueTimes::default(),
        metrics: metrics::Metrics::new(&queues),
        pool,
        queues,
        registry,
        wake: Notify::new(),
        stop: CancellationToken::new(),
        abort: CancellationToken::new(),
        events,
        bookkeeper,
        config,
    });
    tracker.spawn(listener::run(shared.clone(), service.clone()));
    tracker.spawn(timer::run(shared.clone()));
    tracker.spawn(maintenance::heartbeat(shared.clone(), service.clone()));
    if let Some(interval) = shared.config.metrics_interval {
        tracker.spawn(maintenance::sample_gauges(
            shared.clone(),
            service.clone(),
            interval,
        ));
    }
    if let Some(retention) = shared.config.retention.clone() {
        tracker.spawn(maintenance::retention(shared.clone(), retention));
    }
    let workers = TaskTracker::new();
    for lane in 0..shared.config.concurrency + shared.prefetch {
        workers.spawn(worker::run(shared.clone(), lane));
    }
    workers.close();
    // The service tasks stop once every worker has.
    let stop_services = service.clone();
    tracker.spawn(async move {
        workers.wait().await;
        stop_services.cancel();
    });
    tracker.close();
    tracing::info!(
        queues = ?shared.queues,
        concurrency = shared.config.concurrency,
        name = %shared.config.name,
        "pgfifo runner started"
    );
    Ok(RunnerHandle {
        shared,
        tracker,
        service,
    })
}

impl RunnerHandle {
    /// Receives an event for every finished attempt. Events are for
    /// observation (tests, metrics); a slow receiver may miss some.
    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.shared.events.subscribe()
    }

    /// The queues this runner serves.
    pub fn queues(&self) -> &[String] {
        &self.shared.queues
    }

    /// Stops picking jobs, waits for running jobs up to
    /// [`RunnerConfig::shutdown_timeout`], then aborts the rest (they roll
    /// back and run again later) and returns when every task has ended.
    pub async fn shutdown(self) -> Result<()> {
        let deadline = self.shared.config.shutdown_timeout;
        self.shutdown_within(deadline).await
    }

    /// [`shutdown`](Self::shutdown) with an explicit deadline for running jobs.
    pub async fn shutdown_within(self, deadline: Duration) -> Result<()> {
        tracing::info!(?deadline, "pgfifo runner stopping: no new jobs will start");
        self.shared.stop.cancel();
        self.shared.wake_all();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("pgfifo runner: shutdown deadline passed, aborting running jobs");
            self.shared.abort.cancel();
            self.tracker.wait().await;
        }
        self.service.cancel();
        tracing::info!("pgfifo runner stopped");
        Ok(())
    }

    /// Stops at once: running jobs are aborted (they run again later).
    pub async fn abort(self) -> Result<()> {
        self.shared.stop.cancel();
        self.shared.abort.cancel();
        self.shared.wake_all();
        self.tracker.wait().await;
        self.service.cancel();
        Ok(())
    }

    /// Waits for SIGINT (Ctrl-C) or SIGTERM, then [`shutdown`](Self::shutdown).
    pub async fn shutdown_on_signal(self) -> Result<()> {
        wait_for_signal().await?;
        self.shutdown().await
    }
}

async fn wait_for_signal() -> Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| Error::Shutdown(format!("cannot listen for SIGTERM: {e}")))?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map_err(|e| Error::Shutdown(format!("cannot listen for SIGINT: {e}")))?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| Error::Shutdown(format!("cannot listen for Ctrl-C: {e}")))?;
    tracing::info!("pgfifo runner: shutdown signal received");
    Ok(())
}

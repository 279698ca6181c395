//! The runner: picks the head job of each free group, runs its handler inside
//! the job's transaction, and commits the outcome.
//!
//! [`start`] validates the registry, the configuration and the schema, then
//! spawns the runner's tasks, each with only the handles it uses:
//!
//! * the **lanes** (`lanes/`): `concurrency + prefetch` loops that pick, run
//!   and commit jobs, and the protocol by which they wait and wake each
//!   other (its module documentation explains it);
//! * the **bookkeeper** (`bookkeeper.rs`), which records attempt starts on
//!   its own connection, outside the jobs' transactions;
//! * the **listener** (`listener.rs`), which promotes woken groups and wakes
//!   idle lanes on the notifications of `pgfifo` and `pgfifo_groups`, with
//!   polling every [`RunnerConfig::poll_interval`] as the fallback;
//! * the **timer** (`timer.rs`), which wakes idle lanes when work the runner
//!   knows of becomes ready by itself (a retry, a delayed job);
//! * the **periodic tasks** (`maintenance/`): the heartbeat row in
//!   `pgfifo.runner`, the sampled gauges of [`metrics`], and [`Retention`]
//!   when configured;
//! * the **scheduler** (`scheduler/`), when the runner declares
//!   [`Schedule`](crate::Schedule)s: it fires their ticks.
//!
//! What an attempt comes to is decided in one place (`outcome.rs`) and
//! broadcast as a [`JobEvent`] once it commits.
//!
//! Lifecycle: [`RunnerHandle::shutdown`] stops picking, lets running jobs
//! finish until the deadline, then aborts the rest (their transactions roll
//! back and the jobs run again later, without losing an attempt).

mod bookkeeper;
mod config;
mod config_limits;
mod events;
mod hung;
mod jitter;
mod lanes;
mod listener;
mod maintenance;
pub mod metrics;
pub(crate) mod outcome;
mod queue_tokens;
mod scheduler;
mod sessions;
mod timer;

pub use config::{DirectUrl, RunnerConfig};
pub use events::{JobEvent, JobOutcome};
pub use maintenance::Retention;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::db::runner::IdleBounds;
use crate::db::Pool;
use crate::names::validate_queue;
use crate::registry::Registry;
use crate::{Error, Result};
use bookkeeper::Bookkeeper;
use events::Events;
use lanes::{Board, LaneSettings, Lanes};
use listener::Listener;
use maintenance::retention::RetentionTask;
use maintenance::{Gauges, Heartbeat};
use sessions::Sessions;
use timer::Timer;

/// Each job type's idle bound: its timeout plus the grace, in ms.
fn idle_bounds(registry: &Registry, config: &RunnerConfig) -> IdleBounds {
    let ms = |timeout: Duration| {
        i32::try_from((timeout + config.idle_grace).as_millis()).unwrap_or(i32::MAX)
    };
    let (kinds, idle_ms) = registry
        .iter()
        .map(|r| {
            (
                r.kind.to_owned(),
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

/// The queues a runner serves: those configured, or those of the registered
/// job types; each once, in order, and valid.
fn served_queues(registry: &Registry, config: &RunnerConfig) -> Result<Vec<String>> {
    let mut queues = match &config.queues {
        Some(queues) => queues.clone(),
        None => registry.queues(),
    };
    // (A queue named twice would be visited twice by every pick.)
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
    Ok(queues)
}

/// How long [`RunnerHandle::shutdown_within`] and [`RunnerHandle::abort`]
/// wait at most for the runner's tasks once running jobs are aborted (or
/// [`RunnerConfig::round_trip_timeout`], if shorter). An aborted job rolls
/// back at once, or its statement still running on the server is
/// cancelled (up to 5 s), so this passes only when the server does not
/// answer.
pub const ABORT_PATIENCE: Duration = Duration::from_secs(6);

/// A running runner. Stop it with [`shutdown`](Self::shutdown) (or
/// [`shutdown_on_signal`](Self::shutdown_on_signal)); dropping the handle
/// leaves it running until the Tokio runtime ends.
pub struct RunnerHandle {
    queues: Vec<String>,
    concurrency: usize,
    shutdown_timeout: Duration,
    /// How long a round trip may take: how long aborted jobs get to end.
    round_trip: Duration,
    board: Arc<Board>,
    events: Events,
    /// Cancelled to stop picking new jobs.
    stop: CancellationToken,
    /// Cancelled to abort running handlers.
    abort: CancellationToken,
    /// Cancelled once the lanes have stopped: ends the other tasks.
    service: CancellationToken,
    tracker: TaskTracker,
}

impl std::fmt::Debug for RunnerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerHandle")
            .field("queues", &self.queues)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// On the distributed layout, fails for what it does not run yet
/// (docs/scaling.md), naming it: weights in the configuration.
fn refuse_on_distributed(config: &RunnerConfig) -> Result<()> {
    let refuse = |what: &str| Err(Error::NotDistributed(what.to_owned()));
    if config
        .group_limits
        .iter()
        .any(|(_, limits)| limits.weight.is_some_and(|w| w > 1))
    {
        return refuse("weights (RunnerConfig::group_limits)");
    }
    Ok(())
}

/// Starts a runner on `pool` and returns its handle.
///
/// Fails, before running anything, when a job registration is invalid (every
/// problem listed), the configuration cannot work, the schema is not this
/// library's (older or newer: the error names both versions and the command
/// to run), or the database cannot be reached.
pub async fn start(pool: Pool, config: RunnerConfig) -> Result<RunnerHandle> {
    let registry = Registry::global()?;
    config.validate()?;
    let queues = served_queues(registry, &config)?;
    let schedules = crate::schedule::compile_all(&config.schedules)?;
    let (pooled, distributed) = {
        let mut conn = pool.get().await?;
        crate::migrate::check_current(&mut conn).await?;
        let distributed =
            crate::migrate::layout(&mut conn).await? == crate::migrate::Layout::Distributed;
        if distributed {
            refuse_on_distributed(&config)?;
        }
        scheduler::declare(&mut conn, &config.name, &schedules).await?;
        for (queue, limits) in &config.group_limits {
            crate::admin::set_default_group_limits(&mut conn, queue, *limits).await?;
        }
        for (queue, limits) in &config.queue_limits {
            crate::admin::set_queue_limits(&mut conn, queue, *limits).await?;
        }
        (
            crate::db::pooler::is_transaction_pooled(&mut conn),
            distributed,
        )
    };
    let direct_url = config.direct_url.as_ref().map(|url| url.as_str());
    let sessions = Sessions::new(&pool, pooled, direct_url);
    if let Sessions::Direct(_) = sessions {
        // A wrong URL is refused now, not retried forever by the listener.
        sessions.open().await.map_err(|err| {
            Error::InvalidConfig(format!("direct_url does not lead to the database: {err}"))
        })?;
    }
    if matches!(sessions, Sessions::Unavailable) {
        tracing::warn!(
            poll_interval = ?config.poll_interval,
            "pgfifo: the pool goes through a transaction-mode pooler and RunnerConfig::direct_url \
             is not set, so this runner cannot LISTEN: it finds new work by polling every \
             poll_interval (see docs/deploying.md)"
        );
    }

    let service = CancellationToken::new();
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let tracker = TaskTracker::new();
    let events = Events::new();
    let metrics = Arc::new(metrics::Metrics::new(&queues));
    let timer = Timer::default();
    // The bookkeeper's connection is taken before any lane starts: lanes wait
    // for it, so they must never hold every connection of the pool.
    let bookkeeping = pool.get_owned().await?;
    let hung = hung::HungSignal::default();
    let bookkeeper = Bookkeeper::spawn(
        pool.clone(),
        bookkeeping,
        (config.name.clone(), config.round_trip_timeout, hung.clone()),
        service.clone(),
        &tracker,
    );
    let prefetch = config.prefetch.unwrap_or((config.concurrency / 2).max(1));
    let board = Arc::new(Board::new(
        config.concurrency,
        prefetch,
        config.poll_interval,
        (config.round_trip_timeout, hung),
    ));

    let look = Arc::new(tokio::sync::Notify::new());
    tracker.spawn(listener::run(
        Listener {
            pool: pool.clone(),
            sessions: sessions.clone(),
            queues: queues.clone(),
            poll_interval: config.poll_interval,
            board: board.clone(),
            timer: timer.clone(),
            look: look.clone(),
            round_trip: config.round_trip_timeout,
            hung: board.hung.clone(),
        },
        service.clone(),
    ));
    let wake = {
        let board = board.clone();
        move |ready| board.wake(ready)
    };
    tracker.spawn(timer::run(timer.clone(), wake, stop.clone()));
    // A rate-limited queue's next tokens wake a lane through the timer.
    let tokens = queue_tokens::QueueTokens {
        pool: pool.clone(),
        queues: queues.clone(),
        distributed,
        poll_interval: config.poll_interval,
        round_trip: config.round_trip_timeout,
        timer: timer.clone(),
        look,
    };
    tracker.spawn(tokens.run(stop.clone()));
    let heartbeat = Heartbeat {
        pool: pool.clone(),
        name: config.name.clone(),
        queues: queues.clone(),
        interval: config.heartbeat_interval,
        round_trip: config.round_trip_timeout,
        hung: board.hung.clone(),
        metrics: metrics.clone(),
        schedules: scheduler::declarations(&schedules),
        chart_failing: Default::default(),
    };
    tracker.spawn(heartbeat.run(service.clone()));
    if !schedules.is_empty() {
        let scheduler = scheduler::Scheduler::new(
            pool.clone(),
            (config.name.clone(), config.round_trip_timeout),
            schedules,
        );
        tracker.spawn(scheduler.run(stop.clone()));
    }
    if let Some(interval) = config.metrics_interval {
        let gauges = Gauges {
            pool: pool.clone(),
            queues: queues.clone(),
            interval,
            round_trip: config.round_trip_timeout,
            metrics: metrics.clone(),
        };
        tracker.spawn(gauges.run(service.clone()));
    }
    // (The dependencies' sweep: not on the distributed layout, where
    // dependencies refuse.)
    if !distributed {
        tracker.spawn(
            maintenance::Sweep {
                pool: pool.clone(),
                round_trip: config.round_trip_timeout,
            }
            .run(service.clone()),
        );
    }
    if let Some(retention) = config.retention.clone() {
        tracker.spawn(maintenance::retention::run(RetentionTask {
            pool: pool.clone(),
            sessions,
            retention,
            metrics: metrics.clone(),
            stop: stop.clone(),
            round_trip: config.round_trip_timeout,
        }));
    }

    let lanes = Arc::new(Lanes {
        board: board.clone(),
        pool,
        queues: queues.clone(),
        registry,
        settings: LaneSettings {
            max_batch: config.max_batch,
            batch_window: config.batch_window,
            poll_interval: config.poll_interval,
            default_timeout: config.default_timeout,
            max_backoff: config.max_backoff,
            long_transaction_warning: config.long_transaction_warning,
            long_lease: config.long_lease,
            runner: config.name.clone(),
        },
        idle_bounds: idle_bounds(registry, &config),
        bookkeeper,
        timer,
        metrics,
        events: events.clone(),
        stop: stop.clone(),
        abort: abort.clone(),
    });
    let lane_tasks = TaskTracker::new();
    lanes.spawn(&lane_tasks);
    lane_tasks.close();
    // The other tasks stop once every lane has.
    let stop_services = service.clone();
    tracker.spawn(async move {
        lane_tasks.wait().await;
        stop_services.cancel();
    });
    tracker.close();
    tracing::info!(
        queues = ?queues,
        concurrency = config.concurrency,
        name = %config.name,
        "pgfifo runner started"
    );
    Ok(RunnerHandle {
        queues,
        concurrency: config.concurrency,
        shutdown_timeout: config.shutdown_timeout,
        round_trip: config.round_trip_timeout,
        board,
        events,
        stop,
        abort,
        service,
        tracker,
    })
}

impl RunnerHandle {
    /// Receives an event for every finished attempt. Events are for
    /// observation (tests, metrics); a slow receiver may miss some.
    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.events.subscribe()
    }

    /// The queues this runner serves.
    pub fn queues(&self) -> &[String] {
        &self.queues
    }

    /// Stops picking jobs, waits for running jobs up to
    /// [`RunnerConfig::shutdown_timeout`], then aborts the rest (they roll
    /// back and run again later) and returns when every task has ended.
    pub async fn shutdown(self) -> Result<()> {
        let deadline = self.shutdown_timeout;
        self.shutdown_within(deadline).await
    }

    /// [`shutdown`](Self::shutdown) with an explicit deadline for running jobs.
    ///
    /// Returns within the deadline plus [`ABORT_PATIENCE`] even when the
    /// server hangs: tasks still waiting on it then are left to end at their
    /// round-trip deadline (their transactions roll back; nothing they did
    /// counts), and the runner says so.
    pub async fn shutdown_within(self, deadline: Duration) -> Result<()> {
        tracing::info!(?deadline, "pgfifo runner stopping: no new jobs will start");
        self.stop.cancel();
        self.board.wake_all();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("pgfifo runner: shutdown deadline passed, aborting running jobs");
            self.abort.cancel();
            self.wait_for_aborted().await;
        }
        self.service.cancel();
        tracing::info!("pgfifo runner stopped");
        Ok(())
    }

    /// Stops at once: running jobs are aborted (they run again later).
    pub async fn abort(self) -> Result<()> {
        self.stop.cancel();
        self.abort.cancel();
        self.board.wake_all();
        self.wait_for_aborted().await;
        self.service.cancel();
        Ok(())
    }

    /// Waits for the tasks once their jobs are aborted, at most
    /// [`ABORT_PATIENCE`] (or the round-trip deadline, if shorter).
    async fn wait_for_aborted(&self) {
        let patience = ABORT_PATIENCE.min(self.round_trip);
        if tokio::time::timeout(patience, self.tracker.wait())
            .await
            .is_err()
        {
            self.service.cancel();
            tracing::warn!(
                ?patience,
                "pgfifo runner: tasks still wait on the database after their jobs were aborted \
                 (a hung server?); returning without them, they end at their round-trip deadline"
            );
        }
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

//! The runner: picks the head job of each free group, runs its handler inside
//! the job's transaction, and commits the outcome.
//!
//! [`start`] validates the registry and the schema, then spawns:
//! * `concurrency` worker loops (`worker`), each with at most one job, its
//!   transaction and its pooled connection at a time;
//! * the bookkeeper (`bookkeeper`), which records attempt starts on its own
//!   connection, outside the jobs' transactions;
//! * the listener (`listener`), which wakes idle workers on `NOTIFY pgfifo`,
//!   with polling every [`RunnerConfig::poll_interval`] as the fallback;
//! * the periodic tasks (`maintenance`): the heartbeat row in `pgfifo.runner`,
//!   the sampled gauges of [`metrics`], and [`Retention`] when configured.
//!
//! Lifecycle: [`RunnerHandle::shutdown`] stops picking, lets running jobs
//! finish until the deadline, then aborts the rest (their transactions roll
//! back and the jobs run again later, without losing an attempt).

mod bookkeeper;
mod execute;
mod listener;
mod maintenance;
pub mod metrics;
mod txn;
mod worker;

pub use maintenance::Retention;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::RUNNER_ALIVE;
use crate::db::sql::IdleBounds;
use crate::db::Pool;
use crate::enqueue::validate_queue;
use crate::registry::Registry;
use crate::{Error, JobId, Result};

/// How a runner works. Start from `RunnerConfig::default()` and adjust:
///
/// ```
/// use std::time::Duration;
/// use pgfifo::RunnerConfig;
///
/// let config = RunnerConfig::default()
///     .queues(["billing", "emails"])
///     .concurrency(16)
///     .poll_interval(Duration::from_millis(500));
/// assert_eq!(config.concurrency, 16);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunnerConfig {
    /// The queues served; `None` (the default) serves every queue that has a
    /// registered job type.
    pub queues: Option<Vec<String>>,
    /// How many jobs may run at once in this process (default 10). Each
    /// running job holds one pooled connection.
    pub concurrency: usize,
    /// How many jobs may be taken ahead of a free slot (default
    /// `concurrency / 2`, at least 1). While handlers run, these extra
    /// connections commit finished jobs and pick the next ones, so a slot
    /// that frees up starts its next job at once instead of after several
    /// round trips. A prefetched job holds its group (nobody else can run
    /// it) and counts an attempt from the moment it is taken. The runner
    /// holds up to `concurrency + prefetch + 2` pooled connections, and
    /// takes one more now and then for its heartbeat and gauges (and one
    /// for each [`Retention`] pass): size the pool for
    /// `concurrency + prefetch + 4` plus the application's needs.
    pub prefetch: Option<usize>,
    /// How often an idle runner looks for work when no notification arrives
    /// (default 1 s). Notifications make new jobs start within milliseconds;
    /// polling catches delayed jobs and retries whose time has come.
    pub poll_interval: Duration,
    /// The timeout of jobs whose type sets none (default 5 minutes).
    pub default_timeout: Duration,
    /// The longest retry delay (default 1 hour).
    pub max_backoff: Duration,
    /// How long [`RunnerHandle::shutdown`] lets running jobs finish before
    /// aborting them (default 30 s).
    pub shutdown_timeout: Duration,
    /// How long, beyond a job's timeout, its transaction may sit idle before
    /// PostgreSQL ends the session (default 30 s). This is what frees the
    /// group of a worker that froze (SIGSTOP, a stalled VM) without closing
    /// its connection: the server's `idle_in_transaction_session_timeout` is
    /// set to the job's timeout plus this grace for each job's transaction.
    pub idle_grace: Duration,
    /// The runner's name: recorded with each attempt and as its row in
    /// `pgfifo.runner`. Must be unique among live runners (default
    /// `hostname:pid:xxxx`, with 4 random hex digits).
    pub name: String,
    /// How often the runner writes its heartbeat row in `pgfifo.runner`
    /// (default 5 s, at most 15 s): its queues and how many jobs it runs
    /// now, which `pgfifo status` reports. A runner whose heartbeat is older
    /// than [`admin::RUNNER_ALIVE`](crate::admin::RUNNER_ALIVE) counts as
    /// gone. The row is deleted on shutdown.
    pub heartbeat_interval: Duration,
    /// How often the sampled gauges of [`metrics`] (queue depth, group lag,
    /// blocked groups) are read from the database (default 15 s); `None`
    /// reads them never. The counters and the running gauge are recorded as
    /// jobs run, whatever this is.
    pub metrics_interval: Option<Duration>,
    /// Deleting old finished jobs and idle groups (see [`Retention`]). The
    /// default, `None`, deletes nothing: deleting history is opt-in.
    pub retention: Option<Retention>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            queues: None,
            concurrency: 10,
            prefetch: None,
            poll_interval: Duration::from_secs(1),
            default_timeout: Duration::from_secs(300),
            max_backoff: Duration::from_secs(3600),
            shutdown_timeout: Duration::from_secs(30),
            idle_grace: Duration::from_secs(30),
            name: default_name(),
            heartbeat_interval: Duration::from_secs(5),
            metrics_interval: Some(Duration::from_secs(15)),
            retention: None,
        }
    }
}

impl RunnerConfig {
    /// Serves only these queues.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = Some(queues.into_iter().map(Into::into).collect());
        self
    }

    /// Runs at most `n` jobs at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Takes up to `n` jobs ahead of a free slot (see [`RunnerConfig::prefetch`]).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Looks for work at least this often when idle.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The timeout of job types that set none.
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// The longest retry delay.
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    /// How long shutdown waits for running jobs before aborting them.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long beyond its timeout a job's transaction may sit idle.
    pub fn idle_grace(mut self, grace: Duration) -> Self {
        self.idle_grace = grace;
        self
    }

    /// The runner's name (unique among live runners).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Writes the heartbeat row this often.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// Samples the database's gauges this often (`None`: never).
    pub fn metrics_interval(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.metrics_interval = interval.into();
        self
    }

    /// Deletes old finished jobs and idle groups (`None`: nothing).
    pub fn retention(mut self, retention: impl Into<Option<Retention>>) -> Self {
        self.retention = retention.into();
        self
    }

    /// Rejects settings that cannot work.
    fn validate(&self) -> Result<()> {
        let invalid = |reason: &str| Err(Error::InvalidConfig(reason.into()));
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return invalid("poll_interval must be longer than zero");
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval > RUNNER_ALIVE / 2 {
            return Err(Error::InvalidConfig(format!(
                "heartbeat_interval must be longer than zero and at most {:?} (half the age \
                 past which a runner counts as gone)",
                RUNNER_ALIVE / 2
            )));
        }
        if self.metrics_interval.is_some_and(|i| i.is_zero()) {
            return invalid("metrics_interval must be longer than zero (or None)");
        }
        if self.name.is_empty() {
            return invalid("name must not be empty");
        }
        match &self.retention {
            Some(retention) => retention.validate(),
            None => Ok(()),
        }
    }
}

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

fn default_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let tag = (worker::random_fraction() * 65_536.0) as u16;
    format!("{host}:{}:{tag:04x}", std::process::id())
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
    /// Metric handles and the running counts the heartbeat reports.
    pub metrics: metrics::Metrics,
}

impl Shared {
    fn emit(&self, event: JobEvent) {
        // Nobody listening is fine.
        let _ = self.events.send(event);
    }

    /// A job's outcome committed: count it and broadcast its event.
    fn committed(&self, done: execute::Done) {
        self.metrics.committed(&done.event, done.run);
        self.emit(done.event);
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
    let queues = match &config.queues {
        Some(queues) => queues.clone(),
        None => registry.queues(),
    };
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
        self.shared.wake.notify_waiters();
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
        self.shared.wake.notify_waiters();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_differ_by_a_random_tag() {
        let name = default_name();
        let parts: Vec<&str> = name.rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3, "{name}");
        assert_eq!(parts[0].len(), 4, "{name}");
        assert!(parts[0].chars().all(|c| c.is_ascii_hexdigit()), "{name}");
        assert_eq!(parts[1], std::process::id().to_string());
        assert!(!parts[2].is_empty());
        // 16 bits of randomness: ten names are practically never all equal.
        let names: std::collections::HashSet<_> = (0..10).map(|_| default_name()).collect();
        assert!(names.len() > 1);
    }

    #[test]
    fn the_default_config_is_valid_and_keeps_history() {
        let config = RunnerConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.retention, None);
        assert_eq!(config.heartbeat_interval, Duration::from_secs(5));
        assert_eq!(config.metrics_interval, Some(Duration::from_secs(15)));
    }

    #[test]
    fn unworkable_configs_are_rejected() {
        let bad = [
            RunnerConfig::default().concurrency(0),
            RunnerConfig::default().poll_interval(Duration::ZERO),
            RunnerConfig::default().heartbeat_interval(Duration::ZERO),
            RunnerConfig::default().heartbeat_interval(RUNNER_ALIVE),
            RunnerConfig::default().metrics_interval(Duration::ZERO),
            RunnerConfig::default().name(""),
            RunnerConfig::default().retention(Retention::default().batch_size(0)),
        ];
        for config in bad {
            assert!(
                matches!(config.validate(), Err(Error::InvalidConfig(_))),
                "{config:?}"
            );
        }
        let fine = RunnerConfig::default()
            .metrics_interval(None)
            .retention(Retention::default())
            .heartbeat_interval(RUNNER_ALIVE / 2);
        assert!(fine.validate().is_ok());
    }
}

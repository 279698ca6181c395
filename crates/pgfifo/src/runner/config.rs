//! [`RunnerConfig`]: how a runner works, with its defaults and checks.

use std::time::Duration;

use super::maintenance::Retention;
use crate::admin::RUNNER_ALIVE;
use crate::schedule::Schedule;
use crate::{Error, GroupLimits, QueueLimits, Result};

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
    /// it) and counts an attempt from the moment it is taken. While recent
    /// handlers took less than a millisecond on average, these lanes rest:
    /// slots then free up faster than prefetching could help, and the extra
    /// lanes would only compete for the same groups. The runner
    /// holds up to `concurrency + prefetch + 1` pooled connections, and
    /// takes one more now and then for its heartbeat and gauges: size the
    /// pool for `concurrency + prefetch + 4` plus the application's needs.
    /// LISTEN and each [`Retention`] pass use a server connection of their
    /// own, outside the pool.
    pub prefetch: Option<usize>,
    /// How often an idle runner looks for work when no notification arrives
    /// (default 1 s). Notifications make new jobs start within milliseconds,
    /// and work the runner learnt the time of (a retry it wrote, a group it
    /// advanced or promoted to a delayed job) wakes a free lane when it is
    /// due; polling catches the rest: delayed ungrouped jobs, retries and
    /// delays that another runner learnt of while it was busy, lost
    /// notifications.
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
    /// How long a job's transaction may stay open before the runner warns
    /// (default 60 s; `None`: never). A job of a type in the default mode
    /// runs inside its transaction, and an open transaction holds back
    /// VACUUM's horizon for the whole database server. Past this age the
    /// runner logs one warning for the run (tracing, level `WARN`, naming
    /// the job type and suggesting long mode, `#[job(long)]`) and counts it
    /// in [`LONG_TRANSACTIONS`](crate::runner::metrics::LONG_TRANSACTIONS).
    /// The age is counted from the handler's start (its transaction began
    /// at most a batch window earlier). Jobs in long mode
    /// ([`Job::LONG`](crate::Job::LONG)) hold no transaction and are never
    /// warned about.
    pub long_transaction_warning: Option<Duration>,
    /// How long a job in long mode ([`Job::LONG`](crate::Job::LONG)) holds
    /// its group without a sign of life from its runner (default 30 s).
    /// While the handler runs, the runner renews the lease every third of
    /// this. A runner that froze (SIGSTOP, a stalled VM) keeps its
    /// connection, and so its group, until the lease has passed: the next
    /// pick that meets the group then ends the frozen runner's database
    /// session (`pg_terminate_backend`; the runner's role needs the right,
    /// as for any backend of the same role, or `pg_signal_backend`) and the
    /// job runs again. A crash or a lost connection frees the group at once,
    /// whatever this is.
    pub long_lease: Duration,
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
    /// The most jobs one transaction may run (default 16; 1 turns batching
    /// off). A worker picks the heads of several free groups at once and
    /// runs their handlers one after another in one transaction, with one
    /// completion statement and one commit for all, while handlers are
    /// short and leave the job's connection alone. When no other group is
    /// ready, it also takes the next jobs of the groups it took, so that a
    /// group with a backlog of quick jobs runs up to this many per
    /// transaction, in order, each started once the one before it
    /// succeeded. A handler that takes
    /// [`JobContext::conn`](crate::JobContext::conn) always ends its
    /// transaction's batch, so jobs that write through it never share a
    /// transaction with another job's writes. See `docs/performance.md`.
    pub max_batch: usize,
    /// No handler of a batch starts later than this after the batch's first
    /// one (default 25 ms), which bounds how long a finished job waits for
    /// its commit, and its group for its next job. Workers size their picks
    /// from how long recent handlers took, so that a batch fits in this
    /// window. Batches are only taken while every worker has work: while
    /// slots are free and another worker looks for work, a pick takes one
    /// job, and a pick that took every ready job keeps only one, so that
    /// jobs of different groups run side by side rather than one after
    /// another, however short recent handlers were.
    pub batch_window: Duration,
    /// Recurring jobs this runner declares and fires (default none); add
    /// them with [`schedule`](Self::schedule).
    pub schedules: Vec<Schedule>,
    /// Default limits for the groups of a queue, written to the database at
    /// start (see [`group_limits`](Self::group_limits)).
    pub group_limits: Vec<(String, GroupLimits)>,
    /// Whole queues' limits this runner sets at its start (see
    /// [`queue_limits`](Self::queue_limits)).
    pub queue_limits: Vec<(String, QueueLimits)>,
    /// A URL straight to PostgreSQL, for what a transaction-mode pooler
    /// cannot carry: the LISTEN connection and retention's session lock.
    /// Only read when the pool's connections go through such a pooler
    /// ([`ConnectOptions::transaction_pooler`](crate::ConnectOptions::transaction_pooler)).
    /// Without it, that runner polls for new work every
    /// [`poll_interval`](Self::poll_interval) instead of being notified, and
    /// says so once at start. See `docs/deploying.md`.
    pub direct_url: Option<DirectUrl>,
    /// How long the runner waits for the server to answer one of its own
    /// round trips (a pick, a completion, a commit, attempt bookkeeping,
    /// the heartbeat, a promote, LISTEN) before it drops the connection and
    /// takes a new one (default 10 s): a hung server, or one that vanished
    /// without closing the connection, holds a runner no longer than this,
    /// and a multi-host URL then leads the new connection to the writable
    /// server (`docs/failover.md`). A handler's own statements have no such
    /// bound (its job's timeout cancels them).
    pub round_trip_timeout: Duration,
}

/// A connection URL that is never printed whole: its `Debug` hides the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct DirectUrl(String);

impl DirectUrl {
    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DirectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = &self.0;
        // `scheme://user:password@host…`: the password is what sits between
        // the first ':' after the scheme and the last '@' before the path.
        let start = url.find("://").map_or(0, |i| i + 3);
        let end = url[start..]
            .find(['/', '?'])
            .map_or(url.len(), |i| start + i);
        match url[start..end].rfind('@') {
            Some(at) => match url[start..start + at].find(':') {
                Some(colon) => write!(
                    f,
                    "{:?}",
                    format!("{}:***{}", &url[..start + colon], &url[start + at..])
                ),
                None => write!(f, "{url:?}"),
            },
            None => write!(f, "{url:?}"),
        }
    }
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
            long_transaction_warning: Some(Duration::from_secs(60)),
            long_lease: Duration::from_secs(30),
            name: default_name(),
            heartbeat_interval: Duration::from_secs(5),
            metrics_interval: Some(Duration::from_secs(15)),
            retention: None,
            max_batch: 16,
            batch_window: Duration::from_millis(25),
            schedules: Vec::new(),
            group_limits: Vec::new(),
            queue_limits: Vec::new(),
            direct_url: None,
            round_trip_timeout: Duration::from_secs(10),
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

    /// Warns about job transactions open longer than this (`None`: never;
    /// see [`RunnerConfig::long_transaction_warning`]).
    pub fn long_transaction_warning(mut self, age: impl Into<Option<Duration>>) -> Self {
        self.long_transaction_warning = age.into();
        self
    }

    /// How long a long job holds its group without a sign of life (see
    /// [`RunnerConfig::long_lease`]).
    pub fn long_lease(mut self, lease: Duration) -> Self {
        self.long_lease = lease;
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

    /// Runs at most `n` jobs per transaction (see [`RunnerConfig::max_batch`]).
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Starts no handler of a batch later than this after its first.
    pub fn batch_window(mut self, window: Duration) -> Self {
        self.batch_window = window;
        self
    }

    /// Declares a recurring job: the runner enqueues its job on every tick,
    /// once per tick however many runners declare it. Checked by
    /// [`runner::start`](crate::runner::start), which names every invalid
    /// schedule. See [`Schedule`].
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Sets [`direct_url`](Self::direct_url).
    pub fn direct_url(mut self, url: impl Into<String>) -> Self {
        self.direct_url = Some(DirectUrl(url.into()));
        self
    }

    /// Sets [`round_trip_timeout`](Self::round_trip_timeout).
    pub fn round_trip_timeout(mut self, deadline: Duration) -> Self {
        self.round_trip_timeout = deadline;
        self
    }

    /// Rejects settings that cannot work.
    pub(super) fn validate(&self) -> Result<()> {
        let invalid = |reason: &str| Err(Error::InvalidConfig(reason.into()));
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1");
        }
        if self.max_batch == 0 {
            return invalid("max_batch must be at least 1 (1: one job per transaction)");
        }
        // A batch of handlers that leave the connection alone is one idle
        // stretch of its transaction, up to the window plus the last
        // handler's run: the idle bound (timeout + grace) must cover it.
        if self.batch_window >= self.idle_grace {
            return invalid("batch_window must be shorter than idle_grace");
        }
        if self.round_trip_timeout < Duration::from_millis(100) {
            return invalid("round_trip_timeout must be at least 100 ms");
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
        if self.long_transaction_warning.is_some_and(|a| a.is_zero()) {
            return invalid("long_transaction_warning must be longer than zero (or None)");
        }
        if self.long_lease < Duration::from_millis(300) {
            return invalid("long_lease must be at least 300 ms");
        }
        if self.name.is_empty() {
            return invalid("name must not be empty");
        }
        for (queue, limits) in &self.group_limits {
            crate::names::validate_queue(queue)?;
            limits.validate()?;
        }
        for (queue, limits) in &self.queue_limits {
            crate::names::validate_queue(queue)?;
            limits.validate()?;
        }
        match &self.retention {
            Some(retention) => retention.validate(),
            None => Ok(()),
        }
    }
}

fn default_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let tag = (super::jitter::random_fraction() * 65_536.0) as u16;
    format!("{host}:{}:{tag:04x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direct_url_prints_without_its_password() {
        let config = RunnerConfig::default().direct_url("postgres://app:s3cret@db:5432/app");
        let printed = format!("{config:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(
            printed.contains("postgres://app:***@db:5432/app"),
            "{printed}"
        );
        let plain = DirectUrl("postgres://app@db/app".into());
        assert_eq!(format!("{plain:?}"), "\"postgres://app@db/app\"");
    }

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
        assert_eq!(config.max_batch, 16);
        assert_eq!(
            config.long_transaction_warning,
            Some(Duration::from_secs(60))
        );
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
            RunnerConfig::default().long_transaction_warning(Duration::ZERO),
            RunnerConfig::default().long_lease(Duration::from_millis(10)),
            RunnerConfig::default().max_batch(0),
            RunnerConfig::default().batch_window(Duration::from_secs(30)),
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

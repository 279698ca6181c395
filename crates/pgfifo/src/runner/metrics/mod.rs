//! Metrics of a runner, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! pgfifo only records: install a recorder (an exporter such as
//! `metrics-exporter-prometheus`) in your application **before**
//! [`runner::start`](crate::runner::start), because the runner registers its
//! metric handles once, at start (per queue) or at the first job of each type
//! (per queue and type), and keeps them. Without a recorder every metric is a
//! no-op.
//!
//! | name | type | labels | meaning |
//! |------|------|--------|---------|
//! | `pgfifo_jobs_started_total` | counter | `queue`, `kind` | handlers started |
//! | `pgfifo_jobs_succeeded_total` | counter | `queue`, `kind` | jobs that succeeded (counted once committed) |
//! | `pgfifo_jobs_retried_total` | counter | `queue`, `kind` | failed attempts that will be retried |
//! | `pgfifo_jobs_failed_total` | counter | `queue`, `kind` | jobs failed for good (attempts used up, permanent error, timeout on the last attempt, unknown type, bad payload) |
//! | `pgfifo_jobs_cancelled_total` | counter | `queue`, `kind` | jobs cancelled by their handler |
//! | `pgfifo_jobs_snoozed_total` | counter | `queue`, `kind` | runs whose handler snoozed their group |
//! | `pgfifo_jobs_aborted_total` | counter | `queue`, `kind` | runs that ended without an outcome (shutdown deadline, lost connection, an outcome the database refused); the job runs again |
//! | `pgfifo_job_duration_seconds` | histogram | `queue`, `kind`, `outcome` | handler run time in seconds; `outcome` is `succeeded`, `retried`, `failed`, `cancelled` or `aborted` |
//! | `pgfifo_long_transactions_total` | counter | `queue`, `kind` | runs whose job transaction stayed open longer than [`RunnerConfig::long_transaction_warning`](crate::RunnerConfig::long_transaction_warning) (each counted once; a hint to run the type in long mode, `#[job(long)]`) |
//! | `pgfifo_jobs_running` | gauge | `queue` | handlers running now in this runner (including the moment until their outcome commits) |
//! | `pgfifo_queue_depth` | gauge | `queue` | unfinished jobs (waiting, scheduled, between retries or running; counted up to [`COUNT_CAP`](crate::admin::COUNT_CAP)), sampled |
//! | `pgfifo_group_lag_seconds` | gauge | `queue` | how long the oldest head of an active group has been enqueued, in seconds (0 when no group has one): how far the queue lags, sampled |
//! | `pgfifo_blocked_groups` | gauge | `queue` | groups with jobs that cannot run now (paused, held at a failed head, or waiting for a retry), sampled |
//! | `pgfifo_jobs_purged_total` | counter | — | jobs deleted by [retention](crate::runner::Retention) |
//! | `pgfifo_groups_cleaned_total` | counter | — | idle groups deleted by retention |
//! | `pgfifo_schedule_ticks_fired_total` | counter | `schedule` | ticks of a [schedule](crate::Schedule) this runner enqueued a job for |
//! | `pgfifo_schedule_ticks_missed_total` | counter | `schedule` | due ticks this runner dealt with that got no job of their own (see [`Missed`](crate::Missed)) |
//!
//! The counters of job outcomes count what was committed, so they agree with
//! the database (a run whose commit fails counts as aborted). Every started
//! handler ends in exactly one outcome counter, `aborted` included; a job
//! that fails before its handler starts (unknown type, attempts used up by
//! crashes) counts as failed without being started.
//!
//! The sampled gauges are read from the database every
//! [`RunnerConfig::metrics_interval`](crate::RunnerConfig::metrics_interval)
//! (default 15 s) by every runner; each runner reports the queues it serves,
//! so aggregate them with `max` (not `sum`) across runners.
//! `pgfifo_jobs_running` is per runner: `sum` it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Label, Unit};

use super::events::{JobEvent, JobOutcome};

/// Counter: handlers started (labels `queue`, `kind`).
pub const JOBS_STARTED: &str = "pgfifo_jobs_started_total";
/// Counter: jobs that succeeded (labels `queue`, `kind`).
pub const JOBS_SUCCEEDED: &str = "pgfifo_jobs_succeeded_total";
/// Counter: failed attempts that will be retried (labels `queue`, `kind`).
pub const JOBS_RETRIED: &str = "pgfifo_jobs_retried_total";
/// Counter: jobs failed for good (labels `queue`, `kind`).
pub const JOBS_FAILED: &str = "pgfifo_jobs_failed_total";
/// Counter: jobs cancelled by their handler (labels `queue`, `kind`).
pub const JOBS_CANCELLED: &str = "pgfifo_jobs_cancelled_total";
/// Counter: runs whose handler snoozed their group (labels `queue`, `kind`).
pub const JOBS_SNOOZED: &str = "pgfifo_jobs_snoozed_total";
/// Counter: runs aborted without an outcome; the job runs again (labels
/// `queue`, `kind`).
pub const JOBS_ABORTED: &str = "pgfifo_jobs_aborted_total";
/// Histogram: handler run time in seconds (labels `queue`, `kind`, `outcome`).
pub const JOB_DURATION: &str = "pgfifo_job_duration_seconds";
/// Counter: runs whose job transaction stayed open longer than
/// [`RunnerConfig::long_transaction_warning`](crate::RunnerConfig::long_transaction_warning),
/// each counted once (labels `queue`, `kind`).
pub const LONG_TRANSACTIONS: &str = "pgfifo_long_transactions_total";
/// Gauge: handlers running now in this runner (label `queue`).
pub const JOBS_RUNNING: &str = "pgfifo_jobs_running";
/// Gauge: unfinished jobs, sampled (label `queue`).
pub const QUEUE_DEPTH: &str = "pgfifo_queue_depth";
/// Gauge: how long the oldest group head has been enqueued, in seconds,
/// sampled (label `queue`).
pub const GROUP_LAG: &str = "pgfifo_group_lag_seconds";
/// Gauge: groups with jobs that cannot run now (paused, held, retrying),
/// sampled (label `queue`).
pub const BLOCKED_GROUPS: &str = "pgfifo_blocked_groups";
/// Counter: jobs deleted by retention.
pub const JOBS_PURGED: &str = "pgfifo_jobs_purged_total";
/// Counter: idle groups deleted by retention.
pub const GROUPS_CLEANED: &str = "pgfifo_groups_cleaned_total";
/// Counter: schedule ticks this runner enqueued a job for (label `schedule`).
pub const SCHEDULE_TICKS_FIRED: &str = "pgfifo_schedule_ticks_fired_total";
/// Counter: due schedule ticks this runner dealt with that got no job of
/// their own (label `schedule`).
pub const SCHEDULE_TICKS_MISSED: &str = "pgfifo_schedule_ticks_missed_total";

/// What a run came to, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Succeeded,
    Retried,
    Failed,
    Cancelled,
    Snoozed,
    Aborted,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Succeeded,
        Outcome::Retried,
        Outcome::Failed,
        Outcome::Cancelled,
        Outcome::Snoozed,
        Outcome::Aborted,
    ];

    fn of(outcome: &JobOutcome) -> Self {
        match outcome {
            JobOutcome::Succeeded => Outcome::Succeeded,
            JobOutcome::Retrying { .. } => Outcome::Retried,
            JobOutcome::Failed { .. } => Outcome::Failed,
            JobOutcome::Cancelled { .. } => Outcome::Cancelled,
            JobOutcome::Snoozed { .. } => Outcome::Snoozed,
            JobOutcome::Aborted { .. } => Outcome::Aborted,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Retried => "retried",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Snoozed => "snoozed",
            Outcome::Aborted => "aborted",
        }
    }

    fn counter_name(self) -> &'static str {
        match self {
            Outcome::Succeeded => JOBS_SUCCEEDED,
            Outcome::Retried => JOBS_RETRIED,
            Outcome::Failed => JOBS_FAILED,
            Outcome::Cancelled => JOBS_CANCELLED,
            Outcome::Snoozed => JOBS_SNOOZED,
            Outcome::Aborted => JOBS_ABORTED,
        }
    }
}

/// The handles of one (queue, job type).
struct KindMetrics {
    started: Counter,
    /// Outcome counters and duration histograms, indexed by `Outcome as usize`.
    outcomes: [Counter; 6],
    durations: [Histogram; 6],
    long_transactions: Counter,
}

impl KindMetrics {
    fn register(queue: &str, kind: &str) -> Self {
        let labels = vec![
            Label::new("queue", queue.to_owned()),
            Label::new("kind", kind.to_owned()),
        ];
        Self {
            started: metrics::counter!(JOBS_STARTED, labels.clone()),
            outcomes: Outcome::ALL.map(|o| metrics::counter!(o.counter_name(), labels.clone())),
            durations: Outcome::ALL.map(|o| {
                let mut labels = labels.clone();
                labels.push(Label::new("outcome", o.label()));
                metrics::histogram!(JOB_DURATION, labels)
            }),
            long_transactions: metrics::counter!(LONG_TRANSACTIONS, labels.clone()),
        }
    }

    fn record(&self, outcome: Outcome, ran_for: Option<Duration>) {
        self.outcomes[outcome as usize].increment(1);
        if let Some(ran_for) = ran_for {
            self.durations[outcome as usize].record(ran_for);
        }
    }
}

/// The handles and in-memory counters of one served queue.
struct QueueMetrics {
    /// Handlers running now (the heartbeat reports it).
    running: AtomicI64,
    /// Jobs that succeeded, and failed for good, since the heartbeat last
    /// recorded them (`pgfifo.queue_minute`).
    unrecorded_succeeded: AtomicU64,
    unrecorded_failed: AtomicU64,
    running_gauge: Gauge,
    depth: Gauge,
    lag: Gauge,
    blocked: Gauge,
    /// Per job type, registered at its first job.
    kinds: RwLock<HashMap<String, Arc<KindMetrics>>>,
}

impl QueueMetrics {
    fn register(queue: &str) -> Self {
        let label = || [("queue", queue.to_owned())];
        Self {
            running: AtomicI64::new(0),
            unrecorded_succeeded: AtomicU64::new(0),
            unrecorded_failed: AtomicU64::new(0),
            running_gauge: metrics::gauge!(JOBS_RUNNING, &label()),
            depth: metrics::gauge!(QUEUE_DEPTH, &label()),
            lag: metrics::gauge!(GROUP_LAG, &label()),
            blocked: metrics::gauge!(BLOCKED_GROUPS, &label()),
            kinds: RwLock::new(HashMap::new()),
        }
    }

    fn kind(&self, queue: &str, kind: &str) -> Arc<KindMetrics> {
        // A poisoned lock only means a panic elsewhere while inserting: the
        // map is still consistent.
        if let Some(found) = self
            .kinds
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(kind)
        {
            return found.clone();
        }
        self.kinds
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind.to_owned())
            .or_insert_with(|| Arc::new(KindMetrics::register(queue, kind)))
            .clone()
    }
}

/// The runner's metric handles and running counters, built once at start.
pub(crate) struct Metrics {
    queues: HashMap<String, Arc<QueueMetrics>>,
    purged: Counter,
    groups_cleaned: Counter,
}

impl Metrics {
    /// Describes the metrics to the installed recorder and registers the
    /// handles of the served queues.
    pub(crate) fn new(queues: &[String]) -> Self {
        describe();
        Self {
            queues: queues
                .iter()
                .map(|q| (q.clone(), Arc::new(QueueMetrics::register(q))))
                .collect(),
            purged: metrics::counter!(JOBS_PURGED),
            groups_cleaned: metrics::counter!(GROUPS_CLEANED),
        }
    }

    /// A handler of `kind` starts in `queue` (one of the served queues; `None`
    /// otherwise). The returned run counts as running until it is dropped.
    pub(crate) fn start(&self, queue: &str, kind: &str) -> Option<Run> {
        let counters = self.queues.get(queue)?;
        let handles = counters.kind(queue, kind);
        handles.started.increment(1);
        counters.running.fetch_add(1, Ordering::Relaxed);
        counters.running_gauge.increment(1.0);
        Some(Run {
            queue: counters.clone(),
            handles,
            started: Instant::now(),
            ran_for: None,
            settled: false,
        })
    }

    /// Counts the committed outcome of `event`, and its handler's run time
    /// when `run` is the handler's run.
    pub(crate) fn committed(&self, event: &JobEvent, run: Option<Run>) {
        let outcome = Outcome::of(&event.outcome);
        if let Some(counters) = self.queues.get(&event.queue) {
            match outcome {
                Outcome::Succeeded => {
                    counters
                        .unrecorded_succeeded
                        .fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Failed => {
                    counters.unrecorded_failed.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        match run {
            Some(mut run) => {
                run.handles.record(outcome, run.ran_for);
                run.settled = true;
            }
            None => {
                if let Some(counters) = self.queues.get(&event.queue) {
                    counters
                        .kind(&event.queue, &event.kind)
                        .record(outcome, None);
                }
            }
        }
    }

    /// Handlers running now, per served queue: `{"queue": n}`.
    pub(crate) fn running(&self) -> serde_json::Value {
        self.queues
            .iter()
            .map(|(queue, counters)| {
                let n = counters.running.load(Ordering::Relaxed).max(0);
                (queue.clone(), serde_json::Value::from(n))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Takes the jobs finished since the last call, per queue with any:
    /// `(queue, succeeded, failed)`. Give them back with
    /// [`unfinish`](Self::unfinish) if they could not be recorded.
    pub(crate) fn take_finished(&self) -> Vec<(String, i64, i64)> {
        self.queues
            .iter()
            .filter_map(|(queue, c)| {
                let ok = c.unrecorded_succeeded.swap(0, Ordering::Relaxed);
                let failed = c.unrecorded_failed.swap(0, Ordering::Relaxed);
                (ok + failed > 0).then(|| (queue.clone(), ok as i64, failed as i64))
            })
            .collect()
    }

    /// Puts back counts [`take_finished`](Self::take_finished) took.
    pub(crate) fn unfinish(&self, finished: &[(String, i64, i64)]) {
        for (queue, ok, failed) in finished {
            if let Some(c) = self.queues.get(queue) {
                c.unrecorded_succeeded
                    .fetch_add(*ok as u64, Ordering::Relaxed);
                c.unrecorded_failed
                    .fetch_add(*failed as u64, Ordering::Relaxed);
            }
        }
    }

    /// Sets the sampled gauges of the queues in `gauges`.
    pub(crate) fn set_gauges(&self, gauges: &[crate::admin::QueueGauges]) {
        for sample in gauges {
            if let Some(counters) = self.queues.get(&sample.queue) {
                counters.depth.set(sample.depth as f64);
                counters
                    .lag
                    .set(sample.oldest_head_age.map_or(0.0, |age| age.as_secs_f64()));
                counters.blocked.set(sample.blocked_groups as f64);
            }
        }
    }

    /// Counts what one retention pass deleted.
    pub(crate) fn retained(&self, purged: u64, groups_cleaned: u64) {
        self.purged.increment(purged);
        self.groups_cleaned.increment(groups_cleaned);
    }
}

/// A handler run: counted as running until dropped. Dropped without its
/// outcome being committed ([`Metrics::committed`]), it counts as aborted.
pub(crate) struct Run {
    queue: Arc<QueueMetrics>,
    handles: Arc<KindMetrics>,
    started: Instant,
    ran_for: Option<Duration>,
    settled: bool,
}

impl Run {
    /// The handler returned (or was cut off): its run time ends now.
    pub(crate) fn handler_finished(&mut self) {
        self.ran_for = Some(self.started.elapsed());
    }

    /// The run's job transaction has been open longer than the runner's
    /// warning age.
    pub(crate) fn long_transaction(&self) {
        self.handles.long_transactions.increment(1);
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.queue.running.fetch_sub(1, Ordering::Relaxed);
        self.queue.running_gauge.decrement(1.0);
        if !self.settled {
            let ran_for = self.ran_for.unwrap_or_else(|| self.started.elapsed());
            self.handles.record(Outcome::Aborted, Some(ran_for));
        }
    }
}

/// Gives the installed recorder each metric's unit and help text.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    let count = Unit::Count;
    describe_counter!(JOBS_STARTED, count, "Job handlers started");
    describe_counter!(JOBS_SUCCEEDED, count, "Jobs that succeeded");
    describe_counter!(JOBS_RETRIED, count, "Failed attempts that will be retried");
    describe_counter!(JOBS_FAILED, count, "Jobs that failed for good");
    describe_counter!(JOBS_CANCELLED, count, "Jobs cancelled by their handler");
    describe_counter!(
        JOBS_SNOOZED,
        count,
        "Runs whose handler snoozed their group"
    );
    describe_counter!(
        JOBS_ABORTED,
        count,
        "Runs ended without an outcome (shutdown, lost connection); the job runs again"
    );
    describe_counter!(
        LONG_TRANSACTIONS,
        count,
        "Runs whose job transaction stayed open past the warning age (see #[job(long)])"
    );
    describe_histogram!(JOB_DURATION, Unit::Seconds, "Handler run time, by outcome");
    describe_gauge!(JOBS_RUNNING, count, "Handlers running now in this runner");
    describe_gauge!(QUEUE_DEPTH, count, "Unfinished jobs (sampled)");
    describe_gauge!(
        GROUP_LAG,
        Unit::Seconds,
        "Age of the oldest group head since it was enqueued (sampled)"
    );
    describe_gauge!(
        BLOCKED_GROUPS,
        count,
        "Groups with jobs that cannot run now: paused, held, or waiting for a retry (sampled)"
    );
    describe_counter!(JOBS_PURGED, count, "Jobs deleted by retention");
    describe_counter!(
        SCHEDULE_TICKS_FIRED,
        count,
        "Schedule ticks this runner enqueued a job for"
    );
    describe_counter!(
        SCHEDULE_TICKS_MISSED,
        count,
        "Due schedule ticks that got no job of their own"
    );
    describe_counter!(GROUPS_CLEANED, count, "Idle groups deleted by retention");
}

#[cfg(test)]
mod tests;

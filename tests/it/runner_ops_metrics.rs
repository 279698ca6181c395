//! The runner's metrics, seen through a recorder of the test's own.
//!
//! `metrics::set_default_local_recorder` installs a recorder for the current
//! thread only, and the runner registers its handles when it starts and at
//! the first job of each type, on its tasks. These tests therefore run on a
//! current-thread runtime: the runner's tasks run on the test's thread, see
//! the test's recorder, and no other test (nor a global recorder) does.
//!
//! The recorder is a plain registry read without side effects: the
//! `DebuggingRecorder` of metrics-util 0.20 resets counters and gauges to
//! zero at each snapshot, which polling cannot live with (the running gauge
//! is kept by increments and decrements).

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use pgfifo::admin;
use pgfifo::runner::metrics::{
    BLOCKED_GROUPS, GROUPS_CLEANED, GROUP_LAG, JOBS_ABORTED, JOBS_CANCELLED, JOBS_FAILED,
    JOBS_PURGED, JOBS_RETRIED, JOBS_RUNNING, JOBS_STARTED, JOBS_SUCCEEDED, JOB_DURATION,
    LONG_TRANSACTIONS, QUEUE_DEPTH,
};
use pgfifo::{Job, Retention};
use pgfifo_tests::eventually;

use crate::runner_ops_support::{Act, Fx, RunnerOpsJob, LIMIT, QUEUE, TICK};

/// A recorder that keeps every metric's current value, readable at any time.
struct Seen {
    registry: Registry<Key, AtomicStorage>,
}

impl Recorder for Seen {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// Whether `key` is `name` with exactly `labels`, in any order.
fn is(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    let mut have: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
    let mut want = labels.to_vec();
    have.sort_unstable();
    want.sort_unstable();
    key.name() == name && have == want
}

/// The labels of the test job's per-kind metrics.
const KIND: [(&str, &str); 2] = [("queue", QUEUE), ("kind", RunnerOpsJob::KIND)];

/// The labels of the per-queue gauges.
const Q: [(&str, &str); 1] = [("queue", QUEUE)];

/// An outcome's counter and its `outcome` label.
const OUTCOMES: [(&str, &str); 5] = [
    (JOBS_SUCCEEDED, "succeeded"),
    (JOBS_RETRIED, "retried"),
    (JOBS_FAILED, "failed"),
    (JOBS_CANCELLED, "cancelled"),
    (JOBS_ABORTED, "aborted"),
];

impl Seen {
    fn new() -> Seen {
        Seen {
            registry: Registry::atomic(),
        }
    }

    /// A counter's or gauge's value (`None`: never registered).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let counter = self.registry.get_counter_handles().into_iter();
        let gauge = self.registry.get_gauge_handles().into_iter();
        counter
            .map(|(k, v)| (k, v.load(SeqCst) as f64))
            .chain(gauge.map(|(k, v)| (k, f64::from_bits(v.load(SeqCst)))))
            .find(|(k, _)| is(k, name, labels))
            .map(|(_, v)| v)
    }

    /// A per-kind counter of the test job.
    fn count(&self, name: &str) -> f64 {
        self.value(name, &KIND).unwrap_or(0.0)
    }

    /// Duration samples of the test job's runs with `outcome`.
    fn durations(&self, outcome: &str) -> Vec<f64> {
        let mut labels = KIND.to_vec();
        labels.push(("outcome", outcome));
        self.registry
            .get_histogram_handles()
            .into_iter()
            .find(|(k, _)| is(k, JOB_DURATION, &labels))
            .map_or_else(Vec::new, |(_, h)| h.data())
    }

    /// Started runs, and runs that came to an outcome (all outcomes).
    fn started_and_ended(&self) -> (f64, f64) {
        let ended = OUTCOMES.iter().map(|(name, _)| self.count(name)).sum();
        (self.count(JOBS_STARTED), ended)
    }

    /// Waits until `check` passes; panics with its complaint after `LIMIT`.
    async fn wait(&self, what: &str, check: impl Fn(&Seen) -> Result<(), String>) {
        eventually(what, LIMIT, || async { check(self) }).await
    }

    /// Waits until every started run came to an outcome and `started` runs
    /// did; then asserts each outcome's count and its number of duration
    /// samples, and that nothing runs.
    async fn assert_runs(&self, started: f64, expected: &[(&str, f64)]) {
        self.wait(&format!("{started} runs to end"), |seen| {
            match seen.started_and_ended() {
                (s, e) if s == started && e == started => Ok(()),
                other => Err(format!("(started, ended) = {other:?}")),
            }
        })
        .await;
        for (name, label) in OUTCOMES {
            let want = expected
                .iter()
                .find(|(l, _)| *l == label)
                .map_or(0.0, |(_, n)| *n);
            assert_eq!(self.count(name), want, "{name}");
            let durations = self.durations(label);
            assert_eq!(
                durations.len() as f64,
                want,
                "{label} durations: {durations:?}"
            );
            assert!(durations.iter().all(|&d| d >= 0.0), "{durations:?}");
        }
        assert_eq!(self.value(JOBS_RUNNING, &Q), Some(0.0), "{JOBS_RUNNING}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_started_run_ends_in_one_outcome_counter_and_one_duration_sample() {
    let seen = Seen::new();
    let _local = metrics::set_default_local_recorder(&seen);
    let fx = Fx::new().await;
    let runner = fx.start_runner(fx.config().concurrency(4)).await;
    use Act::*;
    let mut ids = fx.push(Some("g1"), &[Ok, Ok, Ok]).await;
    ids.extend(fx.push(Some("g2"), &[RetryOnce, RetryOnce]).await);
    ids.extend(fx.push(Some("g3"), &[FailAlways, Permanent]).await);
    ids.extend(fx.push(None, &[Cancel]).await);
    fx.wait_settled(&ids).await;
    assert_eq!(fx.count_jobs(&ids, "state = 'succeeded'").await, 5);
    assert_eq!(fx.count_jobs(&ids, "state = 'failed'").await, 2);

    // 3 + 2×2 + 2 + 1 + 1 handler runs: 5 succeeded, 3 retried (each
    // RetryOnce once, FailAlways on its first of two attempts), 2 failed, 1
    // cancelled.
    let expected = [
        ("succeeded", 5.0),
        ("retried", 3.0),
        ("failed", 2.0),
        ("cancelled", 1.0),
    ];
    seen.assert_runs(11.0, &expected).await;
    runner.shutdown().await.unwrap();
    assert_eq!(seen.started_and_ended(), (11.0, 11.0), "after shutdown");
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_cut_off_by_shutdown_counts_as_aborted_and_its_rerun_as_started_again() {
    let seen = Seen::new();
    let _local = metrics::set_default_local_recorder(&seen);
    let fx = Fx::new().await;
    let runner = fx.start_runner(fx.config()).await;
    let id = fx.push(Some("g"), &[Act::Hold]).await[0];
    fx.gate().wait_started(1).await;
    seen.wait("the held run to count as running", |seen| {
        match seen.value(JOBS_RUNNING, &Q) {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    runner
        .shutdown_within(Duration::from_millis(100))
        .await
        .unwrap();
    seen.assert_runs(1.0, &[("aborted", 1.0)]).await;
    assert_eq!(
        fx.job_state(id).await,
        "queued 0",
        "the aborted job runs again"
    );

    let runner = fx.start_runner(fx.config()).await;
    fx.gate().wait_started(1).await;
    fx.release(1);
    fx.wait_job_succeeded(id, LIMIT).await;
    seen.assert_runs(2.0, &[("aborted", 1.0), ("succeeded", 1.0)])
        .await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn sampled_gauges_report_depth_lag_and_blocked_groups() {
    let seen = Seen::new();
    let _local = metrics::set_default_local_recorder(&seen);
    let fx = Fx::new().await;
    let runner = fx
        .start_runner(fx.config().concurrency(4).metrics_interval(TICK))
        .await;
    // Two running jobs; three scheduled in an hour in group "later", whose
    // head was enqueued ten minutes ago; one in paused group "p".
    fx.push(Some("h1"), &[Act::Hold]).await;
    fx.push(Some("h2"), &[Act::Hold]).await;
    fx.gate().wait_started(2).await;
    let later = fx.push_later(Some("later"), &[Act::Ok; 3]).await;
    fx.exec(&format!(
        "UPDATE pgfifo.job SET created_at = now() - interval '10 minutes' WHERE id = {}",
        later[0]
    ))
    .await;
    {
        let mut conn = fx.conn().await;
        assert!(admin::pause_group(&mut conn, QUEUE, "p").await.unwrap());
    }
    fx.push(Some("p"), &[Act::Ok]).await;

    let gauges = |depth: f64| {
        move |seen: &Seen| {
            let got = (
                seen.value(JOBS_RUNNING, &Q),
                seen.value(QUEUE_DEPTH, &Q),
                seen.value(GROUP_LAG, &Q),
                seen.value(BLOCKED_GROUPS, &Q),
            );
            let lag_ok = got.2.is_some_and(|lag| (600.0..660.0).contains(&lag));
            let running = if depth == 6.0 { 2.0 } else { 0.0 };
            if got.0 == Some(running) && got.1 == Some(depth) && lag_ok && got.3 == Some(1.0) {
                Ok(())
            } else {
                Err(format!("(running, depth, lag, blocked) = {got:?}"))
            }
        }
    };
    // Unfinished jobs: 2 running + 3 scheduled + 1 paused; lag: the
    // scheduled head's age (its group is active); blocked: the paused group.
    seen.wait("running 2, depth 6, lag ~600 s, blocked 1", gauges(6.0))
        .await;

    fx.release(2);
    seen.wait("running 0, depth 4, lag ~600 s, blocked 1", gauges(4.0))
        .await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn retention_counts_the_jobs_and_groups_it_deletes() {
    let seen = Seen::new();
    let _local = metrics::set_default_local_recorder(&seen);
    let fx = Fx::new().await;
    let retention = Retention::default()
        .finished_after(Duration::from_secs(3600))
        .idle_groups_after(Duration::from_secs(3600))
        .interval(TICK)
        .batch_size(2);
    let runner = fx.start_runner(fx.config().retention(retention)).await;
    let mut ids = Vec::new();
    for group in ["g1", "g2", "g3"] {
        ids.extend(fx.settled(Some(group), &[Act::Ok]).await);
    }
    ids.extend(fx.settled(None, &[Act::Cancel]).await);
    fx.wait_for(
        "SELECT count(*) FROM pgfifo.queue_group WHERE head_id IS NULL",
        3,
        LIMIT,
    )
    .await;
    fx.age_jobs(&ids, "2 days").await;
    fx.age_groups(&["g1", "g2", "g3"]).await;
    fx.wait_for("SELECT count(*) FROM pgfifo.job", 0, LIMIT)
        .await;
    fx.wait_for("SELECT count(*) FROM pgfifo.queue_group", 0, LIMIT)
        .await;
    seen.wait("4 jobs purged and 3 groups cleaned", |seen| {
        match (
            seen.value(JOBS_PURGED, &[]),
            seen.value(GROUPS_CLEANED, &[]),
        ) {
            (Some(4.0), Some(3.0)) => Ok(()),
            other => Err(format!("(purged, cleaned) = {other:?}")),
        }
    })
    .await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_transaction_open_past_the_warning_age_is_counted_once_per_run() {
    let seen = Seen::new();
    let _local = metrics::set_default_local_recorder(&seen);
    let fx = Fx::new().await;
    let runner = fx
        .start_runner(fx.config().long_transaction_warning(TICK))
        .await;
    let held = fx.push(Some("g"), &[Act::Hold]).await;
    fx.gate().wait_started(1).await;
    seen.wait(
        "the held run's transaction to be counted as long",
        |seen| match seen.count(LONG_TRANSACTIONS) {
            1.0 => Ok(()),
            other => Err(format!("{other}")),
        },
    )
    .await;
    // Once per run, however long it goes on: wait several ages more.
    let later = tokio::time::Instant::now() + TICK * 4;
    tokio::time::sleep_until(later).await;
    assert_eq!(seen.count(LONG_TRANSACTIONS), 1.0);
    fx.release(1);
    fx.wait_job_succeeded(held[0], LIMIT).await;
    // A short run is not counted.
    let short = fx.push(Some("g"), &[Act::Ok]).await;
    fx.wait_settled(&short).await;
    seen.assert_runs(2.0, &[("succeeded", 2.0)]).await;
    assert_eq!(seen.count(LONG_TRANSACTIONS), 1.0);
    runner.shutdown().await.unwrap();
}

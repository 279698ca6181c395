//! Queue limits (issue 33, part 1): a whole queue's concurrency and rate,
//! across runners, composed with its groups' own limits. The
//! multi-process check, with a runner killed mid-job, is in
//! `multiprocess/queue_limits.rs`; the SQL-level checks (slots held by the
//! job transaction, prefetch, bad values) in `queue_limits_sql.rs`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfifo::{
    admin, async_trait, EnqueueOptions, GroupLimits, Handler, Job, JobContext, JobError,
    QueueLimits, Rate,
};
use pgfifo_tests::rates::{starts_in_queue, worst_excess};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(60);

/// A handler run: (database name, job id, group, start, end) on this
/// process's monotonic clock.
type Recorded = (String, i64, String, Instant, Instant);

/// Handler runs, keyed by database, as tests run side by side.
static RUNS: Mutex<Vec<Recorded>> = Mutex::new(Vec::new());

/// Sleeps `sleep_ms` and records its run.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "qlim", max_attempts = 3)]
struct QlimJob {
    db: String,
    group: String,
    sleep_ms: u64,
}

#[async_trait]
impl Handler for QlimJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
        RUNS.lock().unwrap().push((
            self.db.clone(),
            ctx.id(),
            self.group.clone(),
            start,
            Instant::now(),
        ));
        Ok(())
    }
}

type RunRec = (i64, String, Instant, Instant);

/// The runs recorded for `db`, by start.
fn runs(db: &TestDb) -> Vec<RunRec> {
    let mut runs: Vec<RunRec> = RUNS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == db.name)
        .map(|r| (r.1, r.2.clone(), r.3, r.4))
        .collect();
    runs.sort_by_key(|r| r.2);
    runs
}

/// The most of `runs` in progress at one instant (an end and a start at
/// the same instant do not overlap).
fn peak<'a>(runs: impl IntoIterator<Item = &'a RunRec>) -> usize {
    let mut edges: Vec<(Instant, i32)> = runs
        .into_iter()
        .flat_map(|r| [(r.2, 1), (r.3, -1)])
        .collect();
    edges.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

/// Enqueues `per_group` jobs in each of `groups` ("" for ungrouped),
/// interleaved; returns their ids in enqueue order.
async fn enqueue(db: &TestDb, groups: &[&str], per_group: usize, sleep_ms: u64) -> Vec<i64> {
    let mut conn = db.conn().await;
    let mut ids = Vec::new();
    for _ in 0..per_group {
        for group in groups {
            let job = QlimJob {
                db: db.name.clone(),
                group: (*group).to_owned(),
                sleep_ms,
            };
            let options = if group.is_empty() {
                EnqueueOptions::ungrouped()
            } else {
                EnqueueOptions::group(*group)
            };
            ids.push(job.enqueue_with(&mut conn, options).await.unwrap());
        }
    }
    ids
}

/// Every job ran once, and each group's jobs began in enqueue order.
fn assert_once_and_in_order(runs: &[RunRec], ids: &[i64]) {
    let mut count: BTreeMap<i64, usize> = BTreeMap::new();
    for r in runs {
        *count.entry(r.0).or_default() += 1;
    }
    assert_eq!(count.len(), ids.len(), "every job ran");
    assert!(
        count.values().all(|&n| n == 1),
        "a job ran twice: {count:?}"
    );
    // In each group, no job ran through while an older one had not begun
    // (jobs of a group with a concurrency above 1, picked a moment apart,
    // may begin their handlers in either order on a loaded machine).
    for later in runs.iter().filter(|r| !r.1.is_empty()) {
        let passed: Vec<i64> = runs
            .iter()
            .filter(|r| r.1 == later.1 && r.0 < later.0 && r.2 >= later.3)
            .map(|r| r.0)
            .collect();
        assert!(
            passed.is_empty(),
            "job {} of group {} ran before {passed:?} began",
            later.0,
            later.1
        );
    }
}

/// Two runners of eight lanes each, a queue limited to 3: never more than
/// three of its jobs run at once, grouped or not, and three do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_runs_at_most_its_concurrency_across_runners() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qlim", QueueLimits::new().concurrency(3))
        .await
        .unwrap();
    let a = db.start_runner(test_config().concurrency(8)).await;
    let b = db.start_runner(test_config().concurrency(8)).await;
    let groups = ["a", "b", "c", "d", "e", "f", "", ""];
    let ids = enqueue(&db, &groups, 6, 40).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    let all = runs(&db);
    assert_once_and_in_order(&all, &ids);
    assert_eq!(peak(&all), 3, "the queue's peak");
    for g in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(peak(all.iter().filter(|r| r.1 == g)), 1, "group {g}");
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_slot WHERE queue = 'qlim'")
            .await,
        3
    );
}

/// Group concurrency 2 inside a queue limit of 3: the wide group never
/// runs more than two, the queue never more than three, and both limits
/// are reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_and_group_concurrency_compose() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qlim", QueueLimits::new().concurrency(3))
        .await
        .unwrap();
    admin::set_group_limits(&mut conn, "qlim", "wide", GroupLimits::new().concurrency(2))
        .await
        .unwrap();
    // (Every job queued before the runner starts, so that the other
    // groups' jobs are there while the wide group runs: a CI run, with
    // them enqueued behind a runner already draining it, never saw the
    // queue at three.)
    let mut ids = enqueue(&db, &["wide"], 12, 40).await;
    ids.extend(enqueue(&db, &["x", "y"], 6, 40).await);
    let runner = db.start_runner(test_config().concurrency(8)).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();

    let all = runs(&db);
    assert_once_and_in_order(&all, &ids);
    assert_eq!(peak(&all), 3, "the queue's peak");
    assert_eq!(
        peak(all.iter().filter(|r| r.1 == "wide")),
        2,
        "the wide group's peak"
    );
}

/// A queue rate of 10/s with a burst of 3: over every window of its
/// recorded starts, no more than 3 + 10 × t, grouped and ungrouped jobs
/// together, with group rates of their own inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_rate_bounds_every_window_of_its_starts() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let limits = QueueLimits::new()
        .rate(Rate::per_second(10).unwrap())
        .burst(3);
    admin::set_queue_limits(&mut conn, "qlim", limits)
        .await
        .unwrap();
    // A group rate below the queue's: its own bound holds too.
    let slow = GroupLimits::new()
        .rate(Rate::per_second(4).unwrap())
        .burst(1);
    admin::set_group_limits(&mut conn, "qlim", "slow", slow)
        .await
        .unwrap();
    let a = db
        .start_runner(
            test_config()
                .concurrency(4)
                .poll_interval(Duration::from_millis(20)),
        )
        .await;
    let b = db
        .start_runner(
            test_config()
                .concurrency(4)
                .poll_interval(Duration::from_millis(20)),
        )
        .await;
    let ids = enqueue(&db, &["slow", "p", "q", ""], 6, 2).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    let all = runs(&db);
    assert_once_and_in_order(&all, &ids);
    let starts = starts_in_queue(&db, "qlim").await;
    assert_eq!(starts.len(), ids.len(), "one recorded start per job");
    let worst = worst_excess(&starts, 10.0, 3.0);
    assert!(worst <= 0.001, "a window exceeded 3 + 10 × t by {worst}");
    let slow_starts = pgfifo_tests::rates::starts_of(&db, "slow").await;
    let worst = worst_excess(&slow_starts, 4.0, 1.0);
    assert!(
        worst <= 0.001,
        "the slow group's window exceeded by {worst}"
    );
}

/// A queue at its rate is looked at again when its tokens come, not at the
/// runner's poll (`runner/queue_tokens.rs`): with a poll of a minute, a
/// backlog at 20/s with a burst of 2 still starts at about 20 a second,
/// and never faster than its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_at_its_rate_starts_when_its_tokens_come_not_at_the_poll() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let limits = QueueLimits::new()
        .rate(Rate::per_second(20).unwrap())
        .burst(2);
    admin::set_queue_limits(&mut conn, "qlim", limits)
        .await
        .unwrap();
    let runner = db
        .start_runner(
            test_config()
                .concurrency(4)
                .poll_interval(Duration::from_secs(60)),
        )
        .await;
    // The runner's tasks run (its first heartbeat is written), so the
    // jobs come while it is idle: the enqueue's notification is what
    // starts the queue, and its next tokens keep it going.
    db.wait_for("SELECT count(*) FROM pgfifo.runner", 1, LIMIT)
        .await;
    let groups = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let ids = enqueue(&db, &groups, 5, 0).await;
    // 40 jobs: 2 at once, then 38 at 20/s take about 1.9 s.
    db.wait_jobs_in(&ids, "succeeded", Duration::from_secs(15))
        .await;
    runner.shutdown().await.unwrap();

    assert_once_and_in_order(&runs(&db), &ids);
    let starts = starts_in_queue(&db, "qlim").await;
    assert_eq!(starts.len(), ids.len(), "one recorded start per job");
    let span = starts[starts.len() - 1] - starts[0];
    let achieved = (starts.len() - 2) as f64 / span;
    assert!(
        achieved >= 16.0,
        "{achieved:.1} starts/s after the burst, over {span:.2}s (the rate: 20/s)"
    );
    let worst = worst_excess(&starts, 20.0, 2.0);
    assert!(worst <= 0.001, "a window exceeded 2 + 20 × t by {worst}");
}

/// Limits changed while the runner runs apply to the next starts: a queue
/// at 1 is raised to 4 and then back to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_limits_apply_to_new_starts() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qlim", QueueLimits::new().concurrency(1))
        .await
        .unwrap();
    let runner = db.start_runner(test_config().concurrency(8)).await;
    let groups = ["a", "b", "c", "d", "e", "f"];
    let first = enqueue(&db, &groups, 2, 30).await;
    db.wait_jobs_in(&first, "succeeded", LIMIT).await;
    let raised = admin::change_queue_limits(
        &mut conn,
        "qlim",
        &["concurrency"],
        QueueLimits::new().concurrency(4),
    )
    .await
    .unwrap();
    assert_eq!(raised.and_then(|l| l.concurrency), Some(4));
    let second = enqueue(&db, &groups, 4, 60).await;
    db.wait_jobs_in(&second, "succeeded", LIMIT).await;
    admin::set_queue_limits(&mut conn, "qlim", QueueLimits::new().concurrency(1))
        .await
        .unwrap();
    let third = enqueue(&db, &groups, 2, 30).await;
    db.wait_jobs_in(&third, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();

    let all = runs(&db);
    let of = |ids: &[i64]| -> Vec<RunRec> {
        all.iter().filter(|r| ids.contains(&r.0)).cloned().collect()
    };
    assert_eq!(peak(&of(&first)), 1, "under 1");
    assert_eq!(peak(&of(&second)), 4, "raised to 4");
    assert_eq!(peak(&of(&third)), 1, "back to 1");
    // Removing the limits leaves no row.
    assert!(admin::reset_queue_limits(&mut conn, "qlim").await.unwrap());
    assert_eq!(admin::queue_limits(&mut conn, "qlim").await.unwrap(), None);
    assert!(!admin::reset_queue_limits(&mut conn, "qlim").await.unwrap());
}

/// Bad values are clear errors and write nothing; a runner refuses to
/// start with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queue_limits_are_refused_and_write_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let rate = Rate::per_second(5).unwrap();
    admin::set_queue_limits(&mut conn, "qlim", QueueLimits::new().concurrency(7))
        .await
        .unwrap();
    let bad = [
        (QueueLimits::new().concurrency(0), "concurrency"),
        (QueueLimits::new().concurrency(10_001), "concurrency"),
        (QueueLimits::new().rate(rate).burst(0), "burst"),
        (QueueLimits::new().burst(4), "burst needs a rate"),
    ];
    for (limits, says) in bad {
        let err = admin::set_queue_limits(&mut conn, "qlim", limits)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(says), "{limits:?}: {err}");
    }
    // A burst added to a queue without a rate: refused by the database.
    let err =
        admin::change_queue_limits(&mut conn, "qlim", &["burst"], QueueLimits::new().burst(4))
            .await
            .expect_err("refused");
    assert!(err.to_string().contains("a burst needs a rate"), "{err}");
    let err = admin::change_queue_limits(&mut conn, "qlim", &["speed"], QueueLimits::new())
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("speed is not a queue limit"),
        "{err}"
    );
    let err = admin::set_queue_limits(&mut conn, "", QueueLimits::new().concurrency(2))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("queue"), "{err}");
    assert_eq!(
        admin::queue_limits(&mut conn, "qlim").await.unwrap(),
        Some(QueueLimits::new().concurrency(7)),
        "nothing written"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_control").await,
        1
    );
    let config = test_config().queue_limits("qlim", QueueLimits::new().concurrency(0));
    assert!(pgfifo::runner::start(db.pool.clone(), config)
        .await
        .is_err());
}

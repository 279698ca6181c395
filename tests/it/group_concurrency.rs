//! Semantic 11, a group's concurrency N: up to N of its jobs run at once,
//! never more, and they start in FIFO order; a job that failed an attempt
//! holds back the jobs behind it until it succeeds; a rate limit holds when
//! N jobs race for its tokens. The multi-process check, with a runner
//! killed mid-job, is in `multiprocess/concurrency.rs`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfifo::admin;
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{
    async_trait, EnqueueOptions, GroupLimits, Handler, Job, JobContext, JobError, NewJob, Rate,
};
use pgfifo_tests::rates::{starts_of, worst_excess};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(30);

/// Handler runs: (database name, job id, start, end) on this process's
/// monotonic clock. Keyed by database, as tests run side by side.
static RUNS: Mutex<Vec<(String, i64, Instant, Instant)>> = Mutex::new(Vec::new());

/// Sleeps `sleep_ms`; fails its first attempt (retry after `retry_ms`) when
/// `fail_once`; waits at its test's gate first when `gated`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "conc", max_attempts = 3)]
struct ConcJob {
    db: String,
    sleep_ms: u64,
    #[serde(default)]
    fail_once: bool,
    #[serde(default)]
    retry_ms: u64,
    #[serde(default)]
    gated: bool,
}

#[async_trait]
impl Handler for ConcJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = Instant::now();
        if self.gated {
            crate::gate::gate(&self.db).hold().await?;
        }
        tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
        RUNS.lock()
            .unwrap()
            .push((self.db.clone(), ctx.id(), start, Instant::now()));
        if self.fail_once && ctx.attempt() == 1 {
            return Err(JobError::retry_after(
                Duration::from_millis(self.retry_ms),
                "first attempt fails",
            ));
        }
        Ok(())
    }
}

fn job(db: &TestDb, sleep_ms: u64) -> ConcJob {
    ConcJob {
        db: db.name.clone(),
        sleep_ms,
        fail_once: false,
        retry_ms: 0,
        gated: false,
    }
}

/// The runs of `ids` recorded for `db`: (id, start, end), by start.
fn runs(db: &TestDb, ids: &[i64]) -> Vec<(i64, Instant, Instant)> {
    let mut runs: Vec<_> = RUNS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == db.name && ids.contains(&r.1))
        .map(|r| (r.1, r.2, r.3))
        .collect();
    runs.sort_by_key(|r| r.1);
    runs
}

/// The most of `runs` in progress at one instant.
fn peak(runs: &[(i64, Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> = runs.iter().flat_map(|r| [(r.1, 1), (r.2, -1)]).collect();
    edges.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

async fn enqueue_all(db: &TestDb, jobs: Vec<ConcJob>, group: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    for job in jobs {
        ids.push(db.enqueue(job, group).await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_runs_up_to_its_concurrency_in_fifo_start_order() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_group_limits(&mut conn, "conc", "wide", GroupLimits::new().concurrency(3))
        .await
        .unwrap();
    let runner = db.start_runner(test_config().concurrency(8)).await;
    let wide = enqueue_all(&db, (0..24).map(|_| job(&db, 100)).collect(), "wide").await;
    let narrow = enqueue_all(&db, (0..6).map(|_| job(&db, 50)).collect(), "narrow").await;
    let began = Instant::now();
    db.wait_jobs_in(&wide, "succeeded", LIMIT).await;
    let took = began.elapsed();
    db.wait_jobs_in(&narrow, "succeeded", LIMIT).await;
    let info = admin::group(&mut conn, "conc", "wide")
        .await
        .unwrap()
        .unwrap();
    runner.shutdown().await.unwrap();

    let wide_runs = runs(&db, &wide);
    assert_eq!(wide_runs.len(), 24, "each job ran once");
    assert_eq!(peak(&wide_runs), 3, "the wide group's peak concurrency");
    // FIFO starts: every older job began before a job was done (jobs
    // picked a moment apart begin their handlers in either order on a
    // loaded machine; a younger job never runs through while an older one
    // waits), and fewer than three older ones were running when it began.
    for (k, later) in wide_runs.iter().enumerate() {
        let (id, start, end) = *later;
        let not_begun: Vec<i64> = wide_runs
            .iter()
            .filter(|r| r.0 < id && r.1 >= end)
            .map(|r| r.0)
            .collect();
        assert!(
            not_begun.is_empty(),
            "job {id} (#{k}) ran before {not_begun:?} began"
        );
        let older_running = wide_runs
            .iter()
            .filter(|r| r.0 < id && r.1 <= start && r.2 > start)
            .count();
        assert!(
            older_running < 3,
            "job {id} began beside {older_running} older ones"
        );
    }
    // 24 jobs of 100 ms, three at a time: about 0.8 s, far from 2.4 s.
    assert!(
        took < Duration::from_millis(1_800),
        "the wide group took {took:?}"
    );
    // A group without limits still runs one job at a time.
    assert_eq!(peak(&runs(&db, &narrow)), 1);
    assert_eq!((info.concurrency, info.own_limits), (3, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_holds_back_the_jobs_behind_it_until_it_succeeds() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_group_limits(&mut conn, "conc", "r", GroupLimits::new().concurrency(3))
        .await
        .unwrap();
    let runner = db.start_runner(test_config().concurrency(6)).await;
    let mut events = runner.subscribe();
    // Three start together; the second fails at once and retries 300 ms
    // later, while the other two run for 200 ms. Its slot is free from its
    // failure on, but the jobs behind it must wait until it succeeds.
    let mut jobs: Vec<ConcJob> = (0..8).map(|_| job(&db, 60)).collect();
    jobs[0].sleep_ms = 200;
    jobs[2].sleep_ms = 200;
    jobs[1].sleep_ms = 10;
    jobs[1].fail_once = true;
    jobs[1].retry_ms = 300;
    let ids = enqueue_all(&db, jobs, "r").await;
    let failing = ids[1];
    wait_for(&mut events, failing, |o| *o == JobOutcome::Succeeded).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();

    let all = runs(&db, &ids);
    let second = all
        .iter()
        .filter(|r| r.0 == failing)
        .nth(1)
        .expect("the failing job ran twice");
    // The jobs behind the first three began only after the failed job's
    // second run had ended (it commits after that, and they are picked
    // after its commit).
    let early: Vec<_> = all
        .iter()
        .filter(|r| ids[3..].contains(&r.0) && r.1 < second.2)
        .collect();
    assert!(early.is_empty(), "started behind a failed job: {early:?}");
    assert!(peak(&all) <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_when_slots_race_for_its_tokens() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let limits = GroupLimits::new()
        .concurrency(4)
        .rate(Rate::per_second(10).unwrap())
        .burst(2);
    admin::set_group_limits(&mut conn, "conc", "rl", limits)
        .await
        .unwrap();
    let runner = db
        .start_runner(
            test_config()
                .concurrency(8)
                .poll_interval(Duration::from_secs(30)),
        )
        .await;
    let ids = enqueue_all(&db, (0..16).map(|_| job(&db, 5)).collect(), "rl").await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();

    let starts = starts_of(&db, "rl").await;
    assert_eq!(
        starts.len(),
        16,
        "one start per job: none refused was counted"
    );
    let worst = worst_excess(&starts, 10.0, 2.0);
    assert!(
        worst <= 0.001,
        "a window exceeded burst + rate × t by {worst}"
    );
    // Fourteen tokens at 10 a second, woken for each (polls every 30 s).
    let span = starts[15] - starts[0];
    assert!((1.39..5.0).contains(&span), "16 starts took {span:.3} s");
}

/// Waits for the event of job `id` that satisfies `pred`; returns when it
/// arrived.
async fn wait_for(
    rx: &mut broadcast::Receiver<JobEvent>,
    id: i64,
    pred: impl Fn(&JobOutcome) -> bool,
) -> Instant {
    tokio::time::timeout(LIMIT, async {
        loop {
            match rx.recv().await {
                Ok(event) if event.id == id && pred(&event.outcome) => return Instant::now(),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("runner events closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching event for job {id} within {LIMIT:?}"))
}

/// Retention's deletion of idle groups takes their slots, buckets and
/// snooze marks with them; the limits set for a group stay. A bucket that
/// has not refilled yet stays until it has: the group, back, must not get
/// a full one early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleaning_idle_groups_takes_their_slots_and_buckets() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let limits = GroupLimits::new()
        .concurrency(2)
        .rate(Rate::per_second(100).unwrap());
    admin::set_group_limits(&mut conn, "conc", "gone", limits)
        .await
        .unwrap();
    let slow = GroupLimits::new().rate(Rate::per_minute(1).unwrap());
    admin::set_group_limits(&mut conn, "conc", "slow", slow)
        .await
        .unwrap();
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let id = db.enqueue(job(&db, 1), "gone").await;
    let slow_id = db.enqueue(job(&db, 1), "slow").await;
    db.wait_job_succeeded(id, LIMIT).await;
    db.wait_job_succeeded(slow_id, LIMIT).await;
    runner.shutdown().await.unwrap();
    let rows = "SELECT (SELECT count(*) FROM pgfifo.group_slot) * 10
                     + (SELECT count(*) FROM pgfifo.group_bucket)";
    assert_eq!(db.scalar(rows).await, 22, "two slots and two buckets");
    let cleaned = admin::clean_groups(&mut conn, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(cleaned, 2);
    assert_eq!(
        db.scalar(rows).await,
        1,
        "only the bucket still refilling is left"
    );
    let left = db
        .text("SELECT group_id FROM pgfifo.group_bucket")
        .await
        .unwrap();
    assert_eq!(left, "slow");
    let set = admin::limits_of(&mut conn, "conc", Some("gone"))
        .await
        .unwrap();
    assert_eq!(set.and_then(|s| s.concurrency), Some(2));
}

/// Raising a group's concurrency while a job that started under 1 runs:
/// that job holds the group's row for its run. The jobs that start in the
/// new slots finish and commit beside it; their completions do not wait
/// for its row (they are not the group's head, so they change nothing of
/// the group).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_concurrency_under_a_running_job_does_not_stall_the_new_slots() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let runner = db.start_runner(test_config().concurrency(4)).await;
    // The first job runs long under the default concurrency of 1.
    let long = enqueue_all(&db, vec![job(&db, 6_000)], "raised").await;
    db.wait_attempt_rows(long[0], 1, LIMIT).await;
    let short = enqueue_all(&db, (0..6).map(|_| job(&db, 20)).collect(), "raised").await;
    admin::set_group_limits(
        &mut conn,
        "conc",
        "raised",
        GroupLimits::new().concurrency(3),
    )
    .await
    .unwrap();
    db.wait_jobs_in(&short, "succeeded", LIMIT).await;
    assert_eq!(
        db.job_state(long[0]).await,
        "queued 0",
        "the short jobs committed while the long one still ran"
    );
    db.wait_jobs_in(&long, "succeeded", LIMIT).await;
    // The group went idle after its last job (no head left on a finished
    // job).
    db.wait_for(
        "SELECT count(*) FROM pgfifo.queue_group WHERE group_id = 'raised' AND head_id IS NULL AND ready_at IS NULL",
        1,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
    let short_runs = runs(&db, &short);
    assert_eq!(short_runs.len(), 6, "each short job ran once");
}

/// A backlog that arrives in a group of concurrency 3 while one job runs
/// (enqueues into an active group wake nobody) fills the three slots as
/// soon as a lane looks at the group: the lane that takes a job wakes
/// another while a slot and a job are left, rather than each slot waiting
/// for a poll (30 s here). Every job waits at the test's gate, so two of the
/// backlog must reach it while the first job is held there: within the
/// gate's patience (20 s), shorter than a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_fills_every_free_slot_without_a_poll() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_group_limits(
        &mut conn,
        "conc",
        "burst",
        GroupLimits::new().concurrency(3),
    )
    .await
    .unwrap();
    let runner = db
        .start_runner(
            test_config()
                .concurrency(4)
                .poll_interval(Duration::from_secs(30)),
        )
        .await;
    let gated = |ms| ConcJob {
        gated: true,
        ..job(&db, ms)
    };
    let gate = crate::gate::gate(&db.name);
    let first = enqueue_all(&db, vec![gated(0)], "burst").await;
    gate.wait_started(1).await;
    let jobs = (0..4)
        .map(|_| NewJob::new(&gated(0), EnqueueOptions::group("burst")).unwrap())
        .collect::<Vec<_>>();
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    // Two of the backlog beside the first job, which is still held.
    gate.wait_started(2).await;
    gate.release.add_permits(5);
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    let all: Vec<i64> = first.iter().chain(&ids).copied().collect();
    let runs = runs(&db, &all);
    assert_eq!(runs.len(), 5, "each job ran once");
    assert_eq!(peak(&runs), 3, "the group's three slots filled: {runs:?}");
}

/// Lowering a group's concurrency while more than the new N run: jobs that
/// started before finish, and no new job starts while N or more of the
/// group run, even once a slot below the new N is free (a job starts only
/// from the group's first N queued jobs, and running jobs are among them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_concurrency_starts_nothing_beyond_the_new_limit() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_group_limits(
        &mut conn,
        "conc",
        "lowered",
        GroupLimits::new().concurrency(3),
    )
    .await
    .unwrap();
    let runner = db.start_runner(test_config().concurrency(4)).await;
    let old = enqueue_all(
        &db,
        vec![job(&db, 600), job(&db, 1_200), job(&db, 1_800)],
        "lowered",
    )
    .await;
    for id in &old {
        db.wait_attempt_rows(*id, 1, LIMIT).await;
    }
    admin::set_group_limits(
        &mut conn,
        "conc",
        "lowered",
        GroupLimits::new().concurrency(2),
    )
    .await
    .unwrap();
    let new = enqueue_all(&db, (0..4).map(|_| job(&db, 100)).collect(), "lowered").await;
    db.wait_jobs_in(&new, "succeeded", LIMIT).await;
    db.wait_jobs_in(&old, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    let all: Vec<i64> = old.iter().chain(&new).copied().collect();
    let runs = runs(&db, &all);
    assert_eq!(runs.len(), 7, "each job ran once");
    for &(id, start, _) in runs.iter().filter(|r| new.contains(&r.0)) {
        let beside: Vec<i64> = runs
            .iter()
            .filter(|r| r.0 != id && r.1 <= start && r.2 > start)
            .map(|r| r.0)
            .collect();
        assert!(
            beside.len() < 2,
            "job {id} started beside {beside:?} with a concurrency of 2"
        );
    }
}

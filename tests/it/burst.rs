//! A burst of slow jobs after a long run of near-instant ones spreads over
//! the free slots: no lane holds a picked job it cannot start while another
//! slot is idle and could (issue 19, part 3).
//!
//! A lane sizes its picks from recent handler times, so after instant jobs
//! one lane used to take a whole burst and run it one job after another
//! (the last of four 400 ms jobs started about 400 ms after the first
//! ended), while the other slots stood idle. Now a pick takes one job while
//! another lane of the runner looks for work with a slot free, and a pick
//! of several jobs that took every ready job hands all but one back
//! (`runner/lanes/lane.rs`), so the other lanes, of this runner or another,
//! take them side by side.
//!
//! The checks read only when each run started and ended: jobs that ran side
//! by side all started before the first of them ended, and a burst that one
//! lane ran serially takes at least twice a job's time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// How long a slow job of a burst takes.
const SLOW: Duration = Duration::from_millis(800);

/// Jobs that ran side by side all end within this of the first start (one
/// job's time and a generous margin; one after another would take twice a
/// job's time).
const SIDE_BY_SIDE: Duration = Duration::from_millis(1_500);

/// When a run started and ended.
type Span = (Instant, Instant);

/// The runs of each test, by its tag.
static RUNS: Mutex<Option<HashMap<String, Vec<Span>>>> = Mutex::new(None);

fn record(tag: &str, span: Span) {
    let mut runs = RUNS.lock().expect("runs");
    runs.get_or_insert_with(HashMap::new)
        .entry(tag.to_owned())
        .or_default()
        .push(span);
}

fn runs_of(tag: &str) -> Vec<Span> {
    let runs = RUNS.lock().expect("runs");
    runs.as_ref()
        .and_then(|r| r.get(tag))
        .cloned()
        .unwrap_or_default()
}

/// Sleeps `ms` without taking the connection (so it may share a pick with
/// others), recording when it ran under `tag`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "burst")]
struct BurstJob {
    tag: String,
    ms: u64,
}

#[async_trait]
impl Handler for BurstJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = Instant::now();
        if self.ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
        record(&self.tag, (start, Instant::now()));
        Ok(())
    }
}

/// Another job type, always instant, recording when it ran under `tag`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "burst")]
struct QuickJob {
    tag: String,
}

#[async_trait]
impl Handler for QuickJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let now = Instant::now();
        record(&self.tag, (now, now));
        Ok(())
    }
}

/// A [`BurstJob`] of `ms` in `group`.
fn burst(tag: &str, ms: u64, group: EnqueueOptions) -> NewJob {
    let job = BurstJob {
        tag: tag.to_owned(),
        ms,
    };
    NewJob::new(&job, group).unwrap()
}

/// A [`QuickJob`] in `group`.
fn quick(tag: &str, group: EnqueueOptions) -> NewJob {
    let job = QuickJob {
        tag: tag.to_owned(),
    };
    NewJob::new(&job, group).unwrap()
}

/// Enqueues `n` jobs made by `job(k, group)` in `groups` groups named
/// `prefix-<k % groups>`, in one batch.
async fn push(
    db: &TestDb,
    prefix: &str,
    n: usize,
    groups: usize,
    job: impl Fn(usize, EnqueueOptions) -> NewJob,
) {
    let jobs = (0..n).map(|k| job(k, EnqueueOptions::group(format!("{prefix}-{}", k % groups))));
    let mut conn = db.conn().await;
    pgfifo::enqueue_batch(&mut conn, jobs.collect::<Vec<_>>())
        .await
        .unwrap();
}

/// A long run of instant jobs (both types) over 40 groups: what the lanes
/// learn of handler times. Waits until all `n` ran.
async fn warm_up(db: &TestDb, tag: &str, n: usize) {
    push(db, "warm", n, 40, |k, group| {
        if k % 2 == 0 {
            burst(tag, 0, group)
        } else {
            quick(tag, group)
        }
    })
    .await;
    db.wait_succeeded(n as i64, LIMIT).await;
}

/// Asserts that `runs` (`n` of them) ran side by side: each started before
/// the first ended, and all ended within [`SIDE_BY_SIDE`] of the first start.
fn assert_side_by_side(runs: &[Span], n: usize, what: &str) {
    assert_eq!(runs.len(), n, "{what}: runs");
    let first_start = runs.iter().map(|r| r.0).min().unwrap();
    let last_start = runs.iter().map(|r| r.0).max().unwrap();
    let first_end = runs.iter().map(|r| r.1).min().unwrap();
    let last_end = runs.iter().map(|r| r.1).max().unwrap();
    assert!(
        last_start < first_end,
        "{what}: not all ran at once: the last started {:?} after the first ended",
        last_start - first_end
    );
    assert!(
        last_end - first_start < SIDE_BY_SIDE,
        "{what}: took {:?} from the first start to the last end",
        last_end - first_start
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_slow_jobs_after_instant_ones_runs_side_by_side() {
    let db = TestDb::new().await;
    let warm = format!("{}-warm", db.name);
    let slow = format!("{}-slow", db.name);
    let runner = db.start_runner(test_config().concurrency(4)).await;
    warm_up(&db, &warm, 400).await;
    // Then four slow jobs in four groups, with four slots free.
    let ms = SLOW.as_millis() as u64;
    push(&db, "slow", 4, 4, |_, group| burst(&slow, ms, group)).await;
    db.wait_succeeded(404, LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_side_by_side(&runs_of(&slow), 4, "four slow jobs, four slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_jobs_interleaved_with_instant_ones_of_another_type_run_side_by_side() {
    let db = TestDb::new().await;
    let warm = format!("{}-warm", db.name);
    let slow = format!("{}-slow", db.name);
    let fast = format!("{}-fast", db.name);
    let runner = db.start_runner(test_config().concurrency(4)).await;
    warm_up(&db, &warm, 400).await;
    // Slow, instant, slow, instant, … in eight groups: lanes that ran an
    // instant job pick again with instant run times in mind.
    let ms = SLOW.as_millis() as u64;
    push(&db, "mixed", 8, 8, |k, group| {
        if k % 2 == 0 {
            burst(&slow, ms, group)
        } else {
            quick(&fast, group)
        }
    })
    .await;
    db.wait_succeeded(408, LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_side_by_side(&runs_of(&slow), 4, "four slow jobs among instant ones");
    assert_eq!(runs_of(&fast).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_over_the_slots_of_two_runners() {
    let db = TestDb::new().await;
    let warm = format!("{}-warm", db.name);
    let slow = format!("{}-slow", db.name);
    // Two runners of two slots each, with pools of their own as two
    // processes would have: one runner's lanes must leave the jobs they
    // cannot start to the other's.
    let mut runners = Vec::new();
    for name in ["burst-a", "burst-b"] {
        let pool = pgfifo::connect(&db.url, 8).await.unwrap();
        let config = test_config().concurrency(2).name(name);
        runners.push(pgfifo::runner::start(pool, config).await.unwrap());
    }
    warm_up(&db, &warm, 400).await;
    let ms = SLOW.as_millis() as u64;
    push(&db, "slow", 4, 4, |_, group| burst(&slow, ms, group)).await;
    db.wait_succeeded(404, LIMIT).await;
    for runner in runners {
        runner.shutdown().await.unwrap();
    }
    assert_side_by_side(
        &runs_of(&slow),
        4,
        "four slow jobs, two runners of two slots",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_slots_keeps_every_slot_busy() {
    let db = TestDb::new().await;
    let warm = format!("{}-warm", db.name);
    let slow = format!("{}-slow", db.name);
    let runner = db.start_runner(test_config().concurrency(4)).await;
    warm_up(&db, &warm, 400).await;
    // Eight slow jobs in eight groups, four slots: two rounds of four.
    let ms = SLOW.as_millis() as u64;
    push(&db, "slow", 8, 8, |_, group| burst(&slow, ms, group)).await;
    db.wait_succeeded(408, LIMIT).await;
    runner.shutdown().await.unwrap();

    let mut runs = runs_of(&slow);
    runs.sort();
    let (first, second) = runs.split_at(4);
    assert_side_by_side(first, 4, "the first four");
    assert_side_by_side(second, 4, "the next four");
    // The next four started as slots freed up: none waited for a later one.
    let first_end = first.iter().map(|r| r.1).min().unwrap();
    let last_start = second.iter().map(|r| r.0).max().unwrap();
    assert!(
        last_start < first_end + (SIDE_BY_SIDE - SLOW),
        "a job of the second round started {:?} after the first round's first end",
        last_start - first_end
    );
    // Never more than four at once.
    for (start, _) in &runs {
        let at_once = runs.iter().filter(|(s, e)| s <= start && start < e).count();
        assert!(at_once <= 4, "{at_once} jobs ran at once on four slots");
    }
}

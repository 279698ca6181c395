//! A burst of slow jobs after a long run of near-instant ones spreads over
//! the free slots: no lane holds a picked job it cannot start while another
//! slot is idle and could (issue 19, part 3).
//!
//! Ignored until that is fixed: today a lane sizes its pick from recent
//! handler times, so after instant jobs one lane takes the whole burst and
//! runs it one job after another (the last of four 400 ms jobs starts about
//! 400 ms after the first ends). Taking one job a pick whenever a slot is
//! free fixes this test but cut the batched drain from about 8,000 to 2,000
//! jobs/s (`fifo-groups`, alternately in one sitting): the fix has to keep
//! batches while every slot is busy. `cargo test -p pgfifo-tests --test it
//! burst -- --ignored` runs it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// When a run started and ended.
type Span = (Instant, Instant);

/// The runs of each test, by its tag.
static RUNS: Mutex<Option<HashMap<String, Vec<Span>>>> = Mutex::new(None);

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
        let mut runs = RUNS.lock().expect("runs");
        runs.get_or_insert_with(HashMap::new)
            .entry(self.tag.clone())
            .or_default()
            .push((start, Instant::now()));
        Ok(())
    }
}

fn runs_of(tag: &str) -> Vec<Span> {
    let runs = RUNS.lock().expect("runs");
    runs.as_ref()
        .and_then(|r| r.get(tag))
        .cloned()
        .unwrap_or_default()
}

/// Enqueues `n` jobs of `ms` in `groups` groups named `prefix-<k>`, in one
/// batch.
async fn push(db: &TestDb, tag: &str, prefix: &str, n: usize, groups: usize, ms: u64) {
    let jobs = (0..n).map(|k| {
        let job = BurstJob {
            tag: tag.to_owned(),
            ms,
        };
        NewJob::new(
            &job,
            EnqueueOptions::group(format!("{prefix}-{}", k % groups)),
        )
        .unwrap()
    });
    let mut conn = db.conn().await;
    pgfifo::enqueue_batch(&mut conn, jobs.collect::<Vec<_>>())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "issue 19, part 3: a burst after instant jobs runs serially on one lane"]
async fn a_burst_of_slow_jobs_after_instant_ones_runs_side_by_side() {
    let db = TestDb::new().await;
    let warm = format!("{}-warm", db.name);
    let slow = format!("{}-slow", db.name);
    let runner = db.start_runner(test_config().concurrency(4)).await;
    // A long run of instant jobs: what the lanes learn of handler times.
    push(&db, &warm, "warm", 400, 40, 0).await;
    db.wait_succeeded(400, LIMIT).await;
    // Then four slow jobs in four groups, with four slots free.
    push(&db, &slow, "slow", 4, 4, 400).await;
    db.wait_succeeded(404, LIMIT).await;
    runner.shutdown().await.unwrap();

    let runs = runs_of(&slow);
    assert_eq!(runs.len(), 4);
    let last_start = runs.iter().map(|r| r.0).max().unwrap();
    let first_end = runs.iter().map(|r| r.1).min().unwrap();
    assert!(
        last_start < first_end,
        "the four slow jobs did not all run at once: the last started {:?} after the first ended",
        last_start - first_end
    );
}

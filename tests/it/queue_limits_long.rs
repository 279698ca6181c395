//! Queue limits with long mode (`#[job(long)]`): a long run commits its
//! pick's transaction at once, so the queue slot's row lock goes; the
//! slot's advisory lock, kept by the run's session until its outcome has
//! committed, holds it instead. Long and default-mode jobs of one queue
//! together never run more than its concurrency, and every slot is free
//! once they are done.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pgfifo::{admin, async_trait, Handler, Job, JobContext, JobError, QueueLimits};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(60);

/// Handler runs: (database name, start, end).
static RUNS: Mutex<Vec<(String, Instant, Instant)>> = Mutex::new(Vec::new());

async fn record(db: &str, sleep_ms: u64) {
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
    RUNS.lock()
        .unwrap()
        .push((db.to_owned(), start, Instant::now()));
}

/// A long-mode job of the limited queue.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "qlong", long)]
struct QlongLongJob {
    db: String,
    sleep_ms: u64,
}

#[async_trait]
impl Handler for QlongLongJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        record(&self.db, self.sleep_ms).await;
        Ok(())
    }
}

/// A default-mode job of the same queue.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "qlong")]
struct QlongShortJob {
    db: String,
    sleep_ms: u64,
}

#[async_trait]
impl Handler for QlongShortJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        record(&self.db, self.sleep_ms).await;
        Ok(())
    }
}

fn peak(db: &TestDb) -> usize {
    let mut edges: Vec<(Instant, i32)> = RUNS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == db.name)
        .flat_map(|r| [(r.1, 1), (r.2, -1)])
        .collect();
    edges.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_runs_hold_their_queue_slot_until_they_end() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qlong", QueueLimits::new().concurrency(2))
        .await
        .unwrap();
    let runner = db.start_runner(test_config().concurrency(8)).await;
    let mut ids = Vec::new();
    for seq in 0..4 {
        for g in 0..6 {
            let group = format!("g{g}");
            let id = if (seq + g) % 2 == 0 {
                let job = QlongLongJob {
                    db: db.name.clone(),
                    sleep_ms: 60,
                };
                db.enqueue(job, &group).await
            } else {
                let job = QlongShortJob {
                    db: db.name.clone(),
                    sleep_ms: 60,
                };
                db.enqueue(job, &group).await
            };
            ids.push(id);
        }
    }
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    // Every slot's advisory lock is given back (the lanes may still be
    // between picks for a moment).
    eventually("the queue slots' locks released", LIMIT, || {
        let db = &db;
        async move {
            let held = db
                .scalar(
                    "SELECT count(*) FROM pg_locks
                     WHERE locktype = 'advisory' AND classid = 1885824625 AND granted",
                )
                .await;
            if held == 0 {
                Ok(())
            } else {
                Err(format!("{held} held"))
            }
        }
    })
    .await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        RUNS.lock()
            .unwrap()
            .iter()
            .filter(|r| r.0 == db.name)
            .count(),
        ids.len(),
        "each job ran once"
    );
    assert_eq!(peak(&db), 2, "the queue's peak, long runs included");
}

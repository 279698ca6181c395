//! No job waits for the poll when the runner knows of it: after a batch, a
//! lane picks again at once if a group it ran has its next job ready (an
//! enqueue into an active group wakes nobody) or if its pick left other
//! work, and otherwise waits for a wake-up. The poll interval here is far
//! longer than the tests' limits, so a job that waited for it fails them.

use std::time::Duration;

use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::gate;

const QUEUE: &str = "wakeups";
/// Far longer than any wait below.
const POLL: Duration = Duration::from_secs(60);
/// How long a job may take to run once the runner knows of it.
const PROMPT: Duration = Duration::from_secs(5);

/// Waits at its test's gate when `hold`, else succeeds at once.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "wakeups")]
struct WakeupsJob {
    tag: String,
    hold: bool,
}

#[async_trait]
impl Handler for WakeupsJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.hold {
            gate(&self.tag).hold().await?;
        }
        Ok(())
    }
}

fn job(tag: &str, hold: bool) -> WakeupsJob {
    WakeupsJob {
        tag: tag.to_owned(),
        hold,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_behind_a_running_one_starts_when_it_ends() {
    let db = TestDb::new().await;
    let tag = "wakeups_behind";
    let runner = db
        .start_runner(
            test_config()
                .queues([QUEUE])
                .concurrency(2)
                .poll_interval(POLL),
        )
        .await;
    let mut conn = db.conn().await;
    let first = job(tag, true)
        .enqueue(&mut conn, "g")
        .await
        .expect("enqueue");
    gate(tag).wait_started(1).await;
    // The group is active: this enqueue sends no wake-up.
    let second = job(tag, false)
        .enqueue(&mut conn, "g")
        .await
        .expect("enqueue");
    drop(conn);
    gate(tag).release.add_permits(1);
    db.wait_jobs_in(&[first, second], "succeeded", PROMPT).await;
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_full_pick_left_behind_start_without_a_wake_up() {
    let db = TestDb::new().await;
    // One lane taking one job per pick: every pick is full, and the groups
    // it leaves ready get no wake-up of their own (one notification for the
    // whole enqueue, which the first pick answers).
    let runner = db
        .start_runner(
            test_config()
                .queues([QUEUE])
                .concurrency(1)
                .prefetch(0)
                .max_batch(1)
                .poll_interval(POLL),
        )
        .await;
    let mut conn = db.conn().await;
    let batch: Vec<NewJob> = (0..5)
        .map(|i| {
            NewJob::new(
                &job("wakeups_full", false),
                EnqueueOptions::group(format!("f{i}")),
            )
            .expect("new job")
        })
        .collect();
    let ids = pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    drop(conn);
    db.wait_jobs_in(&ids, "succeeded", PROMPT).await;
    runner.shutdown().await.expect("shutdown");
}

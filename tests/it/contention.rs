//! Enqueues that meet running jobs: nothing waits for a job, nothing deadlocks.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::runner::JobOutcome;
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

/// Enqueues `follow_up` into group `into` through the job's own connection
/// (so the enqueue is part of the job's transaction), after a short pause
/// that makes the two jobs of the test overlap.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "contention.cross",
    queue = "contention",
    max_attempts = 2,
    backoff = "10ms"
)]
struct ContentionCrossJob {
    into: Option<String>,
}

#[async_trait]
impl Handler for ContentionCrossJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(group) = &self.into {
            ContentionCrossJob { into: None }
                .enqueue_with(ctx.conn(), EnqueueOptions::group(group.clone()))
                .await
                .map_err(JobError::permanent)?;
        }
        Ok(())
    }
}

/// Two jobs, each the last of its group, each enqueueing into the other's
/// group from inside its transaction. Declaring a group idle used to wait for
/// the enqueuers of the group, and here each job's enqueue is held by the
/// other job's transaction: a deadlock that rolled back a successful job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_enqueueing_into_each_others_groups_do_not_deadlock() {
    let db = TestDb::new().await;
    for (group, into) in [("g1", "g2"), ("g2", "g1")] {
        db.enqueue(
            ContentionCrossJob {
                into: Some(into.into()),
            },
            group,
        )
        .await;
    }
    let runner = db
        .start_runner(test_config().queues(["contention"]).concurrency(2))
        .await;
    db.wait_succeeded(4, Duration::from_secs(20)).await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await,
        4,
        "each job ran once: no attempt was lost to a deadlock"
    );
}

/// Holds a job running until the test releases it.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "contention.hold", queue = "contention_hold", max_attempts = 1)]
struct ContentionHoldJob {
    ms: u64,
}

#[async_trait]
impl Handler for ContentionHoldJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(())
    }
}

/// An application transaction that enqueued into a group and stays open must
/// not hold up the completion of the group's running job, nor another
/// application's enqueue into the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_transaction_holds_up_neither_completion_nor_other_enqueues() {
    let db = TestDb::new().await;
    let running = db.enqueue(ContentionHoldJob { ms: 300 }, "g").await;
    let runner = db
        .start_runner(test_config().queues(["contention_hold"]).concurrency(1))
        .await;
    let mut events = runner.subscribe();
    db.wait_attempt_rows(running, 1, Duration::from_secs(10))
        .await;

    // The application's transaction: enqueue into the running group, stay open.
    let mut app = db.direct().await;
    app.batch_execute("BEGIN").await.unwrap();
    let pending = ContentionHoldJob { ms: 1 }
        .enqueue(&mut app, "g")
        .await
        .unwrap();

    // The running job completes while that transaction is open.
    let done = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let event = events.recv().await.unwrap();
            if event.id == running {
                return event;
            }
        }
    })
    .await
    .expect("the running job's completion did not wait for the open enqueue");
    assert_eq!(done.outcome, JobOutcome::Succeeded);

    // Another enqueue into the group returns at once.
    let mut other = AsyncPgConnection::establish(&db.url).await.unwrap();
    let started = std::time::Instant::now();
    let third = tokio::time::timeout(
        Duration::from_secs(3),
        ContentionHoldJob { ms: 1 }.enqueue(&mut other, "g"),
    )
    .await
    .expect("an enqueue waited for another application's transaction")
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));

    // Once the application commits, both jobs run, one after the other. (Not
    // necessarily in id order: the two enqueues overlapped, and a pick
    // between the two commits runs the one committed first; see "Order of
    // concurrent enqueues" in docs/locking.md.)
    app.batch_execute("COMMIT").await.unwrap();
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id IN ({pending}, {third}) AND state = 'succeeded'"),
        2,
        Duration::from_secs(10),
    )
    .await;
    runner.shutdown().await.unwrap();
    // The later of the two started after the earlier one finished.
    let apart = db
        .scalar(&format!(
            "SELECT (max(a.started_at) >= min(j.finished_at))::int \
             FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id \
             WHERE a.job_id IN ({pending}, {third})"
        ))
        .await;
    assert_eq!(apart, 1, "the group ran its two jobs at once");
}

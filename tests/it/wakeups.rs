//! No job waits for the poll when the runner knows of it: enqueues into idle
//! groups and ungrouped enqueues notify (on two channels) and wake lanes;
//! after a batch, a lane picks again at once if a group it ran has its next
//! job ready (an enqueue into an active group wakes nobody), if its pick left
//! other work, or if a wake-up came that no waiting lane could take, and
//! otherwise waits for a wake-up. Work that becomes ready by itself (a retry,
//! a delayed job) wakes a lane when it is due, whichever lane is free. The poll
//! interval here is far longer than the tests' limits, so a job that waited
//! for it fails them.

use std::time::Duration;

use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob, RunnerConfig,
};
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

/// A runner of `concurrency` lanes that polls only after [`POLL`].
fn config(concurrency: usize) -> RunnerConfig {
    test_config()
        .queues([QUEUE])
        .concurrency(concurrency)
        .poll_interval(POLL)
}

/// Enqueues one job that does not wait into each of `groups`, in one batch.
async fn enqueue_batch(db: &TestDb, tag: &str, groups: &[String]) -> Vec<JobId> {
    let batch: Vec<NewJob> = groups
        .iter()
        .map(|group| NewJob::new(&job(tag, false), EnqueueOptions::group(group)).expect("new job"))
        .collect();
    let mut conn = db.conn().await;
    pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_behind_a_running_one_starts_when_it_ends() {
    let db = TestDb::new().await;
    let tag = "wakeups_behind";
    let runner = db.start_runner(config(2)).await;
    let first = db.enqueue(job(tag, true), "g").await;
    gate(tag).wait_started(1).await;
    // The group is active: this enqueue sends no wake-up.
    let second = db.enqueue(job(tag, false), "g").await;
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
    let runner = db.start_runner(config(1).prefetch(0).max_batch(1)).await;
    let groups: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    let ids = enqueue_batch(&db, "wakeups_full", &groups).await;
    db.wait_jobs_in(&ids, "succeeded", PROMPT).await;
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_idle_groups_and_ungrouped_jobs_start_on_their_notification() {
    let db = TestDb::new().await;
    let runner = db.start_runner(config(2)).await;
    // One job (the one-row path of pgfifo.enqueue), then a batch.
    let single = db.enqueue(job("wakeups_idle", false), "idle-1").await;
    db.wait_jobs_in(&[single], "succeeded", PROMPT).await;
    let groups = ["idle-2".to_owned(), "idle-3".to_owned()];
    let ids = enqueue_batch(&db, "wakeups_idle", &groups).await;
    db.wait_jobs_in(&ids, "succeeded", PROMPT).await;
    let mut conn = db.conn().await;
    let ungrouped = job("wakeups_idle", false)
        .enqueue_with(&mut conn, EnqueueOptions::ungrouped())
        .await
        .expect("enqueue");
    db.wait_jobs_in(&[ungrouped], "succeeded", PROMPT).await;
    drop(conn);
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_woken_while_every_lane_is_busy_starts_after_the_batch() {
    let db = TestDb::new().await;
    let tag = "wakeups_busy";
    let runner = db.start_runner(config(1).prefetch(0)).await;
    let first = db.enqueue(job(tag, true), "busy").await;
    gate(tag).wait_started(1).await;
    // Another group: promoted by the listener while the only lane runs the
    // first job, so its wake-up finds no lane waiting.
    let second = db.enqueue(job(tag, false), "other").await;
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group \
             WHERE queue = '{QUEUE}' AND group_id = 'other' AND ready_at IS NOT NULL"
        ),
        1,
        PROMPT,
    )
    .await;
    gate(tag).release.add_permits(1);
    db.wait_jobs_in(&[first, second], "succeeded", PROMPT).await;
    runner.shutdown().await.expect("shutdown");
}

/// Fails its first attempt with a retry after `delay_ms`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "wakeups", max_attempts = 3)]
struct RetriesOnce {
    delay_ms: u64,
}

#[async_trait]
impl Handler for RetriesOnce {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry_after(
                Duration::from_millis(self.delay_ms),
                "first attempt",
            ));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_runs_when_its_delay_is_over_not_at_the_poll() {
    let db = TestDb::new().await;
    let runner = db.start_runner(config(2)).await;
    // Grouped (the group waits for the retry) and ungrouped, each retried
    // once 300 ms after its first attempt.
    let grouped = db.enqueue(RetriesOnce { delay_ms: 300 }, "retried").await;
    let mut conn = db.conn().await;
    let ungrouped = RetriesOnce { delay_ms: 300 }
        .enqueue_with(&mut conn, EnqueueOptions::ungrouped())
        .await
        .expect("enqueue");
    drop(conn);
    db.wait_jobs_in(&[grouped, ungrouped], "succeeded", PROMPT)
        .await;
    assert_eq!(db.attempts_of(&[grouped, ungrouped]).await, 4);
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_runs_when_due_though_the_lane_that_wrote_it_is_busy() {
    let db = TestDb::new().await;
    let (first, second) = ("wakeups_due_first", "wakeups_due_second");
    let runner = db.start_runner(config(2).prefetch(0)).await;
    // One lane holds the first job; the other runs the retried job's first
    // attempt, then takes the second held job (the only lane free for it).
    let held_first = db.enqueue(job(first, true), "held-1").await;
    gate(first).wait_started(1).await;
    let retried = db.enqueue(RetriesOnce { delay_ms: 300 }, "retried").await;
    // Its first attempt is written.
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {retried} \
             AND state = 'queued' AND attempts = 1"
        ),
        1,
        PROMPT,
    )
    .await;
    let held_second = db.enqueue(job(second, true), "held-2").await;
    gate(second).wait_started(1).await;
    // The lane of the first job frees up; the lane that wrote the retry stays
    // busy until the end.
    gate(first).release.add_permits(1);
    db.wait_jobs_in(&[retried], "succeeded", PROMPT).await;
    gate(second).release.add_permits(1);
    db.wait_jobs_in(&[held_first, held_second], "succeeded", PROMPT)
        .await;
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_of_idle_groups_run_when_due_not_at_the_poll() {
    let db = TestDb::new().await;
    let runner = db.start_runner(config(2)).await;
    // One batch wakes both groups, and one promote finds both heads not
    // ready yet, each due at its own time.
    let batch = [("delayed-1", 300), ("delayed-2", 900)]
        .into_iter()
        .map(|(group, ms)| {
            let options = EnqueueOptions::group(group).run_in(Duration::from_millis(ms));
            NewJob::new(&job("wakeups_delayed", false), options).expect("new job")
        })
        .collect::<Vec<_>>();
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    drop(conn);
    db.wait_jobs_in(&ids, "succeeded", PROMPT).await;
    runner.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_without_idle_lanes_hands_new_groups_to_another() {
    let db = TestDb::new().await;
    let tag = "wakeups_hand_over";
    let busy = db.start_runner(config(1).prefetch(0).name("busy")).await;
    let held = db.enqueue(job(tag, true), "held").await;
    gate(tag).wait_started(1).await;
    let idle = db.start_runner(config(1).prefetch(0).name("idle")).await;
    // Both listeners hear of each new group; when the busy runner promotes
    // it, it has no lane for it and must tell the idle one.
    for i in 0..6 {
        let id = db.enqueue(job(tag, false), &format!("new-{i}")).await;
        db.wait_jobs_in(&[id], "succeeded", PROMPT).await;
    }
    gate(tag).release.add_permits(1);
    db.wait_jobs_in(&[held], "succeeded", PROMPT).await;
    idle.shutdown().await.expect("shutdown");
    busy.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_that_wait_give_their_connections_back_long_before_the_poll() {
    // Lanes keep their connection for a moment after their work ends, for
    // the next wake-up; with nothing more to do, the pool must have them
    // back well before the (60 s) poll, for the application or another
    // runner on the same pool.
    let db = TestDb::with_pool_size(8).await;
    let runner = db.start_runner(config(4).prefetch(0)).await;
    // Jobs in eight groups wake every lane.
    for round in 0..3 {
        let groups: Vec<String> = (0..8).map(|i| format!("p{round}_{i}")).collect();
        let ids = enqueue_batch(&db, "wakeups_pool", &groups).await;
        db.wait_jobs_in(&ids, "succeeded", PROMPT).await;
    }
    // Every connection but the bookkeeper's, held at once by the test.
    let mut held = Vec::new();
    for n in 0..7 {
        let conn = tokio::time::timeout(Duration::from_secs(3), db.pool.get_owned())
            .await
            .unwrap_or_else(|_| panic!("connection {n} of 7 not given back by the idle lanes"))
            .expect("pooled connection");
        held.push(conn);
    }
    drop(held);
    runner.shutdown().await.expect("shutdown");
}

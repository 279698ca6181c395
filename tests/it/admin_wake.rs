//! Operator actions that make work runnable wake idle runners at once
//! (NOTIFY), as an enqueue does: the runner here polls only every 30 s, so
//! work that starts within a few seconds was started by a notification.

use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy};
use pgfifo::{EnqueueOptions, JobId, RunnerHandle};
use pgfifo_tests::test_config;

use crate::admin_support::{Fx, Mode, QUEUE};
use pgfifo_tests::id_list;

/// Far longer than any wait of these tests.
const POLL: Duration = Duration::from_secs(30);

/// How soon work must start after the action that allowed it.
const PROMPT: Duration = Duration::from_secs(5);

async fn deaf_runner(fx: &Fx) -> RunnerHandle {
    fx.start_runner(
        test_config()
            .queues([QUEUE])
            .concurrency(2)
            .poll_interval(POLL),
    )
    .await
}

/// Waits until the runner's lanes have finished their last pick and sleep:
/// no other connection to the test's database is running a statement or
/// sits in a transaction, at two looks in a row (a lane between two
/// statements of its pick is idle for a moment).
async fn settle(fx: &Fx) {
    let busy = "SELECT count(*) FROM pg_stat_activity \
                WHERE datname = current_database() AND pid <> pg_backend_pid() \
                AND backend_type = 'client backend' AND state IS DISTINCT FROM 'idle'";
    let deadline = tokio::time::Instant::now() + PROMPT;
    let mut quiet_looks = 0;
    while quiet_looks < 2 {
        quiet_looks = if fx.scalar(busy).await == 0 {
            quiet_looks + 1
        } else {
            0
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner did not go idle within {PROMPT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits [`PROMPT`] at most for `ids` to succeed.
async fn wait_prompt(fx: &Fx, ids: &[JobId], after: &str) {
    let sql = format!(
        "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND state = 'succeeded'",
        id_list(ids)
    );
    let deadline = tokio::time::Instant::now() + PROMPT;
    while fx.scalar(&sql).await != ids.len() as i64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{after}: the runnable jobs did not start within {PROMPT:?} (the runner polls every {POLL:?}): \
             no notification woke it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Group "h" of a `hold` queue held at its failed head (seq 0), with a job
/// behind it; the runner idle.
async fn held_group(fx: &Fx) -> (RunnerHandle, JobId, JobId) {
    fx.set_policy(FailurePolicy::Hold).await;
    fx.break_seqs(&[0]).await;
    // The runner first: jobs enqueued before it started may wait for its
    // poll (see the last test).
    let runner = deaf_runner(fx).await;
    let ids = fx.push_many(Some("h"), 0..2).await;
    fx.wait_held("h").await;
    settle(fx).await;
    (runner, ids[0], ids[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_resume_and_release_wake_an_idle_runner() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    let (runner, head, behind) = held_group(&fx).await;

    // Releasing held groups.
    fx.set_policy(FailurePolicy::Continue).await;
    wait_prompt(&fx, &[behind], "set_failure_policy(continue)").await;

    // Retrying a failed job.
    fx.fix_all().await;
    settle(&fx).await;
    admin::retry_jobs(&mut conn, &[head]).await.unwrap();
    wait_prompt(&fx, &[head], "retry_jobs").await;

    // Resuming a group.
    admin::pause_group(&mut conn, QUEUE, "p").await.unwrap();
    let paused = fx.push_many(Some("p"), 10..12).await;
    fx.assert_not_started(&paused, "group p is paused").await;
    admin::resume_group(&mut conn, QUEUE, "p").await.unwrap();
    wait_prompt(&fx, &paused, "resume_group").await;

    // Resuming the queue.
    admin::pause_queue(&mut conn, QUEUE).await.unwrap();
    let mut waiting = fx.push_many(Some("q"), 20..22).await;
    waiting.extend(fx.push_many(None, 30..31).await);
    fx.assert_not_started(&waiting, "the queue is paused").await;
    admin::resume_queue(&mut conn, QUEUE).await.unwrap();
    wait_prompt(&fx, &waiting, "resume_queue").await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_a_held_head_wakes_an_idle_runner() {
    let fx = Fx::new().await;
    let (runner, head, behind) = held_group(&fx).await;
    let mut conn = fx.conn().await;
    let skipped = admin::skip_head(&mut conn, QUEUE, "h", None).await.unwrap();
    assert_eq!(skipped, Some(head));
    wait_prompt(&fx, &[behind], "skip_head").await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_waiting_head_wakes_an_idle_runner() {
    let fx = Fx::new().await;
    let runner = deaf_runner(&fx).await;
    let later = EnqueueOptions::group("w").run_in(Duration::from_secs(3600));
    let head = fx.push_with(0, Mode::Ok, later).await;
    let next = fx.push("w", 1, Mode::Ok).await;
    fx.wait_head(head).await;
    settle(&fx).await;
    let mut conn = fx.conn().await;
    admin::cancel_job(&mut conn, head, None).await.unwrap();
    wait_prompt(&fx, &[next], "cancel_job of the head").await;
    runner.shutdown().await.unwrap();
}

/// The listener promotes the groups woken while no runner listened when it
/// starts (and after it reconnects); workers that found nothing meanwhile
/// sleep until they are woken, so the listener must wake them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_enqueued_before_the_runner_started_all_run_without_waiting_for_a_poll() {
    let fx = Fx::new().await;
    let mut ids = Vec::new();
    for group in 0..100 {
        ids.extend(
            fx.push_many(Some(&format!("g{group}")), group..group + 1)
                .await,
        );
    }
    let runner = deaf_runner(&fx).await;
    wait_prompt(&fx, &ids, "runner start").await;
    runner.shutdown().await.unwrap();
}

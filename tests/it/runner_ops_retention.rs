//! Retention: a runner with `RunnerConfig::retention` deletes finished jobs
//! (with their attempt records) past their age, and idle groups past theirs,
//! in small batches, one runner at a time (a session advisory lock); queued
//! jobs, a held group's failed head and paused groups are never deleted.
//!
//! Jobs are run for real, then made old in SQL: `created_at` and
//! `finished_at` are moved back, batch by batch in id order.

use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy};
use pgfifo::{JobId, Retention, RunnerHandle};

use pgfifo_tests::id_list;

use crate::runner_ops_support::{Act, Fx, LIMIT, QUEUE, QUIET, TICK};

const HOUR: Duration = Duration::from_secs(3600);

/// Retention's lock key: `ADVISORY_KEY_BASE + 2`, a single bigint.
const RETENTION_LOCK: i64 = pgfifo::migrate::ADVISORY_KEY_BASE + 2;

/// Frequent passes over small batches; finished jobs go after an hour, failed
/// ones and idle groups never (tests turn them on).
fn retention() -> Retention {
    Retention::default()
        .finished_after(HOUR)
        .failed_after(None)
        .idle_groups_after(None)
        .interval(TICK)
        .batch_size(2)
}

impl Fx {
    async fn retention_runner(&self, retention: Retention) -> RunnerHandle {
        self.start_runner(self.config().concurrency(4).retention(retention))
            .await
    }

    /// Waits until none of `ids` is left.
    async fn wait_deleted(&self, ids: &[JobId], what: &str) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id IN ({})",
                id_list(ids)
            ),
            0,
            LIMIT,
        )
        .await;
        assert_eq!(self.attempts_of(ids).await, 0, "{what}: attempt rows left");
    }

    /// Asserts that every job of `ids` is still there, in `state`, with
    /// `attempts` attempt rows in all.
    async fn assert_kept(&self, ids: &[JobId], state: &str, attempts: i64, what: &str) {
        let kept = self.count_jobs(ids, &format!("state = '{state}'")).await;
        assert_eq!(kept, ids.len() as i64, "{what}: {state} jobs deleted");
        assert_eq!(
            self.attempts_of(ids).await,
            attempts,
            "{what}: attempt rows"
        );
    }

    /// Whether the test queue has a row for `group`.
    async fn group_row(&self, group: &str) -> bool {
        self.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = '{group}'"
        ))
        .await
            == 1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_succeeded_and_cancelled_jobs_go_with_their_attempts_and_the_rest_stays() {
    let fx = Fx::new().await;
    let runner = fx.retention_runner(retention()).await;
    use Act::*;
    // Two days old: finished ones in a group and ungrouped, a failed one (kept:
    // failed_after is None), one waiting for its retry in an hour and one
    // scheduled in an hour (both queued: never touched).
    let grouped = fx
        .settled(Some("g"), &[Ok, Ok, Cancel, Permanent, Ok])
        .await;
    let ungrouped = fx.settled(None, &[Ok, Cancel, Ok]).await;
    let waiting = fx.settled(Some("w"), &[RetryLater]).await;
    let scheduled = fx.push_later(Some("s"), &[Ok]).await;
    let old: Vec<JobId> = [&grouped[..], &ungrouped, &waiting, &scheduled].concat();
    fx.age_jobs(&old, "2 days").await;
    // Finished just now.
    let recent = fx.settled(Some("g"), &[Ok, Cancel]).await;

    let failed = vec![grouped[3]];
    let finished: Vec<JobId> = old
        .iter()
        .copied()
        .filter(|id| !failed.contains(id) && !waiting.contains(id) && !scheduled.contains(id))
        .collect();
    assert_eq!(finished.len(), 7);
    fx.wait_deleted(&finished, "old succeeded and cancelled jobs")
        .await;

    // Several more passes: the rest stays.
    tokio::time::sleep(QUIET).await;
    fx.assert_kept(&failed, "failed", 1, "old failed job (failed_after None)")
        .await;
    fx.assert_kept(&waiting, "queued", 1, "job waiting for its retry")
        .await;
    fx.assert_kept(&scheduled, "queued", 0, "scheduled job")
        .await;
    assert_eq!(fx.count_jobs(&recent, "state <> 'queued'").await, 2);
    assert_eq!(fx.attempts_of(&recent).await, 2, "recent jobs' attempts");
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_jobs_go_after_failed_after_but_a_held_groups_failed_head_stays() {
    let fx = Fx::new().await;
    {
        let mut conn = fx.conn().await;
        admin::set_failure_policy(&mut conn, QUEUE, FailurePolicy::Hold)
            .await
            .unwrap();
    }
    // Succeeded jobs go after an hour, failed ones after ten.
    let runner = fx
        .retention_runner(retention().failed_after(HOUR * 10))
        .await;
    use Act::*;
    // Two days old: two failed (ungrouped: not held), a succeeded one, and
    // group h held at its failed head with a job queued behind it.
    let old_failed = fx.settled(None, &[Permanent, FailAlways]).await;
    let old_ok = fx.settled(None, &[Ok]).await;
    let held = fx.push(Some("h"), &[Permanent, Ok]).await;
    fx.wait_settled(&held[..1]).await;
    let held_groups = format!(
        "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = 'h' \
         AND head_id = {} AND ready_at IS NULL",
        held[0]
    );
    fx.wait_for(&held_groups, 1, LIMIT).await;
    fx.age_jobs(&[&old_failed[..], &old_ok, &held].concat(), "2 days")
        .await;
    // Five hours old: the succeeded job goes, the failed one stays.
    let mid = fx.settled(None, &[Permanent, Ok]).await;
    fx.age_jobs(&mid, "5 hours").await;
    // Failed just now.
    let recent = fx.settled(None, &[Permanent]).await;

    fx.wait_deleted(&[&old_failed[..], &old_ok, &mid[1..]].concat(), "old jobs")
        .await;
    tokio::time::sleep(QUIET).await;
    fx.assert_kept(&held[..1], "failed", 1, "the held group's failed head")
        .await;
    fx.assert_kept(&held[1..], "queued", 0, "the job behind the held head")
        .await;
    fx.assert_kept(
        &mid[..1],
        "failed",
        1,
        "a job failed 5 hours ago (failed_after 10 h)",
    )
    .await;
    fx.assert_kept(&recent, "failed", 1, "a job failed just now")
        .await;
    assert_eq!(
        fx.scalar(&held_groups).await,
        1,
        "group h is no longer held"
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_idle_groups_go_and_come_back_with_their_next_job() {
    let fx = Fx::new().await;
    let runner = fx
        .retention_runner(retention().idle_groups_after(HOUR))
        .await;
    let idle = ["idle1", "idle2", "idle3"];
    let kept = ["fresh", "paused"];
    for group in idle.iter().chain(&kept) {
        fx.push(Some(group), &[Act::Ok]).await;
    }
    fx.wait_succeeded(5, LIMIT).await;
    fx.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND head_id IS NULL"
        ),
        5,
        LIMIT,
    )
    .await;
    {
        let mut conn = fx.conn().await;
        assert!(admin::pause_group(&mut conn, QUEUE, "paused")
            .await
            .unwrap());
    }
    // An active group: its head is scheduled in an hour.
    fx.push_later(Some("busy"), &[Act::Ok]).await;
    fx.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' \
             AND group_id = 'busy' AND head_id IS NOT NULL"
        ),
        1,
        LIMIT,
    )
    .await;
    fx.age_groups(&["idle1", "idle2", "idle3", "paused", "busy"])
        .await;

    fx.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' \
             AND group_id IN ('idle1', 'idle2', 'idle3')"
        ),
        0,
        LIMIT,
    )
    .await;
    tokio::time::sleep(QUIET).await;
    for group in ["fresh", "paused", "busy"] {
        assert!(fx.group_row(group).await, "group {group} was deleted");
    }

    // A deleted group comes back with its next job, which runs.
    let id = fx.push(Some("idle1"), &[Act::Ok]).await[0];
    fx.wait_job_succeeded(id, LIMIT).await;
    assert!(fx.group_row("idle1").await, "group idle1 did not come back");
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_idle_groups_do_not_keep_other_idle_groups_from_going() {
    let fx = Fx::new().await;
    // A pass deletes idle groups batch by batch and stops at a short batch;
    // paused groups are kept, so they must not fill the batches. Group rows
    // written directly, all idle for two days: two paused groups first (first
    // in the table), then two that may go. A batch is two rows.
    fx.exec(&format!(
        "INSERT INTO pgfifo.queue_group (queue, group_id, slot, created_at, idle_since)
         SELECT '{QUEUE}', g, pgfifo.group_hash('{QUEUE}', g),
                now() - interval '3 days', now() - interval '2 days'
         FROM unnest(ARRAY['paused1', 'paused2', 'idle1', 'idle2']) AS g;
         INSERT INTO pgfifo.group_pause (queue, group_id)
         VALUES ('{QUEUE}', 'paused1'), ('{QUEUE}', 'paused2');"
    ))
    .await;
    let runner = fx
        .retention_runner(retention().idle_groups_after(HOUR))
        .await;
    fx.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' \
             AND group_id IN ('idle1', 'idle2')"
        ),
        0,
        Duration::from_secs(5),
    )
    .await;
    assert!(fx.group_row("paused1").await && fx.group_row("paused2").await);
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_deleted_while_another_session_holds_the_retention_lock() {
    use diesel_async::SimpleAsyncConnection;
    let fx = Fx::new().await;
    let mut holder = fx.direct().await;
    holder
        .batch_execute(&format!("SELECT pg_advisory_lock({RETENTION_LOCK})"))
        .await
        .unwrap();
    let runner = fx
        .retention_runner(retention().idle_groups_after(HOUR))
        .await;
    let old = fx
        .settled(Some("g"), &[Act::Ok, Act::Cancel, Act::Ok])
        .await;
    fx.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND head_id IS NULL"
        ),
        1,
        LIMIT,
    )
    .await;
    fx.age_jobs(&old, "2 days").await;
    fx.age_groups(&["g"]).await;

    tokio::time::sleep(QUIET).await;
    fx.assert_kept(&old[..1], "succeeded", 1, "while the lock is held")
        .await;
    assert_eq!(
        fx.count_jobs(&old, "true").await,
        3,
        "a job went while the lock is held"
    );
    assert!(
        fx.group_row("g").await,
        "the group went while the lock is held"
    );

    holder
        .batch_execute(&format!("SELECT pg_advisory_unlock({RETENTION_LOCK})"))
        .await
        .unwrap();
    fx.wait_deleted(&old, "after the lock was released").await;
    fx.wait_for(
        &format!("SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}'"),
        0,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
}

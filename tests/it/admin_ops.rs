//! Operations on single jobs and on the tables: cancelling a job, skipping a
//! running head (refused), purging old finished jobs, deleting long-idle
//! group rows.

use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy, FinishedState, GroupState};
use pgfifo::{EnqueueOptions, Error, JobId, RunnerHandle};

use crate::admin_support::{Fx, Mode, QUEUE};
use pgfifo_tests::id_list;

const HOUR: Duration = Duration::from_secs(3600);

/// Starts a runner with job 0 of `group` running (held at the gate) and job 1
/// queued behind it; returns both ids.
async fn running_head(fx: &Fx, group: &str) -> (RunnerHandle, JobId, JobId) {
    let head = fx.push(group, 0, Mode::Hold).await;
    let behind = fx.push(group, 1, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.gate().wait_started(1).await;
    (runner, head, behind)
}

/// How many rows of `table` belong to the jobs `ids`.
async fn rows_of(fx: &Fx, table: &str, column: &str, ids: &[JobId]) -> i64 {
    fx.scalar(&format!(
        "SELECT count(*) FROM {table} WHERE {column} IN ({})",
        id_list(ids)
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_queued_job_and_the_group_runs_without_it() {
    let fx = Fx::new().await;
    let (runner, head, doomed) = running_head(&fx, "c").await;
    let last = fx.push("c", 2, Mode::Ok).await;
    let mut conn = fx.conn().await;
    admin::cancel_job(&mut conn, doomed, Some("not needed any more"))
        .await
        .unwrap();
    assert_eq!(fx.job_state(doomed).await, "cancelled 0");
    assert_eq!(
        fx.last_error(doomed).await.as_deref(),
        Some("not needed any more")
    );

    fx.release(1);
    fx.wait_state(&[head, last], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("c").await, "0:1,2:1");
    assert_eq!(fx.attempts_of(&[doomed]).await, 0, "the cancelled job ran");

    // Finished jobs cannot be cancelled; a missing one is reported.
    for (id, state) in [(head, "succeeded"), (doomed, "cancelled")] {
        match admin::cancel_job(&mut conn, id, None).await {
            Err(Error::JobState {
                id: got, state: s, ..
            }) => assert_eq!((got, s.as_str()), (id, state)),
            other => panic!("cancel of a {state} job: {other:?}"),
        }
    }
    let missing = last + 1_000;
    assert!(matches!(
        admin::cancel_job(&mut conn, missing, None).await,
        Err(Error::JobNotFound(id)) if id == missing
    ));
    assert_eq!(fx.job_state(head).await, "succeeded 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_head_that_waits_for_its_retry_lets_the_next_job_run() {
    let fx = Fx::new().await;
    let head = fx
        .push_with(
            0,
            Mode::RetryLater,
            EnqueueOptions::group("w").max_attempts(3),
        )
        .await;
    let next = fx.push("w", 1, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_retrying(head).await;
    assert_eq!(fx.group_info("w").await.state, GroupState::Retrying);
    fx.assert_not_started(&[next], "the head waits for its retry")
        .await;

    let mut conn = fx.conn().await;
    admin::cancel_job(&mut conn, head, None).await.unwrap();
    fx.wait_state(&[next], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.job_state(head).await, "cancelled 1");
    assert_eq!(
        fx.last_error(head).await.as_deref(),
        Some("come back in a minute"),
        "without a reason, the last error stays"
    );
    assert_eq!(fx.run_order("w").await, "1:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_head_of_a_head_waiting_for_its_retry_fails_it_and_the_group_goes_on() {
    let fx = Fx::new().await;
    let retrying = EnqueueOptions::group("k").max_attempts(3);
    let head = fx.push_with(0, Mode::RetryLater, retrying).await;
    let next = fx.push("k", 1, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_retrying(head).await;

    let mut conn = fx.conn().await;
    let skipped = admin::skip_head(&mut conn, QUEUE, "k", Some("given up by the operator"))
        .await
        .unwrap();
    assert_eq!(skipped, Some(head));
    assert_eq!(fx.job_state(head).await, "failed 1");
    assert_eq!(
        fx.last_error(head).await.as_deref(),
        Some("given up by the operator")
    );
    fx.wait_state(&[next], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("k").await, "1:1");
    assert_eq!(
        fx.attempts_of(&[head]).await,
        1,
        "the skipped head ran again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_is_refused_and_it_still_succeeds() {
    let fx = Fx::new().await;
    let (runner, head, behind) = running_head(&fx, "r").await;
    let loose = fx
        .push_with(5, Mode::Hold, EnqueueOptions::ungrouped())
        .await;
    fx.gate().wait_started(1).await;

    let mut conn = fx.conn().await;
    for id in [head, loose] {
        match admin::cancel_job(&mut conn, id, Some("stop")).await {
            Err(Error::JobRunning(got)) => assert_eq!(got, id),
            other => panic!("cancel of running job {id}: {other:?}"),
        }
        assert_eq!(fx.job_state(id).await, "queued 0");
        assert_eq!(fx.last_error(id).await, None);
    }
    fx.release(2);
    fx.wait_state(&[head, behind, loose], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("r").await, "0:1,1:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_head_of_a_running_group_is_refused() {
    let fx = Fx::new().await;
    let (runner, head, behind) = running_head(&fx, "s").await;
    let info = fx.group_info("s").await;
    assert_eq!(
        (info.state, info.head),
        (GroupState::Running, Some(head)),
        "{info:?}"
    );
    let mut conn = fx.conn().await;
    match admin::skip_head(&mut conn, QUEUE, "s", Some("skip")).await {
        Err(Error::GroupBusy { queue, group }) => {
            assert_eq!((queue.as_str(), group.as_str()), (QUEUE, "s"))
        }
        other => panic!("skip of a running head: {other:?}"),
    }
    assert_eq!(fx.job_state(head).await, "queued 0");
    assert_eq!(fx.job_state(behind).await, "queued 0");
    assert_eq!(fx.last_error(head).await, None);

    fx.release(1);
    fx.wait_state(&[head, behind], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("s").await, "0:1,1:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_old_finished_jobs_with_their_attempts_only() {
    let fx = Fx::new().await;
    fx.break_seqs(&[3, 20]).await;
    let ok = fx.push_many(Some("p"), 0..3).await;
    let failed = fx.push("f", 3, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_state(&ok, "succeeded").await;
    fx.wait_state(&[failed], "failed").await;
    let mut conn = fx.conn().await;
    fx.set_policy(FailurePolicy::Hold).await;
    let held = fx.push("h", 20, Mode::Ok).await;
    let behind_held = fx.push("h", 21, Mode::Ok).await;
    fx.wait_held("h").await;
    runner.shutdown().await.unwrap();
    let queued = fx.push_many(Some("q"), 30..33).await;
    admin::cancel_job(&mut conn, queued[2], None).await.unwrap();

    // Everything was enqueued three hours ago and finished two hours ago,
    // except ok[2], which finished ten minutes ago.
    fx.exec(&format!(
        "UPDATE pgfifo.job SET created_at = now() - interval '3 hours',
             finished_at = CASE WHEN finished_at IS NULL THEN NULL
                                WHEN id = {young} THEN now() - interval '10 minutes'
                                ELSE now() - interval '2 hours' END",
        young = ok[2]
    ))
    .await;
    let old_ok = [ok[0], ok[1]];
    assert_eq!(
        rows_of(&fx, "pgfifo.job_attempt", "job_id", &old_ok).await,
        2
    );

    // Succeeded and cancelled, in batches of two.
    let (mut deleted, mut after, mut batches) = (0, 0, 0);
    loop {
        let batch = admin::purge_batch(
            &mut conn,
            HOUR,
            &[FinishedState::Succeeded, FinishedState::Cancelled],
            after,
            2,
        )
        .await
        .unwrap();
        (deleted, after, batches) = (deleted + batch.deleted, batch.last_id, batches + 1);
        if batch.done {
            break;
        }
        assert!(batches < 50, "the purge walk does not end");
    }
    assert_eq!(deleted, 3);
    assert_eq!(
        rows_of(&fx, "pgfifo.job", "id", &[ok[0], ok[1], queued[2]]).await,
        0
    );
    assert_eq!(
        rows_of(&fx, "pgfifo.job_attempt", "job_id", &old_ok).await,
        0
    );
    let kept = [ok[2], failed, held, behind_held, queued[0], queued[1]];
    assert_eq!(rows_of(&fx, "pgfifo.job", "id", &kept).await, 6);
    assert_eq!(
        rows_of(&fx, "pgfifo.job_attempt", "job_id", &[ok[2]]).await,
        1
    );

    // Failed too: the held group's failed head stays.
    let deleted = admin::purge(&mut conn, HOUR, &FinishedState::ALL)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(rows_of(&fx, "pgfifo.job", "id", &[failed]).await, 0);
    assert_eq!(
        rows_of(&fx, "pgfifo.job_attempt", "job_id", &[failed]).await,
        0
    );
    assert_eq!(fx.job_state(held).await, "failed 1");
    assert_eq!(
        rows_of(&fx, "pgfifo.job_attempt", "job_id", &[held]).await,
        1
    );
    assert_eq!(fx.group_info("h").await.head, Some(held));
    assert_eq!(rows_of(&fx, "pgfifo.job", "id", &kept[2..]).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_groups_deletes_long_idle_groups_which_come_back_with_a_job() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    fx.set_policy(FailurePolicy::Hold).await;
    fx.break_seqs(&[30]).await;
    let done = [
        fx.push("old", 0, Mode::Ok).await,
        fx.push("young", 10, Mode::Ok).await,
        fx.push("paused", 20, Mode::Ok).await,
    ];
    fx.push_many(Some("held"), 30..32).await;
    let later = fx
        .push_with(40, Mode::Ok, EnqueueOptions::group("later").run_in(HOUR))
        .await;
    let runner = fx.runner().await;
    fx.wait_state(&done, "succeeded").await;
    fx.wait_held("held").await;
    fx.wait_head(later).await;
    admin::pause_group(&mut conn, QUEUE, "paused")
        .await
        .unwrap();
    // Every group but "young" has existed, and been idle if it is, for two hours.
    fx.exec(
        "UPDATE pgfifo.queue_group SET created_at = now() - interval '2 hours',
             idle_since = CASE WHEN idle_since IS NULL THEN NULL ELSE now() - interval '2 hours' END
         WHERE group_id <> 'young'",
    )
    .await;

    assert_eq!(admin::clean_groups(&mut conn, HOUR, 100).await.unwrap(), 1);
    assert_eq!(
        fx.text("SELECT string_agg(group_id, ',' ORDER BY group_id) FROM pgfifo.queue_group")
            .await
            .as_deref(),
        Some("held,later,paused,young")
    );

    // The deleted group comes back with its next job, which runs.
    let again = fx.push("old", 1, Mode::Ok).await;
    fx.wait_state(&[again], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("old").await, "0:1,1:1");
    assert_eq!(fx.group_info("old").await.state, GroupState::Idle);
    assert_eq!(admin::clean_groups(&mut conn, HOUR, 100).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_batch_reports_the_first_job_a_later_walk_must_see_again() {
    let fx = Fx::new().await;
    // In id order: old succeeded, queued, old failed (kept by this walk for
    // good), recent succeeded, old succeeded.
    fx.exec(
        "INSERT INTO pgfifo.job (queue, kind, payload, max_attempts, state, created_at, finished_at)
         SELECT 'purge-mark', 'k', '{}', 1, t.state, now() - interval '4 hours',
                CASE WHEN t.state <> 'queued' THEN now() - t.age::interval END
         FROM (VALUES (1, 'succeeded', '3 hours'), (2, 'queued', '0 hours'),
                      (3, 'failed', '3 hours'), (4, 'succeeded', '0 hours'),
                      (5, 'succeeded', '3 hours')) AS t(n, state, age)
         ORDER BY t.n",
    )
    .await;
    let first = fx
        .scalar("SELECT min(id) FROM pgfifo.job WHERE queue = 'purge-mark'")
        .await;
    let mut conn = fx.conn().await;
    let batch = admin::purge_batch(&mut conn, HOUR, &[FinishedState::Succeeded], first - 1, 100)
        .await
        .unwrap();
    assert_eq!(batch.deleted, 2, "the two old succeeded jobs");
    assert!(batch.done);
    assert_eq!(batch.last_id, first + 4);
    assert_eq!(
        batch.first_pending,
        Some(first + 1),
        "the queued job is the first one a later walk must look at again"
    );
    let left = fx
        .text(
            "SELECT string_agg(state, ',' ORDER BY id) FROM pgfifo.job WHERE queue = 'purge-mark'",
        )
        .await;
    assert_eq!(left.as_deref(), Some("queued,failed,succeeded"));
}

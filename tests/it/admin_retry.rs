//! Manual retry of failed jobs: retried jobs run in their original order,
//! ahead of later jobs of their group, with attempt numbers that go on and a
//! fresh budget; jobs that are not failed are reported and left alone.

use pgfifo::admin::{self, JobStatus, Retried, RetryResult};
use pgfifo::{EnqueueOptions, JobId, RunnerHandle};

use crate::admin_support::{Fx, Mode, QUEUE};

fn retried(ids: &[JobId]) -> Vec<Retried> {
    ids.iter()
        .map(|&id| Retried {
            id,
            result: RetryResult::Retried,
        })
        .collect()
}

/// Starts a runner on a test queue where job seq 0 of `group` has failed
/// for good; returns its id.
async fn failed_job(fx: &Fx, group: &str) -> (RunnerHandle, JobId) {
    fx.break_seqs(&[0]).await;
    let failed = fx.push(group, 0, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_state(&[failed], "failed").await;
    (runner, failed)
}

/// Every job and group row, to compare before and after an operation that
/// must change nothing.
async fn snapshot(fx: &Fx) -> Option<String> {
    fx.text(
        "SELECT (SELECT string_agg(format('%s %s %s %s %s %s %s', id, state, attempts, attempt_base,
                                          run_after, finished_at, last_error), ';' ORDER BY id)
                 FROM pgfifo.job)
             || ' | ' || (SELECT coalesce(string_agg(format('%s %s %s', group_id, head_id, ready_at),
                                                      ';' ORDER BY group_id), '')
                          FROM pgfifo.queue_group)
             || ' | ' || (SELECT count(*) FROM pgfifo.group_wake)",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_failed_runs_a_groups_failed_jobs_in_order_with_a_fresh_budget() {
    let fx = Fx::new().await;
    fx.break_seqs(&[1, 2, 5, 7]).await;
    // Group r: A ok, B and C fail for good (one attempt each), D ok.
    let r = fx.push_many(Some("r"), 0..4).await;
    let (failed, succeeded) = ([r[1], r[2]], [r[0], r[3]]);
    // Failed jobs elsewhere in the queue, not asked for at first.
    let other = fx.push_many(Some("s"), 5..6).await[0];
    let loose = fx.push_many(None, 7..8).await[0];
    let runner = fx.runner().await;
    fx.wait_state(&succeeded, "succeeded").await;
    fx.wait_state(&[failed[0], failed[1], other, loose], "failed")
        .await;
    assert_eq!(
        fx.run_order("r").await,
        "0:1,3:1",
        "continue policy: D ran past B and C"
    );

    fx.fix_all().await;
    let mut conn = fx.conn().await;
    let report = admin::retry_failed(&mut conn, QUEUE, Some("r"))
        .await
        .unwrap();
    assert_eq!(report, retried(&failed));
    fx.wait_state(&failed, "succeeded").await;
    assert_eq!(
        fx.run_order("r").await,
        "0:1,3:1,1:2,2:2",
        "B then C, each on its second attempt"
    );
    for (id, seq) in [(failed[0], 1), (failed[1], 2)] {
        assert_eq!(fx.job_state(id).await, "succeeded 2");
        let detail = admin::job(&mut conn, id).await.unwrap().expect("job");
        assert_eq!(detail.summary.status, JobStatus::Succeeded);
        assert_eq!(
            (detail.summary.attempts, detail.summary.max_attempts),
            (2, 2),
            "a retry gives a fresh budget of max_attempts (1) on top of the attempt made"
        );
        let log = &detail.attempt_log;
        assert_eq!(log.len(), 2, "{log:?}");
        assert_eq!((log[0].attempt, log[1].attempt), (1, 2));
        let first = log[0].error.as_deref().unwrap_or_default();
        assert!(first.contains(&format!("seq {seq} is broken")), "{log:?}");
        assert_eq!(log[1].error, None, "{log:?}");
    }
    // The group filter left the others failed.
    assert_eq!(fx.job_state(other).await, "failed 1");
    assert_eq!(fx.job_state(loose).await, "failed 1");

    // Without a group: the rest of the queue.
    let report = admin::retry_failed(&mut conn, QUEUE, None).await.unwrap();
    assert_eq!(report, retried(&[other, loose]));
    fx.wait_state(&[other, loose], "succeeded").await;
    assert!(admin::retry_failed(&mut conn, QUEUE, None)
        .await
        .unwrap()
        .is_empty());
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("s").await, "5:2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_job_that_is_not_failed_or_missing_changes_nothing() {
    let fx = Fx::new().await;
    let done = fx.push("n", 0, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_state(&[done], "succeeded").await;
    runner.shutdown().await.unwrap();
    let queued = fx.push("n", 1, Mode::Ok).await;
    let scheduled = fx
        .push_with(
            2,
            Mode::Ok,
            EnqueueOptions::group("m").run_in(std::time::Duration::from_secs(3600)),
        )
        .await;
    let missing = scheduled + 1_000;

    let before = snapshot(&fx).await;
    let mut conn = fx.conn().await;
    let report = admin::retry_jobs(&mut conn, &[missing, queued, done, scheduled, queued])
        .await
        .unwrap();
    let line = |id, result| Retried { id, result };
    assert_eq!(
        report,
        vec![
            line(done, RetryResult::NotFailed),
            line(queued, RetryResult::NotFailed),
            line(scheduled, RetryResult::NotFailed),
            line(missing, RetryResult::Missing),
        ]
    );
    assert_eq!(
        snapshot(&fx).await,
        before,
        "a retry of nothing changed rows"
    );
    assert!(admin::retry_jobs(&mut conn, &[]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_retried_while_its_group_runs_goes_before_later_jobs() {
    let fx = Fx::new().await;
    fx.break_seqs(&[0]).await;
    // F fails for good, then X runs (held at the gate) with Y behind it.
    let f = fx.push("g", 0, Mode::Ok).await;
    let x = fx.push("g", 1, Mode::Hold).await;
    let y = fx.push("g", 2, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.gate().wait_started(1).await;
    assert_eq!(fx.job_state(f).await, "failed 1");

    fx.fix_all().await;
    let mut conn = fx.conn().await;
    let report = admin::retry_jobs(&mut conn, &[f]).await.unwrap();
    assert_eq!(report, retried(&[f]));
    // X still holds the group: neither the retried job nor Y may start.
    fx.assert_not_started(&[y], "X is running").await;
    assert_eq!(fx.attempts_of(&[f]).await, 1, "F started while X ran");

    fx.release(1);
    fx.wait_state(&[x, f, y], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        fx.run_order("g").await,
        "1:1,0:2,2:1",
        "after X, the retried F runs before the later Y"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_whose_unique_key_was_taken_again_is_not_retried() {
    let fx = Fx::new().await;
    fx.break_seqs(&[0, 1]).await;
    let keyed = |group: &str| EnqueueOptions::group(group).unique_key("k");
    let first = fx.push_with(0, Mode::Ok, keyed("u")).await;
    let runner = fx.runner().await;
    fx.wait_state(&[first], "failed").await;
    // The key is free again: a second job takes it, and fails too.
    let second = fx.push_with(1, Mode::Ok, keyed("u")).await;
    assert_ne!(second, first);
    fx.wait_state(&[second], "failed").await;
    runner.shutdown().await.unwrap();
    let holder = fx.push_with(2, Mode::Ok, keyed("v")).await;

    let mut conn = fx.conn().await;
    let report = admin::retry_jobs(&mut conn, &[first, second])
        .await
        .unwrap();
    let taken = |id| Retried {
        id,
        result: RetryResult::UniqueKeyTaken,
    };
    assert_eq!(report, vec![taken(first), taken(second)]);
    assert_eq!(fx.job_state(first).await, "failed 1");
    assert_eq!(fx.job_state(second).await, "failed 1");

    // Once the holder is gone, one of them gets the key back: the older.
    admin::cancel_job(&mut conn, holder, None).await.unwrap();
    let report = admin::retry_jobs(&mut conn, &[second, first])
        .await
        .unwrap();
    assert_eq!(report, vec![retried(&[first])[0].clone(), taken(second)]);
    assert_eq!(fx.job_state(first).await, "queued 1");
    assert_eq!(fx.job_state(second).await, "failed 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_job_goes_before_a_later_head_that_waits_for_its_time() {
    let fx = Fx::new().await;
    let (runner, failed) = failed_job(&fx, "g").await;
    // A later job scheduled in an hour becomes the group's head.
    let hour = EnqueueOptions::group("g").run_in(std::time::Duration::from_secs(3600));
    let later = fx.push_with(1, Mode::Ok, hour).await;
    fx.wait_head(later).await;

    fx.fix_all().await;
    let mut conn = fx.conn().await;
    assert_eq!(
        admin::retry_jobs(&mut conn, &[failed]).await.unwrap(),
        retried(&[failed])
    );
    fx.wait_state(&[failed], "succeeded").await;
    fx.assert_not_started(&[later], "the later job waits for its time")
        .await;
    runner.shutdown().await.unwrap();
    let info = fx.group_info("g").await;
    assert_eq!(
        (info.state, info.head),
        (admin::GroupState::Scheduled, Some(later)),
        "{info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_failed_job_whose_group_row_was_cleaned_runs_it() {
    let fx = Fx::new().await;
    let (runner, failed) = failed_job(&fx, "x").await;
    fx.wait_for(
        "SELECT count(*) FROM pgfifo.queue_group WHERE group_id = 'x' AND head_id IS NULL",
        1,
        crate::admin_support::LIMIT,
    )
    .await;
    fx.exec("UPDATE pgfifo.queue_group SET idle_since = now() - interval '2 hours'")
        .await;
    let mut conn = fx.conn().await;
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(admin::clean_groups(&mut conn, hour, 10).await.unwrap(), 1);

    fx.fix_all().await;
    assert_eq!(
        admin::retry_jobs(&mut conn, &[failed]).await.unwrap(),
        retried(&[failed])
    );
    fx.wait_state(&[failed], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("x").await, "0:2");
}

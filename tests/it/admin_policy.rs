//! A queue's failure policy: under `hold` a head that failed for good stops
//! its group (new jobs included) until an operator retries or skips it, or
//! switches the queue back to `continue`; under `continue` (the default) the
//! group goes on past it.

use pgfifo::admin::{self, FailurePolicy, GroupState};
use pgfifo::{JobId, RunnerHandle};

use crate::admin_support::{Fx, Mode, QUEUE};

/// Group "h" of a `hold` queue, stopped at its failed head.
struct Held {
    runner: RunnerHandle,
    /// The failed head (seq 0).
    head: JobId,
    /// The jobs behind it (seqs 1, 2, and 3 enqueued while held).
    rest: Vec<JobId>,
}

async fn held_group(fx: &Fx) -> Held {
    assert_eq!(fx.set_policy(FailurePolicy::Hold).await, 0);
    fx.break_seqs(&[0]).await;
    let head = fx.push("h", 0, Mode::Ok).await;
    let mut rest = fx.push_many(Some("h"), 1..3).await;
    let runner = fx.runner().await;
    fx.wait_state(&[head], "failed").await;
    fx.wait_held("h").await;
    fx.assert_not_started(&rest, "group h is held").await;

    let info = fx.group_info("h").await;
    assert_eq!(info.state, GroupState::Held, "{info:?}");
    assert_eq!((info.head, info.backlog), (Some(head), 2), "{info:?}");
    let error = info.head_error.clone().unwrap_or_default();
    assert!(error.contains("seq 0 is broken"), "{info:?}");
    let mut conn = fx.conn().await;
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert_eq!(status.failure_policy, FailurePolicy::Hold);
    assert_eq!(status.blocked_groups.held, 1, "{status:?}");
    assert_eq!(status.failed.value, 1, "{status:?}");

    // A job enqueued into a held group waits too.
    let late = fx.push("h", 3, Mode::Ok).await;
    fx.assert_not_started(&[late], "group h is held").await;
    rest.push(late);
    Held { runner, head, rest }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_policy_stops_the_group_until_its_failed_head_is_retried() {
    let fx = Fx::new().await;
    let held = held_group(&fx).await;

    fx.fix_all().await;
    let mut conn = fx.conn().await;
    let report = admin::retry_jobs(&mut conn, &[held.head]).await.unwrap();
    assert_eq!(report[0].result, admin::RetryResult::Retried);
    fx.wait_state(&held.rest, "succeeded").await;
    held.runner.shutdown().await.unwrap();

    assert_eq!(fx.run_order("h").await, "0:2,1:1,2:1,3:1");
    assert_eq!(fx.job_state(held.head).await, "succeeded 2");
    assert_eq!(fx.group_info("h").await.state, GroupState::Idle);
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert_eq!(status.blocked_groups.held, 0, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_policy_skip_head_lets_the_group_go_on_without_it() {
    let fx = Fx::new().await;
    let held = held_group(&fx).await;

    let mut conn = fx.conn().await;
    let skipped = admin::skip_head(&mut conn, QUEUE, "h", Some("skipped by the operator"))
        .await
        .unwrap();
    assert_eq!(skipped, Some(held.head));
    fx.wait_state(&held.rest, "succeeded").await;
    held.runner.shutdown().await.unwrap();

    assert_eq!(fx.run_order("h").await, "1:1,2:1,3:1");
    assert_eq!(fx.job_state(held.head).await, "failed 1");
    assert_eq!(
        admin::skip_head(&mut conn, QUEUE, "h", None).await.unwrap(),
        None,
        "an idle group has no head to skip"
    );
    assert_eq!(fx.group_info("h").await.state, GroupState::Idle);
    assert_eq!(
        fx.last_error(held.head).await.as_deref(),
        Some("skipped by the operator"),
        "skip_head records its reason as the skipped head's last error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_back_to_continue_releases_the_held_groups() {
    let fx = Fx::new().await;
    assert_eq!(fx.set_policy(FailurePolicy::Hold).await, 0);
    fx.break_seqs(&[0, 10, 20]).await;
    let mut heads = Vec::new();
    let mut behind = Vec::new();
    // Held groups with one, two and no jobs behind their failed head.
    for (group, seqs) in [("h1", 0..2), ("h2", 10..13), ("h3", 20..21)] {
        let ids = fx.push_many(Some(group), seqs).await;
        heads.push(ids[0]);
        behind.extend_from_slice(&ids[1..]);
    }
    let runner = fx.runner().await;
    for group in ["h1", "h2", "h3"] {
        fx.wait_held(group).await;
    }
    fx.assert_not_started(&behind, "the groups are held").await;

    assert_eq!(fx.set_policy(FailurePolicy::Continue).await, 3);
    fx.wait_state(&behind, "succeeded").await;
    runner.shutdown().await.unwrap();

    assert_eq!(fx.run_order("h1").await, "1:1");
    assert_eq!(fx.run_order("h2").await, "11:1,12:1");
    for head in heads {
        assert_eq!(fx.job_state(head).await, "failed 1");
    }
    for group in ["h1", "h2", "h3"] {
        assert_eq!(fx.group_info(group).await.state, GroupState::Idle);
    }
    let mut conn = fx.conn().await;
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert_eq!(status.failure_policy, FailurePolicy::Continue);
    assert_eq!(status.blocked_groups.held, 0, "{status:?}");
    assert_eq!(
        fx.set_policy(FailurePolicy::Continue).await,
        0,
        "nothing left to release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_policy_a_failed_head_does_not_block_its_group() {
    let fx = Fx::new().await;
    fx.break_seqs(&[0]).await;
    let ids = fx.push_many(Some("c"), 0..3).await;
    let runner = fx.runner().await;
    fx.wait_state(&ids[1..], "succeeded").await;
    runner.shutdown().await.unwrap();

    assert_eq!(fx.job_state(ids[0]).await, "failed 1");
    assert_eq!(fx.run_order("c").await, "1:1,2:1");
    assert_eq!(fx.group_info("c").await.state, GroupState::Idle);
    let mut conn = fx.conn().await;
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert_eq!(status.failure_policy, FailurePolicy::Continue);
    assert_eq!(
        (status.blocked_groups.held, status.failed.value),
        (0, 1),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_policy_also_holds_at_a_head_whose_attempts_crashed_away() {
    let fx = Fx::new().await;
    assert_eq!(fx.set_policy(FailurePolicy::Hold).await, 0);
    let ids = fx.push_many(Some("z"), 0..2).await;
    // Its one attempt started and never finished: a worker died running it.
    fx.exec(&format!(
        "INSERT INTO pgfifo.job_attempt (job_id, attempt, runner) VALUES ({}, 1, 'gone')",
        ids[0]
    ))
    .await;
    let runner = fx.runner().await;
    fx.wait_state(&ids[..1], "failed").await;
    fx.wait_held("z").await;
    fx.assert_not_started(&ids[1..], "group z is held").await;
    assert_eq!(fx.runs_of(&ids[..1]).await, 0, "the head ran again");
    let info = fx.group_info("z").await;
    assert_eq!((info.state, info.head), (GroupState::Held, Some(ids[0])));
    let error = info.head_error.unwrap_or_default();
    assert!(error.contains("never finished"), "{error}");

    // Retried, it gets a fresh attempt (number 2) and the group goes on.
    let mut conn = fx.conn().await;
    admin::retry_jobs(&mut conn, &ids[..1]).await.unwrap();
    fx.wait_state(&ids, "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("z").await, "0:2,1:1");
}

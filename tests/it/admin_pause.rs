//! Pausing and resuming one group or a whole queue: a paused group's jobs
//! stay queued and none starts (a running one finishes), other groups go on,
//! enqueueing still works, and resuming runs everything in FIFO order with
//! nothing lost or run twice.

use pgfifo::admin::{self, GroupState};
use pgfifo::EnqueueOptions;

use crate::admin_support::{Fx, Mode, QUEUE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_group_while_its_head_runs_then_resume_in_order() {
    let fx = Fx::new().await;
    let head = fx.push("p", 0, Mode::Hold).await;
    let rest = fx.push_many(Some("p"), 1..4).await;
    let runner = fx.runner().await;
    fx.gate().wait_started(1).await;

    let mut conn = fx.conn().await;
    assert!(admin::pause_group(&mut conn, QUEUE, "p").await.unwrap());
    assert!(
        !admin::pause_group(&mut conn, QUEUE, "p").await.unwrap(),
        "a second pause reports it was paused already"
    );

    // The running head is not interrupted: it finishes and commits.
    fx.release(1);
    fx.wait_state(&[head], "succeeded").await;
    // Other groups keep running while "p" is paused.
    let others = fx.push_many(Some("other"), 10..13).await;
    let loose = fx.push_many(None, 20..21).await;
    fx.wait_state(&others, "succeeded").await;
    fx.wait_state(&loose, "succeeded").await;
    fx.assert_not_started(&rest, "group p is paused").await;

    let info = fx.group_info("p").await;
    assert_eq!(info.state, GroupState::Paused, "{info:?}");
    assert_eq!(info.backlog, 3, "{info:?}");
    assert!(info.paused_at.is_some(), "{info:?}");
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert_eq!(status.blocked_groups.paused, 1, "{status:?}");

    assert!(admin::resume_group(&mut conn, QUEUE, "p").await.unwrap());
    assert!(
        !admin::resume_group(&mut conn, QUEUE, "p").await.unwrap(),
        "a second resume reports it was not paused"
    );
    fx.wait_state(&rest, "succeeded").await;
    runner.shutdown().await.unwrap();

    assert_eq!(fx.run_order("p").await, "0:1,1:1,2:1,3:1");
    let mut all = rest.clone();
    all.push(head);
    assert_eq!(fx.runs_of(&all).await, 4, "each job ran exactly once");
    assert_eq!(fx.attempts_of(&all).await, 4, "each job started once");
    assert_ne!(fx.group_info("p").await.state, GroupState::Paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_group_before_its_first_job_keeps_new_jobs_waiting() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    assert!(admin::pause_group(&mut conn, QUEUE, "fresh").await.unwrap());
    // Listed although it has no job yet.
    assert_eq!(fx.group_info("fresh").await.state, GroupState::Paused);

    let runner = fx.runner().await;
    let waiting = fx.push_many(Some("fresh"), 0..3).await;
    let control = fx.push_many(Some("control"), 10..11).await;
    fx.wait_state(&control, "succeeded").await;
    fx.assert_not_started(&waiting, "group fresh was paused before its jobs came")
        .await;
    let info = fx.group_info("fresh").await;
    assert_eq!(
        (info.state, info.backlog),
        (GroupState::Paused, 3),
        "{info:?}"
    );

    assert!(admin::resume_group(&mut conn, QUEUE, "fresh")
        .await
        .unwrap());
    fx.wait_state(&waiting, "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("fresh").await, "0:1,1:1,2:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_the_queue_stops_grouped_and_ungrouped_jobs_until_resumed() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    assert!(admin::pause_queue(&mut conn, QUEUE).await.unwrap());
    assert!(
        !admin::pause_queue(&mut conn, QUEUE).await.unwrap(),
        "a second pause reports it was paused already"
    );

    let runner = fx.runner().await;
    // Enqueueing into a paused queue works.
    let mut ids = fx.push_many(Some("a"), 0..3).await;
    ids.extend(fx.push_many(Some("b"), 10..12).await);
    ids.extend(fx.push_many(None, 20..22).await);
    ids.push(
        fx.push_with(30, Mode::Ok, EnqueueOptions::group("c").priority(5))
            .await,
    );
    assert_eq!(ids.len(), 8);
    fx.assert_not_started(&ids, "the queue is paused").await;
    let status = admin::queue_status(&mut conn, QUEUE, 5).await.unwrap();
    assert!(status.paused, "{status:?}");
    assert_eq!(status.queued.value, 8, "{status:?}");

    assert!(admin::resume_queue(&mut conn, QUEUE).await.unwrap());
    fx.wait_state(&ids, "succeeded").await;
    assert!(
        !admin::resume_queue(&mut conn, QUEUE).await.unwrap(),
        "a second resume reports it was not paused"
    );
    runner.shutdown().await.unwrap();
    assert_eq!(fx.run_order("a").await, "0:1,1:1,2:1");
    assert_eq!(fx.run_order("b").await, "10:1,11:1");
    assert_eq!(fx.runs_of(&ids).await, 8);
    assert!(
        !admin::queue_status(&mut conn, QUEUE, 5)
            .await
            .unwrap()
            .paused
    );
}

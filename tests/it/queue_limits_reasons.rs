//! Why a ready group waits for its queue (docs/queue-limits.md, "Why a
//! group waits"): `admin::groups` and the dashboard say "waiting: the queue
//! is at its limit of N running" while every slot of the queue is held by
//! a running job, or name the queue's rate while its bucket is empty, and
//! stop saying it once a slot or a token is free. Slots are counted from
//! the server's locks: with no runner holding one, a ready group does not
//! wait for its queue.

use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use pgfifo::admin::{self, GroupState, QueueWait};
use pgfifo::{dashboard, QueueLimits, Rate};

use crate::admin_support::{Fx, Mode, QUEUE};
use crate::dashboard_support::Client;

/// The reason of a queue at a concurrency of 1.
const AT_LIMIT: &str = "waiting: the queue is at its limit of 1 running";

/// Sets the test queue's limits.
async fn set_limits(fx: &Fx, limits: QueueLimits) {
    let mut conn = fx.conn().await;
    admin::set_queue_limits(&mut conn, QUEUE, limits)
        .await
        .expect("set the queue's limits");
}

/// The test queue's usage (it has limits).
async fn usage(fx: &Fx) -> admin::QueueUsage {
    let mut conn = fx.conn().await;
    admin::queue_usage(&mut conn, QUEUE)
        .await
        .expect("queue usage")
        .expect("the queue has limits")
}

/// Two groups, one slot: while one group's job is held at the gate, the
/// other's ready head waits for the queue and says so; once the slot frees,
/// it runs and the reason is gone. A group that becomes ready while no
/// runner holds the slot does not wait for the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_group_says_it_waits_for_a_queue_slot_until_one_frees() {
    let fx = Fx::new().await;
    set_limits(&fx, QueueLimits::new().concurrency(1)).await;
    fx.push("a", 1, Mode::Hold).await;
    fx.push("b", 2, Mode::Hold).await;
    let runner = fx.runner().await;
    let gate = fx.gate();
    gate.wait_started(1).await;

    let (a, b) = (fx.group_info("a").await, fx.group_info("b").await);
    let (running, waiting) = if a.state == GroupState::Running {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(running.state, GroupState::Running, "{running:?}");
    assert_eq!(
        running.queue_wait, None,
        "a running group waits for nothing"
    );
    assert_eq!(waiting.state, GroupState::Ready, "{waiting:?}");
    assert_eq!(
        waiting.queue_wait,
        Some(QueueWait::Concurrency {
            limit: 1,
            running: 1
        })
    );
    assert_eq!(waiting.queue_wait.unwrap().to_string(), AT_LIMIT);
    let now = usage(&fx).await;
    assert_eq!((now.running, now.at_limit), (Some(1), true), "{now:?}");

    // The slot frees: the waiting group's job starts in it.
    fx.release(1);
    gate.wait_started(1).await;
    let second = fx.group_info(&waiting.group).await;
    assert_eq!(second.state, GroupState::Running, "{second:?}");
    assert_eq!(second.queue_wait, None);
    fx.release(1);
    fx.wait_state(&[fx.push("c", 3, Mode::Ok).await], "succeeded")
        .await;
    runner.shutdown().await.unwrap();

    // No runner holds the slot: a ready group does not wait for the queue.
    fx.push("d", 4, Mode::Ok).await;
    // (Made active as a runner would.)
    fx.exec(&format!("SELECT pgfifo.promote(ARRAY['{QUEUE}'], 1000)"))
        .await;
    let d = fx.group_info("d").await;
    assert_eq!((d.state, d.queue_wait), (GroupState::Ready, None), "{d:?}");
    let idle = usage(&fx).await;
    assert_eq!((idle.running, idle.at_limit), (Some(0), false), "{idle:?}");
}

/// A queue whose bucket is empty: the ready group names the queue's rate
/// and when its next token is due; raising the rate lets it start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_group_says_it_waits_for_a_queue_token() {
    let fx = Fx::new().await;
    let hourly = Rate::new(1, Duration::from_secs(3_600)).unwrap();
    set_limits(&fx, QueueLimits::new().rate(hourly).burst(1)).await;
    let first = fx.push("a", 1, Mode::Ok).await;
    let second = fx.push("b", 2, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id IN ({first}, {second}) AND state = 'succeeded'"),
        1,
        Duration::from_secs(20),
    )
    .await;
    let (a, b) = (fx.group_info("a").await, fx.group_info("b").await);
    let waiting = if a.state == GroupState::Ready { a } else { b };
    assert_eq!(waiting.state, GroupState::Ready, "{waiting:?}");
    let Some(
        wait @ QueueWait::Rate {
            rate,
            burst,
            next_token_at: Some(at),
        },
    ) = waiting.queue_wait
    else {
        panic!("the group waits for the queue's token: {waiting:?}");
    };
    assert_eq!((rate, burst), (hourly, 1));
    let due = at.duration_since(SystemTime::now()).unwrap_or_default();
    assert!(due > Duration::from_secs(3_000), "next token in {due:?}");
    assert_eq!(
        wait.to_string(),
        "waiting: the queue's rate (1/h, burst 1) has no token left"
    );

    set_limits(
        &fx,
        QueueLimits::new().rate(Rate::per_second(1_000).unwrap()),
    )
    .await;
    fx.wait_state(&[first, second], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(fx.group_info(&waiting.group).await.queue_wait, None);
}

/// The dashboard's queue page shows the queue's limits and the reason
/// beside the waiting group; its group page says the same, with the whole
/// queue's limits among the group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_group_waiting_for_its_queue() {
    let fx = Fx::new().await;
    set_limits(&fx, QueueLimits::new().concurrency(1)).await;
    fx.push("a", 1, Mode::Hold).await;
    fx.push("b", 2, Mode::Hold).await;
    let runner = fx.runner().await;
    let gate = fx.gate();
    gate.wait_started(1).await;
    let a = fx.group_info("a").await;
    let waiting = if a.state == GroupState::Ready {
        "a"
    } else {
        "b"
    };
    let mut client = Client::new(dashboard::router(fx.pool.clone()));

    let queue = client.get(&format!("/queues/{QUEUE}")).await;
    assert_eq!(queue.status, StatusCode::OK);
    assert!(
        queue
            .body
            .contains("1 at once, 1 running now (at its limit)"),
        "the queue's limits: {}",
        queue.body
    );
    assert!(queue.body.contains(AT_LIMIT), "{}", queue.body);
    let group = client
        .get(&format!("/queues/{QUEUE}/groups/{waiting}"))
        .await;
    assert_eq!(group.status, StatusCode::OK);
    let reason = group.body.split("id=\"reason\"").nth(1).unwrap_or("");
    assert!(
        reason.contains(&format!("is ready, {AT_LIMIT}")),
        "{}",
        group.body
    );
    let limits = group.body.split("id=\"limits\"").nth(1).unwrap_or("");
    assert!(
        limits.contains("<dt>whole queue</dt><dd>1 at once, 1 running now (at its limit)"),
        "{limits}"
    );

    // Both ran: no reason is left on the queue's page.
    fx.release(2);
    fx.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE queue = '{QUEUE}' AND state = 'succeeded'"),
        2,
        Duration::from_secs(20),
    )
    .await;
    runner.shutdown().await.unwrap();
    let after = client.get(&format!("/queues/{QUEUE}")).await;
    assert!(!after.body.contains(AT_LIMIT), "{}", after.body);
    assert!(
        after.body.contains("1 at once, 0 running now"),
        "{}",
        after.body
    );
}

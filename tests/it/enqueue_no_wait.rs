//! Enqueueing into a busy group without waiting for it: a group with a
//! running job, a group another open transaction enqueued into. The job type
//! and helpers are `enqueue_api`'s.

use std::time::{Duration, Instant};

use diesel_async::AsyncConnection;
use pgfifo::runner::JobOutcome;
use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::test_config;

use crate::enqueue_api::{gate, gated, job, next_event_of, setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_into_a_running_group_does_not_block() {
    let db = setup().await;
    let gate_name = "enq_api_running_group";
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let mut conn = db.conn().await;
    let running = gated("running", gate_name)
        .enqueue(&mut conn, "busy")
        .await
        .unwrap();
    db.wait_attempt_rows(running, 1, Duration::from_secs(10))
        .await;

    // The runner holds the group's locks now; enqueueing into it must not wait.
    let started = Instant::now();
    let next = tokio::time::timeout(
        Duration::from_secs(3),
        job("next").enqueue(&mut conn, "busy"),
    )
    .await
    .expect("enqueue into a group with a running job blocked")
    .unwrap();
    let batch = tokio::time::timeout(
        Duration::from_secs(3),
        pgfifo::enqueue_batch(
            &mut conn,
            [
                NewJob::new(&job("batch-1"), EnqueueOptions::group("busy")).unwrap(),
                NewJob::new(&job("batch-2"), EnqueueOptions::group("other")).unwrap(),
            ],
        ),
    )
    .await
    .expect("batch enqueue into a group with a running job blocked")
    .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "enqueues took {took:?}");

    // The group still runs one job at a time: only the other group moves.
    let event = next_event_of(&mut events, batch[1], Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    assert_eq!(db.attempt_rows(next).await, 0);
    assert_eq!(db.attempt_rows(batch[0]).await, 0);
    assert_eq!(
        db.text(&format!(
            "SELECT state FROM pgfifo.job WHERE id = {running}"
        ))
        .await
        .as_deref(),
        Some("queued")
    );

    gate(gate_name).add_permits(1);
    for id in [running, next, batch[0]] {
        let event = next_event_of(&mut events, id, Duration::from_secs(10)).await;
        assert_eq!(event.outcome, JobOutcome::Succeeded, "job {id}");
    }
    runner.shutdown().await.unwrap();
    let order = db
        .text("SELECT string_agg(tag, ',' ORDER BY n) FROM enq_api_log WHERE tag <> 'batch-2'")
        .await;
    assert_eq!(order.as_deref(), Some("running,next,batch-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_does_not_wait_for_another_open_enqueue_transaction() {
    let db = setup().await;
    let mut holder = db.conn().await;
    // A connection of its own: if the enqueue below hangs, it is dropped mid-query.
    let mut other = db.direct().await;
    let result = holder
        .transaction::<_, pgfifo::Error, _>(async |c| {
            // The application's transaction enqueues into a new group and stays open.
            job("first").enqueue(c, "shared").await?;
            let started = Instant::now();
            let second = tokio::time::timeout(
                Duration::from_secs(3),
                job("second").enqueue(&mut other, "shared"),
            )
            .await;
            Ok((second, started.elapsed()))
        })
        .await
        .unwrap();
    let (second, took) = result;
    let second = second.unwrap_or_else(|_| {
        panic!("an autocommit enqueue into group `shared` waited {took:?} for another application transaction")
    });
    second.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE group_id = 'shared'")
            .await,
        2
    );
}

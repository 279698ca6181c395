//! Enqueue options: unique keys, delays, priorities, per-job max attempts.
//! The job type and helpers are `enqueue_api`'s.

use std::time::Duration;

use pgfifo::runner::JobOutcome;
use pgfifo::{EnqueueOptions, Job, JobId, NewJob};
use pgfifo_tests::test_config;

use crate::enqueue_api::{failing, gate, job, next_event_of, setup, EnqApiJob};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_key_returns_the_unfinished_job() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let opts = || EnqueueOptions::group("u").unique_key("invoice-7");

    let first = job("first").enqueue_with(&mut conn, opts()).await.unwrap();
    let dup = job("dup").enqueue_with(&mut conn, opts()).await.unwrap();
    assert_eq!(dup, first, "same key while queued: same id");
    // Another group of the same queue: the key is per queue.
    let dup_other_group = job("dup2")
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group("v").unique_key("invoice-7"),
        )
        .await
        .unwrap();
    assert_eq!(dup_other_group, first);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job").await,
        1,
        "nothing inserted"
    );
    assert_eq!(
        db.text(&format!(
            "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {first}"
        ))
        .await
        .as_deref(),
        Some("first"),
        "the first payload is kept"
    );
    // The same key in another queue is another job.
    let other_queue = job("other-queue")
        .enqueue_with(&mut conn, opts().queue("enq_api_other"))
        .await
        .unwrap();
    assert_ne!(other_queue, first);
    // Duplicates inside one batch collapse too.
    let batch = pgfifo::enqueue_batch(
        &mut conn,
        [
            NewJob::new(
                &job("batch-a"),
                EnqueueOptions::group("w").unique_key("k-batch"),
            )
            .unwrap(),
            NewJob::new(
                &job("batch-b"),
                EnqueueOptions::group("w").unique_key("k-batch"),
            )
            .unwrap(),
            NewJob::new(&job("batch-c"), opts()).unwrap(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(batch[0], batch[1], "{batch:?}");
    assert_eq!(batch[2], first);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 3);

    // While the job is running it is still unfinished.
    db.exec(&format!("UPDATE pgfifo.job SET payload = jsonb_set(payload, '{{gate}}', '\"enq_api_unique\"') WHERE id = {first}"))
        .await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    db.wait_attempt_rows(first, 1, Duration::from_secs(10))
        .await;
    let while_running = tokio::time::timeout(
        Duration::from_secs(5),
        job("dup3").enqueue_with(&mut conn, opts()),
    )
    .await
    .expect("enqueue with the key of a running job does not block")
    .unwrap();
    assert_eq!(while_running, first, "same key while running: same id");
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE queue = 'enq_api'")
            .await,
        2
    );

    gate("enq_api_unique").add_permits(1);
    let event = next_event_of(&mut events, first, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);

    // Finished: the key is free again.
    let next = job("next").enqueue_with(&mut conn, opts()).await.unwrap();
    assert_ne!(next, first);
    assert!(next > first);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE queue = 'enq_api'")
            .await,
        3
    );
    let event = next_event_of(&mut events, next, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE unique_key = 'invoice-7' AND queue = 'enq_api' AND state = 'succeeded'")
            .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_in_delays_the_start_and_holds_the_group() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let delayed = job("delayed")
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group("d").run_in(Duration::from_millis(1500)),
        )
        .await
        .unwrap();
    let follower = job("follower").enqueue(&mut conn, "d").await.unwrap();
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let probe = job("probe").enqueue(&mut conn, "p").await.unwrap();
    let event = next_event_of(&mut events, probe, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);

    // The runner is working, the delay has not passed: neither job of group d started.
    assert_eq!(
        db.attempt_rows(delayed).await,
        0,
        "the delayed job did not start early"
    );
    assert_eq!(
        db.attempt_rows(follower).await,
        0,
        "the follower waits behind the delayed head"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT (clock_timestamp() < run_after)::int FROM pgfifo.job WHERE id = {delayed}"
        ))
        .await,
        1,
        "the checks above ran before the delay passed (machine too slow?)"
    );

    let event = next_event_of(&mut events, delayed, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    let event = next_event_of(&mut events, follower, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.scalar(&format!(
            "SELECT (extract(epoch FROM run_after - created_at) * 1000)::bigint FROM pgfifo.job WHERE id = {delayed}"
        ))
        .await,
        1500,
        "run_after is the delay after the enqueue"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt a JOIN pgfifo.job j ON j.id = a.job_id
             WHERE j.id = {delayed} AND a.started_at >= j.run_after"
        ))
        .await,
        1,
        "the delayed job started after its run_after"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt a, pgfifo.job d
             WHERE a.job_id = {follower} AND d.id = {delayed} AND a.started_at >= d.finished_at"
        ))
        .await,
        1,
        "the follower started after the delayed head finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_picks_the_group_not_the_order_inside_it() {
    let db = setup().await;
    let with = |tag: &str, group: &str, priority: i16| {
        NewJob::new(&job(tag), EnqueueOptions::group(group).priority(priority)).unwrap()
    };
    let mut conn = db.conn().await;
    // Enqueue order (= id order): a1 a2 b1 c1.
    let ids = pgfifo::enqueue_batch(
        &mut conn,
        [
            with("a1", "a", 0),
            with("a2", "a", 100),
            with("b1", "b", 5),
            with("c1", "c", 1),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        db.scalar(&format!(
            "SELECT priority FROM pgfifo.job WHERE id = {}",
            ids[1]
        ))
        .await,
        100
    );
    drop(conn);
    // Make the groups active before the runner starts, as one promotion:
    // otherwise a lane may find a group activated before the others (the
    // runner's listener and its lanes promote concurrently) and run it first.
    db.scalar("SELECT promoted FROM pgfifo.promote(ARRAY(SELECT DISTINCT queue FROM pgfifo.group_wake), 100)")
        .await;

    // One lane: with a prefetch lane too, two lanes pick b and c at once and
    // whichever gets the one slot first runs first, whatever the priorities.
    let runner = db
        .start_runner(test_config().concurrency(1).prefetch(0))
        .await;
    db.wait_for(
        "SELECT count(*) FROM enq_api_log",
        4,
        Duration::from_secs(20),
    )
    .await;
    runner.shutdown().await.unwrap();

    let order = db
        .text("SELECT string_agg(tag, ',' ORDER BY n) FROM enq_api_log")
        .await;
    // b (5) then c (1) then a (0); a2's priority 100 does not let it pass a1.
    assert_eq!(order.as_deref(), Some("b1,c1,a1,a2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_option_overrides_the_type_default() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let default = failing("default").enqueue(&mut conn, "m1").await.unwrap();
    let overridden = failing("overridden")
        .enqueue_with(&mut conn, EnqueueOptions::group("m2").max_attempts(2))
        .await
        .unwrap();
    let batch = pgfifo::enqueue_batch(
        &mut conn,
        [NewJob::new(&job("batch"), EnqueueOptions::group("m3").max_attempts(9)).unwrap()],
    )
    .await
    .unwrap();
    drop(conn);
    let max_of = |id: JobId| format!("SELECT max_attempts FROM pgfifo.job WHERE id = {id}");
    assert_eq!(
        db.scalar(&max_of(default)).await,
        i64::from(EnqApiJob::MAX_ATTEMPTS)
    );
    assert_eq!(db.scalar(&max_of(default)).await, 4);
    assert_eq!(db.scalar(&max_of(overridden)).await, 2);
    assert_eq!(db.scalar(&max_of(batch[0])).await, 9);

    // The stored value is the one the runner obeys.
    let runner = db.start_runner(test_config().concurrency(3)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        3,
        Duration::from_secs(20),
    )
    .await;
    runner.shutdown().await.unwrap();
    let state_of = |id: JobId| format!("SELECT state FROM pgfifo.job WHERE id = {id}");
    assert_eq!(
        db.text(&state_of(overridden)).await.as_deref(),
        Some("failed")
    );
    assert_eq!(db.attempt_rows(overridden).await, 2);
    assert_eq!(db.text(&state_of(default)).await.as_deref(), Some("failed"));
    assert_eq!(db.attempt_rows(default).await, 4);
    assert_eq!(
        db.text(&state_of(batch[0])).await.as_deref(),
        Some("succeeded")
    );
}

//! De-duplication windows under concurrency: several producers of one key
//! at once, producers inside application transactions that commit or roll
//! back, debounce of a job a runner holds, and a debounced group head
//! (FIFO, and no start before its new time). Job type and helpers:
//! `dedup_windows`.

use std::sync::Arc;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, EnqueueOutcome, Enqueued};
use pgfifo_tests::{eventually, test_config, TestDb};
use tokio::sync::Barrier;

use crate::dedup_windows::{new_gated, new_job, one, setup};
use crate::enqueue_api::gate;

const HOUR: Duration = Duration::from_secs(3600);
const PRODUCERS: usize = 8;

/// What a producer adds to a job's options.
type Options = fn(EnqueueOptions) -> EnqueueOptions;

/// `PRODUCERS` connections enqueue a job with `options` at once, each in a
/// transaction of its own that commits; returns their outcomes.
async fn race(db: &TestDb, options: fn(EnqueueOptions) -> EnqueueOptions) -> Vec<Enqueued> {
    let barrier = Arc::new(Barrier::new(PRODUCERS));
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let mut conn = db.direct().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            conn.batch_execute("BEGIN").await.unwrap();
            barrier.wait().await;
            let out = one(
                &mut conn,
                new_job(&format!("p{p}"), &format!("g{p}"), options),
            )
            .await;
            conn.batch_execute("COMMIT").await.unwrap();
            out
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

fn count(out: &[Enqueued], outcome: EnqueueOutcome) -> usize {
    out.iter().filter(|o| o.outcome == outcome).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_of_one_key_make_exactly_one_job() {
    let db = setup().await;
    let cases: [(&str, Options, EnqueueOutcome); 3] = [
        (
            "unique",
            |o| o.unique_for("k-unique", HOUR),
            EnqueueOutcome::Deduplicated,
        ),
        (
            "throttle",
            |o| o.throttle("k-throttle", HOUR),
            EnqueueOutcome::Throttled,
        ),
        (
            "debounce",
            |o| o.debounce("k-debounce", HOUR),
            EnqueueOutcome::Debounced,
        ),
    ];
    for (mode, options, folded) in cases {
        let out = race(&db, options).await;
        assert_eq!(count(&out, EnqueueOutcome::Created), 1, "{mode}: {out:?}");
        assert_eq!(count(&out, folded), PRODUCERS - 1, "{mode}: {out:?}");
        assert!(
            out.iter().all(|o| o.id == out[0].id),
            "{mode}: one id for all: {out:?}"
        );
        assert_eq!(
            db.scalar(&format!(
                "SELECT count(*) FROM pgfifo.job AS j JOIN pgfifo.job_window AS w ON w.job_id = j.id \
                 WHERE w.mode = '{mode}'"
            ))
            .await,
            1,
            "{mode}"
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 3);
}

/// A producer whose transaction stays open after enqueueing with `key`.
async fn open_producer(db: &TestDb, key: &'static str) -> (AsyncPgConnection, Enqueued) {
    let mut conn = db.direct().await;
    conn.batch_execute("BEGIN").await.unwrap();
    let out = one(&mut conn, new_job("open", "a", |o| o.unique_for(key, HOUR))).await;
    assert_eq!(out.outcome, EnqueueOutcome::Created);
    (conn, out)
}

/// A second producer of `key`, started now; it waits for the first.
async fn second_producer(db: &TestDb, key: &'static str) -> tokio::task::JoinHandle<Enqueued> {
    let mut conn = db.direct().await;
    tokio::spawn(async move {
        one(
            &mut conn,
            new_job("second", "b", |o| o.unique_for(key, HOUR)),
        )
        .await
    })
}

/// Waits until some session waits for an advisory lock (the key's).
async fn someone_waits_for_a_key(db: &TestDb) {
    db.wait_for(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid::bigint = 1885824615 AND objsubid = 2",
        1,
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_producer_waits_for_the_first_and_sees_its_outcome() {
    let db = setup().await;
    // Rolled back: the second producer creates the job.
    let (mut first, rolled) = open_producer(&db, "rb").await;
    let second = second_producer(&db, "rb").await;
    someone_waits_for_a_key(&db).await;
    assert!(
        !second.is_finished(),
        "the second producer waits for the first's end"
    );
    first.batch_execute("ROLLBACK").await.unwrap();
    let out = second.await.unwrap();
    assert_eq!(out.outcome, EnqueueOutcome::Created);
    assert_ne!(out.id, rolled.id);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_window WHERE key = 'rb' AND job_id = {}",
            out.id
        ))
        .await,
        1
    );

    // Committed: the second producer gets the first's job.
    let (mut first, committed) = open_producer(&db, "cm").await;
    let second = second_producer(&db, "cm").await;
    someone_waits_for_a_key(&db).await;
    first.batch_execute("COMMIT").await.unwrap();
    let out = second.await.unwrap();
    assert_eq!(out.id, committed.id);
    assert_eq!(out.outcome, EnqueueOutcome::Deduplicated);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debounce_of_a_started_job_creates_a_new_one_without_waiting() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let gate_name = "dedup_started";
    let first = one(
        &mut conn,
        new_gated("first", Some(gate_name), "g", |o| {
            o.debounce("s", Duration::from_micros(1))
        }),
    )
    .await;
    let runner = db.start_runner(test_config()).await;
    // Started: its attempt is recorded, and it waits for its gate.
    db.wait_attempt_rows(first.id, 1, Duration::from_secs(20))
        .await;
    // The runner holds the job's row for its run: this must not wait for it.
    let next = tokio::time::timeout(
        Duration::from_secs(30),
        one(
            &mut conn,
            new_job("next", "g", |o| o.debounce("s", Duration::from_micros(1))),
        ),
    )
    .await
    .expect("a debounce of a running job does not wait for it");
    assert_eq!(next.outcome, EnqueueOutcome::Created);
    assert!(next.id > first.id);
    gate(gate_name).add_permits(1);
    db.wait_job_succeeded(next.id, Duration::from_secs(20))
        .await;
    assert_eq!(
        db.text("SELECT string_agg(tag, ',' ORDER BY n) FROM dedup_log")
            .await
            .as_deref(),
        Some("first,next"),
        "FIFO in the group"
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_debounced_head_holds_its_group_until_its_new_time() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let runner = db.start_runner(test_config()).await;
    // Long enough that the group is not ready before the second debounce,
    // even on a loaded machine: a runner looking at a ready group holds its
    // row for a moment, and a debounce then keeps the start (see the next
    // test).
    let quiet = Duration::from_secs(3);
    let head = one(&mut conn, new_job("v1", "g", |o| o.debounce("h", quiet))).await;
    let behind = one(&mut conn, new_job("behind", "g", |o| o)).await;
    // The head's group becomes active with the head's first start time.
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE group_id = 'g' AND head_id = {}",
            head.id
        ),
        1,
        Duration::from_secs(20),
    )
    .await;
    let old_start = db
        .text(&format!(
            "SELECT run_after::text FROM pgfifo.job WHERE id = {}",
            head.id
        ))
        .await
        .unwrap();
    let moved = one(&mut conn, new_job("v2", "g", |o| o.debounce("h", HOUR))).await;
    assert_eq!(moved.id, head.id);
    assert_eq!(moved.outcome, EnqueueOutcome::Debounced);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group AS g JOIN pgfifo.job AS j ON j.id = g.head_id \
             WHERE g.group_id = 'g' AND g.ready_at = j.run_after AND j.id = {} \
             AND j.run_after > now() + interval '50 minutes'",
            head.id
        ))
        .await,
        1,
        "the group's ready_at moved with its head"
    );
    // A job of another group due after the head's old time: once it has run,
    // the runner has looked at the queue after that time.
    let probe = one(
        &mut conn,
        new_job("probe", "other", |o| o.run_in(2 * quiet)),
    )
    .await;
    db.wait_job_succeeded(probe.id, Duration::from_secs(20))
        .await;
    assert!(
        db.scalar(&format!("SELECT (now() > '{old_start}'::timestamptz)::int"))
            .await
            == 1,
        "the old start has passed"
    );
    for id in [head.id, behind.id] {
        assert_eq!(
            db.job_state(id).await,
            "queued 0",
            "job {id} waits for the head's new time"
        );
    }
    // Debounced to a start that is near: both run, head first, latest payload.
    let last = one(
        &mut conn,
        new_job("v3", "g", |o| o.debounce("h", Duration::from_micros(1))),
    )
    .await;
    assert_eq!(last.id, head.id);
    db.wait_job_succeeded(behind.id, Duration::from_secs(20))
        .await;
    let log = eventually("both jobs logged", Duration::from_secs(20), || async {
        let log = db
            .text("SELECT string_agg(tag, ',' ORDER BY n) FROM dedup_log WHERE tag <> 'probe'")
            .await;
        match log.as_deref() {
            Some(l) if l.split(',').count() == 2 => Ok(l.to_owned()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(log, "v3,behind");
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_a_runner_holds_the_group_debounce_replaces_the_payload_and_keeps_the_start() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let gate_name = "dedup_held_group";
    let running = one(&mut conn, new_gated("running", Some(gate_name), "g", |o| o)).await;
    let runner = db.start_runner(test_config()).await;
    db.wait_attempt_rows(running.id, 1, Duration::from_secs(20))
        .await;
    // Enqueued behind the running job; the runner holds the group's row.
    let waiting = one(&mut conn, new_job("v1", "g", |o| o.debounce("busy", HOUR))).await;
    let start = format!(
        "SELECT run_after::text FROM pgfifo.job WHERE id = {}",
        waiting.id
    );
    let before = db.text(&start).await;
    let again = one(
        &mut conn,
        new_job("v2", "g", |o| o.debounce("busy", 2 * HOUR)),
    )
    .await;
    assert_eq!(again.id, waiting.id);
    assert_eq!(again.outcome, EnqueueOutcome::Debounced);
    assert_eq!(db.text(&start).await, before, "the start stays");
    assert_eq!(
        db.text(&format!(
            "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {}",
            waiting.id
        ))
        .await
        .as_deref(),
        Some("v2"),
        "the payload is replaced"
    );
    gate(gate_name).add_permits(1);
    db.wait_job_succeeded(running.id, Duration::from_secs(20))
        .await;
    assert_eq!(db.job_state(waiting.id).await, "queued 0");
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_a_retry_has_started_and_another_kind_is_refused() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let first = one(&mut conn, new_job("v1", "g", |o| o.debounce("r", HOUR))).await;
    // Another job type under the same key: its payload is not this job's.
    let other = pgfifo::NewJob::new(
        &crate::enqueue_api::job("other"),
        EnqueueOptions::group("g")
            .queue("dedup")
            .debounce("r", HOUR),
    )
    .unwrap();
    let err = pgfifo::enqueue_batch_outcomes(&mut conn, [other])
        .await
        .expect_err("another kind");
    assert!(err.to_string().contains("of kind"), "{err}");
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
    // As if it had failed once and waited for its retry.
    db.exec(&format!(
        "UPDATE pgfifo.job SET attempts = 1 WHERE id = {}",
        first.id
    ))
    .await;
    let next = one(&mut conn, new_job("v2", "g", |o| o.debounce("r", HOUR))).await;
    assert_eq!(next.outcome, EnqueueOutcome::Created);
    assert!(next.id > first.id);
    assert_eq!(
        db.text(&format!(
            "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {}",
            first.id
        ))
        .await
        .as_deref(),
        Some("v1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock() {
    let db = setup().await;
    let keys = ["k-a", "k-b", "k-c", "k-d"];
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(2));
        let mut tasks = Vec::new();
        for reversed in [false, true] {
            let mut conn = db.direct().await;
            let barrier = barrier.clone();
            let mut order: Vec<&'static str> = keys.to_vec();
            if reversed {
                order.reverse();
            }
            tasks.push(tokio::spawn(async move {
                conn.batch_execute("BEGIN").await.unwrap();
                barrier.wait().await;
                let jobs = order.iter().map(|k| {
                    let key = format!("{k}-{round}");
                    new_job(k, "g", move |o| o.unique_for(key, HOUR))
                });
                let out = pgfifo::enqueue_batch_outcomes(&mut conn, jobs).await;
                conn.batch_execute("COMMIT").await.unwrap();
                out
            }));
        }
        let mut created = 0;
        for task in tasks {
            let out = task.await.unwrap().expect("no deadlock");
            created += count(&out, EnqueueOutcome::Created);
        }
        assert_eq!(created, keys.len(), "round {round}: one job per key");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 20);
}

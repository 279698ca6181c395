//! Semantic 8: a handler past its timeout is cancelled and counted as a
//! failed attempt (also when it is stuck in SQL); shutdown stops picking,
//! lets running jobs finish up to a deadline, then aborts them without using
//! up an attempt, and they run again later. Nothing is lost either way.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::gate;
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(20);

const TS_LOG: &str = "CREATE TABLE ts_log (
    seq bigint NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())";

async fn log_run(ctx: &mut JobContext<'_>, seq: i64) -> Result<(), JobError> {
    let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
    diesel::sql_query("INSERT INTO ts_log (seq, job_id, attempt) VALUES ($1, $2, $3)")
        .bind::<BigInt, _>(seq)
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt)
        .execute(ctx.conn())
        .await?;
    Ok(())
}

/// Sleeps 10 s on its first attempt (far past its 300 ms timeout).
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(
    queue = "timeouts",
    timeout = "300ms",
    max_attempts = 2,
    backoff = "10ms"
)]
struct TimeoutSleepJob {
    seq: i64,
}

#[async_trait]
impl Handler for TimeoutSleepJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(ctx, self.seq).await?;
        if ctx.attempt() == 1 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Ok(())
    }
}

/// Stuck in `pg_sleep(30)` on its first attempt when `stuck`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(
    queue = "timeouts",
    timeout = "300ms",
    max_attempts = 2,
    backoff = "10ms"
)]
struct TimeoutSqlJob {
    seq: i64,
    stuck: bool,
}

#[async_trait]
impl Handler for TimeoutSqlJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(ctx, self.seq).await?;
        if self.stuck && ctx.attempt() == 1 {
            diesel::sql_query("SELECT pg_sleep(30)")
                .execute(ctx.conn())
                .await?;
        }
        Ok(())
    }
}

/// Signals its start, then takes `ms` (only on its first run in this process
/// when `first_run_only`).
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "shutdown", max_attempts = 3, backoff = "10ms")]
struct ShutdownSlowJob {
    tag: String,
    seq: i64,
    ms: u64,
    first_run_only: bool,
}

#[async_trait]
impl Handler for ShutdownSlowJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let gate = gate(&self.tag);
        let run = gate.runs.fetch_add(1, Ordering::SeqCst);
        gate.started.add_permits(1);
        log_run(ctx, self.seq).await?;
        if run == 0 || !self.first_run_only {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
        Ok(())
    }
}

fn slow(tag: &str, seq: i64, ms: u64, first_run_only: bool) -> ShutdownSlowJob {
    ShutdownSlowJob {
        tag: tag.into(),
        seq,
        ms,
        first_run_only,
    }
}

/// Every event received so far.
fn drain(rx: &mut broadcast::Receiver<JobEvent>) -> Vec<JobEvent> {
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_cancels_handler_counts_attempt_and_retries() {
    let db = TestDb::new().await;
    db.exec(TS_LOG).await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let id = db.enqueue(TimeoutSleepJob { seq: 0 }, "t").await;

    let started = Instant::now();
    db.wait_job_succeeded(id, LIMIT).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the 10 s sleep was not cut short"
    );
    runner.shutdown().await.unwrap();

    let retry = drain(&mut events)
        .into_iter()
        .find(|e| e.id == id && e.attempt == 1)
        .expect("an event for attempt 1");
    match &retry.outcome {
        JobOutcome::Retrying { error, .. } => assert!(error.contains("timed out"), "{error}"),
        other => panic!("attempt 1 should be retried after its timeout: {other:?}"),
    }
    assert_eq!(db.job_state(id).await, "succeeded 2");
    let last_error = db.last_error(id).await.unwrap();
    assert!(last_error.contains("timed out"), "{last_error}");
    let attempt_error = db.attempt_error(id, 1).await.unwrap();
    assert!(attempt_error.contains("timed out"), "{attempt_error}");
    let ran_ms = db
        .scalar(&format!(
            "SELECT (extract(epoch FROM finished_at - started_at) * 1000)::bigint \
             FROM pgfifo.job_attempt WHERE job_id = {id} AND attempt = 1"
        ))
        .await;
    assert!(
        (250..3000).contains(&ran_ms),
        "attempt 1 ran {ran_ms} ms with a 300 ms timeout"
    );
    // The timed-out attempt's write was rolled back.
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt::text, ',') FROM ts_log WHERE job_id = {id}"
        ))
        .await
        .as_deref(),
        Some("2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_cancels_handler_stuck_in_sql_and_group_proceeds() {
    let db = TestDb::new().await;
    db.exec(TS_LOG).await;
    let stuck = db
        .enqueue(
            TimeoutSqlJob {
                seq: 0,
                stuck: true,
            },
            "sql",
        )
        .await;
    let next = db
        .enqueue(
            TimeoutSqlJob {
                seq: 1,
                stuck: false,
            },
            "sql",
        )
        .await;

    let started = Instant::now();
    let runner = db.start_runner(test_config().concurrency(2)).await;
    db.wait_job_succeeded(next, LIMIT).await;
    let took = started.elapsed();
    runner.shutdown().await.unwrap();
    assert!(
        took < Duration::from_secs(8),
        "the group was held {took:?} by a statement past its timeout"
    );

    assert_eq!(db.job_state(stuck).await, "succeeded 2");
    let attempt_error = db.attempt_error(stuck, 1).await.unwrap();
    assert!(attempt_error.contains("timed out"), "{attempt_error}");
    // The stuck statement was cancelled at the timeout: the failed attempt
    // was written within the timeout (300 ms) and the documented grace
    // (cancel and rollback; 1 s here, for a loaded machine), not after the
    // seconds a statement waiting for its own end would take.
    let held_ms = db
        .scalar(&format!(
            "SELECT (extract(epoch FROM finished_at - started_at) * 1000)::bigint \
             FROM pgfifo.job_attempt WHERE job_id = {stuck} AND attempt = 1"
        ))
        .await;
    println!("the stuck first attempt held its group {held_ms} ms");
    assert!(
        (300..1_300).contains(&held_ms),
        "the first attempt held the group {held_ms} ms"
    );
    // The group went on only after its head was done.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt a, pgfifo.job h \
             WHERE a.job_id = {next} AND h.id = {stuck} AND a.started_at < h.finished_at"
        ))
        .await,
        0
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%pg_sleep(30)%'"
        )
        .await,
        0,
        "the stuck statement is still running on the server"
    );
    assert_eq!(
        db.text("SELECT string_agg(seq || ':' || attempt, ',' ORDER BY at) FROM ts_log")
            .await
            .as_deref(),
        Some("0:2,1:1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_running_job_finish_and_starts_nothing_new() {
    let db = TestDb::new().await;
    db.exec(TS_LOG).await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let tag = db.name.clone();
    let gate = gate(&tag);
    let running = db.enqueue(slow(&tag, 0, 500, false), "g").await;
    let waiting_b = db.enqueue(slow(&tag, 1, 0, false), "g").await;
    let waiting_c = db.enqueue(slow(&tag, 2, 0, false), "g").await;

    gate.wait_started(1).await;
    let stopping = Instant::now();
    runner
        .shutdown_within(Duration::from_secs(15))
        .await
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(10));

    // The running job finished normally…
    assert_eq!(db.job_state(running).await, "succeeded 1");
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM ts_log WHERE job_id = {running}"
        ))
        .await,
        1
    );
    let events = drain(&mut events);
    assert!(
        events
            .iter()
            .any(|e| e.id == running && e.outcome == JobOutcome::Succeeded),
        "{events:?}"
    );
    // …and nothing started after the call, though the group was free then.
    assert_eq!(gate.runs(), 1, "a job started after shutdown was called");
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id IN ({waiting_b}, {waiting_c}) AND state = 'queued' AND attempts = 0"
        ))
        .await,
        2
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({waiting_b}, {waiting_c})"
        ))
        .await,
        0
    );

    // Nothing lost: a new runner runs the rest.
    let runner = db.start_runner(test_config().concurrency(2)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND attempts = 1",
        3,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.text("SELECT string_agg(seq::text, ',' ORDER BY at) FROM ts_log")
            .await
            .as_deref(),
        Some("0,1,2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deadline_aborts_long_job_without_counting_the_attempt() {
    let db = TestDb::new().await;
    db.exec(TS_LOG).await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let tag = db.name.clone();
    let gate = gate(&tag);
    // Takes 10 s on its first run, no time on the next.
    let long = db.enqueue(slow(&tag, 0, 10_000, true), "g").await;
    let behind = db.enqueue(slow(&tag, 1, 0, false), "g").await;

    gate.wait_started(1).await;
    assert_eq!(db.attempt_rows(long).await, 1);
    let stopping = Instant::now();
    runner
        .shutdown_within(Duration::from_millis(300))
        .await
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "shutdown with a 300 ms deadline took {took:?}"
    );

    let events = drain(&mut events);
    assert!(
        events
            .iter()
            .any(|e| e.id == long && matches!(e.outcome, JobOutcome::Aborted { .. })),
        "{events:?}"
    );
    // Rolled back and kept queued; the aborted attempt does not count.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {long} AND state = 'queued' AND attempts = 0 \
             AND last_error IS NULL AND finished_at IS NULL"
        ))
        .await,
        1
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({long}, {behind})"
        ))
        .await,
        0,
        "the aborted attempt was not forgotten"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM ts_log").await,
        0,
        "the aborted run's write was rolled back"
    );
    // Its locks are gone with the runner.
    let mut direct = db.direct().await;
    direct
        .batch_execute("SELECT 1 FROM pgfifo.queue_group WHERE group_id = 'g' FOR UPDATE NOWAIT")
        .await
        .unwrap();
    drop(direct);

    // A new runner runs it, as attempt 1, then the job behind it.
    let runner = db.start_runner(test_config().concurrency(2)).await;
    db.wait_succeeded(2, LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_eq!(db.job_state(long).await, "succeeded 1");
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt::text, ',') FROM pgfifo.job_attempt WHERE job_id = {long}"
        ))
        .await
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        db.text("SELECT string_agg(seq::text, ',' ORDER BY at) FROM ts_log")
            .await
            .as_deref(),
        Some("0,1")
    );
    // The aborted run, the re-run, the job behind.
    assert_eq!(gate.runs(), 3);
}

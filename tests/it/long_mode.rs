//! Long mode (`#[job(long)]`): a job holds its group without an open
//! transaction. The group stays exclusive and in order; the runner's
//! connections hold no transaction id or snapshot while the handler runs; a
//! holder whose session dies has its job run again at once, and one that
//! stops renewing its lease is ended; the outcome is written once, fenced
//! by the claim; the handler's writes commit as they go.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel_async::RunQueryDsl;
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{admin, async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::gate::gate;

const LIMIT: Duration = Duration::from_secs(20);
const QUEUE: &str = "long_mode";

/// Writes a row through its connection (autocommit in long mode), notes its
/// backend, then holds at its test's gate when `hold`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "long_mode", long, max_attempts = 5, backoff = "10ms")]
struct LongModeJob {
    tag: String,
    hold: bool,
}

#[derive(diesel::QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[async_trait]
impl Handler for LongModeJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
        diesel::sql_query("INSERT INTO long_rows (job_id, attempt) VALUES ($1, $2)")
            .bind::<BigInt, _>(id)
            .bind::<Integer, _>(attempt)
            .execute(ctx.conn())
            .await?;
        let me: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(ctx.conn())
            .await?;
        let gate = gate(&self.tag);
        gate.pids.lock().unwrap().push(me.pid);
        if self.hold {
            gate.hold().await?;
        }
        Ok(())
    }
}

/// A job of the default mode in the same queue.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "long_mode")]
struct LongModeShort;

#[async_trait]
impl Handler for LongModeShort {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

async fn setup() -> TestDb {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE long_rows (job_id bigint NOT NULL, attempt int NOT NULL)")
        .await;
    db
}

fn long(tag: &str, hold: bool) -> LongModeJob {
    LongModeJob {
        tag: tag.to_owned(),
        hold,
    }
}

/// Sessions of this database other than the test's own that hold a
/// transaction id or a snapshot.
const PINNING: &str = "SELECT count(*) FROM pg_stat_activity \
    WHERE datname = current_database() AND pid <> pg_backend_pid() \
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)";

/// Succeeded events of job `id` received so far.
fn successes(events: &mut broadcast::Receiver<JobEvent>, id: i64, seen: &mut u32) {
    while let Ok(event) = events.try_recv() {
        if event.id == id && event.outcome == JobOutcome::Succeeded {
            *seen += 1;
        }
    }
}

#[tokio::test]
async fn a_long_job_holds_its_group_without_a_transaction() {
    let db = setup().await;
    let tag = "long_holds";
    let runner = db
        .start_runner(test_config().queues([QUEUE]).concurrency(4))
        .await;
    let held = db.enqueue(long(tag, true), "g").await;
    let after = db.enqueue(LongModeShort, "g").await;
    gate(tag).wait_started(1).await;

    // Other groups run; the held group's next job waits.
    let other = db.enqueue(LongModeShort, "other").await;
    db.wait_job_succeeded(other, LIMIT).await;
    assert_eq!(db.job_state(after).await, "queued 0");
    // Nothing pins the vacuum horizon: the claim committed, and the
    // handler's write committed on its own.
    db.wait_for(PINNING, 0, LIMIT).await;
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM long_rows WHERE job_id = {held}"
        ))
        .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_run").await,
        1,
        "the run is recorded"
    );
    // An operator cannot cancel or skip the running head.
    {
        let mut conn = db.conn().await;
        let cancelled = admin::cancel_job(&mut conn, held, None).await;
        assert!(cancelled.is_err(), "{cancelled:?}");
        let skipped = admin::skip_head(&mut conn, QUEUE, "g", None).await;
        assert!(skipped.is_err(), "{skipped:?}");
    }

    gate(tag).release.add_permits(1);
    db.wait_job_succeeded(held, LIMIT).await;
    db.wait_job_succeeded(after, LIMIT).await;
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_run").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group WHERE ready_at = '-infinity'")
            .await,
        0
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_long_job_whose_session_dies_runs_again_at_once_and_completes_once() {
    let db = setup().await;
    let tag = "long_session_dies";
    let runner = db
        .start_runner(test_config().queues([QUEUE]).concurrency(4))
        .await;
    let mut events = runner.subscribe();
    let id = db.enqueue(long(tag, true), "g").await;
    let next = db.enqueue(LongModeShort, "g").await;
    gate(tag).wait_started(1).await;
    let first = gate(tag).pids.lock().unwrap()[0];
    db.exec(&format!("SELECT pg_terminate_backend({first})"))
        .await;
    // Run again at once, on another connection, while the first run's
    // handler still waits at the gate.
    gate(tag).wait_started(1).await;
    assert_ne!(gate(tag).pids.lock().unwrap()[1], first);
    assert_eq!(db.job_state(next).await, "queued 0", "order kept");
    // Both runs finish: only the second one's outcome is written.
    gate(tag).release.add_permits(2);
    db.wait_job_succeeded(id, LIMIT).await;
    db.wait_job_succeeded(next, LIMIT).await;
    assert_eq!(db.attempt_rows(id).await, 2);
    assert_eq!(db.job_state(id).await, "succeeded 2");
    let mut seen = 0;
    eventually("the second run's success event", LIMIT, || {
        successes(&mut events, id, &mut seen);
        let seen = seen;
        async move {
            if seen >= 1 {
                Ok(())
            } else {
                Err(format!("{seen}"))
            }
        }
    })
    .await;
    runner.shutdown().await.unwrap();
    successes(&mut events, id, &mut seen);
    assert_eq!(seen, 1, "completed exactly once");
}

#[tokio::test]
async fn a_long_job_that_stops_renewing_its_lease_is_ended_and_run_again() {
    let db = setup().await;
    let tag = "long_lease";
    let runner = db
        .start_runner(test_config().queues([QUEUE]).concurrency(4))
        .await;
    let id = db.enqueue(long(tag, true), "g").await;
    gate(tag).wait_started(1).await;
    let first = gate(tag).pids.lock().unwrap()[0];
    // As if its process had frozen: the lease passes unrenewed (the
    // default lease is renewed every 10 s).
    db.exec("UPDATE pgfifo.job_run SET lease_until = now() - interval '1 second'")
        .await;
    gate(tag).wait_started(1).await;
    db.wait_for(
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"),
        0,
        LIMIT,
    )
    .await;
    gate(tag).release.add_permits(2);
    db.wait_job_succeeded(id, LIMIT).await;
    assert_eq!(db.attempt_rows(id).await, 2);
    runner.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_long_job_aborted_by_shutdown_runs_again_without_losing_an_attempt() {
    let db = setup().await;
    let tag = "long_shutdown";
    let runner = db.start_runner(test_config().queues([QUEUE])).await;
    let id = db.enqueue(long(tag, true), "g").await;
    gate(tag).wait_started(1).await;
    runner
        .shutdown_within(Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(db.job_state(id).await, "queued 0");
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_run").await, 0);
    let runner = db.start_runner(test_config().queues([QUEUE])).await;
    gate(tag).wait_started(1).await;
    gate(tag).release.add_permits(2);
    db.wait_job_succeeded(id, LIMIT).await;
    assert_eq!(
        db.job_state(id).await,
        "succeeded 1",
        "the aborted attempt is forgotten"
    );
    runner.shutdown().await.unwrap();
}

//! Semantics 4 and 5: a job's group and job rows are locked in its
//! transaction for the handler's whole run; a crash or a lost connection
//! aborts the transaction, releases the locks and the job runs again; attempts
//! count even when a run never gets to write its outcome.
//!
//! A "crash" here is the job's own backend being terminated
//! (`pg_terminate_backend`), by the handler itself or by the test: for the
//! database that is exactly a worker process dying mid-job.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::gate;

const LIMIT: Duration = Duration::from_secs(20);

const CRASH_LOG: &str = "CREATE TABLE crash_log (
    seq bigint NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())";

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

async fn log_run(ctx: &mut JobContext<'_>, seq: i64) -> Result<(), JobError> {
    let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
    diesel::sql_query("INSERT INTO crash_log (seq, job_id, attempt) VALUES ($1, $2, $3)")
        .bind::<BigInt, _>(seq)
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt)
        .execute(ctx.conn())
        .await?;
    Ok(())
}

/// Terminates its own backend on attempts `1..=kill_attempts`, else logs and
/// succeeds.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "crashes", max_attempts = 3, backoff = "10ms")]
struct CrashSelfKillJob {
    seq: i64,
    kill_attempts: u32,
}

#[async_trait]
impl Handler for CrashSelfKillJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if ctx.attempt() <= self.kill_attempts {
            // Half-way through the job's work, the worker "dies".
            log_run(ctx, self.seq).await?;
            diesel::sql_query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(ctx.conn())
                .await?;
            return Err(JobError::permanent(
                "the backend survived pg_terminate_backend",
            ));
        }
        log_run(ctx, self.seq).await
    }
}

/// Reports its backend pid at the gate and waits there until released.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "crashes", max_attempts = 3, backoff = "10ms")]
struct CrashHoldJob {
    tag: String,
    seq: i64,
}

#[async_trait]
impl Handler for CrashHoldJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let gate = gate(&self.tag);
        let pid: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(ctx.conn())
            .await?;
        gate.pids.lock().unwrap().push(pid.pid);
        gate.hold().await?;
        log_run(ctx, self.seq).await
    }
}

/// Attempts of other jobs of `id`'s group that started before `id` finished.
async fn group_starts_before_finish(db: &TestDb, id: i64) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.job h JOIN pgfifo.job o \
           ON o.queue = h.queue AND o.group_id = h.group_id AND o.id <> h.id \
         JOIN pgfifo.job_attempt a ON a.job_id = o.id \
         WHERE h.id = {id} AND a.started_at < h.finished_at"
    ))
    .await
}

/// Tries to lock rows on a connection of its own, without waiting: `Err`
/// with the server's message when another transaction holds them.
async fn try_lock_now(db: &TestDb, sql: &str) -> Result<(), String> {
    let mut conn = db.direct().await;
    conn.batch_execute(sql).await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_releases_locks_and_job_runs_again_without_group_overlap() {
    let db = TestDb::new().await;
    db.exec(CRASH_LOG).await;
    let crasher = db
        .enqueue(
            CrashSelfKillJob {
                seq: 0,
                kill_attempts: 1,
            },
            "crash",
        )
        .await;
    let mut rest = Vec::new();
    for seq in 1..5 {
        rest.push(
            db.enqueue(
                CrashSelfKillJob {
                    seq,
                    kill_attempts: 0,
                },
                "crash",
            )
            .await,
        );
    }

    let runner = db.start_runner(test_config().concurrency(3)).await;
    db.wait_succeeded(5, LIMIT).await;
    // The error of the crashed attempt is noted outside its (lost) transaction.
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {crasher} AND attempt = 1 AND error IS NOT NULL"),
        1,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.job_state(crasher).await,
        "succeeded 2",
        "the crashed job ran again and succeeded on attempt 2"
    );
    assert_eq!(db.attempt_rows(crasher).await, 2);
    // The crashed run's write died with its transaction.
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt::text, ',') FROM crash_log WHERE job_id = {crasher}"
        ))
        .await
        .as_deref(),
        Some("2")
    );
    // Nothing else of the group started before the crashed job was done: not
    // in between its attempts, not concurrently.
    assert_eq!(group_starts_before_finish(&db, crasher).await, 0);
    assert_eq!(
        db.text("SELECT string_agg(seq::text, ',' ORDER BY at) FROM crash_log")
            .await
            .as_deref(),
        Some("0,1,2,3,4")
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND attempts = 1")
            .await,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_count_across_crashes_until_failed() {
    let db = TestDb::new().await;
    db.exec(CRASH_LOG).await;
    // Kills its worker on every run; max_attempts = 3.
    let crasher = db
        .enqueue(
            CrashSelfKillJob {
                seq: 0,
                kill_attempts: u32::MAX,
            },
            "doomed",
        )
        .await;
    let next = db
        .enqueue(
            CrashSelfKillJob {
                seq: 1,
                kill_attempts: 0,
            },
            "doomed",
        )
        .await;

    let runner = db.start_runner(test_config().concurrency(3)).await;
    db.wait_job_succeeded(next, LIMIT).await;
    runner.shutdown().await.unwrap();

    assert_eq!(db.job_state(crasher).await, "failed 3");
    let reason = db.last_error(crasher).await.unwrap();
    assert!(
        reason.contains("attempt") && reason.contains("no attempts left"),
        "the reason should say the attempts are used up: {reason}"
    );
    assert_eq!(
        db.attempt_rows(crasher).await,
        3,
        "exactly max_attempts attempts started"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT max(attempt) FROM pgfifo.job_attempt WHERE job_id = {crasher}"
        ))
        .await,
        3
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM crash_log WHERE job_id = {crasher}"
        ))
        .await,
        0
    );
    // The group went on after the dead job, and only then.
    assert_eq!(group_starts_before_finish(&db, crasher).await, 0);
    assert_eq!(db.job_state(next).await, "succeeded 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_held_for_the_handlers_lifetime() {
    let db = TestDb::new().await;
    db.exec(CRASH_LOG).await;
    let tag = db.name.clone();
    let gate = gate(&tag);
    let held = db
        .enqueue(
            CrashHoldJob {
                tag: tag.clone(),
                seq: 0,
            },
            "held",
        )
        .await;
    let behind = db
        .enqueue(
            CrashSelfKillJob {
                seq: 1,
                kill_attempts: 0,
            },
            "held",
        )
        .await;
    let elsewhere = db
        .enqueue(
            CrashSelfKillJob {
                seq: 2,
                kill_attempts: 0,
            },
            "free",
        )
        .await;

    let runner = db.start_runner(test_config().concurrency(3)).await;
    gate.wait_started(1).await;
    // Other groups run meanwhile, so the runner is not just slow.
    db.wait_job_succeeded(elsewhere, LIMIT).await;

    let group_lock = "SELECT 1 FROM pgfifo.queue_group WHERE queue = 'crashes' AND group_id = 'held' FOR UPDATE NOWAIT";
    let err = try_lock_now(&db, group_lock)
        .await
        .expect_err("the running job's group row is not locked");
    assert!(err.contains("could not obtain lock"), "{err}");
    let job_lock = format!("SELECT 1 FROM pgfifo.job WHERE id = {held} FOR UPDATE NOWAIT");
    let err = try_lock_now(&db, &job_lock)
        .await
        .expect_err("the running job's row is not locked");
    assert!(err.contains("could not obtain lock"), "{err}");
    // An idle group's row is free.
    try_lock_now(&db, "SELECT 1 FROM pgfifo.queue_group WHERE queue = 'crashes' AND group_id = 'free' FOR UPDATE NOWAIT")
        .await
        .unwrap();
    assert_eq!(
        db.attempt_rows(behind).await,
        0,
        "a job started while its group's head was running"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {held} AND state = 'queued'"
        ))
        .await,
        1
    );

    gate.release.add_permits(1);
    db.wait_succeeded(3, LIMIT).await;
    runner.shutdown().await.unwrap();

    // Completion released both locks.
    try_lock_now(&db, group_lock).await.unwrap();
    try_lock_now(&db, &job_lock).await.unwrap();
    assert_eq!(group_starts_before_finish(&db, held).await, 0);
    assert_eq!(
        db.scalar(&format!(
            "SELECT attempts FROM pgfifo.job WHERE id = {held}"
        ))
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_releases_locks_and_job_runs_again() {
    let db = TestDb::new().await;
    db.exec(CRASH_LOG).await;
    let tag = db.name.clone();
    let gate = gate(&tag);
    let held = db
        .enqueue(
            CrashHoldJob {
                tag: tag.clone(),
                seq: 0,
            },
            "cut",
        )
        .await;
    let behind = db
        .enqueue(
            CrashSelfKillJob {
                seq: 1,
                kill_attempts: 0,
            },
            "cut",
        )
        .await;

    let runner = db.start_runner(test_config().concurrency(3)).await;
    gate.wait_started(1).await;
    let first_pid = gate.pids.lock().unwrap()[0];
    // The job's connection is cut while its handler runs.
    assert_eq!(
        db.scalar(&format!("SELECT pg_terminate_backend({first_pid})::int"))
            .await,
        1
    );
    // Its locks went with it: the job is picked again (attempt 2) at once,
    // while the first run's handler is still waiting at the gate.
    gate.wait_started(1).await;
    let pids = gate.pids.lock().unwrap().clone();
    assert_eq!(pids.len(), 2);
    assert_ne!(pids[0], pids[1]);
    assert_eq!(
        db.attempt_rows(behind).await,
        0,
        "the job behind must wait for the re-run of its head"
    );

    // Both runs go on; the first cannot commit on its dead connection.
    gate.release.add_permits(2);
    db.wait_succeeded(2, LIMIT).await;
    runner.shutdown().await.unwrap();

    assert_eq!(db.job_state(held).await, "succeeded 2");
    assert_eq!(db.attempt_rows(held).await, 2);
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt::text, ',') FROM crash_log WHERE job_id = {held}"
        ))
        .await
        .as_deref(),
        Some("2"),
        "only the surviving run committed"
    );
    assert_eq!(group_starts_before_finish(&db, held).await, 0);
}

/// While a job runs, its transaction must hold the locks of its own group
/// only. Regression: a group whose head was finished out of band (here:
/// cancelled by hand) is repaired by `pgfifo.pick`; an earlier revision then
/// went on to pick another job in the same transaction, keeping the repaired
/// group's row lock and exclusive advisory lock for that other job's whole
/// run, so enqueues into the repaired group waited for an unrelated job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_held_only_for_the_running_jobs_group() {
    let db = TestDb::new().await;
    db.exec(CRASH_LOG).await;
    let tag = db.name.clone();
    let gate = gate(&tag);
    let config = || test_config().queues(["crashes"]).concurrency(1);

    // Group "oob" becomes active with head J; the runner is stopped while J
    // runs, so J stays the head, queued.
    let runner = db.start_runner(config()).await;
    let mut conn = db.conn().await;
    let head = CrashHoldJob {
        tag: tag.clone(),
        seq: 0,
    }
    .enqueue(&mut conn, "oob")
    .await
    .unwrap();
    gate.wait_started(1).await;
    runner.abort().await.unwrap();
    // An operator then finishes J by hand.
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'cancelled', finished_at = now() WHERE id = {head}"
    ))
    .await;
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE group_id = 'oob' AND head_id = {head}"
        ))
        .await,
        1,
        "setup: the group's head is the job finished by hand"
    );
    // Two ungrouped jobs that wait at the gate. Picks alternate between
    // grouped-first and ungrouped-first, so one of the two picks meets the
    // stale group before it returns its ungrouped job.
    for seq in 1..3 {
        CrashHoldJob {
            tag: tag.clone(),
            seq,
        }
        .enqueue_with(&mut conn, pgfifo::EnqueueOptions::ungrouped())
        .await
        .unwrap();
    }
    drop(conn);

    let runner = db.start_runner(config()).await;
    let mut problems = Vec::new();
    for stop in 1..3 {
        gate.wait_started(1).await;
        // Another lane may be inside its own short pick transaction (say,
        // repairing the stale group) at the instant of a probe; only a lock
        // that stays while the job runs is a problem. Probe for a while.
        let mut row = Ok(());
        let mut advisory_free = 0;
        for _ in 0..20 {
            row = try_lock_now(
                &db,
                "SELECT 1 FROM pgfifo.queue_group WHERE queue = 'crashes' AND group_id = 'oob' FOR UPDATE NOWAIT",
            )
            .await;
            advisory_free = db
                .scalar(
                    "SELECT pg_try_advisory_xact_lock_shared(1885824614, pgfifo.group_lock_key('crashes', 'oob'))::int",
                )
                .await;
            if row.is_ok() && advisory_free == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if row.is_err() || advisory_free == 0 {
            // What an application sees: enqueueing into the group waits for
            // the unrelated running job.
            let mut direct = db.direct().await;
            direct
                .batch_execute("SET lock_timeout = '1s'")
                .await
                .unwrap();
            let enqueued = CrashSelfKillJob {
                seq: 9,
                kill_attempts: 0,
            }
            .enqueue(&mut direct, "oob")
            .await;
            problems.push(format!(
                "while ungrouped job #{stop} ran: group row lock: {row:?}; group advisory lock free: {}; \
                 enqueue into the group with lock_timeout 1s: {enqueued:?}",
                advisory_free == 1
            ));
        }
        gate.release.add_permits(1);
    }
    db.wait_succeeded(2, LIMIT).await;
    runner.shutdown().await.unwrap();
    assert!(
        problems.is_empty(),
        "a running job's transaction held the locks of another group:\n{}",
        problems.join("\n")
    );
}

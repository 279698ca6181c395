//! Semantic 6, atomic completion: what a handler writes through the job's
//! connection commits together with the job's success, or not at all; a
//! failing handler's writes are rolled back while its failure and error are
//! still recorded.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::runner::JobOutcome;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::gate;

const LIMIT: Duration = Duration::from_secs(20);

const ATOM_ROWS: &str = "CREATE TABLE atom_rows (
    job_id bigint NOT NULL, attempt int NOT NULL, what text NOT NULL)";

async fn write(
    conn: &mut AsyncPgConnection,
    id: i64,
    attempt: u32,
    what: &str,
) -> diesel::QueryResult<usize> {
    diesel::sql_query("INSERT INTO atom_rows (job_id, attempt, what) VALUES ($1, $2, $3)")
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt as i32)
        .bind::<Text, _>(what)
        .execute(conn)
        .await
}

/// Writes a row through the job's connection, then does what `mode` says.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "atomicity", max_attempts = 2, backoff = "10ms")]
struct AtomWriteJob {
    tag: String,
    mode: String,
}

#[async_trait]
impl Handler for AtomWriteJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (id, attempt) = (ctx.id(), ctx.attempt());
        write(ctx.conn(), id, attempt, &self.mode).await?;
        match self.mode.as_str() {
            "ok" => Ok(()),
            "hold" => gate(&self.tag).hold().await,
            "err_first" if attempt == 1 => Err(JobError::retry("refused on attempt 1")),
            "err_first" => Ok(()),
            "err_permanent" => Err(JobError::permanent("refused for good")),
            "sql_error" => {
                // Aborts the transaction on the server; the `?` makes it a
                // retryable failure.
                diesel::sql_query("SELECT 1 / 0")
                    .execute(ctx.conn())
                    .await?;
                Ok(())
            }
            "panic" => panic!("handler blew up on attempt {attempt}"),
            "nested" => {
                // A committed inner transaction (a savepoint, released).
                ctx.conn()
                    .transaction::<_, diesel::result::Error, _>(async |c| {
                        write(c, id, attempt, "inner-ok").await?;
                        Ok(())
                    })
                    .await?;
                // An inner transaction the handler rolls back on purpose.
                let rolled_back = ctx
                    .conn()
                    .transaction::<(), diesel::result::Error, _>(async |c| {
                        write(c, id, attempt, "inner-rolled-back").await?;
                        Err(diesel::result::Error::RollbackTransaction)
                    })
                    .await;
                assert!(matches!(
                    rolled_back,
                    Err(diesel::result::Error::RollbackTransaction)
                ));
                // An inner transaction whose SQL fails: rolling back to the
                // savepoint must leave the job's transaction usable.
                let failed = ctx
                    .conn()
                    .transaction::<(), diesel::result::Error, _>(async |c| {
                        write(c, id, attempt, "inner-sql-error").await?;
                        diesel::sql_query("SELECT 1 / 0").execute(c).await?;
                        Ok(())
                    })
                    .await;
                assert!(failed.is_err());
                write(ctx.conn(), id, attempt, "outer-after").await?;
                Ok(())
            }
            "result" => {
                ctx.set_result(&serde_json::json!({ "answer": 42, "tag": self.tag }))?;
                Ok(())
            }
            "result_then_fail" => {
                ctx.set_result(&serde_json::json!({ "answer": 0 }))?;
                Err(JobError::permanent("failed after setting a result"))
            }
            other => Err(JobError::permanent(format!("unknown mode {other}"))),
        }
    }
}

fn job(tag: &str, mode: &str) -> AtomWriteJob {
    AtomWriteJob {
        tag: tag.into(),
        mode: mode.into(),
    }
}

async fn rows_of(db: &TestDb, id: i64) -> Option<String> {
    db.text(&format!(
        "SELECT string_agg(attempt || ':' || what, ',' ORDER BY attempt, what) FROM atom_rows WHERE job_id = {id}"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_completion_writes_commit_with_success() {
    let db = TestDb::new().await;
    db.exec(ATOM_ROWS).await;
    let tag = db.name.clone();
    let gate = gate(&tag);
    let held = db.enqueue(job(&tag, "hold"), "a").await;
    let plain = db.enqueue(job(&tag, "ok"), "b").await;

    let runner = db.start_runner(test_config().concurrency(2)).await;
    tokio::time::timeout(LIMIT, gate.started.acquire())
        .await
        .expect("the handler did not start")
        .unwrap()
        .forget();
    // The handler has written its row but not finished: neither the row nor
    // the success is visible to anyone else.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM atom_rows WHERE job_id = {held}"
        ))
        .await,
        0
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {held} AND state = 'queued'"
        ))
        .await,
        1
    );
    gate.release.add_permits(1);

    db.wait_succeeded(2, LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_eq!(rows_of(&db, held).await.as_deref(), Some("1:hold"));
    assert_eq!(rows_of(&db, plain).await.as_deref(), Some("1:ok"));
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND attempts = 1 AND last_error IS NULL")
            .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_completion_handler_error_rolls_back_writes_but_records_failure() {
    let db = TestDb::new().await;
    db.exec(ATOM_ROWS).await;
    let tag = db.name.clone();
    let retried = db.enqueue(job(&tag, "err_first"), "a").await;
    let permanent = db.enqueue(job(&tag, "err_permanent"), "b").await;
    let sql_error = db.enqueue(job(&tag, "sql_error"), "c").await;

    let runner = db.start_runner(test_config().concurrency(3)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        3,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    // Failed on attempt 1 (write rolled back, error kept), succeeded on 2.
    assert_eq!(rows_of(&db, retried).await.as_deref(), Some("2:err_first"));
    assert_eq!(
        db.text(&format!("SELECT state || ' ' || attempts || ' ' || last_error FROM pgfifo.job WHERE id = {retried}"))
            .await
            .as_deref(),
        Some("succeeded 2 refused on attempt 1")
    );
    assert_eq!(
        db.attempt_error(retried, 1).await.as_deref(),
        Some("refused on attempt 1")
    );
    // Failed for good: nothing written, the failure is recorded.
    assert_eq!(rows_of(&db, permanent).await, None);
    assert_eq!(
        db.text(&format!("SELECT state || ' ' || attempts || ' ' || last_error FROM pgfifo.job WHERE id = {permanent}"))
            .await
            .as_deref(),
        Some("failed 1 refused for good")
    );
    // An SQL error aborted the transaction on the server: the writes are
    // gone, and the failure is still recorded, attempt after attempt.
    assert_eq!(rows_of(&db, sql_error).await, None);
    assert_eq!(db.job_state(sql_error).await, "failed 2");
    let error = db.last_error(sql_error).await.unwrap();
    assert!(error.contains("division by zero"), "{error}");
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {sql_error} AND error LIKE '%division by zero%'"
        ))
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_completion_panic_rolls_back_and_runner_keeps_running() {
    let db = TestDb::new().await;
    db.exec(ATOM_ROWS).await;
    let tag = db.name.clone();
    // One worker: the one that caught the panic must run the later jobs.
    let runner = db.start_runner(test_config().concurrency(1)).await;
    let mut events = runner.subscribe();
    let panicky = db.enqueue(job(&tag, "panic"), "p").await;
    let after = db.enqueue(job(&tag, "ok"), "p").await;

    let failed = tokio::time::timeout(LIMIT, async {
        loop {
            let event = events.recv().await.unwrap();
            if event.id == panicky && matches!(event.outcome, JobOutcome::Failed { .. }) {
                return event;
            }
        }
    })
    .await
    .expect("no failure event for the panicking job");
    assert_eq!(failed.attempt, 2);
    // Enqueued after the panics: the runner still picks new work.
    let later = db.enqueue(job(&tag, "ok"), "q").await;
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id IN ({after}, {later}) AND state = 'succeeded'"),
        2,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        rows_of(&db, panicky).await,
        None,
        "a panicking handler's writes must be rolled back"
    );
    assert_eq!(db.job_state(panicky).await, "failed 2");
    let error = db.last_error(panicky).await.unwrap();
    assert!(
        error.contains("panicked") && error.contains("handler blew up on attempt 2"),
        "{error}"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {panicky} AND error LIKE '%panicked%'"
        ))
        .await,
        2
    );
    assert_eq!(rows_of(&db, after).await.as_deref(), Some("1:ok"));
    assert_eq!(rows_of(&db, later).await.as_deref(), Some("1:ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_completion_nested_transactions_are_savepoints() {
    let db = TestDb::new().await;
    db.exec(ATOM_ROWS).await;
    let tag = db.name.clone();
    let nested = db.enqueue(job(&tag, "nested"), "n").await;

    let runner = db.start_runner(test_config().concurrency(1)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        1,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.job_state(nested).await,
        "succeeded 1",
        "last_error: {:?}",
        db.last_error(nested).await
    );
    assert_eq!(
        rows_of(&db, nested).await.as_deref(),
        Some("1:inner-ok,1:nested,1:outer-after"),
        "released savepoints commit with the job, rolled-back ones do not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_completion_set_result_stores_result() {
    let db = TestDb::new().await;
    db.exec(ATOM_ROWS).await;
    let tag = db.name.clone();
    let ok = db.enqueue(job(&tag, "result"), "r1").await;
    let failing = db.enqueue(job(&tag, "result_then_fail"), "r2").await;
    let none = db.enqueue(job(&tag, "ok"), "r3").await;

    let runner = db.start_runner(test_config().concurrency(2)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        3,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.text(&format!("SELECT state FROM pgfifo.job WHERE id = {ok}"))
            .await
            .as_deref(),
        Some("succeeded")
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT (result->>'answer')::int FROM pgfifo.job WHERE id = {ok}"
        ))
        .await,
        42
    );
    assert_eq!(
        db.text(&format!(
            "SELECT result->>'tag' FROM pgfifo.job WHERE id = {ok}"
        ))
        .await,
        Some(tag.clone())
    );
    assert_eq!(
        db.text(&format!(
            "SELECT state || ' ' || last_error FROM pgfifo.job WHERE id = {failing}"
        ))
        .await
        .as_deref(),
        Some("failed failed after setting a result")
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {failing} AND result IS NULL"
        ))
        .await,
        1,
        "a failed run stores no result"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {none} AND result IS NULL"
        ))
        .await,
        1
    );
}

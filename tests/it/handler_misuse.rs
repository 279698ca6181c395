//! Handlers that misuse the job's connection: the runner keeps its promises
//! (the failure is recorded with its real error, no job completes without its
//! locks) and keeps running.

use std::time::Duration;

use diesel_async::SimpleAsyncConnection;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

/// What the handler does wrong.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
enum Misuse {
    /// Runs a failing statement, ignores the error, returns `Ok`.
    SwallowError,
    /// Inserts a row that violates a deferred constraint, returns `Ok`.
    DeferredViolation,
    /// Sends COMMIT on the job's connection (on the first attempt only).
    Commit,
}

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "misuse.job",
    queue = "misuse",
    max_attempts = 2,
    backoff = "10ms"
)]
struct MisuseJob {
    misuse: Misuse,
}

#[async_trait]
impl Handler for MisuseJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        match self.misuse {
            Misuse::SwallowError => {
                let _ = ctx.conn().batch_execute("SELECT 1 / 0").await;
            }
            Misuse::DeferredViolation => {
                ctx.conn()
                    .batch_execute("INSERT INTO misuse_child (parent) VALUES (42)")
                    .await?;
            }
            Misuse::Commit => {
                if ctx.attempt() == 1 {
                    ctx.conn().batch_execute("COMMIT").await?;
                }
            }
        }
        Ok(())
    }
}

async fn run_one(db: &TestDb, misuse: Misuse) -> i64 {
    db.enqueue(MisuseJob { misuse }, "g").await
}

/// A handler that ignores a database error and returns `Ok` cannot succeed:
/// its transaction is aborted. The attempt fails with the real error and is
/// retried with backoff, instead of looking like a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swallowed_database_error_fails_the_attempt_with_its_error() {
    let db = TestDb::new().await;
    let id = run_one(&db, Misuse::SwallowError).await;
    let runner = db.start_runner(test_config().queues(["misuse"])).await;
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'failed'"),
        1,
        Duration::from_secs(10),
    )
    .await;
    runner.shutdown().await.unwrap();
    let error = db.last_error(id).await.unwrap();
    assert!(
        error.contains("transaction failed when its success was written"),
        "{error}"
    );
    assert!(error.contains("aborted"), "{error}");
    assert_eq!(
        db.scalar(&format!("SELECT attempts FROM pgfifo.job WHERE id = {id}"))
            .await,
        2
    );
}

/// A deferred constraint violated by the handler's writes fails the attempt
/// (checked before the success is written), not the COMMIT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_constraint_violation_fails_the_attempt() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE misuse_parent (id int PRIMARY KEY); \
         CREATE TABLE misuse_child (parent int REFERENCES misuse_parent DEFERRABLE INITIALLY DEFERRED)",
    )
    .await;
    let id = run_one(&db, Misuse::DeferredViolation).await;
    let runner = db.start_runner(test_config().queues(["misuse"])).await;
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'failed'"),
        1,
        Duration::from_secs(10),
    )
    .await;
    runner.shutdown().await.unwrap();
    let error = db.last_error(id).await.unwrap();
    assert!(error.contains("foreign key"), "{error}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM misuse_child").await,
        0,
        "the handler's write was rolled back"
    );
}

/// A handler that commits the job's transaction itself has released the
/// job's locks: the runner must not write the outcome in autocommit
/// (`pgfifo.complete` refuses outside a job transaction). The attempt is
/// dropped, noted on the attempt, and the job runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_commit_does_not_complete_the_job_without_its_locks() {
    let db = TestDb::new().await;
    let id = run_one(&db, Misuse::Commit).await;
    let runner = db.start_runner(test_config().queues(["misuse"])).await;
    db.wait_job_succeeded(id, Duration::from_secs(10)).await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.scalar(&format!("SELECT attempts FROM pgfifo.job WHERE id = {id}"))
            .await,
        2
    );
    let noted = db.attempt_error(id, 1).await.unwrap_or_default();
    assert!(noted.contains("did the handler COMMIT"), "{noted}");
}

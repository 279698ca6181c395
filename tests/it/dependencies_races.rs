//! Dependencies under concurrency and at the edges of a group, at the SQL
//! level: the two dependencies of one job ending at once in two
//! transactions (the second waits for the dependent's row and sees the
//! first's commit, so it releases the job without the sweep), a rollback
//! of the completion, and a cancelled dependent that was its group's only
//! job (the group must not stay stuck behind it).

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{
    async_trait, DependencyFailure, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob,
};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(20);

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "dependencies_races")]
struct DependenciesRaceJob {
    fail: bool,
}

#[async_trait]
impl Handler for DependenciesRaceJob {
    async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.fail {
            return Err(JobError::permanent("fails"));
        }
        Ok(())
    }
}

fn job(fail: bool, options: EnqueueOptions) -> NewJob {
    NewJob::new(&DependenciesRaceJob { fail }, options).unwrap()
}

/// Starts a job transaction on `conn` and writes job `id`'s success, as a
/// runner does; leaves the transaction open.
async fn complete_uncommitted(conn: &mut AsyncPgConnection, id: i64) {
    conn.batch_execute(&format!(
        "BEGIN; SET LOCAL pgfifo.job_transaction = on;
         SELECT * FROM pgfifo.complete(ARRAY[{id}]::bigint[], ARRAY[1], ARRAY['succeeded'],
             ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[], ARRAY[NULL]::bigint[],
             ARRAY['dependencies_races'], ARRAY[NULL]::text[]);"
    ))
    .await
    .unwrap();
}

/// Waits until a backend of the test's database waits for a lock.
async fn wait_blocked(db: &TestDb) {
    eventually(
        "the second completion to wait for the dependent's row",
        LIMIT,
        || async {
            let n = db
                .scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0",
                )
                .await;
            if n >= 1 {
                Ok(())
            } else {
                Err(format!("{n} waiting"))
            }
        },
    )
    .await;
}

/// Whether job `id` is released: queued, due, not waiting.
async fn released(db: &TestDb, id: i64) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.job AS j WHERE j.id = {id} AND j.state = 'queued'
           AND j.run_after <= now()
           AND NOT EXISTS (SELECT 1 FROM pgfifo.job_wait AS w WHERE w.job_id = j.id)"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dependencies_ending_at_once_release_their_dependent_without_the_sweep() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(
        &mut conn,
        [
            job(false, EnqueueOptions::ungrouped()),
            job(false, EnqueueOptions::ungrouped()),
        ],
    )
    .await
    .unwrap();
    let (x, y) = (ids[0], ids[1]);
    let d = pgfifo::enqueue_batch(
        &mut conn,
        [job(false, EnqueueOptions::group("d").depends_on([x, y]))],
    )
    .await
    .unwrap()[0];
    drop(conn);
    let mut first = db.direct().await;
    let mut second = db.direct().await;
    complete_uncommitted(&mut first, x).await;
    let waiter = tokio::spawn(async move {
        complete_uncommitted(&mut second, y).await;
        second
    });
    wait_blocked(&db).await;
    first.batch_execute("COMMIT").await.unwrap();
    let mut second = waiter.await.unwrap();
    assert_eq!(released(&db, d).await, 0, "not before the commit");
    second.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        released(&db, d).await,
        1,
        "released by the second completion"
    );
    let wakes = db
        .scalar("SELECT count(*) FROM pgfifo.group_wake WHERE group_id = 'd'")
        .await;
    assert!(wakes >= 1, "its group is woken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_rolls_back_releases_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let x = pgfifo::enqueue_batch(&mut conn, [job(false, EnqueueOptions::ungrouped())])
        .await
        .unwrap()[0];
    let d = pgfifo::enqueue_batch(
        &mut conn,
        [job(false, EnqueueOptions::ungrouped().depends_on([x]))],
    )
    .await
    .unwrap()[0];
    drop(conn);
    let mut runner = db.direct().await;
    complete_uncommitted(&mut runner, x).await;
    runner.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(released(&db, d).await, 0);
    assert_eq!(
        db.scalar("SELECT settled::bigint FROM pgfifo.release_dependents(0, 100)")
            .await,
        0
    );
    complete_uncommitted(&mut runner, x).await;
    runner.batch_execute("COMMIT").await.unwrap();
    assert_eq!(released(&db, d).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_dependent_does_not_leave_its_group_stuck() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let f = pgfifo::enqueue_batch(&mut conn, [job(true, EnqueueOptions::group("f"))])
        .await
        .unwrap()[0];
    // Alone in its group: cancelled by f's failure.
    let d = pgfifo::enqueue_batch(
        &mut conn,
        [job(false, EnqueueOptions::group("solo").depends_on([f]))],
    )
    .await
    .unwrap()[0];
    // Held, then cancelled by an operator.
    let held = EnqueueOptions::group("held")
        .depends_on([f])
        .on_dependency_failure(DependencyFailure::Hold);
    let h = pgfifo::enqueue_batch(&mut conn, [job(false, held)])
        .await
        .unwrap()[0];
    let runner = db
        .start_runner(test_config().queues(["dependencies_races"]))
        .await;
    db.wait_jobs_in(&[f], "failed", LIMIT).await;
    db.wait_jobs_in(&[d], "cancelled", LIMIT).await;
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.job_wait WHERE job_id = {h} AND blocked_by_job = {f}"
        ),
        1,
        LIMIT,
    )
    .await;
    pgfifo::admin::cancel_job(&mut conn, h, Some("given up"))
        .await
        .unwrap();
    // New jobs of both groups run.
    let next = pgfifo::enqueue_batch(
        &mut conn,
        [
            job(false, EnqueueOptions::group("solo")),
            job(false, EnqueueOptions::group("held")),
        ],
    )
    .await
    .unwrap();
    db.wait_jobs_in(&next, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_wait").await, 0);
}

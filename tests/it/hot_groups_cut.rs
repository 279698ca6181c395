//! A hot group's batch whose transaction dies under it (its backend ended,
//! as when the server restarts or an operator kills it): the jobs it ran
//! commit nothing and run again from the batch's first job, in order, and
//! the lane starts none of the jobs after the one that was running, which
//! another lane may already be running from the group's head.

use std::sync::Mutex;
use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, JobId};
use pgfifo_tests::query::scalar;
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// The test database, for the handler that ends its lane's backend.
static URL: Mutex<Option<String>> = Mutex::new(None);
/// Each start, in order.
static STARTS: Mutex<Vec<JobId>> = Mutex::new(Vec::new());

/// With `cut`, its first attempt ends the backend of the transaction it
/// runs in (from a connection of its own: it leaves the job's connection
/// alone, so it runs in a batch) and waits until that backend is gone.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "hot_cut", max_attempts = 5, backoff = "10ms")]
struct CutJob {
    cut: bool,
}

#[async_trait]
impl Handler for CutJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        STARTS.lock().expect("starts").push(ctx.id());
        if !self.cut || ctx.attempt() > 1 {
            return Ok(());
        }
        let url = URL.lock().expect("url").clone().expect("set by the test");
        let mut other = AsyncPgConnection::establish(&url)
            .await
            .map_err(JobError::permanent)?;
        // The runner's only open transaction is this job's: its other lanes
        // wait for work, and its own bookkeeping runs in autocommit.
        let ended = scalar(
            &mut other,
            "(SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
              WHERE datname = current_database() AND state = 'idle in transaction' \
                AND pid <> pg_backend_pid()) AS t)",
        )
        .await;
        assert_eq!(ended, 1, "one job transaction to end");
        for _ in 0..500 {
            let left: i64 = scalar(
                &mut other,
                "(SELECT count(*) FROM pg_stat_activity \
                  WHERE datname = current_database() AND state = 'idle in transaction')",
            )
            .await;
            if left == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(JobError::permanent("the backend did not go away"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_transaction_dies_starts_nothing_more_and_runs_again_in_order() {
    let db = TestDb::new().await;
    *URL.lock().expect("url") = Some(db.url.clone());
    const CUT: usize = 20;
    let ids: Vec<JobId> = {
        let mut conn = db.conn().await;
        let batch: Vec<pgfifo::NewJob> = (0..40)
            .map(|i| {
                pgfifo::NewJob::new(
                    &CutJob { cut: i == CUT },
                    pgfifo::EnqueueOptions::group("tenant"),
                )
                .expect("new job")
            })
            .collect();
        pgfifo::enqueue_batch(&mut conn, batch)
            .await
            .expect("enqueue")
    };
    // A wide window: batches end at max_batch, not at a slow moment.
    let runner = db
        .start_runner(
            test_config()
                .queues(["hot_cut"])
                .concurrency(4)
                .batch_window(Duration::from_millis(500)),
        )
        .await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    // In order up to the job that ended the transaction; then again from
    // the first job of its batch (its outcome was never committed), to the
    // end, each once.
    let starts = STARTS.lock().expect("starts").clone();
    let restart = (1..starts.len())
        .find(|&i| starts[i] <= starts[i - 1])
        .expect("the batch ran again");
    assert_eq!(starts[..restart], ids[..=CUT], "{starts:?}");
    let from = ids
        .iter()
        .position(|&id| id == starts[restart])
        .expect("ours");
    assert!(
        from < CUT,
        "job {CUT} was the first of its batch: the test shows nothing ({starts:?})"
    );
    assert_eq!(starts[restart..], ids[from..], "{starts:?}");
    // Each attempt that started counts: the batch's jobs up to the cut
    // twice; those it had picked after it were handed back.
    let twice = (CUT + 1 - from) as i64;
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64 + twice);
    let mut conn = db.conn().await;
    let committed: i64 = diesel::sql_query(
        "SELECT count(*) AS n FROM pgfifo.job WHERE id = ANY ($1) AND state = 'succeeded' AND attempts = 2",
    )
    .bind::<diesel::sql_types::Array<BigInt>, _>(&ids)
    .get_result::<Count>(&mut conn)
    .await
    .expect("count")
    .n;
    assert_eq!(
        committed, twice,
        "the jobs that ran twice succeeded on attempt 2"
    );
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

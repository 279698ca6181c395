//! Batches at the SQL level, without a runner: two transactions ending a
//! batch's last jobs at once (one waits for the batch's row and sees the
//! other's counts), a completion that rolls back, an enqueue in a rolled
//! back transaction, bad input, and `migrate down` below the batches.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::batch;
use pgfifo::{
    async_trait, Batch, EnqueueOptions, Error, Handler, Job, JobContext, JobError, NewJob,
};
use pgfifo_tests::{eventually, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "batches_sql")]
struct BatchesSqlJob {
    n: u32,
}

#[async_trait]
impl Handler for BatchesSqlJob {
    async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn job(n: u32, options: EnqueueOptions) -> NewJob {
    NewJob::new(&BatchesSqlJob { n }, options).unwrap()
}

/// A batch of two ungrouped jobs with a complete callback (job n = 99).
async fn two_job_batch(db: &TestDb) -> pgfifo::EnqueuedBatch {
    let mut conn = db.conn().await;
    Batch::new()
        .on_complete(job(99, EnqueueOptions::group("cb")))
        .enqueue(
            &mut conn,
            [
                job(1, EnqueueOptions::ungrouped()),
                job(2, EnqueueOptions::ungrouped()),
            ],
        )
        .await
        .unwrap()
}

/// Starts a job transaction on `conn` and writes job `id`'s success, as a
/// runner does at the end of its handler; leaves the transaction open.
async fn complete_uncommitted(conn: &mut AsyncPgConnection, id: i64) {
    conn.batch_execute(&format!(
        "BEGIN; SET LOCAL pgfifo.job_transaction = on;
         SELECT * FROM pgfifo.complete(ARRAY[{id}]::bigint[], ARRAY[1], ARRAY['succeeded'],
             ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[], ARRAY[NULL]::bigint[],
             ARRAY['batches_sql'], ARRAY[NULL]::text[]);"
    ))
    .await
    .unwrap();
}

const CALLBACKS: &str = "SELECT count(*) FROM pgfifo.job WHERE payload = '{\"n\": 99}'::jsonb";

/// Waits until one backend waits for a lock held by `holder`.
pub(super) async fn wait_blocked(db: &TestDb, holder: i32) {
    eventually(
        "a second completion to wait for the first",
        Duration::from_secs(10),
        || async {
            let n = db
                .scalar(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE {holder} = ANY (pg_blocking_pids(pid))"
            ))
                .await;
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} waiting"))
            }
        },
    )
    .await;
}

/// The backend pid of `conn`'s session.
pub(super) async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    pgfifo_tests::query::scalar(conn, "SELECT pg_backend_pid()::bigint").await as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_two_jobs_ending_at_once_enqueue_the_callback_once() {
    let db = TestDb::new().await;
    let batch = two_job_batch(&db).await;
    let mut first = db.direct().await;
    let mut second = db.direct().await;
    let holder = backend_pid(&mut first).await;
    complete_uncommitted(&mut first, batch.job_ids[0]).await;
    let b = batch.job_ids[1];
    let waiter = tokio::spawn(async move {
        complete_uncommitted(&mut second, b).await;
        second.batch_execute("COMMIT").await.unwrap();
    });
    wait_blocked(&db, holder).await;
    first.batch_execute("COMMIT").await.unwrap();
    waiter.await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 1, "the callback once");
    assert_eq!(
        db.scalar(&format!(
            "SELECT sum(s.succeeded) * 10 + min(b.total) FROM pgfifo.batch AS b
             JOIN pgfifo.batch_shard AS s ON s.batch_id = b.id WHERE b.id = {}",
            batch.id
        ))
        .await,
        22
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_rolls_back_takes_its_count_and_callback_with_it() {
    let db = TestDb::new().await;
    let batch = two_job_batch(&db).await;
    let mut first = db.direct().await;
    let mut second = db.direct().await;
    let holder = backend_pid(&mut first).await;
    complete_uncommitted(&mut first, batch.job_ids[0]).await;
    let b = batch.job_ids[1];
    let waiter = tokio::spawn(async move {
        complete_uncommitted(&mut second, b).await;
        second.batch_execute("COMMIT").await.unwrap();
    });
    wait_blocked(&db, holder).await;
    // The first runner dies before its commit.
    first.batch_execute("ROLLBACK").await.unwrap();
    waiter.await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 0, "one job has not ended");
    // Its job runs again and succeeds: now the batch completes.
    complete_uncommitted(&mut first, batch.job_ids[0]).await;
    first.batch_execute("COMMIT").await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_enqueued_in_a_transaction_that_rolls_back_leaves_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let result = conn
        .transaction::<(), Error, _>(async |c| {
            let created = Batch::new()
                .on_complete(job(99, EnqueueOptions::ungrouped()))
                .enqueue(
                    c,
                    [
                        job(1, EnqueueOptions::group("g")),
                        job(2, EnqueueOptions::ungrouped()),
                    ],
                )
                .await?;
            // Closed, no callback yet; an empty one completes at once.
            Batch::new()
                .on_success(job(98, EnqueueOptions::ungrouped()))
                .enqueue(c, [])
                .await?;
            assert_eq!(created.job_ids.len(), 2);
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        })
        .await;
    assert!(result.is_err());
    assert_eq!(
        db.scalar(
            "SELECT (SELECT count(*) FROM pgfifo.job) + (SELECT count(*) FROM pgfifo.batch)
                  + (SELECT count(*) FROM pgfifo.batch_job) + (SELECT count(*) FROM pgfifo.batch_callback)
    + (SELECT count(*) FROM pgfifo.batch_shard)
                  + (SELECT count(*) FROM pgfifo.group_wake)"
        )
        .await,
        0
    );
}

/// Rows of every table a batch writes to.
const WRITTEN: &str =
    "SELECT (SELECT count(*) FROM pgfifo.job) + (SELECT count(*) FROM pgfifo.batch)
    + (SELECT count(*) FROM pgfifo.batch_job) + (SELECT count(*) FROM pgfifo.batch_callback)
    + (SELECT count(*) FROM pgfifo.batch_shard)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_error_that_writes_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let keyed = job(1, EnqueueOptions::group("g").unique_key("k"));
    let err = Batch::new()
        .enqueue(&mut conn, [keyed.clone()])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidOption(m) if m.contains("unique key")),
        "{err}"
    );
    let err = Batch::new()
        .on_complete(job(
            2,
            EnqueueOptions::ungrouped().run_in(Duration::from_secs(1)),
        ))
        .enqueue(&mut conn, [job(3, EnqueueOptions::ungrouped())])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidOption(m) if m.contains("run_at")),
        "{err}"
    );
    let err = Batch::new()
        .description("x".repeat(2000))
        .enqueue(&mut conn, [job(3, EnqueueOptions::ungrouped())])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err}");
    let err = batch::add(&mut conn, 12345, [job(4, EnqueueOptions::ungrouped())])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BatchNotFound(12345)), "{err}");
    let err = batch::close(&mut conn, 12345).await.unwrap_err();
    assert!(matches!(err, Error::BatchNotFound(12345)), "{err}");
    assert_eq!(db.scalar(WRITTEN).await, 0, "nothing written");

    // A closed batch takes no job: the refused jobs are not enqueued.
    let closed = Batch::new()
        .enqueue(&mut conn, [job(5, EnqueueOptions::ungrouped())])
        .await
        .unwrap();
    let before = db.scalar(WRITTEN).await;
    let err = batch::add(&mut conn, closed.id, [job(6, EnqueueOptions::group("g"))])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BatchClosed(id) if id == closed.id),
        "{err}"
    );
    // SQL callers: callbacks only at creation, known events, once each.
    for sql in [
        format!(
            "SELECT pgfifo.batch_enqueue({}, NULL, false, ARRAY['complete'], ARRAY['q'], ARRAY[NULL],
                ARRAY['k'], ARRAY['{{}}'::jsonb], ARRAY[0::smallint], ARRAY[1], '{{}}', '{{}}', '{{}}',
                '{{}}', '{{}}', '{{}}', '{{}}', '{{}}')",
            closed.id
        ),
        "SELECT pgfifo.batch_enqueue(NULL, NULL, false, ARRAY['done', 'done'], ARRAY['q', 'q'],
            ARRAY[NULL, NULL], ARRAY['k', 'k'], ARRAY['{}'::jsonb, '{}'], ARRAY[0, 0]::smallint[],
            ARRAY[1, 1], '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')"
            .to_owned(),
        "SELECT pgfifo.batch_enqueue(NULL, NULL, false, '{}', '{}', '{}', '{}', '{}', '{}', '{}',
            ARRAY['q'], '{}', ARRAY['k'], ARRAY['{}'::jsonb], ARRAY[0::smallint], ARRAY[1],
            ARRAY[NULL::bigint], ARRAY[NULL::bigint])"
            .to_owned(),
    ] {
        let err = conn.batch_execute(&sql).await.unwrap_err();
        assert!(err.to_string().contains("pgfifo batch"), "{sql}: {err}");
    }
    assert_eq!(db.scalar(WRITTEN).await, before, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_completion_of_jobs_of_two_batches_counts_each_in_its_own() {
    let db = TestDb::new().await;
    let a = two_job_batch(&db).await;
    let b = two_job_batch(&db).await;
    let mut conn = db.conn().await;
    let plain = pgfifo::enqueue_batch(&mut conn, [job(3, EnqueueOptions::ungrouped())])
        .await
        .unwrap()[0];
    // One call ends jobs of both batches and one outside any (a runner's
    // pick of several jobs), with every kind of terminal outcome.
    let ids = [a.job_ids[0], b.job_ids[0], plain, b.job_ids[1]];
    let mut direct = db.direct().await;
    direct
        .batch_execute(&format!(
            "BEGIN; SET LOCAL pgfifo.job_transaction = on;
             SELECT * FROM pgfifo.complete(ARRAY[{}, {}, {}, {}]::bigint[], ARRAY[1, 1, 1, 1],
                 ARRAY['succeeded', 'failed', 'succeeded', 'cancelled'],
                 ARRAY[NULL, 'boom', NULL, NULL]::text[], ARRAY[NULL, NULL, NULL, NULL]::jsonb[],
                 ARRAY[NULL, NULL, NULL, NULL]::bigint[],
                 ARRAY['batches_sql', 'batches_sql', 'batches_sql', 'batches_sql'],
                 ARRAY[NULL, NULL, NULL, NULL]::text[]);
             COMMIT;",
            ids[0], ids[1], ids[2], ids[3]
        ))
        .await
        .unwrap();
    let counts = |s: batch::BatchSummary| {
        let p = s.progress;
        (
            p.total,
            p.succeeded,
            p.failed,
            p.cancelled,
            p.completed_at.is_some(),
        )
    };
    let first = batch::summary(&mut conn, a.id).await.unwrap().unwrap();
    assert_eq!(
        counts(first),
        (2, 1, 0, 0, false),
        "batch a: one of two ended"
    );
    let second = batch::summary(&mut conn, b.id).await.unwrap().unwrap();
    assert_eq!(counts(second), (2, 0, 1, 1, true), "batch b: both ended");
    // Only b completed: its callback, once.
    assert_eq!(db.scalar(CALLBACKS).await, 1);
}

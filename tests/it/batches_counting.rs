//! How completions count a batch's jobs at the SQL level, given the jobs'
//! batches as the runner sends them (`pgfifo.complete_batches`): a
//! completion that empties a shard while free ones have jobs left does not
//! lock the batch's row, one whose free shards fall short waits for the
//! shard another holds, and each way the batch completes once; an
//! operator's retry of failures in two batches and a completion ending
//! both take the locks in one order, and a head skipped while a retry
//! queues it again counts as failed.

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{async_trait, Batch, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::TestDb;

use super::batches_sql::{backend_pid, wait_blocked};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "batches_counting")]
struct CountedJob {
    n: u32,
}

#[async_trait]
impl Handler for CountedJob {
    async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn job(n: u32) -> NewJob {
    NewJob::new(&CountedJob { n }, EnqueueOptions::ungrouped()).unwrap()
}

const CALLBACKS: &str = "SELECT count(*) FROM pgfifo.job WHERE payload = '{\"n\": 0}'::jsonb";

/// A closed batch of `n` ungrouped jobs (n = 1 to n) with a complete
/// callback (n = 0).
async fn batch_of(db: &TestDb, n: u32) -> pgfifo::EnqueuedBatch {
    let mut conn = db.conn().await;
    Batch::new()
        .on_complete(job(0))
        .enqueue(&mut conn, (1..=n).map(job))
        .await
        .unwrap()
}

/// Opens a job transaction on `conn` and writes the success of jobs `ids`
/// of batch `batch`, each job's batch given as a runner gives it; leaves
/// the transaction open.
async fn complete_uncommitted(conn: &mut AsyncPgConnection, batch: i64, ids: &[i64]) {
    let jobs: Vec<(i64, i64)> = ids.iter().map(|&id| (batch, id)).collect();
    end_uncommitted(conn, &jobs, "succeeded").await.unwrap();
}

/// Opens a job transaction on `conn` and writes `outcome` for each job of
/// `jobs` (its batch, its id), ungrouped jobs; leaves the transaction open.
async fn end_uncommitted(
    conn: &mut AsyncPgConnection,
    jobs: &[(i64, i64)],
    outcome: &str,
) -> diesel::QueryResult<()> {
    end_in_group(conn, jobs, outcome, "NULL").await
}

/// [`end_uncommitted`] for jobs of group `group` (an SQL literal).
async fn end_in_group(
    conn: &mut AsyncPgConnection,
    jobs: &[(i64, i64)],
    outcome: &str,
    group: &str,
) -> diesel::QueryResult<()> {
    let list = |f: &dyn Fn(&(i64, i64)) -> String| jobs.iter().map(f).collect::<Vec<_>>().join(",");
    let n = jobs.len();
    conn.batch_execute(&format!(
        "BEGIN; SET LOCAL pgfifo.job_transaction = on;
         SELECT set_config('pgfifo.complete_batches', '{{{batches}}}', true);
         SELECT * FROM pgfifo.complete(ARRAY[{ids}]::bigint[], array_fill(1, ARRAY[{n}]),
             array_fill('{outcome}'::text, ARRAY[{n}]), array_fill(NULL::text, ARRAY[{n}]),
             array_fill(NULL::jsonb, ARRAY[{n}]), array_fill(NULL::bigint, ARRAY[{n}]),
             array_fill('batches_counting'::text, ARRAY[{n}]), array_fill({group}::text, ARRAY[{n}]));",
        batches = list(&|(batch, _)| batch.to_string()),
        ids = list(&|(_, id)| id.to_string()),
    ))
    .await
}

/// Ends jobs `first` of batch `batch` in a transaction left open, then
/// jobs `rest` in another, which is seen waiting for the first; returns
/// the first's connection (to commit) and the second's task (which commits).
async fn second_waits_for_first(
    db: &TestDb,
    batch: i64,
    first: &[i64],
    rest: Vec<i64>,
) -> (AsyncPgConnection, tokio::task::JoinHandle<()>) {
    let mut conn = db.direct().await;
    let holder = backend_pid(&mut conn).await;
    complete_uncommitted(&mut conn, batch, first).await;
    let mut second = db.direct().await;
    let waiter = tokio::spawn(async move {
        complete_uncommitted(&mut second, batch, &rest).await;
        second.batch_execute("COMMIT").await.unwrap();
    });
    wait_blocked(db, holder).await;
    (conn, waiter)
}

/// The batch's jobs left in its shards, and the successes counted.
async fn counts(db: &TestDb, batch: i64) -> (i64, i64) {
    let left = db
        .scalar(&format!(
            "SELECT coalesce(sum(remaining), 0) FROM pgfifo.batch_shard WHERE batch_id = {batch}"
        ))
        .await;
    let succeeded = db
        .scalar(&format!(
            "SELECT coalesce(sum(succeeded), 0) FROM pgfifo.batch_shard WHERE batch_id = {batch}"
        ))
        .await;
    (left, succeeded)
}

/// The batch's failures counted.
async fn failed(db: &TestDb, batch: i64) -> i64 {
    db.scalar(&format!(
        "SELECT coalesce(sum(failed), 0) FROM pgfifo.batch_shard WHERE batch_id = {batch}"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emptying_a_shard_while_free_ones_have_jobs_left_leaves_the_batch_row_alone() {
    let db = TestDb::new().await;
    // Three jobs: one in each of three shards.
    let batch = batch_of(&db, 3).await;
    let mut first = db.direct().await;
    complete_uncommitted(&mut first, batch.id, &batch.job_ids[..1]).await;
    // Its shard is empty, two others have a job left and are free: the
    // completion did not lock the batch's row (a NOWAIT lock succeeds).
    let mut other = db.direct().await;
    other
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgfifo.batch WHERE id = {} FOR UPDATE NOWAIT; ROLLBACK;",
            batch.id
        ))
        .await
        .expect("the batch's row is free while the first completion is open");
    first.batch_execute("COMMIT").await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 0);
    // The other two, one after the other: the last one completes the batch.
    for id in &batch.job_ids[1..] {
        complete_uncommitted(&mut first, batch.id, &[*id]).await;
        first.batch_execute("COMMIT").await.unwrap();
    }
    assert_eq!(db.scalar(CALLBACKS).await, 1, "the callback once");
    assert_eq!(counts(&db, batch.id).await, (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_jobs_wait_for_the_shard_another_completion_holds_and_complete_once() {
    let db = TestDb::new().await;
    // 128 jobs: two in each of the 64 shards.
    let batch = batch_of(&db, 128).await;
    // The other 127 at once: the free shards hold 126 of them, so this
    // completion undoes what it took and waits for the first one's shard.
    let (mut first, waiter) = second_waits_for_first(
        &db,
        batch.id,
        &batch.job_ids[..1],
        batch.job_ids[1..].to_vec(),
    )
    .await;
    assert_eq!(db.scalar(CALLBACKS).await, 0);
    first.batch_execute("COMMIT").await.unwrap();
    waiter.await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 1, "the callback once");
    assert_eq!(counts(&db, batch.id).await, (0, 128));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_two_jobs_ending_at_once_complete_the_batch_once() {
    let db = TestDb::new().await;
    let batch = batch_of(&db, 2).await;
    // The second finds the other shard held: it locks the batch's row
    // after the first, and sees its count there.
    let (mut first, waiter) =
        second_waits_for_first(&db, batch.id, &batch.job_ids[..1], vec![batch.job_ids[1]]).await;
    first.batch_execute("COMMIT").await.unwrap();
    waiter.await.unwrap();
    assert_eq!(db.scalar(CALLBACKS).await, 1, "the callback once");
    assert_eq!(counts(&db, batch.id).await, (0, 2));
}

/// A closed batch of two jobs whose first failed for good: shard 0 holds
/// the failure, shard 1 the job left (where the failure was taken from is
/// random; the test needs it there, and only sums mean something).
async fn batch_with_a_failure(db: &TestDb) -> pgfifo::EnqueuedBatch {
    let batch = batch_of(db, 2).await;
    let mut conn = db.direct().await;
    end_uncommitted(&mut conn, &[(batch.id, batch.job_ids[0])], "failed")
        .await
        .unwrap();
    conn.batch_execute(&format!(
        "UPDATE pgfifo.batch_shard
         SET remaining = shard, failed = 1 - shard, succeeded = 0, cancelled = 0
         WHERE batch_id = {}; COMMIT;",
        batch.id
    ))
    .await
    .unwrap();
    batch
}

/// A transaction left open holding shard `shard` of batch `batch`: its
/// connection and backend pid.
async fn hold_shard(db: &TestDb, batch: i64, shard: i32) -> (AsyncPgConnection, i32) {
    let mut conn = db.direct().await;
    let pid = backend_pid(&mut conn).await;
    conn.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM pgfifo.batch_shard WHERE batch_id = {batch} AND shard = {shard} FOR UPDATE;"
    ))
    .await
    .unwrap();
    (conn, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_failures_of_two_batches_while_a_completion_ends_both_does_not_deadlock() {
    let db = TestDb::new().await;
    let a = batch_with_a_failure(&db).await;
    let b = batch_with_a_failure(&db).await;
    assert!(a.id < b.id);
    // A transaction holds b's shard with a job left.
    let (mut holder, holder_pid) = hold_shard(&db, b.id, 1).await;
    // A completion of both batches' last jobs takes a's shard 1, then
    // waits for b's (holding b's shard 0, which the waiting take locks
    // first); after it, it locks a's row and b's (each emptied its last
    // shard).
    let mut completion = db.direct().await;
    let completion_pid = backend_pid(&mut completion).await;
    let jobs = [(a.id, a.job_ids[1]), (b.id, b.job_ids[1])];
    let completing = tokio::spawn(async move {
        end_uncommitted(&mut completion, &jobs, "succeeded").await?;
        completion.batch_execute("COMMIT").await
    });
    wait_blocked(&db, holder_pid).await;
    // An operator retries both failures. It takes a's shard 0, then waits
    // for b's shard 0. Had it locked a's row before b's shards, the
    // completion would wait for that row while the retry waits for the
    // completion's shard, and PostgreSQL would abort one of them.
    let mut operator = db.direct().await;
    let retry = format!(
        "SELECT * FROM pgfifo.retry_jobs(ARRAY[{}, {}]::bigint[])",
        a.job_ids[0], b.job_ids[0]
    );
    let retrying = tokio::spawn(async move { operator.batch_execute(&retry).await });
    wait_blocked(&db, completion_pid).await;
    holder.batch_execute("COMMIT").await.unwrap();
    completing
        .await
        .unwrap()
        .expect("the completion commits: no deadlock");
    retrying
        .await
        .unwrap()
        .expect("the retry commits: no deadlock");
    // The completion saw both batches done: each one's callback once. The
    // retried jobs count again, as remaining.
    assert_eq!(db.scalar(CALLBACKS).await, 2, "each batch's callback once");
    for batch in [&a, &b] {
        assert_eq!(counts(&db, batch.id).await, (1, 1));
        assert_eq!(
            failed(&db, batch.id).await,
            0,
            "the retried failure no longer counts"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipping_a_held_head_while_a_retry_queues_it_again_counts_its_failure() {
    let db = TestDb::new().await;
    db.scalar("SELECT pgfifo.set_failure_policy('batches_counting', 'hold')::bigint")
        .await;
    // A batch of one job in group g; it fails for good and holds g.
    let mut conn = db.conn().await;
    let grouped = NewJob::new(&CountedJob { n: 1 }, EnqueueOptions::group("g")).unwrap();
    let batch = Batch::new()
        .on_complete(job(0))
        .enqueue(&mut conn, [grouped])
        .await
        .unwrap();
    drop(conn);
    let id = batch.job_ids[0];
    // Its group's row, with the job as its head (as a runner's promote does).
    db.scalar("SELECT promoted::bigint FROM pgfifo.promote(ARRAY['batches_counting'], 100)")
        .await;
    let mut runner = db.direct().await;
    end_in_group(&mut runner, &[(batch.id, id)], "failed", "'g'")
        .await
        .unwrap();
    runner.batch_execute("COMMIT").await.unwrap();
    let held = format!(
        "SELECT count(*) FROM pgfifo.queue_group
         WHERE queue = 'batches_counting' AND group_id = 'g' AND head_id = {id} AND ready_at IS NULL"
    );
    assert_eq!(db.scalar(&held).await, 1, "g is held at its failed head");
    // An operator's retry queues it again, and is held up (by a lock on
    // the batch's shard) before it commits.
    let (mut holder, holder_pid) = hold_shard(&db, batch.id, 0).await;
    let mut retrier = db.direct().await;
    let retrier_pid = backend_pid(&mut retrier).await;
    let retry = format!("SELECT * FROM pgfifo.retry_jobs(ARRAY[{id}]::bigint[])");
    let retrying = tokio::spawn(async move { retrier.batch_execute(&retry).await });
    wait_blocked(&db, holder_pid).await;
    // Another operator skips g's head meanwhile: it waits for the retry.
    let mut skipper = db.direct().await;
    let skipping = tokio::spawn(async move {
        skipper
            .batch_execute("SELECT pgfifo.skip_head('batches_counting', 'g', 'skipped')")
            .await
    });
    wait_blocked(&db, retrier_pid).await;
    holder.batch_execute("COMMIT").await.unwrap();
    retrying.await.unwrap().expect("the retry commits");
    skipping.await.unwrap().expect("the skip commits");
    // The skip came last: the job failed, and its batch counts it so.
    let state = format!("SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'failed'");
    assert_eq!(db.scalar(&state).await, 1);
    assert_eq!(
        counts(&db, batch.id).await,
        (0, 0),
        "no job left, none succeeded"
    );
    assert_eq!(
        failed(&db, batch.id).await,
        1,
        "the skipped job counts as failed"
    );
}

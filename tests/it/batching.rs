//! Several jobs per transaction (`RunnerConfig::max_batch`): short handlers
//! that leave the job's connection alone share their pick's transaction;
//! every job keeps its own outcome; a handler that takes the connection never
//! shares its writes with another job; the batch window bounds a batch.
//!
//! Which transaction wrote a job's outcome is the `xmin` of its row: jobs
//! whose outcomes committed together have the same one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, JobId};
use pgfifo_tests::{id_list, test_config, TestDb};
use serde::{Deserialize, Serialize};

pub(crate) const QUEUE: &str = "batching";
const LIMIT: Duration = Duration::from_secs(30);

/// Never takes the connection: succeeds, fails for good, or sleeps `ms`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "batching", max_attempts = 3, backoff = "10ms")]
pub(crate) struct BatchFreeJob {
    pub(crate) fail: bool,
    pub(crate) ms: u64,
}

#[async_trait]
impl Handler for BatchFreeJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
        }
        if self.fail {
            return Err(JobError::permanent("refused by the test"));
        }
        Ok(())
    }
}

/// When each run of a [`BatchSpanJob`] started and ended.
static SPANS: Mutex<Vec<(Instant, Instant)>> = Mutex::new(Vec::new());

/// Sleeps 20 ms without the connection, recording when it ran.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "batching_spans")]
struct BatchSpanJob {}

#[async_trait]
impl Handler for BatchSpanJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        SPANS.lock().expect("spans").push((start, Instant::now()));
        Ok(())
    }
}

/// Writes a row through the job's connection, then succeeds or fails.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "batching", max_attempts = 1)]
struct BatchWriteJob {
    fail: bool,
}

#[async_trait]
impl Handler for BatchWriteJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let id = ctx.id();
        diesel::sql_query("INSERT INTO batch_rows (job_id) VALUES ($1)")
            .bind::<BigInt, _>(id)
            .execute(ctx.conn())
            .await?;
        if self.fail {
            return Err(JobError::permanent("refused after writing"));
        }
        Ok(())
    }
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    xmin: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Text)]
    kind: String,
}

/// Each job's state, kind and the transaction that wrote its outcome.
async fn rows(db: &TestDb, ids: &[JobId]) -> Vec<Row> {
    let mut conn = db.conn().await;
    diesel::sql_query(format!(
        "SELECT id, xmin::text AS xmin, state, kind FROM pgfifo.job WHERE id IN ({})",
        id_list(ids)
    ))
    .load(&mut conn)
    .await
    .expect("read the jobs")
}

/// How many jobs each writing transaction finished.
fn per_transaction(rows: &[Row]) -> HashMap<&str, Vec<&Row>> {
    let mut map: HashMap<&str, Vec<&Row>> = HashMap::new();
    for row in rows {
        map.entry(row.xmin.as_str()).or_default().push(row);
    }
    map
}

/// Enqueues one job per group, all in one batch call, so the runner finds
/// every group ready at once.
pub(crate) async fn enqueue_one_per_group<J: Job>(db: &TestDb, jobs: Vec<J>) -> Vec<JobId> {
    let mut conn = db.conn().await;
    let batch: Vec<pgfifo::NewJob> = jobs
        .into_iter()
        .enumerate()
        .map(|(i, job)| {
            pgfifo::NewJob::new(&job, pgfifo::EnqueueOptions::group(format!("g{i}")))
                .expect("new job")
        })
        .collect();
    pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue")
}

/// Enqueues `n` jobs made by `job`, round-robin over `groups` groups named
/// `{prefix}{k}`, in one batch call.
async fn enqueue_round_robin<J: Job>(
    db: &TestDb,
    n: usize,
    groups: usize,
    prefix: &str,
    job: impl Fn() -> J,
) -> Vec<JobId> {
    let mut conn = db.conn().await;
    let batch: Vec<pgfifo::NewJob> = (0..n)
        .map(|i| {
            let group = pgfifo::EnqueueOptions::group(format!("{prefix}{}", i % groups));
            pgfifo::NewJob::new(&job(), group).expect("new job")
        })
        .collect();
    pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue")
}

/// One lane and one prefetch lane, batches of up to `max_batch` jobs.
fn one_lane(max_batch: usize) -> pgfifo::RunnerConfig {
    test_config()
        .queues([QUEUE])
        .concurrency(1)
        .prefetch(1)
        .max_batch(max_batch)
}

/// Runs `config` until every job of `ids` succeeded, then reads the jobs.
async fn drain(db: &TestDb, config: pgfifo::RunnerConfig, ids: &[JobId]) -> Vec<Row> {
    let runner = db.start_runner(config).await;
    db.wait_jobs_in(ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");
    rows(db, ids).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_jobs_that_leave_the_connection_alone_share_transactions() {
    let db = TestDb::new().await;
    let jobs = (0..64)
        .map(|_| BatchFreeJob { fail: false, ms: 0 })
        .collect();
    let ids = enqueue_one_per_group(&db, jobs).await;
    let rows = drain(&db, one_lane(8), &ids).await;
    let txs = per_transaction(&rows);
    let largest = txs.values().map(Vec::len).max().unwrap_or(0);
    assert!(
        largest <= 8,
        "a transaction finished {largest} jobs, more than max_batch"
    );
    assert!(
        txs.len() < ids.len() / 2,
        "64 no-op jobs took {} transactions: they were not batched",
        txs.len()
    );
    // Each ran once: one attempt each, none forgotten or repeated.
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_batch_one_gives_every_job_its_own_transaction() {
    let db = TestDb::new().await;
    let jobs = (0..24)
        .map(|_| BatchFreeJob { fail: false, ms: 0 })
        .collect();
    let ids = enqueue_one_per_group(&db, jobs).await;
    let rows = drain(&db, one_lane(1), &ids).await;
    assert_eq!(per_transaction(&rows).len(), ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_a_batch_keeps_to_its_job() {
    let db = TestDb::new().await;
    let jobs = (0..48)
        .map(|i| BatchFreeJob {
            fail: i % 3 == 0,
            ms: 0,
        })
        .collect();
    let ids = enqueue_one_per_group(&db, jobs).await;
    let runner = db.start_runner(one_lane(8)).await;
    let failing: Vec<JobId> = ids.iter().step_by(3).copied().collect();
    let passing: Vec<JobId> = ids
        .iter()
        .copied()
        .filter(|id| !failing.contains(id))
        .collect();
    db.wait_jobs_in(&failing, "failed", LIMIT).await;
    db.wait_jobs_in(&passing, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    for id in &failing {
        let error = db.last_error(*id).await.unwrap_or_default();
        assert!(error.contains("refused by the test"), "job {id}: {error:?}");
    }
    for id in &passing {
        assert_eq!(db.last_error(*id).await, None, "job {id}");
    }
    // Failures and successes were committed together, each with its own
    // outcome.
    let rows = rows(&db, &ids).await;
    let mixed = per_transaction(&rows)
        .values()
        .filter(|tx| {
            tx.iter().any(|r| r.state == "failed") && tx.iter().any(|r| r.state == "succeeded")
        })
        .count();
    assert!(
        mixed > 0,
        "no transaction finished both a failure and a success"
    );
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_takes_the_connection_never_shares_its_writes() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE batch_rows (job_id bigint NOT NULL)")
        .await;
    let mut conn = db.conn().await;
    // Alternate: no-op, writer that succeeds, no-op, writer that fails, …
    let mut batch = Vec::new();
    for i in 0..48 {
        let group = pgfifo::EnqueueOptions::group(format!("g{i}"));
        let job = match i % 4 {
            1 => pgfifo::NewJob::new(&BatchWriteJob { fail: false }, group),
            3 => pgfifo::NewJob::new(&BatchWriteJob { fail: true }, group),
            _ => pgfifo::NewJob::new(&BatchFreeJob { fail: false, ms: 0 }, group),
        };
        batch.push(job.expect("new job"));
    }
    let ids = pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    drop(conn);
    let runner = db.start_runner(one_lane(8)).await;
    let by_kind = |rem: usize| -> Vec<JobId> {
        ids.iter()
            .enumerate()
            .filter(|(i, _)| i % 4 == rem)
            .map(|(_, id)| *id)
            .collect()
    };
    let (written, refused) = (by_kind(1), by_kind(3));
    db.wait_jobs_in(&written, "succeeded", LIMIT).await;
    db.wait_jobs_in(&refused, "failed", LIMIT).await;
    db.wait_jobs_in(&by_kind(0), "succeeded", LIMIT).await;
    db.wait_jobs_in(&by_kind(2), "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    // The successful writers' rows are there, the failed writers' are not.
    let kept = db
        .scalar(&format!(
            "SELECT count(*) FROM batch_rows WHERE job_id IN ({})",
            id_list(&written)
        ))
        .await;
    assert_eq!(kept, written.len() as i64);
    let leaked = db
        .scalar(&format!(
            "SELECT count(*) FROM batch_rows WHERE job_id IN ({})",
            id_list(&refused)
        ))
        .await;
    assert_eq!(leaked, 0, "a failed handler's writes were committed");
    // No transaction finished two jobs that took the connection.
    let rows = rows(&db, &ids).await;
    for (xmin, tx) in per_transaction(&rows) {
        let writers = tx
            .iter()
            .filter(|r| r.kind.ends_with("BatchWriteJob"))
            .count();
        assert!(
            writers <= 1,
            "transaction {xmin} finished {writers} writing jobs"
        );
    }
    let free: Vec<JobId> = by_kind(0).into_iter().chain(by_kind(2)).collect();
    assert_eq!(db.attempts_of(&free).await, free.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_bounds_a_batch_and_hands_back_the_rest() {
    let db = TestDb::new().await;
    // Mostly no-op handlers (so picks take many jobs), every fourth one
    // sleeping 15 ms, a 10 ms window: once a slow one has run, its batch
    // starts no other job, so no transaction holds two slow ones.
    let jobs = (0..48)
        .map(|i| BatchFreeJob {
            fail: false,
            ms: if i % 4 == 0 { 15 } else { 0 },
        })
        .collect();
    let ids = enqueue_one_per_group(&db, jobs).await;
    let config = one_lane(8).batch_window(Duration::from_millis(10));
    let rows = drain(&db, config, &ids).await;
    let slow: Vec<JobId> = ids.iter().step_by(4).copied().collect();
    let txs = per_transaction(&rows);
    for (xmin, tx) in &txs {
        let slow_ones = tx.iter().filter(|r| slow.contains(&r.id)).count();
        assert!(
            slow_ones <= 1,
            "transaction {xmin} ran {slow_ones} jobs of 15 ms in a 10 ms window"
        );
    }
    assert!(
        txs.len() < ids.len(),
        "no batch at all: the test shows nothing"
    );
    // Jobs handed back unstarted did not keep the attempt recorded for them.
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_slots_run_other_groups_side_by_side_instead_of_in_a_batch() {
    let db = TestDb::new().await;
    // 4 groups of 5 jobs of 20 ms, 4 slots, and a window that would let one
    // lane take all 4 groups at once: while another lane seeks work with a
    // slot free, a pick takes one job, so the groups run side by side.
    let ids = enqueue_round_robin(&db, 20, 4, "s", || BatchSpanJob {}).await;
    let runner = db
        .start_runner(
            test_config()
                .queues(["batching_spans"])
                .concurrency(4)
                .max_batch(8)
                .batch_window(Duration::from_millis(200)),
        )
        .await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    let spans = SPANS.lock().expect("spans").clone();
    assert_eq!(spans.len(), ids.len());
    // The most runs at once: each start, against the runs it falls in.
    let most = spans
        .iter()
        .map(|(start, _)| {
            spans
                .iter()
                .filter(|(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(most >= 3, "at most {most} of 4 groups ran at once");
    // A transaction may run several jobs of one group (its next jobs could
    // not run elsewhere meanwhile), but not of several groups.
    let rows = rows(&db, &ids).await;
    let group_of = |id: JobId| ids.iter().position(|&i| i == id).expect("ours") % 4;
    let most_groups = per_transaction(&rows)
        .values()
        .map(|tx| {
            let mut groups: Vec<usize> = tx.iter().map(|r| group_of(r.id)).collect();
            groups.sort_unstable();
            groups.dedup();
            groups.len()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most_groups <= 2,
        "a transaction ran jobs of 20 ms of {most_groups} groups while slots were free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_that_all_have_work_batch_jobs_of_a_few_ms() {
    let db = TestDb::new().await;
    // 40 groups of 3 jobs of about 5 ms, 2 slots and 2 lanes: a lane's own
    // slot is free whenever it picks, but every lane has work until the end,
    // so no idle lane could run a batch's jobs side by side, and batches
    // fill the window instead of holding one job each.
    let ids = enqueue_round_robin(&db, 120, 40, "b", || BatchFreeJob { fail: false, ms: 5 }).await;
    let config = test_config()
        .queues([QUEUE])
        .concurrency(2)
        .prefetch(0)
        .max_batch(8)
        .batch_window(Duration::from_millis(100));
    let rows = drain(&db, config, &ids).await;
    let txs = per_transaction(&rows);
    let largest = txs.values().map(Vec::len).max().unwrap_or(0);
    assert!(
        largest <= 8,
        "a transaction ran {largest} jobs, more than max_batch"
    );
    assert!(
        txs.len() <= ids.len() / 2,
        "120 jobs of 5 ms took {} transactions while every lane had work",
        txs.len()
    );
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

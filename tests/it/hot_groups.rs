//! A hot group: one group with a backlog of quick jobs runs several of them
//! per transaction (a pick takes the group's next jobs behind its head),
//! strictly in order, each with its own outcome, and a job that does not
//! succeed stops the rest of its batch, which runs after it as its outcome
//! says. The SQL side (`pgfifo.pick`'s followers, `pgfifo.complete` with
//! several jobs of one group) is in `hot_groups_sql.rs`.
//!
//! Which transaction wrote a job's outcome is the `xmin` of its row: jobs
//! whose outcomes committed together have the same one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::admin::FailurePolicy;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, JobId};
use pgfifo_tests::{id_list, test_config, TestDb};
use serde::{Deserialize, Serialize};

pub(crate) const QUEUE: &str = "hot";
const GROUP: &str = "tenant";
const LIMIT: Duration = Duration::from_secs(30);

/// What a [`HotJob`] does.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Succeeds at once, without the connection.
    Ok,
    /// Fails its first attempt (retryable), then succeeds.
    RetryOnce,
    /// Fails for good.
    Fail,
    /// Cancels itself.
    Cancel,
    /// Snoozes its group for this many ms the first time, then succeeds.
    SnoozeOnce(u64),
    /// Inserts a row of its own through the connection and succeeds.
    Write,
    /// Inserts a row of its own through the connection, then fails for good.
    WriteAndFail,
}

/// Records its start (per test `tag`), then does its [`Act`].
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "hot", max_attempts = 3, backoff = "10ms")]
pub(crate) struct HotJob {
    pub(crate) tag: String,
    pub(crate) act: Act,
}

/// Per test tag, each start: the job and when.
static STARTS: Mutex<Vec<(String, JobId, Instant)>> = Mutex::new(Vec::new());
/// Jobs that snoozed already.
static SNOOZED: Mutex<Vec<JobId>> = Mutex::new(Vec::new());

#[async_trait]
impl Handler for HotJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let id = ctx.id();
        STARTS
            .lock()
            .expect("starts")
            .push((self.tag.clone(), id, Instant::now()));
        match self.act {
            Act::Ok => Ok(()),
            Act::RetryOnce if ctx.attempt() == 1 => Err(JobError::retry("the first attempt fails")),
            Act::RetryOnce => Ok(()),
            Act::Fail => Err(JobError::permanent("refused by the test")),
            Act::Cancel => Err(JobError::cancel("cancelled by the test")),
            Act::SnoozeOnce(ms) => {
                let mut snoozed = SNOOZED.lock().expect("snoozed");
                if snoozed.contains(&id) {
                    return Ok(());
                }
                snoozed.push(id);
                Err(JobError::snooze(Duration::from_millis(ms), "not yet"))
            }
            Act::Write | Act::WriteAndFail => {
                diesel::sql_query("INSERT INTO hot_rows (job_id) VALUES ($1)")
                    .bind::<BigInt, _>(id)
                    .execute(ctx.conn())
                    .await?;
                if self.act == Act::WriteAndFail {
                    return Err(JobError::permanent("refused after writing"));
                }
                Ok(())
            }
        }
    }
}

/// The starts recorded for `tag`, in order, with their times.
fn starts(tag: &str) -> Vec<(JobId, Instant)> {
    STARTS
        .lock()
        .expect("starts")
        .iter()
        .filter(|(t, _, _)| t == tag)
        .map(|(_, id, at)| (*id, *at))
        .collect()
}

/// The jobs started for `tag`, in order.
fn started(tag: &str) -> Vec<JobId> {
    starts(tag).into_iter().map(|(id, _)| id).collect()
}

/// Enqueues one job per act, in order, all in group [`GROUP`], in one
/// batch call.
pub(crate) async fn enqueue_group(db: &TestDb, tag: &str, acts: &[Act]) -> Vec<JobId> {
    let mut conn = db.conn().await;
    let batch: Vec<pgfifo::NewJob> = acts
        .iter()
        .map(|&act| {
            let job = HotJob {
                tag: tag.to_owned(),
                act,
            };
            pgfifo::NewJob::new(&job, pgfifo::EnqueueOptions::group(GROUP)).expect("new job")
        })
        .collect();
    pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue")
}

/// A runner of the test queue with 4 slots (the defaults otherwise: batches
/// of up to 16 jobs in a 25 ms window).
async fn runner(db: &TestDb) -> pgfifo::runner::RunnerHandle {
    db.start_runner(test_config().queues([QUEUE]).concurrency(4))
        .await
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    xmin: String,
}

/// Per writing transaction (`xmin`), the jobs whose outcome it wrote.
async fn transactions(db: &TestDb, ids: &[JobId]) -> HashMap<String, Vec<JobId>> {
    let mut conn = db.conn().await;
    let rows: Vec<Row> = diesel::sql_query(format!(
        "SELECT id, xmin::text AS xmin FROM pgfifo.job WHERE id IN ({}) ORDER BY id",
        id_list(ids)
    ))
    .load(&mut conn)
    .await
    .expect("read the jobs");
    let mut map: HashMap<String, Vec<JobId>> = HashMap::new();
    for row in rows {
        map.entry(row.xmin).or_default().push(row.id);
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_group_runs_several_jobs_per_transaction_in_order() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "drain", &[Act::Ok; 80]).await;
    let runner = runner(&db).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    assert_eq!(started("drain"), ids, "each job once, in order");
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
    // One group runs one job at a time whatever the slots: before, each
    // job had a transaction of its own.
    let txs = transactions(&db, &ids).await;
    assert!(
        txs.len() <= ids.len() / 4,
        "{} jobs of one group took {} transactions",
        ids.len(),
        txs.len()
    );
    // Each transaction finished a run of consecutive jobs, at most
    // max_batch of them.
    for jobs in txs.values() {
        let at = ids.iter().position(|id| *id == jobs[0]).expect("ours");
        assert_eq!(
            jobs.as_slice(),
            &ids[at..at + jobs.len()],
            "a transaction finished jobs that do not follow each other"
        );
        assert!(jobs.len() <= 16, "{} jobs in one transaction", jobs.len());
    }
    // The group went idle after its last job.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group \
             WHERE queue = '{QUEUE}' AND group_id = '{GROUP}' AND head_id IS NULL"
        ))
        .await,
        1
    );
}

/// `acts` with `act` at `at` and [`Act::Ok`] elsewhere.
fn acts_with(n: usize, at: usize, act: Act) -> Vec<Act> {
    let mut acts = vec![Act::Ok; n];
    acts[at] = act;
    acts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_a_batch_runs_again_before_the_jobs_behind_it() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "retry", &acts_with(40, 12, Act::RetryOnce)).await;
    let runner = runner(&db).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    // Job 12's second attempt comes right after its first: nothing behind
    // it started in between, although it was picked with them.
    let mut want: Vec<JobId> = ids[..=12].to_vec();
    want.extend_from_slice(&ids[12..]);
    assert_eq!(started("retry"), want);
    // The jobs handed back unstarted kept no attempt: one each, two for 12.
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64 + 1);
    assert_eq!(db.attempt_rows(ids[12]).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_in_a_batch_holds_the_jobs_behind_it_until_it_ends() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "snooze", &acts_with(30, 9, Act::SnoozeOnce(300))).await;
    let runner = runner(&db).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    let starts = starts("snooze");
    let order: Vec<JobId> = starts.iter().map(|(id, _)| *id).collect();
    let mut want: Vec<JobId> = ids[..=9].to_vec();
    want.extend_from_slice(&ids[9..]);
    assert_eq!(order, want);
    // The second start of job 9 waited for the snooze; so did job 10.
    let slept = starts[10].1 - starts[9].1;
    assert!(
        slept >= Duration::from_millis(290),
        "job 9 ran again {slept:?} after it snoozed for 300 ms"
    );
    // A snooze does not use an attempt; nor did the jobs handed back.
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_a_batch_lets_the_rest_go_on_in_order() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "cancel", &acts_with(30, 7, Act::Cancel)).await;
    let runner = runner(&db).await;
    let others: Vec<JobId> = ids.iter().copied().filter(|&id| id != ids[7]).collect();
    db.wait_jobs_in(&others, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    assert_eq!(db.job_state(ids[7]).await, "cancelled 1");
    assert_eq!(started("cancel"), ids, "each job once, in order");
    assert_eq!(db.attempts_of(&ids).await, ids.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_that_holds_the_group_leaves_the_jobs_behind_it_unstarted() {
    let db = TestDb::new().await;
    {
        let mut conn = db.conn().await;
        pgfifo::admin::set_failure_policy(&mut conn, QUEUE, FailurePolicy::Hold)
            .await
            .expect("hold");
    }
    let ids = enqueue_group(&db, "hold", &acts_with(30, 6, Act::Fail)).await;
    let runner = runner(&db).await;
    db.wait_jobs_in(&ids[6..=6], "failed", LIMIT).await;
    // The failure and the hold commit together: from now on the group is
    // held by its failed head, and nothing behind it ran or counts an
    // attempt.
    db.wait_jobs_in(&ids[..6], "succeeded", LIMIT).await;
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' \
             AND group_id = '{GROUP}' AND head_id = {} AND ready_at IS NULL",
            ids[6]
        ))
        .await,
        1,
        "the group is held by job 6"
    );
    assert_eq!(started("hold"), ids[..=6].to_vec());
    assert_eq!(db.attempts_of(&ids[7..]).await, 0);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND state = 'queued'",
            id_list(&ids[7..])
        ))
        .await,
        ids.len() as i64 - 7
    );

    // Skipping the failed head lets the rest run, in order.
    {
        let mut conn = db.conn().await;
        let skipped = pgfifo::admin::skip_head(&mut conn, QUEUE, GROUP, None)
            .await
            .expect("skip the head");
        assert_eq!(skipped, Some(ids[6]));
    }
    db.wait_jobs_in(&ids[7..], "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(started("hold"), ids, "each job once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_the_connection_take_effect_once_beside_failures() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE hot_rows (job_id bigint NOT NULL)")
        .await;
    let acts = [
        Act::Ok,
        Act::Ok,
        Act::Write,
        Act::Fail,
        Act::Ok,
        Act::WriteAndFail,
        Act::Ok,
        Act::Write,
        Act::RetryOnce,
        Act::Ok,
        Act::Write,
        Act::WriteAndFail,
        Act::Ok,
    ];
    let mut acts = acts.to_vec();
    acts.extend([Act::Ok; 20]);
    let ids = enqueue_group(&db, "writes", &acts).await;
    let runner = runner(&db).await;
    let failed: Vec<JobId> = acts
        .iter()
        .zip(&ids)
        .filter(|(act, _)| matches!(act, Act::Fail | Act::WriteAndFail))
        .map(|(_, id)| *id)
        .collect();
    let succeeded: Vec<JobId> = ids
        .iter()
        .copied()
        .filter(|id| !failed.contains(id))
        .collect();
    db.wait_jobs_in(&succeeded, "succeeded", LIMIT).await;
    db.wait_jobs_in(&failed, "failed", LIMIT).await;
    runner.shutdown().await.expect("shutdown");

    // The rows of the jobs that wrote and succeeded, once each; none of
    // those that failed after writing.
    let mut conn = db.conn().await;
    #[derive(QueryableByName)]
    struct Written {
        #[diesel(sql_type = BigInt)]
        job_id: i64,
        #[diesel(sql_type = Text)]
        xmin: String,
    }
    let rows: Vec<Written> =
        diesel::sql_query("SELECT job_id, xmin::text AS xmin FROM hot_rows ORDER BY job_id")
            .load(&mut conn)
            .await
            .expect("read the rows");
    let writers: Vec<JobId> = acts
        .iter()
        .zip(&ids)
        .filter(|(act, _)| **act == Act::Write)
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(
        rows.iter().map(|r| r.job_id).collect::<Vec<_>>(),
        writers,
        "each writer's row once, no failed job's"
    );
    // Each row committed with its job's outcome, and with no job after it.
    let txs = transactions(&db, &ids).await;
    for row in &rows {
        let jobs = &txs[&row.xmin];
        assert_eq!(
            jobs.last(),
            Some(&row.job_id),
            "job {} wrote, and a job after it shared its transaction: {jobs:?}",
            row.job_id
        );
    }
    // Every job ran in order; only the retried one twice.
    let mut want: Vec<JobId> = ids[..=8].to_vec();
    want.extend_from_slice(&ids[8..]);
    assert_eq!(started("writes"), want);
    assert!(
        txs.len() < ids.len() / 2,
        "the jobs that leave the connection alone were batched: {} transactions",
        txs.len()
    );
}

//! Batches (issue 34, part 1), with a runner: callbacks fire once with the
//! counts their handler reads, open batches take jobs from a handler, an
//! empty batch completes when closed, an operator's retry and cancel. The
//! SQL-level races, rollbacks and bad input are in `batches_sql.rs`; the
//! multi-process check with `kill -9` in `multiprocess/batches.rs`.

use std::sync::Mutex;
use std::time::Duration;

use pgfifo::batch::{self, BatchSummary};
use pgfifo::{
    admin, async_trait, Batch, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob,
};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// Callback runs: (database, event name given in the payload, the summary
/// its handler read).
static REPORTS: Mutex<Vec<(String, String, BatchSummary)>> = Mutex::new(Vec::new());

/// A job of a batch: ends as `outcome` says ("ok", "fail", "cancel"); with
/// `children` > 0, adds that many "ok" jobs to its own batch through its
/// connection and closes the batch.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "batches", max_attempts = 1)]
struct BatchesWork {
    db: String,
    outcome: String,
    children: u32,
}

#[async_trait]
impl Handler for BatchesWork {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.children > 0 {
            let me = ctx.id();
            let id = batch::of_job(ctx.conn(), me)
                .await
                .map_err(JobError::retry)?
                .expect("the parent is in a batch");
            let jobs: Vec<NewJob> = (0..self.children)
                .map(|i| {
                    NewJob::new(
                        &work(&self.db, "ok"),
                        EnqueueOptions::group(format!("c{i}")),
                    )
                })
                .collect::<pgfifo::Result<_>>()
                .map_err(JobError::permanent)?;
            batch::add(ctx.conn(), id, jobs)
                .await
                .map_err(JobError::retry)?;
            batch::close(ctx.conn(), id)
                .await
                .map_err(JobError::retry)?;
        }
        match self.outcome.as_str() {
            "fail" => Err(JobError::permanent("told to fail")),
            "cancel" => Err(JobError::cancel("told to cancel")),
            _ => Ok(()),
        }
    }
}

fn work(db: &str, outcome: &str) -> BatchesWork {
    BatchesWork {
        db: db.to_owned(),
        outcome: outcome.to_owned(),
        children: 0,
    }
}

/// A callback: records the batch's summary as its handler reads it.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "batches_cb", max_attempts = 3)]
struct BatchesReport {
    db: String,
    event: String,
}

#[async_trait]
impl Handler for BatchesReport {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let summary = ctx
            .batch()
            .await
            .map_err(JobError::retry)?
            .expect("a callback has a batch");
        REPORTS
            .lock()
            .unwrap()
            .push((self.db.clone(), self.event.clone(), summary));
        Ok(())
    }
}

fn report(db: &TestDb, event: &str) -> NewJob {
    let job = BatchesReport {
        db: db.name.clone(),
        event: event.to_owned(),
    };
    NewJob::new(&job, EnqueueOptions::group("reports")).unwrap()
}

fn with_all_callbacks(db: &TestDb) -> Batch {
    Batch::new()
        .description("test batch")
        .on_success(report(db, "success"))
        .on_complete(report(db, "complete"))
        .on_failure(report(db, "failure"))
}

/// The reports of `db`: (event, summary), in the order they ran.
fn reports(db: &TestDb) -> Vec<(String, BatchSummary)> {
    REPORTS
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == db.name)
        .map(|r| (r.1.clone(), r.2.clone()))
        .collect()
}

fn events(db: &TestDb) -> Vec<String> {
    reports(db).into_iter().map(|r| r.0).collect()
}

async fn wait_reports(db: &TestDb, n: usize) {
    eventually("the callbacks", LIMIT, || async {
        let got = events(db);
        if got.len() >= n {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
}

fn jobs(db: &TestDb, outcomes: &[&str]) -> Vec<NewJob> {
    outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            NewJob::new(
                &work(&db.name, o),
                EnqueueOptions::group(format!("g{}", i % 3)),
            )
        })
        .collect::<pgfifo::Result<_>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_succeeds_fires_success_and_complete_once_with_its_counts() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let batch = with_all_callbacks(&db)
        .enqueue(&mut conn, jobs(&db, &["ok"; 6]))
        .await
        .unwrap();
    assert_eq!(batch.job_ids.len(), 6);
    let runner = db.start_runner(test_config()).await;
    wait_reports(&db, 2).await;
    // Nothing else is coming: every callback has its job, and both ran.
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE kind LIKE '%BatchesReport' AND state = 'succeeded'",
        2,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        events(&db),
        ["success", "complete"],
        "in that order, once each"
    );
    for (_, summary) in reports(&db) {
        let p = &summary.progress;
        assert_eq!(
            (p.total, p.succeeded, p.failed, p.cancelled, p.pending),
            (6, 6, 0, 0, 0)
        );
        assert_eq!(summary.job_ids("succeeded"), batch.job_ids);
    }
    let summary = batch::summary(&mut conn, batch.id).await.unwrap().unwrap();
    assert_eq!(summary.progress.state, batch::BatchState::Completed);
    let fired: Vec<_> = summary
        .callbacks
        .iter()
        .map(|c| (c.event.as_str(), c.job_id.is_some()))
        .collect();
    assert_eq!(
        fired,
        [("failure", false), ("success", true), ("complete", true)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_cancels_fire_failure_and_complete_not_success() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let batch = with_all_callbacks(&db)
        .enqueue(
            &mut conn,
            jobs(&db, &["ok", "fail", "ok", "cancel", "fail", "ok"]),
        )
        .await
        .unwrap();
    let runner = db.start_runner(test_config()).await;
    wait_reports(&db, 2).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE kind LIKE '%BatchesReport' AND state <> 'succeeded'",
        0,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
    let got = reports(&db);
    assert_eq!(events(&db), ["failure", "complete"]);
    let (_, complete) = &got[1];
    let p = &complete.progress;
    assert_eq!((p.total, p.succeeded, p.failed, p.cancelled), (6, 3, 2, 1));
    assert_eq!(
        complete.job_ids("failed"),
        [batch.job_ids[1], batch.job_ids[4]]
    );
    assert_eq!(complete.job_ids("cancelled"), [batch.job_ids[3]]);
    assert!(got[0].1.progress.failed >= 1, "failure saw a failed job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_batch_takes_jobs_from_a_handler_and_completes_after_close() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let parent = BatchesWork {
        db: db.name.clone(),
        outcome: "ok".into(),
        children: 3,
    };
    let batch = Batch::new()
        .keep_open()
        .on_complete(report(&db, "complete"))
        .enqueue(
            &mut conn,
            [NewJob::new(&parent, EnqueueOptions::group("p")).unwrap()],
        )
        .await
        .unwrap();
    let runner = db.start_runner(test_config()).await;
    wait_reports(&db, 1).await;
    runner.shutdown().await.unwrap();
    let got = reports(&db);
    assert_eq!(events(&db), ["complete"]);
    let p = &got[0].1.progress;
    assert_eq!(
        (p.total, p.succeeded),
        (4, 4),
        "the parent and its three children"
    );
    assert!(p.closed_at.is_some());
    assert_eq!(got[0].1.jobs[0].id, batch.job_ids[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_completes_when_it_is_closed() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let open = with_all_callbacks(&db)
        .keep_open()
        .enqueue(&mut conn, [])
        .await
        .unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.batch_callback WHERE job_id IS NOT NULL")
            .await,
        0,
        "an open batch does not complete"
    );
    assert!(batch::close(&mut conn, open.id).await.unwrap());
    assert!(
        !batch::close(&mut conn, open.id).await.unwrap(),
        "closed already"
    );
    // Closed at once: completes in its enqueue.
    let closed = with_all_callbacks(&db)
        .enqueue(&mut conn, [])
        .await
        .unwrap();
    for id in [open.id, closed.id] {
        let s = batch::summary(&mut conn, id).await.unwrap().unwrap();
        let fired: Vec<_> = s
            .callbacks
            .iter()
            .filter(|c| c.job_id.is_some())
            .map(|c| c.event.as_str())
            .collect();
        assert_eq!(fired, ["success", "complete"], "batch {id}");
        assert!(s.progress.completed_at.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_retry_and_cancel_correct_the_counts_and_fire_nothing_twice() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let delayed = NewJob::new(
        &work(&db.name, "ok"),
        EnqueueOptions::group("later").run_in(Duration::from_secs(3600)),
    )
    .unwrap();
    let mut all = jobs(&db, &["fail", "ok"]);
    all.push(delayed);
    let batch = with_all_callbacks(&db)
        .enqueue(&mut conn, all)
        .await
        .unwrap();
    let runner = db.start_runner(test_config()).await;
    wait_reports(&db, 1).await;
    assert_eq!(events(&db), ["failure"]);
    // The operator cancels the delayed job: the batch completes.
    admin::cancel_job(&mut conn, batch.job_ids[2], None)
        .await
        .unwrap();
    wait_reports(&db, 2).await;
    assert_eq!(events(&db), ["failure", "complete"]);
    // A retry of the failed job: it no longer counts as failed; when it
    // fails again it counts again, and nothing fires twice.
    admin::retry_jobs(&mut conn, &[batch.job_ids[0]])
        .await
        .unwrap();
    let s = batch::summary(&mut conn, batch.id).await.unwrap().unwrap();
    assert_eq!((s.progress.failed, s.progress.pending), (0, 1));
    assert_eq!(
        s.progress.state,
        batch::BatchState::Completed,
        "completed stays"
    );
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {} AND state = 'failed'",
            batch.job_ids[0]
        ),
        1,
        LIMIT,
    )
    .await;
    let s = batch::summary(&mut conn, batch.id).await.unwrap().unwrap();
    assert_eq!(
        (
            s.progress.succeeded,
            s.progress.failed,
            s.progress.cancelled
        ),
        (1, 1, 1)
    );
    runner.shutdown().await.unwrap();
    assert_eq!(events(&db), ["failure", "complete"], "nothing fired twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_held_after_failing_counts_as_failed_once_even_when_skipped() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_failure_policy(&mut conn, "batches", admin::FailurePolicy::Hold)
        .await
        .unwrap();
    let in_group =
        |o: &str| NewJob::new(&work(&db.name, o), EnqueueOptions::group("held")).unwrap();
    let batch = with_all_callbacks(&db)
        .enqueue(&mut conn, [in_group("fail"), in_group("ok")])
        .await
        .unwrap();
    let runner = db.start_runner(test_config()).await;
    // The failed head holds its group: the batch has a failure, not its end.
    wait_reports(&db, 1).await;
    assert_eq!(events(&db), ["failure"]);
    let s = batch::summary(&mut conn, batch.id).await.unwrap().unwrap();
    assert_eq!((s.progress.failed, s.progress.pending), (1, 1));
    // Skipping the held head counts nothing twice; the group goes on.
    let skipped = admin::skip_head(&mut conn, "batches", "held", None)
        .await
        .unwrap();
    assert_eq!(skipped, Some(batch.job_ids[0]));
    wait_reports(&db, 2).await;
    runner.shutdown().await.unwrap();
    assert_eq!(events(&db), ["failure", "complete"]);
    let s = batch::summary(&mut conn, batch.id).await.unwrap().unwrap();
    let p = &s.progress;
    assert_eq!((p.total, p.succeeded, p.failed, p.pending), (2, 1, 1, 0));
}

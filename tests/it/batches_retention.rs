//! Retention of batches (`admin::clean_batches`, called by runners'
//! retention): a completed batch goes once its jobs and its callbacks' jobs
//! were purged, with its counts, members and callbacks; a batch with a job
//! left, or not completed, stays.

use std::time::Duration;

use pgfifo::admin::{self, FinishedState};
use pgfifo::{async_trait, Batch, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

/// Never run here: the jobs end by an operator's cancel.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "batch_retention")]
struct RetainedJob;

#[async_trait]
impl Handler for RetainedJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn jobs(groups: &[&str]) -> Vec<NewJob> {
    groups
        .iter()
        .map(|g| NewJob::new(&RetainedJob, EnqueueOptions::group(*g)))
        .collect::<pgfifo::Result<_>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_goes_once_retention_purged_its_jobs_and_callbacks() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let callback = NewJob::new(&RetainedJob, EnqueueOptions::group("report")).unwrap();
    let done = Batch::new()
        .on_complete(callback)
        .enqueue(&mut conn, jobs(&["a", "b"]))
        .await
        .unwrap();
    let running = Batch::new()
        .enqueue(&mut conn, jobs(&["c", "d"]))
        .await
        .unwrap();
    for id in done.job_ids.iter().chain(&running.job_ids[..1]) {
        admin::cancel_job(&mut conn, *id, None).await.unwrap();
    }
    let summary = admin::batch(&mut conn, done.id).await.unwrap().unwrap();
    assert!(summary.progress.completed_at.is_some());
    let fired = summary.callbacks[0]
        .job_id
        .expect("the complete callback fired");

    // The callback's job is still there: the batch stays.
    assert!(
        admin::purge(&mut conn, Duration::ZERO, &[FinishedState::Cancelled])
            .await
            .unwrap()
            >= 3
    );
    assert_eq!(admin::clean_batches(&mut conn, 100).await.unwrap(), 0);
    assert!(admin::batch(&mut conn, done.id).await.unwrap().is_some());

    // Once it is purged too, the completed batch goes with its rows; the
    // batch with a job left stays.
    admin::cancel_job(&mut conn, fired, None).await.unwrap();
    assert_eq!(
        admin::purge(&mut conn, Duration::ZERO, &[FinishedState::Cancelled])
            .await
            .unwrap(),
        1
    );
    assert_eq!(admin::clean_batches(&mut conn, 100).await.unwrap(), 1);
    assert!(admin::batch(&mut conn, done.id).await.unwrap().is_none());
    for table in ["batch_shard", "batch_job", "batch_callback"] {
        assert_eq!(
            db.scalar(&format!(
                "SELECT count(*) FROM pgfifo.{table} WHERE batch_id = {}",
                done.id
            ))
            .await,
            0,
            "{table}"
        );
    }
    let left = admin::batch(&mut conn, running.id).await.unwrap().unwrap();
    assert_eq!((left.progress.cancelled, left.progress.pending), (1, 1));
    assert_eq!(admin::clean_batches(&mut conn, 100).await.unwrap(), 0);
}

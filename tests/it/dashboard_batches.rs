//! The dashboard's batch pages (`/batches`, `/batches/{id}`): a batch's
//! progress before and after its jobs end, its callback's job once the
//! event fired, the filter of unfinished batches, escaping of the
//! description, and a 404 for an unknown batch.

use axum::http::StatusCode;
use pgfifo::{
    admin, async_trait, dashboard, Batch, EnqueueOptions, Handler, Job, JobContext, JobError,
    NewJob,
};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

use crate::dashboard_support::Client;

const SCRIPT: &str = "<script>alert(1)</script>";

/// Never run here: the jobs end by an operator's cancel.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "dash_batches")]
struct DashBatchJob;

#[async_trait]
impl Handler for DashBatchJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_pages_show_progress_callbacks_and_escape_data() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let jobs = ["a", "b"]
        .iter()
        .map(|g| NewJob::new(&DashBatchJob, EnqueueOptions::group(*g)))
        .collect::<pgfifo::Result<Vec<_>>>()
        .unwrap();
    let callback = NewJob::new(&DashBatchJob, EnqueueOptions::group("report")).unwrap();
    let batch = Batch::new()
        .description(format!("close {SCRIPT}"))
        .on_complete(callback)
        .enqueue(&mut conn, jobs)
        .await
        .unwrap();
    let mut client = Client::new(dashboard::router(db.pool.clone()));

    let list = client.get("/batches").await;
    assert_eq!(list.status, StatusCode::OK);
    assert!(
        list.body
            .contains(&format!("href=\"/batches/{}\"", batch.id)),
        "{}",
        list.body
    );
    assert!(!list.body.contains(SCRIPT), "the description is escaped");
    assert!(list.body.contains("&lt;script&gt;"), "{}", list.body);
    let unfinished = client.get("/batches?unfinished=true").await;
    assert!(unfinished.body.contains(&format!("/batches/{}", batch.id)));

    let page = client.get(&format!("/batches/{}", batch.id)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("0 of 2 ended"), "{}", page.body);
    assert!(page.body.contains("not fired"), "{}", page.body);
    assert!(!page.body.contains(SCRIPT));
    for id in &batch.job_ids {
        assert!(
            page.body.contains(&format!("/jobs/{id}")),
            "job {id} listed"
        );
    }

    // Both jobs end (an operator cancels them): the batch completes and its
    // callback is enqueued.
    for id in &batch.job_ids {
        admin::cancel_job(&mut conn, *id, Some("not needed"))
            .await
            .unwrap();
    }
    let summary = admin::batch(&mut conn, batch.id).await.unwrap().unwrap();
    let fired = summary.callbacks[0]
        .job_id
        .expect("the complete callback fired");
    let page = client.get(&format!("/batches/{}", batch.id)).await;
    assert!(
        page.body
            .contains("2 of 2 ended: 0 succeeded, 0 failed, 2 cancelled"),
        "{}",
        page.body
    );
    assert!(page.body.contains("completed"), "{}", page.body);
    assert!(
        page.body.contains(&format!("/jobs/{fired}")),
        "{}",
        page.body
    );
    let unfinished = client.get("/batches?unfinished=true").await;
    assert!(
        !unfinished
            .body
            .contains(&format!("/batches/{}\"", batch.id)),
        "{}",
        unfinished.body
    );

    let job = client.get(&format!("/jobs/{}", batch.job_ids[0])).await;
    assert!(
        job.body
            .contains(&format!("href=\"/batches/{}\"", batch.id)),
        "a job's page links to its batch: {}",
        job.body
    );

    let missing = client.get("/batches/999999999").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let bad = client.get("/batches?before=soon").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

//! Why a dependent waits, as the admin API and the dashboard show it:
//! "waiting for jobs 17 and 18", "waiting for batch 5", and, held by a
//! failed dependency, "held: dependency job 17 failed".

use axum::http::StatusCode;
use pgfifo::admin::{self, GroupState, JobStatus};
use pgfifo::{
    async_trait, dashboard, Batch, DependencyFailure, EnqueueOptions, Handler, Job, JobContext,
    JobError, NewJob,
};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

use crate::dashboard_support::Client;

/// Never run here.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "dependencies_views")]
struct DependenciesViewJob;

#[async_trait]
impl Handler for DependenciesViewJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn job(options: EnqueueOptions) -> NewJob {
    NewJob::new(&DependenciesViewJob, options).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_views_say_what_a_dependent_waits_for() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(
        &mut conn,
        [
            job(EnqueueOptions::group("a")),
            job(EnqueueOptions::group("b")),
        ],
    )
    .await
    .unwrap();
    let (x, y) = (ids[0], ids[1]);
    let batch = Batch::new()
        .enqueue(&mut conn, [job(EnqueueOptions::group("c"))])
        .await
        .unwrap();
    let d = pgfifo::enqueue_batch(
        &mut conn,
        [job(EnqueueOptions::group("d")
            .depends_on([y, x])
            .after_batch(batch.id))],
    )
    .await
    .unwrap()[0];
    let held = EnqueueOptions::group("h")
        .depends_on([x])
        .on_dependency_failure(DependencyFailure::Hold);
    let h = pgfifo::enqueue_batch(&mut conn, [job(held)]).await.unwrap()[0];
    admin::cancel_job(&mut conn, x, Some("no longer needed"))
        .await
        .unwrap();
    // (The cancel decided both: d is cancelled, h held.)
    assert_eq!(db.job_state(d).await, "cancelled 0");

    let detail = admin::job(&mut conn, h).await.unwrap().unwrap();
    assert_eq!(detail.summary.status, JobStatus::Waiting);
    let wait = detail.dependency_wait.expect("h waits");
    assert_eq!(wait.to_string(), format!("held: dependency job {x} failed"));

    // A fresh dependent of y and the batch.
    let e = pgfifo::enqueue_batch(
        &mut conn,
        [job(EnqueueOptions::group("e")
            .depends_on([y])
            .after_batch(batch.id))],
    )
    .await
    .unwrap()[0];
    let detail = admin::job(&mut conn, e).await.unwrap().unwrap();
    let reason = format!("waiting for job {y} and batch {}", batch.id);
    assert_eq!(detail.dependency_wait.unwrap().to_string(), reason);
    // The group's view, once a runner's promote made it active.
    db.exec("SELECT * FROM pgfifo.promote(ARRAY['dependencies_views'], 100)")
        .await;
    let group = admin::group(&mut conn, "dependencies_views", "e")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(group.state, GroupState::Waiting);
    assert_eq!(group.dependency_wait.unwrap().to_string(), reason);
    drop(conn);

    let mut client = Client::new(dashboard::router(db.pool.clone()));
    let page = client.get(&format!("/jobs/{e}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(&reason), "{}", page.body);
    assert!(page.body.contains(&format!("/jobs/{y}")), "{}", page.body);
    let page = client.get("/queues/dependencies_views/groups/e").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(&reason), "{}", page.body);
    let page = client.get("/queues/dependencies_views/groups/h").await;
    assert!(
        page.body
            .contains(&format!("held: dependency job {x} failed")),
        "{}",
        page.body
    );
}

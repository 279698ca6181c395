use std::time::Duration;

use pgfifo::{EnqueueOptions, NewJob};
use pgfifo_tests::{test_config, TestDb};

use crate::jobs::{LogJob, LOG_TABLE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_once_each_in_group_order() {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    let mut jobs = Vec::new();
    for seq in 0..30 {
        for group in ["a", "b", "c"] {
            let job = LogJob {
                group: group.into(),
                seq,
                sleep_ms: 1,
            };
            jobs.push(NewJob::new(&job, EnqueueOptions::group(group)).unwrap());
        }
    }
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    drop(conn);
    assert_eq!(ids.len(), 90);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids follow input order"
    );

    let runner = db.start_runner(test_config().concurrency(4)).await;
    db.wait_succeeded(90, Duration::from_secs(30)).await;
    runner.shutdown().await.unwrap();

    assert_eq!(db.scalar("SELECT count(*) FROM test_log").await, 90);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT (grp, seq)) FROM test_log")
            .await,
        90
    );
    let disorder = db.scalar(
        "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY grp ORDER BY started_ns) AS prev FROM test_log) s WHERE prev > seq",
    ).await;
    assert_eq!(disorder, 0);
}

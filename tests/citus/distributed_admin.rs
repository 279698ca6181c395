//! An operator's actions on the distributed layout, with a runner: cancel
//! a queued job, skip a held group's failed head, retry a failed job, and
//! pause a whole queue.

use pgfifo::admin::{FailurePolicy, RetryResult};
use pgfifo::migrate::Layout;
use pgfifo_tests::test_config;

use crate::coordinator::{cluster_with, count, job, wait_for};
use crate::jobs::failing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn cancel_skip_head_retry_and_queue_pause_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();

    // The queue paused first: nothing runs until it is resumed.
    assert!(pgfifo::admin::pause_queue(&mut conn, "citus")
        .await
        .expect("pause the queue"));
    pgfifo::admin::set_failure_policy(&mut conn, "citus", FailurePolicy::Hold)
        .await
        .expect("policy");
    // Group "c": its second job is cancelled before it runs. Group "held":
    // its head fails for good and holds it. Group "r": under 'hold' too,
    // its head fails for good and is retried by the operator.
    let ids = pgfifo::enqueue_batch(
        &mut conn,
        [
            job("c", 0, false),
            job("c", 1, false),
            job("c", 2, false),
            failing("held", 0),
            job("held", 1, false),
            failing("r", 0),
            job("r", 1, false),
        ],
    )
    .await
    .expect("enqueue");
    pgfifo::admin::cancel_job(&mut conn, ids[1], Some("not wanted"))
        .await
        .expect("cancel a queued job");

    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().concurrency(4))
        .await
        .expect("runner");
    // Paused: the runner makes the groups active (promote), and its lanes,
    // woken for them and polling every 100 ms, start nothing in five polls.
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.queue_group WHERE queue = 'citus' AND ready_at IS NOT NULL",
        3,
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM citus_log").await,
        0,
        "a job of a paused queue ran"
    );
    assert!(pgfifo::admin::resume_queue(&mut conn, "citus")
        .await
        .expect("resume the queue"));
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'failed'",
        2,
    )
    .await;
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE group_id = 'c' AND state = 'succeeded'",
        2,
    )
    .await;
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id = {} AND state = 'cancelled'",
                ids[1]
            )
        )
        .await,
        1
    );

    // Skip the held group's failed head: the job behind it runs.
    let skipped = pgfifo::admin::skip_head(&mut conn, "citus", "held", Some("skipped"))
        .await
        .expect("skip head");
    assert_eq!(skipped, Some(ids[3]));
    // Retry group r's failed head: its second attempt succeeds, then the
    // job behind it.
    let retried = pgfifo::admin::retry_jobs(&mut conn, &[ids[5], ids[0], i64::MAX])
        .await
        .expect("retry");
    let results: Vec<(i64, RetryResult)> = retried.iter().map(|r| (r.id, r.result)).collect();
    assert!(
        results.contains(&(ids[5], RetryResult::Retried)),
        "{results:?}"
    );
    assert!(
        results.contains(&(ids[0], RetryResult::NotFailed)),
        "{results:?}"
    );
    assert!(
        results.contains(&(i64::MAX, RetryResult::Missing)),
        "{results:?}"
    );
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE group_id IN ('held', 'r') AND state = 'succeeded'",
        3,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY grp ORDER BY started_at) AS prev
                 FROM citus_log) s WHERE prev >= seq"
        )
        .await,
        0,
        "a group ran out of order"
    );
}

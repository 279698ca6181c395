//! Group concurrency N and the failure policy 'hold' on the cluster, with
//! pgfifo unchanged on the coordinator (see `coordinator`) and on the
//! distributed layout (more of the group limits there in
//! `distributed_controls`).

use pgfifo::admin::FailurePolicy;
use pgfifo::migrate::Layout;
use pgfifo::{EnqueueOptions, GroupLimits, NewJob};
use pgfifo_tests::test_config;

use crate::coordinator::{cluster_with, count, job, wait_for};
use crate::jobs::LogJob;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn group_concurrency_three_and_a_held_group() {
    limits_and_hold(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_same_on_the_distributed_layout() {
    limits_and_hold(Layout::Distributed).await;
}

async fn limits_and_hold(layout: Layout) {
    let (cluster, mut conn) = cluster_with(layout).await;
    let url = cluster.url();

    // Group "wide" runs up to 3 jobs at once, in FIFO start order: no job
    // finishes before an older one has begun.
    pgfifo::admin::set_group_limits(
        &mut conn,
        "citus",
        "wide",
        GroupLimits::new().concurrency(3),
    )
    .await
    .expect("limits");
    let wide_jobs = 12;
    let wide = (0..wide_jobs).map(|seq| {
        let job = LogJob {
            group: "wide".into(),
            seq,
            fail_first: false,
            hold_ms: 100,
        };
        NewJob::new(&job, EnqueueOptions::group("wide")).expect("new job")
    });
    pgfifo::enqueue_batch(&mut conn, wide)
        .await
        .expect("enqueue");

    // Failure policy 'hold': group "held" fails its head for good (one
    // attempt allowed) and waits; group "free" goes on.
    pgfifo::admin::set_failure_policy(&mut conn, "citus", FailurePolicy::Hold)
        .await
        .expect("policy");
    let failing = LogJob {
        group: "held".into(),
        seq: 0,
        fail_first: true,
        hold_ms: 0,
    };
    let failing =
        NewJob::new(&failing, EnqueueOptions::group("held").max_attempts(1)).expect("new job");
    pgfifo::enqueue_batch(
        &mut conn,
        [failing, job("held", 1, false), job("free", 0, false)],
    )
    .await
    .expect("enqueue");

    let pool = pgfifo::connect(&url, 12).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().concurrency(8))
        .await
        .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued' AND group_id IN ('wide', 'held', 'free')",
        wide_jobs + 2,
    )
    .await;
    wide_checks(&mut conn).await;
    hold_checks(&mut conn, layout).await;

    // Back to 'continue': the held group is released and goes on.
    let released = pgfifo::admin::set_failure_policy(&mut conn, "citus", FailurePolicy::Continue)
        .await
        .expect("policy");
    assert_eq!(released, 1);
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE group_id = 'held' AND state = 'succeeded'",
        1,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
}

/// At most three of the wide group's jobs ran at once, two or more did,
/// and none ran through before an older one began.
async fn wide_checks(conn: &mut diesel_async::AsyncPgConnection) {
    let peak = count(
        conn,
        "SELECT max(c) FROM (SELECT (SELECT count(*) FROM citus_log b
             WHERE b.grp = a.grp AND b.started_at <= a.started_at AND b.ended_at > a.started_at) AS c
         FROM citus_log a WHERE a.grp = 'wide') s",
    )
    .await;
    assert!(
        peak <= 3,
        "{peak} jobs of a group of concurrency 3 ran at once"
    );
    assert!(
        peak >= 2,
        "a group of concurrency 3 never ran two jobs at once"
    );
    assert_eq!(
        count(
            conn,
            "SELECT count(*) FROM citus_log a JOIN citus_log b ON a.grp = b.grp AND a.seq < b.seq
             WHERE a.grp = 'wide' AND a.started_at >= b.ended_at"
        )
        .await,
        0,
        "a younger job of the wide group ran through before an older one began \
         (jobs picked a moment apart may begin their handlers in either order)"
    );
}

/// The held group's head failed for good, the job behind it never started,
/// and the other group ran.
async fn hold_checks(conn: &mut diesel_async::AsyncPgConnection, layout: Layout) {
    let same_part = match layout {
        Layout::Plain => "",
        Layout::Distributed => "a.part = j.part AND",
    };
    assert_eq!(
        count(
            conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'held' AND state = 'failed'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job j WHERE group_id = 'held' AND state = 'queued'
                   AND NOT EXISTS (SELECT 1 FROM pgfifo.job_attempt a
                                   WHERE {same_part} a.job_id = j.id)"
            )
        )
        .await,
        1,
        "the job behind a held group's failed head started"
    );
    assert_eq!(
        count(
            conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'free' AND state = 'succeeded'"
        )
        .await,
        1,
        "another group stopped with the held one"
    );
}

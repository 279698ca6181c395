//! Retention on the distributed layout: `admin::purge` deletes old
//! finished jobs from every shard with their attempt records and keeps a
//! held group's failed head, `admin::clean_groups` deletes idle groups
//! shard by shard with their orphaned snoozes, and a runner with
//! [`pgfifo::Retention`] makes those passes by itself.

use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy, FinishedState};
use pgfifo::migrate::Layout;
use pgfifo::{NewJob, Retention};
use pgfifo_tests::test_config;

use crate::coordinator::{cluster_with, count, job, wait_for};
use crate::jobs::{failing, log_job};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn purge_and_clean_groups_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();
    admin::set_failure_policy(&mut conn, "citus", FailurePolicy::Hold)
        .await
        .expect("policy");
    // 30 groups of 3 jobs (on both workers), a held group, 4 ungrouped.
    let mut batch: Vec<NewJob> = (0..90)
        .map(|k| job(&format!("o{:02}", k % 30), k / 30, false))
        .collect();
    batch.extend([failing("held", 0), job("held", 1, false)]);
    batch.extend((0..4).map(|k| log_job(None, k, 3, None)));
    let ids = pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .expect("enqueue");
    let held_head = ids[90];
    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let runner = pgfifo::runner::start(pool.clone(), test_config().concurrency(4))
        .await
        .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state IN ('succeeded', 'failed')",
        95,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job_attempt").await,
        95
    );

    // Nothing is old enough yet.
    let day = Duration::from_secs(24 * 3600);
    let states = [FinishedState::Succeeded, FinishedState::Failed];
    assert_eq!(
        admin::purge(&mut conn, day, &states).await.expect("purge"),
        0
    );
    // Two days old: every finished job goes but the held group's head.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE pgfifo.job SET finished_at = now() - interval '2 days' WHERE finished_at IS NOT NULL",
        ),
        &mut conn,
    )
    .await
    .expect("age the jobs");
    // Trace contexts of three of them, and of the held head: they go with
    // their jobs, and stay with the head.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(format!(
            "INSERT INTO pgfifo.job_trace (job_id, traceparent, part)
             SELECT id, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', part
             FROM pgfifo.job WHERE group_id = 'o00' OR id = {held_head}"
        )),
        &mut conn,
    )
    .await
    .expect("trace contexts");
    assert_eq!(
        admin::purge(&mut conn, day, &states).await.expect("purge"),
        94
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job_trace").await,
        1,
        "the held head's trace context stays, the others went with their jobs"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job").await,
        2,
        "the held head and the job behind it stay"
    );
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) FROM pgfifo.job WHERE id = {held_head} AND state = 'failed'")
        )
        .await,
        1
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job_attempt").await,
        1,
        "only the held head's attempt is left"
    );

    // Idle groups: the 30 drained ones, not the held one; a snooze left by
    // a group that is gone goes with them.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE pgfifo.queue_group SET idle_since = now() - interval '2 hours'
             WHERE head_id IS NULL;
             ",
        ),
        &mut conn,
    )
    .await
    .expect("age the groups");
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "INSERT INTO pgfifo.group_snooze (queue, group_id, until, job_id, part)
             VALUES ('citus', 'gone', now(), 1, pgfifo.part_of('citus', 'gone'))",
        ),
        &mut conn,
    )
    .await
    .expect("an orphaned snooze");
    let hour = Duration::from_secs(3600);
    assert_eq!(
        admin::clean_groups(&mut conn, hour, 20)
            .await
            .expect("clean"),
        20
    );
    assert_eq!(
        admin::clean_groups(&mut conn, hour, 20)
            .await
            .expect("clean"),
        10
    );
    assert_eq!(
        admin::clean_groups(&mut conn, hour, 20)
            .await
            .expect("clean"),
        0
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.queue_group").await,
        1,
        "the held group stays"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.group_snooze").await,
        0
    );

    // A runner with retention: new jobs, drained, aged, purged by it.
    let more: Vec<NewJob> = (0..20)
        .map(|k| job(&format!("n{:02}", k % 10), k / 10, false))
        .collect();
    pgfifo::enqueue_batch(&mut conn, more)
        .await
        .expect("enqueue");
    let runner = pgfifo::runner::start(
        pool,
        test_config().concurrency(4).retention(
            Retention::default()
                .finished_after(day)
                .interval(Duration::from_millis(200)),
        ),
    )
    .await
    .expect("a runner with retention on the distributed layout");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        20,
    )
    .await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE pgfifo.job SET finished_at = now() - interval '2 days' WHERE state = 'succeeded'",
        ),
        &mut conn,
    )
    .await
    .expect("age the jobs");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        0,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job").await,
        2,
        "the held group's jobs stay"
    );
}

//! What an operator reads on the distributed layout: the admin API's
//! status, group and job listings, one job with its attempts, runners and
//! throughput, and every page of the dashboard, over a queue with a held
//! group, a paused one, a delayed job, finished and failed jobs and an
//! ungrouped job.

use std::time::Duration;

use axum::http::StatusCode;
use pgfifo::admin::{self, FailurePolicy, GroupOrder, GroupQuery, GroupState, JobQuery};
use pgfifo::migrate::Layout;
use pgfifo_tests::test_config;

use crate::coordinator::{cluster_with, job, wait_for};
use crate::dashboard_support::Client;
use crate::jobs::log_job;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn status_listings_and_dashboard_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();
    admin::set_failure_policy(&mut conn, "citus", FailurePolicy::Hold)
        .await
        .expect("policy");
    assert!(admin::pause_group(&mut conn, "citus", "paused")
        .await
        .expect("pause a group"));
    let ids = pgfifo::enqueue_batch(
        &mut conn,
        [
            job("ok", 0, false),
            job("ok", 1, false),
            log_job(Some("held"), 0, 1, None),
            job("held", 1, false),
            job("paused", 0, false),
            job("paused", 1, false),
            log_job(Some("later"), 0, 3, Some(Duration::from_secs(3600))),
            log_job(None, 0, 3, None),
        ],
    )
    .await
    .expect("enqueue");
    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let runner = pgfifo::runner::start(pool.clone(), test_config().concurrency(4))
        .await
        .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state IN ('succeeded', 'failed')",
        4,
    )
    .await;
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.queue_group
         WHERE queue = 'citus' AND group_id = 'held' AND ready_at IS NULL AND head_id IS NOT NULL",
        1,
    )
    .await;

    // Status: one queue, its counts and blocked groups.
    // (The runner's queues are listed too: it takes every queue of the
    // suite's job types.)
    let status = admin::status(&mut conn, None, 5).await.expect("status");
    let queue = status
        .iter()
        .find(|q| q.queue == "citus")
        .unwrap_or_else(|| panic!("no queue citus in {status:?}"));
    assert_eq!(queue.queued.value, 4, "{queue:?}");
    let backlogs: Vec<_> = queue
        .largest_backlogs
        .iter()
        .map(|b| (b.group.as_str(), b.backlog))
        .collect();
    assert_eq!(
        backlogs,
        [("paused", 2), ("held", 1), ("later", 1)],
        "{queue:?}"
    );
    assert_eq!(queue.failed.value, 1, "{queue:?}");
    assert_eq!(queue.blocked_groups.held, 1, "{queue:?}");
    assert_eq!(queue.blocked_groups.paused, 1, "{queue:?}");
    assert_eq!(queue.runners, 1, "{queue:?}");
    // The estimates of the final states, once the job table's shards are
    // analyzed (autovacuum may have done it already): each worker's
    // shards' figures added up (small shards, as here, counted).
    diesel_async::RunQueryDsl::execute(diesel::sql_query("ANALYZE pgfifo.job"), &mut conn)
        .await
        .expect("analyze");
    let status = admin::status(&mut conn, None, 5).await.expect("status");
    let queue = status
        .iter()
        .find(|q| q.queue == "citus")
        .expect("queue citus");
    let estimate = |c: &Option<admin::Count>| c.as_ref().map(|c| (c.value, c.exact));
    assert_eq!(estimate(&queue.succeeded), Some((3, false)), "{queue:?}");
    assert_eq!(estimate(&queue.cancelled), Some((0, false)), "{queue:?}");

    // Groups, in each order, and the blocked ones.
    for order in [
        GroupOrder::Name,
        GroupOrder::OldestHead,
        GroupOrder::Backlog,
    ] {
        let groups = admin::groups(
            &mut conn,
            "citus",
            &GroupQuery {
                order,
                ..GroupQuery::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("groups by {order:?}: {e}"));
        assert!(!groups.is_empty(), "{order:?}");
    }
    let blocked = admin::groups(
        &mut conn,
        "citus",
        &GroupQuery {
            blocked_only: true,
            ..GroupQuery::default()
        },
    )
    .await
    .expect("blocked groups");
    let names: Vec<_> = blocked.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["held", "paused"], "{blocked:?}");
    // By oldest head: the held group (the paused one has no head: no
    // runner made it active).
    let by_lag = admin::groups(
        &mut conn,
        "citus",
        &GroupQuery {
            order: GroupOrder::OldestHead,
            blocked_only: true,
            ..GroupQuery::default()
        },
    )
    .await
    .expect("blocked groups by oldest head");
    assert!(by_lag.iter().any(|g| g.group == "held"), "{by_lag:?}");
    let held = admin::group(&mut conn, "citus", "held")
        .await
        .expect("group")
        .expect("the held group");
    assert_eq!(held.state, GroupState::Held, "{held:?}");
    assert_eq!(held.head, Some(ids[2]), "{held:?}");

    // Jobs: all, by queue and group, by state; one job and its attempt.
    let all = admin::jobs(&mut conn, &JobQuery::default())
        .await
        .expect("jobs");
    assert_eq!(all.len(), ids.len(), "{all:?}");
    let of_group = admin::jobs(
        &mut conn,
        &JobQuery {
            queue: Some("citus".into()),
            group: Some("ok".into()),
            ..JobQuery::default()
        },
    )
    .await
    .expect("a group's jobs");
    assert_eq!(of_group.len(), 2);
    let history = admin::group_history(&mut conn, "citus", "ok", 10)
        .await
        .expect("history");
    assert_eq!(history.len(), 2);
    let failed = admin::job(&mut conn, ids[2])
        .await
        .expect("job")
        .expect("the failed job");
    assert_eq!(failed.attempt_log.len(), 1, "{failed:?}");
    assert!(admin::job(&mut conn, i64::MAX)
        .await
        .expect("job")
        .is_none());
    let runners = admin::runners(&mut conn).await.expect("runners");
    assert_eq!(runners.len(), 1);
    // The runner adds its finished jobs to the minute's counts with its
    // heartbeat.
    wait_for(
        &url,
        "SELECT coalesce(sum(succeeded), 0)::bigint FROM pgfifo.queue_minute WHERE queue = 'citus'",
        3,
    )
    .await;
    let minutes = admin::throughput(&mut conn).await.expect("throughput");
    let citus: Vec<_> = minutes.iter().filter(|m| m.queue == "citus").collect();
    assert_eq!(
        citus.iter().map(|m| m.failed).sum::<i64>(),
        1,
        "{minutes:?}"
    );

    // The runner's gauges: the unfinished jobs, and the blocked groups.
    let gauges = admin::gauges(&mut conn, &["citus".to_owned()])
        .await
        .expect("gauges");
    assert_eq!(gauges[0].depth, 4, "{gauges:?}");
    assert_eq!(gauges[0].blocked_groups, 2, "{gauges:?}");

    // The dashboard: every page answers.
    let mut client = Client::new(pgfifo::dashboard::router(pool.clone()));
    for path in [
        "/".to_owned(),
        "/queues/citus".to_owned(),
        "/queues/citus?blocked=1".to_owned(),
        "/queues/citus?sort=lag".to_owned(),
        "/queues/citus?sort=backlog".to_owned(),
        "/queues/citus/failed".to_owned(),
        "/queues/citus/groups/held".to_owned(),
        "/queues/citus/groups/paused".to_owned(),
        format!("/jobs/{}", ids[2]),
        format!("/jobs/{}", ids[7]),
        "/batches".to_owned(),
    ] {
        let page = client.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
    }
    let overview = client.get("/").await.body;
    assert!(overview.contains("1 held"), "{overview}");
    let group = client.get("/queues/citus/groups/held").await.body;
    assert!(
        group.contains(&format!(
            "head job {} failed for good (1/1 attempts)",
            ids[2]
        )),
        "{group}"
    );
    assert!(
        group.contains(&format!("/jobs/{}", ids[3])),
        "the next job is listed"
    );
    let blocked = client.get("/queues/citus?blocked=1").await.body;
    assert!(
        blocked.contains("/groups/held") && blocked.contains("/groups/paused"),
        "{blocked}"
    );
    assert!(!blocked.contains("/groups/ok"), "{blocked}");
    runner.shutdown().await.expect("shutdown");

    // A group paused while its head waits to run (no runner has parked it
    // yet) is blocked too, in each order.
    pgfifo::enqueue_batch(&mut conn, [job("p2", 0, false)])
        .await
        .expect("enqueue");
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("SELECT * FROM pgfifo.promote(ARRAY['citus'], 100)"),
        &mut conn,
    )
    .await
    .expect("promote");
    assert!(admin::pause_group(&mut conn, "citus", "p2")
        .await
        .expect("pause"));
    for order in [
        GroupOrder::Name,
        GroupOrder::OldestHead,
        GroupOrder::Backlog,
    ] {
        let blocked = admin::groups(
            &mut conn,
            "citus",
            &GroupQuery {
                order,
                blocked_only: true,
                ..GroupQuery::default()
            },
        )
        .await
        .expect("blocked groups");
        let p2 = blocked
            .iter()
            .find(|g| g.group == "p2")
            .unwrap_or_else(|| panic!("p2 not blocked by {order:?}: {blocked:?}"));
        assert!(p2.head.is_some() && p2.paused_at.is_some(), "{p2:?}");
    }
}

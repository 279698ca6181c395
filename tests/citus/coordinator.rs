//! pgfifo unchanged on a Citus coordinator: the application points its URL
//! at the coordinator, `pgfifo::migrate` lays out the schema there (Citus
//! keeps the tables local to the coordinator and copies the schema and
//! functions to the workers), and the guarantees hold through the public
//! API: Citus being loaded changes nothing for pgfifo. The same tests run
//! on the distributed layout (`pgfifo::migrate::distribute`), where the
//! work spreads over the workers.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::migrate::Layout;
use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::citus::Cluster;
use pgfifo_tests::query::scalar;
use pgfifo_tests::{eventually, test_config};

use crate::jobs::{LogJob, LOG_TABLE};

const LIMIT: Duration = Duration::from_secs(120);

/// A started cluster with pgfifo migrated through the coordinator's URL and
/// the log table created.
pub(crate) async fn migrated_cluster() -> (Cluster, AsyncPgConnection) {
    cluster_with(Layout::Plain).await
}

/// The same with pgfifo's tables in `layout` (distributed: spread over the
/// workers by `pgfifo::migrate::distribute`).
pub(crate) async fn cluster_with(layout: Layout) -> (Cluster, AsyncPgConnection) {
    let cluster = Cluster::start().await.expect("start the Citus cluster");
    let mut conn = cluster.coordinator_conn().await.expect("coordinator");
    pgfifo::migrate::migrate_conn(&mut conn)
        .await
        .expect("migrate through the coordinator");
    if layout == Layout::Distributed {
        pgfifo::migrate::distribute(&mut conn)
            .await
            .expect("distribute");
    }
    conn.batch_execute(LOG_TABLE).await.expect("log table");
    (cluster, conn)
}

/// The join of a job's attempts to the job, in `layout`: by part too when
/// distributed (Citus joins distributed tables on their distribution
/// column).
fn attempts_of_jobs(layout: Layout) -> &'static str {
    match layout {
        Layout::Plain => "pgfifo.job_attempt a JOIN pgfifo.job j ON j.id = a.job_id",
        Layout::Distributed => {
            "pgfifo.job_attempt a JOIN pgfifo.job j ON j.part = a.part AND j.id = a.job_id"
        }
    }
}

pub(crate) async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    scalar(conn, sql).await
}

/// Waits until `sql` (a bigint) equals `expected`.
pub(crate) async fn wait_for(url: &str, sql: &str, expected: i64) {
    eventually(sql, LIMIT, || async {
        let mut conn = AsyncPgConnection::establish(url)
            .await
            .map_err(|e| e.to_string())?;
        let n = scalar(&mut conn, sql).await;
        if n == expected {
            Ok(())
        } else {
            Err(format!("{n}, not {expected}"))
        }
    })
    .await
}

pub(crate) fn job(group: &str, seq: i64, fail_first: bool) -> NewJob {
    let job = LogJob {
        group: group.to_owned(),
        seq,
        fail_first,
        hold_ms: 0,
    };
    NewJob::new(&job, EnqueueOptions::group(group)).expect("new job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn fifo_one_at_a_time_and_retries_holding_the_head_across_two_runners() {
    fifo_across_two_runners(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_same_on_the_distributed_layout() {
    fifo_across_two_runners(Layout::Distributed).await;
}

/// FIFO within a group, one job at a time per group and retries holding
/// the head, with two runners, in `layout`.
async fn fifo_across_two_runners(layout: Layout) {
    let (cluster, mut conn) = cluster_with(layout).await;
    let distributed = count(
        &mut conn,
        "SELECT count(*) FROM citus_tables WHERE table_name::text LIKE 'pgfifo.%'",
    )
    .await;
    match layout {
        Layout::Plain => assert_eq!(
            distributed, 0,
            "migrate distributed a table: this case is about the unchanged layout"
        ),
        Layout::Distributed => assert!(distributed >= 20, "{distributed} tables distributed"),
    }
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND shouldhaveshards"
        )
        .await,
        2,
        "the cluster has two workers"
    );

    // 12 groups × 15 jobs, interleaved; every fifth job fails its first
    // attempt, so its group must wait for its retry.
    let mut jobs = Vec::new();
    for seq in 0..15 {
        for g in 0..12 {
            jobs.push(job(&format!("g{g:02}"), seq, seq % 5 == 2));
        }
    }
    let ids = pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    assert_eq!(ids.len(), 180);

    // Two runners of their own pools, as two processes would have, with
    // concurrency 4 each: 8 workers for 12 groups.
    let url = cluster.url();
    // Citus's counts of single- and multi-shard statement executions, for
    // the drain alone (new sessions take the setting).
    conn.batch_execute(
        "ALTER DATABASE postgres SET citus.enable_stat_counters = on;
         SELECT citus_stat_counters_reset();",
    )
    .await
    .expect("stat counters");
    let mut runners = Vec::new();
    for name in ["citus-a", "citus-b"] {
        let pool = pgfifo::connect(&url, 8).await.expect("pool");
        runners.push(
            pgfifo::runner::start(pool, test_config().concurrency(4).name(name))
                .await
                .expect("start a runner"),
        );
    }
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        180,
    )
    .await;
    for runner in runners {
        runner.shutdown().await.expect("shutdown");
    }
    let executions = pgfifo_tests::query::text(
        &mut conn,
        "SELECT format('single_shard=%s multi_shard=%s', sum(query_execution_single_shard),
                       sum(query_execution_multi_shard))
         FROM citus_stat_counters(0)",
    )
    .await
    .unwrap_or_default();
    println!("citus drain ({layout:?} layout): 180 jobs, statement executions: {executions}");

    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM citus_log").await,
        180,
        "one committed run per job"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(DISTINCT job_id) FROM citus_log").await,
        180,
        "no job committed twice"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE attempts <> CASE WHEN (payload->>'fail_first')::boolean THEN 2 ELSE 1 END"
        )
        .await,
        0,
        "each job took one attempt, or two when its first failed"
    );
    // Order and exclusivity on the attempt records, which include the
    // failed attempts: within a group, each attempt starts after the one
    // before it ended (a failed attempt's end is on its record, the last
    // one's is the job's completion), and jobs start in enqueue (id) order.
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM (SELECT j.group_id, a.job_id, a.started_at,
                     lag(a.job_id) OVER w AS prev_id,
                     lag(coalesce(a.finished_at, j.finished_at)) OVER w AS prev_end
                 FROM {}
                 WINDOW w AS (PARTITION BY j.group_id ORDER BY a.started_at)) s
             WHERE prev_id > job_id OR prev_end > started_at OR prev_end IS NULL AND prev_id IS NOT NULL",
                attempts_of_jobs(layout)
            )
        )
        .await,
        0,
        "a group's attempts overlapped or started out of order"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM (SELECT seq, lag(seq) OVER w AS prev
                 FROM citus_log WINDOW w AS (PARTITION BY grp ORDER BY started_at)) s
             WHERE prev >= seq"
        )
        .await,
        0,
        "a group's committed runs are out of seq order"
    );
    assert!(
        count(
            &mut conn,
            "SELECT count(*) FROM citus_log a JOIN citus_log b ON a.grp < b.grp
             WHERE a.started_at < b.ended_at AND b.started_at < a.ended_at"
        )
        .await
            > 0,
        "no two groups ever ran at once: there was no concurrency"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn transactional_enqueue_unique_keys_delays_and_pause() {
    enqueue_keys_delays_and_pause(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_same_enqueues_on_the_distributed_layout() {
    enqueue_keys_delays_and_pause(Layout::Distributed).await;
}

/// Enqueue in the application's transaction, unique keys, a delayed job
/// and a paused group, run by a runner, in `layout`.
async fn enqueue_keys_delays_and_pause(layout: Layout) {
    let (cluster, mut conn) = cluster_with(layout).await;
    conn.batch_execute("CREATE TABLE app_order (id bigint PRIMARY KEY)")
        .await
        .expect("application table");

    // Enqueue inside the application's transaction: committed with its row,
    // or gone with it.
    let in_tx = |seq| LogJob {
        group: "tx".into(),
        seq,
        fail_first: false,
        hold_ms: 0,
    };
    conn.batch_execute("BEGIN; INSERT INTO app_order VALUES (1)")
        .await
        .expect("begin");
    let committed = in_tx(0).enqueue(&mut conn, "tx").await.expect("enqueue");
    conn.batch_execute("COMMIT").await.expect("commit");
    conn.batch_execute("BEGIN; INSERT INTO app_order VALUES (2)")
        .await
        .expect("begin");
    in_tx(1).enqueue(&mut conn, "tx").await.expect("enqueue");
    conn.batch_execute("ROLLBACK").await.expect("rollback");

    // A unique key: the second enqueue gets the first job's id.
    let keyed = |seq| {
        let job = LogJob {
            group: "uniq".into(),
            seq,
            fail_first: false,
            hold_ms: 0,
        };
        NewJob::new(&job, EnqueueOptions::group("uniq").unique_key("once")).expect("new job")
    };
    let first = pgfifo::enqueue_batch(&mut conn, [keyed(0)])
        .await
        .expect("keyed");
    let second = pgfifo::enqueue_batch(&mut conn, [keyed(1)])
        .await
        .expect("keyed");
    assert_eq!(first, second, "a taken unique key returns its job's id");

    // A delayed job, 1.5 s from now on the server's clock.
    let delayed = LogJob {
        group: "later".into(),
        seq: 0,
        fail_first: false,
        hold_ms: 0,
    };
    let delayed_id = delayed
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group("later").run_in(Duration::from_millis(1500)),
        )
        .await
        .expect("delayed");

    // A paused group keeps its jobs queued while the rest drains.
    assert!(pgfifo::admin::pause_group(&mut conn, "citus", "held")
        .await
        .expect("pause"));
    let paused_ids = pgfifo::enqueue_batch(&mut conn, (0..3).map(|s| job("held", s, false)))
        .await
        .expect("enqueue paused");

    let url = cluster.url();
    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().concurrency(4))
        .await
        .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        3,
    )
    .await;
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id = {committed} AND state = 'succeeded'"
            )
        )
        .await,
        1,
        "the job enqueued in a committed transaction ran"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'tx'"
        )
        .await,
        1,
        "the job enqueued in a rolled-back transaction exists"
    );
    assert_eq!(count(&mut conn, "SELECT count(*) FROM app_order").await, 1);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'uniq'"
        )
        .await,
        1,
        "the unique key let a second job in"
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM {} WHERE j.id = {delayed_id} AND a.started_at < j.run_after",
                attempts_of_jobs(layout)
            )
        )
        .await,
        0,
        "the delayed job started before its time"
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND state = 'queued' AND attempts = 0",
                pgfifo_tests::id_list(&paused_ids)
            )
        )
        .await,
        3,
        "a job of the paused group started"
    );
    assert!(pgfifo::admin::resume_group(&mut conn, "citus", "held")
        .await
        .expect("resume"));
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        6,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM (SELECT seq, lag(seq) OVER (ORDER BY started_at) AS prev
                 FROM citus_log WHERE grp = 'held') s WHERE prev >= seq"
        )
        .await,
        0,
        "the resumed group ran out of order"
    );
}

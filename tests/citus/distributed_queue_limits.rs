//! Queue limits on the distributed layout, whose slots and bucket are
//! tables of the coordinator: a queue of concurrency 3 runs at most three
//! jobs at once across two runners and every shard, one per group; a queue
//! rate bounds every window of its starts; the operator reads the limits
//! and their use.

use diesel_async::AsyncPgConnection;
use pgfifo::admin;
use pgfifo::migrate::Layout;
use pgfifo::{EnqueueOptions, NewJob, QueueLimits, Rate};
use pgfifo_tests::query::text;
use pgfifo_tests::test_config;

use crate::coordinator::{cluster_with, count, wait_for};
use crate::jobs::LogJob;

/// A `LogJob` of `group` (ungrouped for "") that works for `hold_ms`.
fn work(group: &str, seq: i64, hold_ms: u64) -> NewJob {
    let job = LogJob {
        group: if group.is_empty() { "-" } else { group }.to_owned(),
        seq,
        fail_first: false,
        hold_ms,
    };
    let options = if group.is_empty() {
        EnqueueOptions::ungrouped()
    } else {
        EnqueueOptions::group(group)
    };
    NewJob::new(&job, options).expect("new job")
}

/// The most runs of `citus_log` rows matching `filter` that overlapped.
async fn peak(conn: &mut AsyncPgConnection, filter: &str) -> i64 {
    count(
        conn,
        &format!(
            "SELECT coalesce(max(c), 0) FROM (SELECT (SELECT count(*) FROM citus_log b
                 WHERE {filter} AND b.started_at <= a.started_at AND b.ended_at > a.started_at) AS c
             FROM citus_log a WHERE {}) s",
            filter.replace("b.", "a.")
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn queue_limits_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();

    // Concurrency 3 over six groups and ungrouped jobs, two runners.
    admin::set_queue_limits(&mut conn, "citus", QueueLimits::new().concurrency(3))
        .await
        .expect("limits");
    let mut jobs = Vec::new();
    for seq in 0..4 {
        for group in ["a", "b", "c", "d", "e", "f", ""] {
            jobs.push(work(group, seq, 40));
        }
    }
    let n = jobs.len() as i64;
    pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    let mut runners = Vec::new();
    for _ in 0..2 {
        let pool = pgfifo::connect(&url, 10).await.expect("pool");
        runners.push(
            pgfifo::runner::start(pool, test_config().concurrency(6))
                .await
                .expect("a runner with queue limits on the distributed layout"),
        );
    }
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        n,
    )
    .await;
    let usage = admin::queue_usage(&mut conn, "citus")
        .await
        .expect("usage")
        .expect("the queue's limits");
    assert_eq!(usage.limits.concurrency, Some(3));
    for runner in runners {
        runner.shutdown().await.expect("shutdown");
    }
    let queue_peak = peak(&mut conn, "true").await;
    assert!(
        (2..=3).contains(&queue_peak),
        "{queue_peak} jobs of a queue of concurrency 3 ran at once"
    );
    for group in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(
            peak(&mut conn, &format!("b.grp = '{group}'")).await,
            1,
            "group {group}"
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM citus_log").await,
        n,
        "each job ran once"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM citus_log a JOIN citus_log b ON a.grp = b.grp AND a.seq < b.seq
             WHERE a.grp <> '-' AND a.started_at > b.started_at"
        )
        .await,
        0,
        "a group's jobs started out of order"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.queue_slot WHERE queue = 'citus'"
        )
        .await,
        3
    );

    // A rate instead: 4 a second with a burst of 2, over every window of
    // the recorded starts (the tokens' times), grouped and ungrouped.
    admin::reset_queue_limits(&mut conn, "citus")
        .await
        .expect("reset");
    let rate = QueueLimits::new()
        .rate(Rate::per_second(4).unwrap())
        .burst(2);
    admin::set_queue_limits(&mut conn, "citus", rate)
        .await
        .expect("limits");
    diesel_async::RunQueryDsl::execute(diesel::sql_query("TRUNCATE citus_log"), &mut conn)
        .await
        .expect("truncate");
    let first_new = count(&mut conn, "SELECT max(id) FROM pgfifo.job").await;
    let mut jobs = Vec::new();
    for seq in 0..3 {
        for group in ["p", "q", ""] {
            jobs.push(work(group, seq, 0));
        }
    }
    pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    let pool = pgfifo::connect(&url, 10).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().concurrency(4))
        .await
        .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        n + 9,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    let usage = admin::queue_usage(&mut conn, "citus")
        .await
        .expect("usage")
        .expect("the queue's limits");
    assert_eq!(usage.limits.rate, Some(Rate::per_second(4).unwrap()));
    let tokens = usage.tokens.expect("the bucket's tokens");
    assert!((0.0..=2.0).contains(&tokens), "{usage:?}");
    // What the runner's token watch reads: the queue, its burst, no work.
    assert_eq!(
        text(
            &mut conn,
            "SELECT string_agg(queue || ' ' || burst || ' ' || per_second || ' ' || ready, ',')
             FROM pgfifo.rate_limited_queues(ARRAY['citus', 'citus_long'])"
        )
        .await
        .as_deref(),
        Some("citus 2 4 false")
    );
    let starts = text(
        &mut conn,
        &format!(
            "SELECT string_agg(extract(epoch FROM a.started_at)::text, ',' ORDER BY a.started_at)
             FROM pgfifo.job_attempt a JOIN pgfifo.job j ON j.part = a.part AND j.id = a.job_id
             WHERE j.id > {first_new}"
        ),
    )
    .await
    .expect("starts");
    let starts: Vec<f64> = starts.split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(starts.len(), 9, "one recorded start per job");
    let worst = pgfifo_tests::rates::worst_excess(&starts, 4.0, 2.0);
    assert!(
        worst <= 0.01,
        "a window held {worst:.3} starts beyond 2 + 4 × t"
    );
    assert!(
        starts[8] - starts[0] >= 1.7,
        "9 starts at 4 a second with a burst of 2 took {:.3} s",
        starts[8] - starts[0]
    );
}

/// The distributed pick visits shards one after another in one
/// transaction: a visit that took a queue's slot and found nothing must
/// not keep it while a later visit takes another queue's jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_visit_that_gives_nothing_keeps_no_queue_slot() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    admin::set_queue_limits(&mut conn, "citus", QueueLimits::new().concurrency(1))
        .await
        .expect("limits");
    // Queue "citus": ungrouped jobs on many shards, which another
    // transaction holds, so that a visit finds its work and takes nothing.
    pgfifo::enqueue_batch(&mut conn, (0..64).map(|seq| work("", seq, 0)))
        .await
        .expect("enqueue");
    let q_shard = count(
        &mut conn,
        "SELECT min(s.shard) FROM pgfifo.layout_shard AS s
         JOIN pgfifo.job AS j ON j.part = ANY (s.parts) WHERE j.queue = 'citus'",
    )
    .await;
    // Queue "citus_long" (no limits): one job, in a group on the next
    // shard in the pick's order.
    let group = text(
        &mut conn,
        &format!(
            "SELECT g FROM generate_series(0, 10000) AS n, LATERAL (SELECT 'r' || n AS g) AS x
             JOIN pgfifo.layout_shard AS s ON pgfifo.part_of('citus_long', x.g) = ANY (s.parts)
             WHERE s.shard = ({q_shard} + 1) % (SELECT count(*) FROM pgfifo.layout_shard)
             ORDER BY n LIMIT 1"
        ),
    )
    .await
    .expect("a group on the next shard");
    let other = count(
        &mut conn,
        &format!(
            "SELECT pgfifo.add_job(kind => 'citus.other', queue => 'citus_long', payload => '{{}}',
                                   group_id => '{group}')"
        ),
    )
    .await;
    count(
        &mut conn,
        "SELECT count(pgfifo.promote(ARRAY['citus_long'], 10))",
    )
    .await;

    let mut holder = cluster.coordinator_conn().await.expect("coordinator");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut holder, "BEGIN")
        .await
        .expect("begin");
    let jobs = text(
        &mut conn,
        "SELECT string_agg(id || ':' || part, ',') FROM pgfifo.job WHERE queue = 'citus'",
    )
    .await
    .expect("jobs");
    for job in jobs.split(',') {
        let (id, part) = job.split_once(':').expect("id:part");
        count(
            &mut holder,
            &format!("SELECT count(*) FROM (SELECT 1 FROM pgfifo.job WHERE part = {part} AND id = {id} FOR UPDATE) s"),
        )
        .await;
    }

    // The pick, in a job transaction, with its first shard the one where
    // "citus" has (held) work and "citus_long" visited first in each shard.
    let pid = count(&mut conn, "SELECT pg_backend_pid()::bigint").await;
    let shards = count(&mut conn, "SELECT count(*) FROM pgfifo.layout_shard").await;
    let turn = (q_shard - pid).rem_euclid(shards);
    // (Each visit starts at queue `turn` modulo their number.)
    let queues = if turn % 2 == 0 {
        "ARRAY['citus_long', 'citus']"
    } else {
        "ARRAY['citus', 'citus_long']"
    };
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "BEGIN; SELECT set_config('pgfifo.job_transaction', 'on', true)",
    )
    .await
    .expect("begin");
    let picked = text(
        &mut conn,
        &format!(
            "SELECT string_agg(coalesce(p.id::text, 'none'), ',') FROM pgfifo.pick(
                 {queues}, {turn}, 0, ARRAY[]::text[], ARRAY[]::integer[], 0, 4) AS p"
        ),
    )
    .await;
    assert_eq!(picked, Some(other.to_string()), "the other queue's job");
    assert_eq!(
        text(
            &mut conn,
            "SELECT coalesce(current_setting('pgfifo.queue_slot', true), '')"
        )
        .await,
        Some(String::new()),
        "the pick keeps a slot of the queue it took nothing from"
    );
    let mut third = cluster.coordinator_conn().await.expect("coordinator");
    assert_eq!(
        count(
            &mut third,
            "SELECT count(*) FROM (SELECT 1 FROM pgfifo.queue_slot WHERE queue = 'citus'
                                   FOR UPDATE SKIP LOCKED) s"
        )
        .await,
        1,
        "the queue's one slot is free"
    );
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "ROLLBACK")
        .await
        .expect("rollback");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut holder, "ROLLBACK")
        .await
        .expect("rollback");
}

//! The drain of grouped no-op jobs by pgfifo's runner on the cluster, on
//! the plain layout (pgfifo's tables on the coordinator) and on the
//! distributed one, alternately: jobs/s, PostgreSQL CPU per job on each
//! node, and the split of the jobs between the workers, printed for
//! docs/scaling.md; each job run once, each group in order.

use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use pgfifo::migrate::Layout;
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::citus::cpu_ticks_all;
use pgfifo_tests::query::{scalar, text};
use pgfifo_tests::test_config;
use serde::{Deserialize, Serialize};

use crate::coordinator::{cluster_with, wait_for};

const GROUPS: usize = 200;
const PER_GROUP: usize = 10;

/// A job that does nothing: the drain measures pgfifo's cost per job.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "citus.noop", queue = "citus-drain")]
struct Noop {
    seq: usize,
}

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_runners_drain_on_both_layouts_with_cpu_per_node() {
    for layout in [Layout::Plain, Layout::Distributed] {
        drain(layout).await;
    }
}

async fn drain(layout: Layout) {
    let (cluster, mut conn) = cluster_with(layout).await;
    let url = cluster.url();
    for seq in 0..PER_GROUP {
        let jobs = (0..GROUPS).map(|g| {
            NewJob::new(&Noop { seq }, EnqueueOptions::group(format!("g{g:03}"))).expect("job")
        });
        pgfifo::enqueue_batch(&mut conn, jobs)
            .await
            .expect("enqueue");
    }
    let total = (GROUPS * PER_GROUP) as i64;
    let nodes: Vec<_> = std::iter::once(&cluster.coordinator)
        .chain(&cluster.workers)
        .collect();
    conn.batch_execute(
        "ALTER DATABASE postgres SET citus.enable_stat_counters = on;
         ALTER DATABASE postgres SET track_functions = 'pl';
         SELECT citus_stat_counters_reset(), pg_stat_reset();",
    )
    .await
    .expect("stat counters");
    let before: Vec<u64> = nodes.iter().map(|n| cpu_ticks_all(n)).collect();
    let began = Instant::now();
    let pool = pgfifo::connect(&url, 32).await.expect("pool");
    let runner = pgfifo::runner::start(
        pool,
        test_config()
            .concurrency(16)
            .queues(["citus-drain"])
            .poll_interval(Duration::from_secs(1)),
    )
    .await
    .expect("runner");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE queue = 'citus-drain' AND state = 'succeeded'",
        total,
    )
    .await;
    let took = began.elapsed();
    let after: Vec<u64> = nodes.iter().map(|n| cpu_ticks_all(n)).collect();
    runner.shutdown().await.expect("shutdown");
    let executions = text(
        &mut conn,
        &format!(
            "SELECT format('%s/%s', round(sum(query_execution_single_shard)::numeric / {total}, 1),
                           round(sum(query_execution_multi_shard)::numeric / {total}, 2))
             FROM citus_stat_counters(0)"
        ),
    )
    .await
    .unwrap_or_default();

    // Each job once, each group's jobs started in order (the jobs of one
    // pick are recorded with one start time, in id order).
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE queue = 'citus-drain' AND attempts <> 1"
        )
        .await,
        0,
        "a job ran more than once"
    );
    // Calls per job of pgfifo's functions (the runner's connections have
    // reported them by now: they ended with its shutdown).
    let calls = text(
        &mut conn,
        &format!(
            "SELECT string_agg(format('%s=%s', funcname, round(calls::numeric / {total}, 2)), ' '
                               ORDER BY funcname)
             FROM pg_stat_user_functions
             WHERE schemaname = 'pgfifo'
               AND funcname IN ('pick', 'pick_in', 'promote', 'start_attempts', 'complete')"
        ),
    )
    .await
    .unwrap_or_default();
    let join = match layout {
        Layout::Plain => "j.id = a.job_id",
        Layout::Distributed => "j.part = a.part AND j.id = a.job_id",
    };
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM (SELECT a.job_id,
                     lag(a.job_id) OVER (PARTITION BY j.group_id
                                        ORDER BY a.started_at, a.job_id) AS prev
                 FROM pgfifo.job_attempt a JOIN pgfifo.job j ON {join}
                 WHERE j.queue = 'citus-drain') s WHERE prev > job_id"
            )
        )
        .await,
        0,
        "a group's jobs started out of order"
    );
    let split = match layout {
        Layout::Plain => "all on the coordinator".to_owned(),
        Layout::Distributed => {
            let per_worker = text(
                &mut conn,
                "SELECT string_agg(round(100.0 * n / t, 1)::text, '/' ORDER BY port)
                 FROM (SELECT port, n, sum(n) OVER () AS t
                       FROM (SELECT p.nodeport AS port, count(*) AS n FROM pgfifo.job AS j
                             JOIN pg_dist_shard_placement AS p
                               ON p.shardid = get_shard_id_for_distribution_column('pgfifo.job', j.part)
                             WHERE j.queue = 'citus-drain' GROUP BY 1) AS w) AS x",
            )
            .await
            .unwrap_or_default();
            for share in per_worker.split('/') {
                let share: f64 = share.parse().expect("a share");
                assert!(
                    (35.0..=65.0).contains(&share),
                    "a worker carried {share} % of the jobs: {per_worker}"
                );
            }
            format!("{per_worker} % of the jobs on the workers")
        }
    };
    // Clock ticks are 10 ms.
    let ms_per_job: Vec<String> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| format!("{:.2}", a.saturating_sub(*b) as f64 * 10.0 / total as f64))
        .collect();
    println!(
        "citus runner drain ({layout:?} layout): jobs={total} groups={GROUPS} concurrency=16 \
         jobs_per_s={:.0} pg_cpu_ms_per_job coordinator={} worker1={} worker2={} \
         single/multi_shard_statements_per_job={executions} calls_per_job: {calls} ({split})",
        total as f64 / took.as_secs_f64(),
        ms_per_job[0],
        ms_per_job[1],
        ms_per_job[2],
    );
}

//! The layout's job cycle in miniature, run for real on the cluster: 2,000
//! jobs in 400 groups (the `layout` schema), drained by 8 connections, each
//! cycle one transaction of a delegated per-shard pick that locks a group
//! (or up to 8) and its head, a delegated completion that advances the
//! head, and a commit: through the coordinator one job per call, the same
//! with 8 jobs per call, the same with a handler's write to a table on the
//! coordinator in each transaction, and with the connections made to the
//! workers. Checks the outcome (each job once, each
//! group in order, never two of a group at once) and the shape (every call
//! ran on a worker, each worker carried 35–65 % of the jobs), and prints
//! jobs/s and the PostgreSQL CPU per job on each node for docs/scaling.md.
//! It measures the layout's statements, not pgfifo's functions, which are
//! not ported yet.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo_tests::citus::{cpu_ticks, Cluster};
use pgfifo_tests::records::now_ns;

use crate::layout::SCHEMA;

const TASKS: usize = 8;
const JOBS: usize = 2_000;

/// The cycle's two calls, distributed by their bucket.
const CYCLE: &str = "
    CREATE FUNCTION probe.take(p_bucket integer, p_buckets integer[])
    RETURNS TABLE (port integer, job_id bigint, bucket integer, group_id text, seq bigint)
    LANGUAGE plpgsql AS $$
    DECLARE v_group record;
    BEGIN
        SELECT g.bucket, g.queue, g.group_id, g.head_seq INTO v_group FROM probe.queue_group AS g
        WHERE g.bucket = ANY (p_buckets) AND g.head_seq IS NOT NULL
        LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT inet_server_port(), j.id, j.bucket, j.group_id, j.seq FROM probe.job AS j
        WHERE j.bucket = v_group.bucket AND j.queue = v_group.queue
          AND j.group_id = v_group.group_id AND j.seq = v_group.head_seq AND j.state = 'queued'
        FOR UPDATE;
    END $$;
    SELECT create_distributed_function('probe.take(integer, integer[])', 'p_bucket',
                                       colocate_with := 'probe.queue_group');
    CREATE FUNCTION probe.finish(p_bucket integer, p_job bigint, p_group text)
    RETURNS TABLE (port integer) LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE probe.job SET state = 'done' WHERE bucket = p_bucket AND id = p_job;
        UPDATE probe.queue_group
        SET head_seq = CASE WHEN head_seq >= 5 THEN NULL ELSE head_seq + 1 END
        WHERE bucket = p_bucket AND queue = 'q' AND group_id = p_group;
        RETURN QUERY SELECT inet_server_port();
    END $$;
    SELECT create_distributed_function('probe.finish(integer, bigint, text)', 'p_bucket',
                                       colocate_with := 'probe.queue_group',
                                       force_delegation := true);
    -- The same for up to p_limit groups of one shard at once.
    CREATE FUNCTION probe.take_many(p_bucket integer, p_buckets integer[], p_limit integer)
    RETURNS TABLE (port integer, job_id bigint, bucket integer, group_id text, seq bigint)
    LANGUAGE plpgsql AS $$
    BEGIN
        RETURN QUERY
        WITH g AS (SELECT g.bucket, g.queue, g.group_id, g.head_seq FROM probe.queue_group AS g
                   WHERE g.bucket = ANY (p_buckets) AND g.head_seq IS NOT NULL
                   LIMIT p_limit FOR UPDATE SKIP LOCKED)
        SELECT inet_server_port(), j.id, j.bucket, j.group_id, j.seq FROM g JOIN probe.job AS j
          ON j.bucket = g.bucket AND j.queue = g.queue AND j.group_id = g.group_id
         AND j.seq = g.head_seq
        WHERE j.bucket = ANY (p_buckets) AND j.state = 'queued';
    END $$;
    SELECT create_distributed_function('probe.take_many(integer, integer[], integer)', 'p_bucket',
                                       colocate_with := 'probe.queue_group');
    CREATE FUNCTION probe.finish_many(p_bucket integer, p_buckets integer[], p_jobs bigint[],
                                      p_groups text[])
    RETURNS TABLE (port integer) LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE probe.job SET state = 'done' WHERE bucket = ANY (p_buckets) AND id = ANY (p_jobs);
        UPDATE probe.queue_group
        SET head_seq = CASE WHEN head_seq >= 5 THEN NULL ELSE head_seq + 1 END
        WHERE bucket = ANY (p_buckets) AND queue = 'q' AND group_id = ANY (p_groups);
        RETURN QUERY SELECT inet_server_port();
    END $$;
    SELECT create_distributed_function('probe.finish_many(integer, integer[], bigint[], text[])',
                                       'p_bucket', colocate_with := 'probe.queue_group',
                                       force_delegation := true);
";

#[derive(QueryableByName)]
struct Shard {
    #[diesel(sql_type = Integer)]
    rep: i32,
    /// The port of the worker that holds it.
    #[diesel(sql_type = Integer)]
    port: i32,
    #[diesel(sql_type = Array<Integer>)]
    buckets: Vec<i32>,
}

#[derive(QueryableByName)]
struct Taken {
    #[diesel(sql_type = Integer)]
    port: i32,
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    bucket: i32,
    #[diesel(sql_type = Text)]
    group_id: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

#[derive(QueryableByName)]
struct Finished {
    #[diesel(sql_type = Integer)]
    port: i32,
}

/// One cycle as the client saw it.
struct Cycle {
    job_id: i64,
    group: String,
    seq: i64,
    take_port: i32,
    finish_port: i32,
    /// After the pick returned.
    start_ns: i64,
    /// Before the commit was sent.
    end_ns: i64,
}

async fn drain_task(
    url: String,
    shards: Arc<Vec<Shard>>,
    first: usize,
    done: Arc<AtomicUsize>,
    batch: i32,
    write: bool,
) -> (Vec<Cycle>, AsyncPgConnection) {
    let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
    let mut cycles = Vec::new();
    let mut at = first;
    let began = Instant::now();
    while AtomicUsize::load(&done, Ordering::SeqCst) < JOBS {
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "the drain took over 120 s"
        );
        let shard = &shards[at % shards.len()];
        if batch > 1 {
            let more = cycle_many(&mut conn, shard, batch).await;
            if more.is_empty() {
                at += 1;
            }
            done.fetch_add(more.len(), Ordering::SeqCst);
            cycles.extend(more);
            continue;
        }
        conn.batch_execute("BEGIN").await.expect("begin");
        let taken: Vec<Taken> =
            diesel::sql_query("SELECT port, job_id, bucket, group_id, seq FROM probe.take($1, $2)")
                .bind::<Integer, _>(shard.rep)
                .bind::<Array<Integer>, _>(&shard.buckets)
                .load(&mut conn)
                .await
                .expect("take");
        let Some(job) = taken.into_iter().next() else {
            conn.batch_execute("COMMIT").await.expect("commit");
            // Nothing free in this shard: the next one.
            at += 1;
            continue;
        };
        let start_ns = now_ns();
        let finished: Finished = diesel::sql_query("SELECT port FROM probe.finish($1, $2, $3)")
            .bind::<Integer, _>(job.bucket)
            .bind::<BigInt, _>(job.job_id)
            .bind::<Text, _>(&job.group_id)
            .get_result(&mut conn)
            .await
            .expect("finish");
        if write {
            // The handler's own write, in a table on the coordinator: the
            // commit now spans two nodes.
            diesel::sql_query("INSERT INTO app_done (job_id) VALUES ($1)")
                .bind::<BigInt, _>(job.job_id)
                .execute(&mut conn)
                .await
                .expect("the handler's write");
        }
        let end_ns = now_ns();
        conn.batch_execute("COMMIT").await.expect("commit");
        done.fetch_add(1, Ordering::SeqCst);
        cycles.push(Cycle {
            job_id: job.job_id,
            group: job.group_id,
            seq: job.seq,
            take_port: job.port,
            finish_port: finished.port,
            start_ns,
            end_ns,
        });
    }
    // The connection stays open until the CPU has been read: its backends
    // (on the coordinator and, through it, on the workers) hold the ticks.
    (cycles, conn)
}

/// One transaction of up to `batch` jobs of `shard`: their cycles (none
/// when the shard had nothing free).
async fn cycle_many(conn: &mut AsyncPgConnection, shard: &Shard, batch: i32) -> Vec<Cycle> {
    conn.batch_execute("BEGIN").await.expect("begin");
    let taken: Vec<Taken> = diesel::sql_query(
        "SELECT port, job_id, bucket, group_id, seq FROM probe.take_many($1, $2, $3)",
    )
    .bind::<Integer, _>(shard.rep)
    .bind::<Array<Integer>, _>(&shard.buckets)
    .bind::<Integer, _>(batch)
    .load(conn)
    .await
    .expect("take many");
    if taken.is_empty() {
        conn.batch_execute("COMMIT").await.expect("commit");
        return Vec::new();
    }
    let start_ns = now_ns();
    let ids: Vec<i64> = taken.iter().map(|t| t.job_id).collect();
    let groups: Vec<&str> = taken.iter().map(|t| t.group_id.as_str()).collect();
    let finished: Finished =
        diesel::sql_query("SELECT port FROM probe.finish_many($1, $2, $3, $4)")
            .bind::<Integer, _>(shard.rep)
            .bind::<Array<Integer>, _>(&shard.buckets)
            .bind::<Array<BigInt>, _>(&ids)
            .bind::<Array<Text>, _>(&groups)
            .get_result(conn)
            .await
            .expect("finish many");
    let end_ns = now_ns();
    conn.batch_execute("COMMIT").await.expect("commit");
    taken
        .into_iter()
        .map(|job| Cycle {
            job_id: job.job_id,
            group: job.group_id,
            seq: job.seq,
            take_port: job.port,
            finish_port: finished.port,
            start_ns,
            end_ns,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_cycle_with_eight_jobs_per_call_through_the_coordinator() {
    drain(Through::Coordinator, 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_cycle_with_a_handler_write_on_the_coordinator() {
    drain(Through::CoordinatorWithWrite, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_layouts_job_cycle_drains_in_order_on_both_workers() {
    drain(Through::Coordinator, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_same_cycle_with_runners_connected_to_the_workers() {
    drain(Through::Workers, 1).await;
}

/// Where the drain's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Through {
    /// All to the coordinator, visiting every shard.
    Coordinator,
    /// The same, each cycle also writing a row to a table on the
    /// coordinator, as a handler writes the application's data.
    CoordinatorWithWrite,
    /// Half to each worker, visiting the shards that worker holds.
    Workers,
}

async fn drain(through: Through, batch: i32) {
    let cluster = Cluster::start().await.expect("start the Citus cluster");
    let mut conn = cluster.coordinator_conn().await.expect("coordinator");
    conn.batch_execute(SCHEMA)
        .await
        .expect("the miniature layout");
    conn.batch_execute(CYCLE)
        .await
        .expect("the cycle's functions");
    conn.batch_execute("CREATE TABLE app_done (job_id bigint PRIMARY KEY)")
        .await
        .expect("the application's table");
    let shards: Vec<Shard> = diesel::sql_query(
        "SELECT min(b) AS rep, array_agg(b ORDER BY b) AS buckets, min(p.nodeport) AS port
         FROM generate_series(0, 1023) AS b
         JOIN pg_dist_shard_placement AS p
           ON p.shardid = get_shard_id_for_distribution_column('probe.queue_group', b)
         GROUP BY p.shardid ORDER BY 1",
    )
    .load(&mut conn)
    .await
    .expect("the shards' buckets");
    assert_eq!(shards.len(), 32);
    let workers: Vec<i32> = cluster
        .workers
        .iter()
        .map(|w| i32::from(w.port()))
        .collect();
    // Per task: its URL and the shards it visits.
    let plan: Vec<(String, Arc<Vec<Shard>>)> = match through {
        Through::Coordinator | Through::CoordinatorWithWrite => {
            let all = Arc::new(shards);
            (0..TASKS).map(|_| (cluster.url(), all.clone())).collect()
        }
        Through::Workers => {
            let mut per_worker: Vec<Arc<Vec<Shard>>> = Vec::new();
            let mut shards = shards;
            for port in &workers {
                let (mine, rest) = shards.into_iter().partition(|s| s.port == *port);
                per_worker.push(Arc::new(mine));
                shards = rest;
            }
            (0..TASKS)
                .map(|i| {
                    (
                        cluster.workers[i % 2].url("postgres"),
                        per_worker[i % 2].clone(),
                    )
                })
                .collect()
        }
    };
    let nodes: Vec<_> = std::iter::once(&cluster.coordinator)
        .chain(&cluster.workers)
        .collect();

    let done = Arc::new(AtomicUsize::new(0));
    let before: Vec<u64> = nodes.iter().map(|n| cpu_ticks(n)).collect();
    let began = Instant::now();
    let tasks: Vec<_> = plan
        .into_iter()
        .enumerate()
        .map(|(i, (url, shards))| {
            tokio::spawn(drain_task(
                url,
                shards,
                i * 32 / TASKS,
                done.clone(),
                batch,
                through == Through::CoordinatorWithWrite,
            ))
        })
        .collect();
    let mut cycles = Vec::new();
    let mut open = Vec::new();
    for task in tasks {
        let (done, conn) = task.await.expect("a drain task");
        cycles.extend(done);
        open.push(conn);
    }
    let took = began.elapsed();
    let after: Vec<u64> = nodes.iter().map(|n| cpu_ticks(n)).collect();
    drop(open);

    // The outcome: each job once, each group in order, one at a time, and
    // the handler's writes committed with their jobs.
    assert_eq!(cycles.len(), JOBS, "cycles committed");
    let written = pgfifo_tests::query::scalar(&mut conn, "SELECT count(*) FROM app_done").await;
    let expected = if through == Through::CoordinatorWithWrite {
        JOBS as i64
    } else {
        0
    };
    assert_eq!(written, expected, "the handlers' rows");
    let ids: HashSet<i64> = cycles.iter().map(|c| c.job_id).collect();
    assert_eq!(ids.len(), JOBS, "a job ran twice");
    let mut by_group: BTreeMap<&str, Vec<&Cycle>> = BTreeMap::new();
    for c in &cycles {
        by_group.entry(&c.group).or_default().push(c);
    }
    assert_eq!(by_group.len(), 400);
    for (group, runs) in &mut by_group {
        runs.sort_by_key(|c| c.start_ns);
        let seqs: Vec<i64> = runs.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5], "group {group} ran out of order");
        for pair in runs.windows(2) {
            assert!(
                pair[0].end_ns < pair[1].start_ns,
                "two jobs of group {group} held it at once"
            );
        }
    }

    // The shape: every call ran on a worker, the completion where the pick
    // did, and each worker carried 35–65 % of the jobs.
    for c in &cycles {
        assert!(
            workers.contains(&c.take_port),
            "a pick ran on {}",
            c.take_port
        );
        assert_eq!(
            c.finish_port, c.take_port,
            "a completion ran elsewhere than its pick"
        );
    }
    let jobs_s = JOBS as f64 / took.as_secs_f64();
    let cpu_ms: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 * 10.0 / JOBS as f64)
        .collect();
    let shares: Vec<f64> = workers
        .iter()
        .map(|p| cycles.iter().filter(|c| c.take_port == *p).count() as f64 / JOBS as f64)
        .collect();
    println!(
        "citus drain: through={through:?} jobs_per_call={batch} jobs={JOBS} connections={TASKS} jobs_per_s={jobs_s:.0} \
         cpu_ms_per_job coordinator={:.2} worker1={:.2} worker2={:.2} \
         share worker1={:.1}% worker2={:.1}%",
        cpu_ms[0],
        cpu_ms[1],
        cpu_ms[2],
        shares[0] * 100.0,
        shares[1] * 100.0
    );
    for (port, share) in workers.iter().zip(&shares) {
        assert!(
            (0.35..=0.65).contains(share),
            "worker {port} carried {:.1} % of the jobs",
            share * 100.0
        );
    }
}

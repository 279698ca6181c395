//! `fifo-groups`: enqueue JOBS round-robin over NGROUPS groups, drain them
//! with WORKERS concurrent jobs, check every run, and measure the server's
//! single-row UPDATE ceiling for comparison.
//!
//! `POOLER_URL` runs the runner through a transaction-mode pooler: its
//! pool connects there (database `pgfifo_bench` behind it) with
//! `ConnectOptions::transaction_pooler`, and LISTENs on a direct connection
//! unless `POOLER_DIRECT=0`. Enqueue, checks and the ceiling stay direct.
//! The WAL written per job (enqueue, and drain with completion) is read from
//! `pg_current_wal_lsn()` around each phase.
//!
//! `GROUP_CONCURRENCY` (default 1) sets the queue's default group
//! concurrency N before the drain: up to N jobs of a group run at once. The
//! checks then allow N at once per group (`overlaps` counts runs that began
//! beside N others) and jobs picked together beginning a moment out of
//! order (`order_violations` counts jobs that began after a younger one of
//! their group had ended).
//!
//! `QUEUE_CONCURRENCY` (default 0: none) limits the whole queue to that many
//! jobs at once (`pgfifo::QueueLimits`, see `docs/queue-limits.md`); the
//! report then adds `max_running` (the most handlers at once, from their
//! records; must be ≤ the limit), `queue_ideal_jobs_per_s` (the limit over
//! the mean handler time) and `queue_ratio` (the drain's rate over it;
//! target with `WORK_MS=5`: ≥ 0.9).
//!
//! `BATCH=1` enqueues the jobs as one batch with a complete callback (see
//! `batch_mode`); the report adds `callback_ms`, how long after the last
//! job's outcome the callback started.
//!
//! Every run reports the PostgreSQL CPU per job of enqueue and of the drain
//! (`pg_cpu_ms_per_job_enqueue`, `pg_cpu_ms_per_job_drain`: the whole
//! server's processes, so run it on a server that serves only the
//! scenario). `CITUS=1` runs on a Citus cluster whose coordinator is
//! `DATABASE_URL` (see `citus`): the CPU is reported for each node, and the
//! report adds `worker_split_percent` (each worker's share of the jobs) and
//! `drain_statements_per_job` (the statements Citus routed to one shard and
//! ran on several, from `citus_stat_counters`).

use std::time::{Duration, Instant};

use diesel::sql_types::Integer;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, NewJob, RunnerConfig};
use serde_json::json;

use crate::common::{self, BenchJob, Inputs};
use crate::progress;
use crate::{citus, pg_cpu};

/// Jobs per `enqueue_batch` call.
const BATCH: u64 = 5_000;

pub async fn run(inputs: &Inputs) -> Result<serde_json::Value, String> {
    let jobs = inputs.number("JOBS", 20_000)?;
    let groups = inputs.number("NGROUPS", 200)?.max(1);
    let workers = inputs.number("WORKERS", 16)?.max(1);
    let work_ms = inputs.number("WORK_MS", 0)?;
    let ceiling_secs = inputs.number("CEILING_SECS", 5)?;
    let group_concurrency = inputs.number("GROUP_CONCURRENCY", 1)?;
    let max_n = u64::from(pgfifo::MAX_GROUP_CONCURRENCY);
    if !(1..=max_n).contains(&group_concurrency) {
        return Err(format!(
            "GROUP_CONCURRENCY={group_concurrency} is outside 1 to {max_n}"
        ));
    }
    let queue_concurrency = inputs.number("QUEUE_CONCURRENCY", 0)?;
    let in_batch = inputs.number("BATCH", 0)? == 1;
    let server = inputs.database_url();
    let pooler_url = inputs.string("POOLER_URL", "");
    let in_citus = inputs.number("CITUS", 0)? == 1;
    if in_citus && (in_batch || !pooler_url.is_empty()) {
        return Err(
            "CITUS=1 runs without batches and poolers: batches are not on the distributed \
                    layout, and a pooler in front of a cluster is not measured here \
                    (docs/scaling.md)"
                .into(),
        );
    }
    common::set_work_ms(work_ms);

    let pool_size = workers as u32 * 2 + 4;
    let (pool, url, nodes) = if in_citus {
        let nodes = citus::nodes(&server).await?;
        let name = common::database_name("pgfifo_bench")?;
        let (pool, url) = citus::fresh_database(&server, &nodes, &name, pool_size).await?;
        progress!("distributed over {} workers", nodes.len() - 1);
        (pool, url, nodes)
    } else {
        let (pool, url) = common::fresh_database(&server, "pgfifo_bench", pool_size).await?;
        (pool, url, Vec::new())
    };
    let name = common::database_name("pgfifo_bench")?;
    let servers = node_servers(&citus::database_urls(&server, &nodes, &name)).await;
    let cpu_start = node_ticks(&servers);
    progress!("enqueueing {jobs} jobs over {groups} groups");
    let wal_start = wal_lsn(&pool).await?;
    let (enqueue_secs, batch) = enqueue_round_robin(&pool, jobs, groups, in_batch).await?;
    let wal_enqueued = wal_lsn(&pool).await?;
    let cpu_enqueued = node_ticks(&servers);
    if in_citus {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        citus::reset_statements(&mut conn).await?;
    }
    let enqueue_rate = jobs as f64 / enqueue_secs;
    progress!("enqueued in {enqueue_secs:.3}s ({enqueue_rate:.0} jobs/s); draining with {workers} workers");

    if group_concurrency > 1 {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        let limits = pgfifo::GroupLimits::new().concurrency(group_concurrency as u32);
        pgfifo::admin::set_default_group_limits(&mut conn, "bench", limits)
            .await
            .map_err(|e| format!("set GROUP_CONCURRENCY: {e}"))?;
        progress!("groups may run {group_concurrency} jobs at once");
    }
    if queue_concurrency > 0 {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        let limits = pgfifo::QueueLimits::new().concurrency(queue_concurrency as u32);
        pgfifo::admin::set_queue_limits(&mut conn, "bench", limits)
            .await
            .map_err(|e| format!("set QUEUE_CONCURRENCY: {e}"))?;
        progress!("the queue may run {queue_concurrency} jobs at once");
    }
    common::epoch();
    common::take_records();
    let mut config = inputs.tune(
        RunnerConfig::default()
            .queues(["bench"])
            .concurrency(workers as usize)
            .poll_interval(Duration::from_millis(200)),
    )?;
    let runner_pool = if pooler_url.is_empty() {
        pool.clone()
    } else {
        if inputs.number("POOLER_DIRECT", 1)? == 1 {
            config = config.direct_url(url.clone());
        }
        progress!("the runner goes through the transaction-mode pooler at {pooler_url}");
        let options = pgfifo::ConnectOptions::new(pool_size).transaction_pooler(true);
        pgfifo::connect_with(&pooler_url, options)
            .await
            .map_err(|e| format!("connect to the pooler: {e}"))?
    };
    let runner = pgfifo::runner::start(runner_pool, config)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while (common::finished() as u64) < jobs {
        if Instant::now() > deadline {
            return Err(format!(
                "drain did not finish: {} of {jobs} ran",
                common::finished()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_all_committed(&pool, jobs).await?;
    let wal_drained = wal_lsn(&pool).await?;
    let cpu_drained = node_ticks(&servers);
    let cluster = if in_citus {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        let (single, multi) = citus::statements(&mut conn).await?;
        let per_job = |n: i64| (n as f64 / jobs as f64 * 100.0).round() / 100.0;
        Some(json!({
            "worker_split_percent": citus::split(&mut conn, "bench").await?,
            "drain_statements_per_job": {"single_shard": per_job(single), "multi_shard": per_job(multi)},
        }))
    } else {
        None
    };
    let callback_ms = match batch {
        Some(id) => {
            let mut conn = pool.get().await.map_err(|e| e.to_string())?;
            Some(crate::batch_mode::callback_latency_ms(&mut conn, id).await?)
        }
        None => None,
    };
    runner.shutdown().await.map_err(|e| e.to_string())?;
    let records = common::take_records();
    let first = records.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last = records.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let drain_secs = (last.saturating_sub(first)) as f64 / 1e9;
    let drain_rate = jobs as f64 / drain_secs.max(1e-9);
    let checked = common::check_concurrent(&records, jobs, groups, group_concurrency);
    // How long handlers ran against how long the slots were there: what
    // separates the runner's overhead from handlers that overran their
    // WORK_MS (a thread's sleep wakes late on loaded cores).
    let handler_secs: f64 = records
        .iter()
        .map(|r| r.end_ns.saturating_sub(r.start_ns) as f64 / 1e9)
        .sum();
    let mean_handler_ms = handler_secs * 1e3 / records.len().max(1) as f64;
    let slots_busy = handler_secs / (drain_secs.max(1e-9) * workers as f64);
    progress!(
        "drained in {drain_secs:.3}s ({drain_rate:.0} jobs/s); {checked:?}; handlers ran \
         {mean_handler_ms:.3} ms on average, slots busy {:.1} %",
        slots_busy * 100.0
    );
    let max_running = max_running(&records);
    let queue_ideal = queue_concurrency as f64 * 1e3 / mean_handler_ms.max(1e-9);
    if let Ok(path) = std::env::var("RECORDS_FILE") {
        common::write_records(&path, &records)?;
        progress!("wrote {} records to {path}", records.len());
    }

    progress!(
        "measuring the ceiling: {workers} connections of single-row UPDATEs for {ceiling_secs}s"
    );
    let ceiling = ceiling_tps(&url, workers, Duration::from_secs(ceiling_secs)).await?;
    progress!("ceiling {ceiling:.0} tx/s");
    let cpu_ms_per_job = |from: &[Option<u64>], to: &[Option<u64>]| {
        servers
            .iter()
            .zip(from.iter().zip(to))
            .filter_map(|((name, _), pair)| match pair {
                (Some(a), Some(b)) => {
                    let ms = pg_cpu::Server::seconds(*a, *b) * 1e3 / jobs as f64;
                    Some((name.clone(), json!((ms * 1000.0).round() / 1000.0)))
                }
                _ => None,
            })
            .collect::<serde_json::Map<_, _>>()
    };
    let mut report = json!({
        "scenario": "fifo-groups",
        "jobs": jobs,
        "groups": groups,
        "workers": workers,
        "work_ms": work_ms,
        "group_concurrency": group_concurrency,
        "enqueue_jobs_per_s": enqueue_rate.round(),
        "drain_jobs_per_s": drain_rate.round(),
        "ceiling_tps": ceiling.round(),
        "drain_vs_ceiling": (drain_rate / ceiling * 1000.0).round() / 1000.0,
        "mean_handler_ms": (mean_handler_ms * 1000.0).round() / 1000.0,
        "slots_busy": (slots_busy * 1000.0).round() / 1000.0,
        "lost": checked.lost,
        "duplicates": checked.duplicates,
        "order_violations": checked.order_violations,
        "overlaps": checked.overlaps,
        "peak_rss_mb": peak_rss_mb(),
        "through_pooler": !pooler_url.is_empty(),
        "wal_bytes_per_job_enqueue": ((wal_enqueued - wal_start) as f64 / jobs as f64).round(),
        "wal_bytes_per_job_drain": ((wal_drained - wal_enqueued) as f64 / jobs as f64).round(),
        "batch": in_batch,
        "callback_ms": callback_ms.map(|ms| (ms * 10.0).round() / 10.0),
        "queue_concurrency": queue_concurrency,
        "max_running": max_running,
        "queue_ideal_jobs_per_s": (queue_concurrency > 0).then(|| queue_ideal.round()),
        "queue_ratio": (queue_concurrency > 0)
            .then(|| (drain_rate / queue_ideal * 1000.0).round() / 1000.0),
        "citus": in_citus,
        "pg_cpu_ms_per_job_enqueue": cpu_ms_per_job(&cpu_start, &cpu_enqueued),
        "pg_cpu_ms_per_job_drain": cpu_ms_per_job(&cpu_enqueued, &cpu_drained),
    });
    if let (Some(cluster), Some(map)) = (cluster, report.as_object_mut()) {
        map.extend(cluster.as_object().cloned().unwrap_or_default());
    }
    Ok(report)
}

/// The servers behind each node's database, by the node's name (`None`
/// for a server whose processes cannot be read from here).
async fn node_servers(urls: &[(String, String)]) -> Vec<(String, Option<pg_cpu::Server>)> {
    let mut servers = Vec::new();
    for (name, url) in urls {
        let server = match AsyncPgConnection::establish(url).await {
            Ok(mut conn) => pg_cpu::Server::of(&mut conn).await,
            Err(_) => None,
        };
        servers.push((name.clone(), server));
    }
    servers
}

/// Every node's CPU ticks now (see [`pg_cpu::Server::ticks`]).
fn node_ticks(servers: &[(String, Option<pg_cpu::Server>)]) -> Vec<Option<u64>> {
    servers
        .iter()
        .map(|(_, s)| s.as_ref().map(pg_cpu::Server::ticks))
        .collect()
}

/// The most handlers running at one instant (an end and a start at the
/// same instant do not overlap).
fn max_running(records: &[common::Record]) -> i64 {
    let mut edges: Vec<(u64, i64)> = records
        .iter()
        .flat_map(|r| [(r.start_ns, 1), (r.end_ns, -1)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut peak) = (0, 0);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    peak
}

#[derive(diesel::QueryableByName)]
struct Lsn {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    bytes: i64,
}

/// The server's current WAL position, in bytes.
async fn wal_lsn(pool: &pgfifo::Pool) -> Result<i64, String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let row: Lsn = diesel::sql_query("SELECT (pg_current_wal_lsn() - '0/0')::bigint AS bytes")
        .get_result(&mut *conn)
        .await
        .map_err(|e| format!("read the WAL position: {e}"))?;
    Ok(row.bytes)
}

/// The process's peak resident memory (VmHWM) in MiB: the runner, its 16
/// workers and this benchmark's in-memory records. `None` off Linux.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((kb / 1024.0 * 10.0).round() / 10.0)
}

/// Enqueues job k as group `k % groups`, seq `k / groups`, in batches (as
/// one pgfifo batch if `in_batch`); returns the seconds it took and the
/// pgfifo batch's id.
pub async fn enqueue_round_robin(
    pool: &pgfifo::Pool,
    jobs: u64,
    groups: u64,
    in_batch: bool,
) -> Result<(f64, Option<pgfifo::BatchId>), String> {
    let names: Vec<String> = (0..groups).map(|g| format!("g{g}")).collect();
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut pgfifo_batch = None;
    let mut k = 0;
    while k < jobs {
        let end = (k + BATCH).min(jobs);
        let batch = (k..end)
            .map(|k| {
                let (g, s) = (k % groups, k / groups);
                let job = BenchJob {
                    g: g as u32,
                    s: s as u32,
                };
                NewJob::new(&job, EnqueueOptions::group(names[g as usize].clone()))
            })
            .collect::<pgfifo::Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        if in_batch {
            crate::batch_mode::enqueue_chunk(&mut conn, &mut pgfifo_batch, batch).await?;
        } else {
            pgfifo::enqueue_batch(&mut conn, batch)
                .await
                .map_err(|e| e.to_string())?;
        }
        k = end;
    }
    crate::batch_mode::close(&mut conn, pgfifo_batch).await?;
    Ok((started.elapsed().as_secs_f64(), pgfifo_batch))
}

async fn wait_all_committed(pool: &pgfifo::Pool, jobs: u64) -> Result<(), String> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    for _ in 0..2_000 {
        let c: Count =
            diesel::sql_query("SELECT count(*) AS n FROM pgfifo.job WHERE state = 'succeeded'")
                .get_result(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        if c.n as u64 >= jobs {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err("jobs ran but their outcomes did not all commit".into())
}

/// `connections` sessions doing one single-row UPDATE per transaction (each
/// on its own row) for `length`; returns transactions per second.
pub async fn ceiling_tps(url: &str, connections: u64, length: Duration) -> Result<f64, String> {
    let mut setup = AsyncPgConnection::establish(url)
        .await
        .map_err(|e| e.to_string())?;
    setup
        .batch_execute(
            "DROP TABLE IF EXISTS bench_ceiling; \
             CREATE TABLE bench_ceiling (id integer PRIMARY KEY, n bigint NOT NULL DEFAULT 0); \
             INSERT INTO bench_ceiling (id) SELECT generate_series(0, 1023)",
        )
        .await
        .map_err(|e| e.to_string())?;
    let stop = Instant::now() + length;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut conn = AsyncPgConnection::establish(&url)
                .await
                .map_err(|e| e.to_string())?;
            let mut done = 0u64;
            while Instant::now() < stop {
                diesel::sql_query("UPDATE bench_ceiling SET n = n + 1 WHERE id = $1")
                    .bind::<Integer, _>((c % 1024) as i32)
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                done += 1;
            }
            Ok::<u64, String>(done)
        }));
    }
    let started = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await.map_err(|e| e.to_string())??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

//! `long-job`: what one long job costs the short jobs around it.
//!
//! Two phases, each on a fresh database, with the same load: `fifo-groups`
//! style short jobs (`BenchJob`, round-robin over `NGROUPS` groups, drained
//! by `WORKERS` workers) — once plain, once while one job of another queue
//! and group runs for the whole window. By default that job runs in long
//! mode (`LongHoldJob`, `#[job(long)]`: its group is held without an open
//! transaction); `LONG_MODE=0` runs it the old way (`HoldJob`, which keeps
//! its transaction open, with an xid), for comparison. `ratio` is the
//! short jobs' throughput with the long job ÷ without. While each window
//! runs, a watcher reads `pg_stat_activity` every 100 ms and reports the
//! longest any runner connection held a transaction id or a snapshot
//! (`backend_xid` or `backend_xmin`, aged from its transaction's start) as
//! `max_xid_age_s` (the benchmark's own enqueuing connection is left out).
//!
//! Choice of measurement: a fixed window of `HOLD` seconds, not a fixed
//! number of jobs. `JOBS` short jobs drain in a few seconds, far less than a
//! hold of a minute, and the cost of a long transaction grows with its age
//! (every dead row version made since it began must be kept, by VACUUM and by
//! page pruning alike). So the backlog is kept topped up (another `JOBS` jobs
//! are enqueued whenever fewer than `JOBS / 2` wait) and throughput is the
//! jobs finished during the window divided by its length. In the hold phase
//! the window opens once the hold job is running (its transaction has an xid,
//! which holds back the xmin horizon) and closes before it is released, so
//! the whole window is under the hold. In both phases the window opens when
//! the first short job has finished (the runner's start-up is reported as
//! `startup_secs`, not measured). The plain phase uses the same window
//! length, the same top-ups and an idle runner for the hold queue, so only
//! the hold differs.
//!
//! At the end of each window: the dead tuples of `pgfifo.job` and
//! `pgfifo.queue_group` (`n_dead_tup`, read once the backends have flushed
//! their statistics) and the tables' sizes; then, after the hold is
//! released, a manual `VACUUM` and the dead tuples left after it, to show
//! which were only kept alive by the hold.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
// (Atomics behind an Arc are read as `AtomicU64::load(&x, …)`: diesel's
// RunQueryDsl::load would shadow `x.load(…)`.)
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, Job, NewJob, RunnerConfig};
use serde_json::{json, Value};

use crate::common::{self, round3, BenchJob, Inputs};
use crate::progress;

mod hold;

use hold::{watch_xids, HoldJob, LongHoldJob, HOLD_DONE, HOLD_RELEASE, HOLD_STARTED, HOLD_TIMES};

const DATABASE: &str = "pgfifo_bench_long_job";
/// The long job's own database with `HOLD_ELSEWHERE=1`.
const HOLD_DATABASE: &str = "pgfifo_bench_long_job_hold";
/// Jobs per `enqueue_batch` call.
const BATCH: u64 = 5_000;
/// Samples of the finished count per window (for the throughput series).
const SLICES: u32 = 10;
/// How long the hold job may take to start.
const START_PATIENCE: Duration = Duration::from_secs(30);

#[derive(QueryableByName)]
struct TableStats {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = BigInt)]
    dead: i64,
    #[diesel(sql_type = BigInt)]
    live: i64,
    #[diesel(sql_type = BigInt)]
    bytes: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The load of one phase.
#[derive(Clone, Copy)]
struct Load {
    jobs: u64,
    groups: u64,
    workers: u64,
    window: Duration,
    /// Run the long job in a database of its own (`HOLD_ELSEWHERE=1`).
    elsewhere: bool,
    /// Run the long job in long mode (`LONG_MODE`, default 1).
    long_mode: bool,
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let load = Load {
        jobs: inputs.number("JOBS", 20_000)?.max(2),
        groups: inputs.number("NGROUPS", 200)?.max(1),
        workers: inputs.number("WORKERS", 16)?.max(1),
        window: Duration::from_secs(inputs.number("HOLD", 60)?.max(1)),
        elsewhere: inputs.number("HOLD_ELSEWHERE", 0)? != 0,
        long_mode: inputs.number("LONG_MODE", 1)? != 0,
    };
    let server = inputs.database_url();
    common::set_work_ms(0);

    progress!("phase 1/2: short jobs for {:?}, no long job", load.window);
    let without = phase(&server, load, false).await?;
    progress!(
        "phase 2/2: short jobs for {:?} while one long job runs ({})",
        load.window,
        if load.long_mode {
            "long mode: no open transaction"
        } else {
            "LONG_MODE=0: it holds its transaction"
        }
    );
    let with = phase(&server, load, true).await?;
    common::drop_database(&server, DATABASE).await?;
    if load.elsewhere {
        common::drop_database(&server, HOLD_DATABASE).await?;
    }

    let rate = |v: &Value| v["throughput"].as_f64().unwrap_or(0.0);
    let ratio = if rate(&without) > 0.0 {
        round3(rate(&with) / rate(&without))
    } else {
        0.0
    };
    progress!(
        "throughput {} jobs/s without, {} with the long job (ratio {ratio}); longest xid or snapshot held by a runner connection {} s; dead tuples at the end: job {}, queue_group {}",
        without["throughput"],
        with["throughput"],
        with["max_xid_age_s"],
        with["job_dead_tup"],
        with["queue_group_dead_tup"]
    );
    Ok(json!({
        "scenario": "long-job",
        "jobs": load.jobs,
        "groups": load.groups,
        "workers": load.workers,
        "hold_secs": load.window.as_secs(),
        "hold_database": if load.elsewhere { "separate" } else { "same" },
        "long_mode": load.long_mode,
        "hold_measured_secs": with["hold_measured_secs"],
        "throughput_without": without["throughput"],
        "throughput_with": with["throughput"],
        "ratio": ratio,
        "max_xid_age_s": with["max_xid_age_s"],
        "job_dead_tup": with["job_dead_tup"],
        "queue_group_dead_tup": with["queue_group_dead_tup"],
        "without": without,
        "with": with,
    }))
}

/// One phase: returns its figures.
async fn phase(server: &str, load: Load, hold: bool) -> Result<Value, String> {
    let (pool, url) =
        common::fresh_database(server, DATABASE, load.workers as u32 * 2 + 10).await?;
    common::epoch();
    common::take_records();
    *HOLD_TIMES.lock().expect("hold times") = (None, None);
    let names: Arc<Vec<String>> = Arc::new((0..load.groups).map(|g| format!("g{g}")).collect());
    let enqueued = Arc::new(AtomicU64::new(0));
    {
        let mut conn = pool.get().await.map_err(|e| e.to_string())?;
        enqueue_range(&mut conn, 0, load.jobs, &names).await?;
        enqueued.store(load.jobs, Ordering::Relaxed);
    }

    // The hold queue has its own runner in both phases (idle in the plain one),
    // on the same database or, with HOLD_ELSEWHERE=1, on a second database of
    // the same server (PostgreSQL keeps a horizon per database).
    let hold_pool = if load.elsewhere {
        common::fresh_database(server, HOLD_DATABASE, 4).await?.0
    } else {
        pool.clone()
    };
    let hold_runner = pgfifo::runner::start(
        hold_pool.clone(),
        RunnerConfig::default()
            .queues([HoldJob::QUEUE])
            .concurrency(1),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut hold_xid = false;
    if hold {
        let mut conn = hold_pool.get().await.map_err(|e| e.to_string())?;
        let max_ms = (load.window.as_millis() as u64).saturating_mul(2) + 300_000;
        if load.long_mode {
            LongHoldJob { max_ms }.enqueue(&mut conn, "hold").await
        } else {
            HoldJob { max_ms }.enqueue(&mut conn, "hold").await
        }
        .map_err(|e| e.to_string())?;
        tokio::time::timeout(START_PATIENCE, HOLD_STARTED.notified())
            .await
            .map_err(|_| "the hold job did not start".to_owned())?;
        let holders: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xid IS NOT NULL",
        )
        .get_result(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        hold_xid = holders.n > 0;
        progress!("the hold job runs (a transaction with an xid sits idle: {hold_xid})");
    }

    let runner_started = Instant::now();
    let runner = pgfifo::runner::start(
        pool.clone(),
        RunnerConfig::default()
            .queues([BenchJob::QUEUE])
            .concurrency(load.workers as usize)
            .poll_interval(Duration::from_millis(200)),
    )
    .await
    .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let feeder_pid = Arc::new(AtomicI32::new(0));
    let feeder = tokio::spawn(feed(
        pool.clone(),
        load,
        names,
        enqueued.clone(),
        stop.clone(),
        feeder_pid.clone(),
    ));

    // The window opens once short jobs flow: the runner's start-up (pool
    // connections, first promotion of the groups) is not what is measured.
    let deadline = Instant::now() + START_PATIENCE;
    while common::finished() == 0 {
        if Instant::now() > deadline {
            return Err("no short job ran within 30 s of the runner's start".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let startup_secs = runner_started.elapsed().as_secs_f64();
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch_xids(
        AsyncPgConnection::establish(&url)
            .await
            .map_err(|e| format!("connect the watcher: {e}"))?,
        feeder_pid.clone(),
        stop_watching.clone(),
    ));
    let started = Instant::now();
    let first = common::finished() as u64;
    let mut previous = first;
    let mut series = Vec::new();
    let slice = load.window / SLICES;
    for i in 1..=SLICES {
        tokio::time::sleep_until((started + slice * i).into()).await;
        let now = common::finished() as u64;
        series.push((((now - previous) as f64) / slice.as_secs_f64()).round());
        previous = now;
    }
    let window_secs = started.elapsed().as_secs_f64();
    stop_watching.store(true, Ordering::Relaxed);
    let max_xid_age = watcher.await.map_err(|e| e.to_string())??;
    let done = common::finished() as u64 - first;
    let throughput = done as f64 / window_secs;
    stop.store(true, Ordering::Relaxed);
    feeder.await.map_err(|e| e.to_string())??;
    runner.shutdown().await.map_err(|e| e.to_string())?;
    progress!(
        "{done} short jobs in {window_secs:.1}s: {throughput:.0} jobs/s; per slice {series:?}"
    );

    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let at_end = settled_stats(&mut conn).await?;
    let mut hold_measured = 0.0;
    if hold {
        HOLD_RELEASE.notify_one();
        tokio::time::timeout(START_PATIENCE, HOLD_DONE.notified())
            .await
            .map_err(|_| "the hold job did not end when released".to_owned())?;
        let (start, end) = *HOLD_TIMES.lock().expect("hold times");
        if let (Some(start), Some(end)) = (start, end) {
            hold_measured = (end - start).as_secs_f64();
        }
        // Let its commit land before VACUUM looks at the horizon.
        wait_hold_committed(&mut conn).await?;
    }
    hold_runner.shutdown().await.map_err(|e| e.to_string())?;
    conn.batch_execute("VACUUM pgfifo.job, pgfifo.queue_group")
        .await
        .map_err(|e| e.to_string())?;
    let after_vacuum = read_stats(&mut conn).await?;
    drop(conn);
    drop(pool);

    let records = common::take_records();
    let checked = common::check(
        &records,
        AtomicU64::load(&enqueued, Ordering::Relaxed),
        load.groups,
    );
    let stat = |stats: &[TableStats], table: &str, field: fn(&TableStats) -> i64| {
        stats
            .iter()
            .find(|s| s.name == table)
            .map(field)
            .unwrap_or(-1)
    };
    progress!(
        "dead tuples: job {} / queue_group {} at the end, {} / {} after VACUUM",
        stat(&at_end, "job", |s| s.dead),
        stat(&at_end, "queue_group", |s| s.dead),
        stat(&after_vacuum, "job", |s| s.dead),
        stat(&after_vacuum, "queue_group", |s| s.dead),
    );
    Ok(json!({
        "throughput": throughput.round(),
        "jobs_done": done,
        "window_secs": round3(window_secs),
        "startup_secs": round3(startup_secs),
        "throughput_per_slice": series,
        "hold_measured_secs": round3(hold_measured),
        "hold_xid_seen": hold_xid,
        "max_xid_age_s": round3(max_xid_age),
        "job_dead_tup": stat(&at_end, "job", |s| s.dead),
        "job_live_tup": stat(&at_end, "job", |s| s.live),
        "job_bytes": stat(&at_end, "job", |s| s.bytes),
        "queue_group_dead_tup": stat(&at_end, "queue_group", |s| s.dead),
        "queue_group_bytes": stat(&at_end, "queue_group", |s| s.bytes),
        "job_dead_tup_after_vacuum": stat(&after_vacuum, "job", |s| s.dead),
        "queue_group_dead_tup_after_vacuum": stat(&after_vacuum, "queue_group", |s| s.dead),
        "enqueued": AtomicU64::load(&enqueued, Ordering::Relaxed),
        "duplicates": checked.duplicates,
        "order_violations": checked.order_violations,
        "overlaps": checked.overlaps,
    }))
}

/// Keeps the backlog topped up until `stop`: another `load.jobs` jobs
/// whenever fewer than half that many are waiting.
async fn feed(
    pool: pgfifo::Pool,
    load: Load,
    names: Arc<Vec<String>>,
    enqueued: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicI32>,
) -> Result<(), String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let me: Count = diesel::sql_query("SELECT pg_backend_pid()::bigint AS n")
        .get_result(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    pid.store(me.n as i32, Ordering::Relaxed);
    while !AtomicBool::load(&stop, Ordering::Relaxed) {
        let total = AtomicU64::load(&enqueued, Ordering::Relaxed);
        if total.saturating_sub(common::finished() as u64) >= load.jobs / 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let mut k = total;
        while k < total + load.jobs && !AtomicBool::load(&stop, Ordering::Relaxed) {
            let end = (k + BATCH).min(total + load.jobs);
            enqueue_range(&mut conn, k, end, &names).await?;
            enqueued.store(end, Ordering::Relaxed);
            k = end;
        }
    }
    Ok(())
}

/// Enqueues jobs `from..to`: job k is group `k % groups`, seq `k / groups`
/// (the numbering of `fifo-groups`, continued), in batches.
async fn enqueue_range(
    conn: &mut AsyncPgConnection,
    from: u64,
    to: u64,
    names: &[String],
) -> Result<(), String> {
    let groups = names.len() as u64;
    let mut k = from;
    while k < to {
        let end = (k + BATCH).min(to);
        let batch = (k..end)
            .map(|k| {
                let (g, s) = (k % groups, k / groups);
                NewJob::new(
                    &BenchJob {
                        g: g as u32,
                        s: s as u32,
                    },
                    EnqueueOptions::group(names[g as usize].clone()),
                )
            })
            .collect::<pgfifo::Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        pgfifo::enqueue_batch(conn, batch)
            .await
            .map_err(|e| e.to_string())?;
        k = end;
    }
    Ok(())
}

/// Dead and live tuples and total sizes of the job and group tables.
async fn read_stats(conn: &mut AsyncPgConnection) -> Result<Vec<TableStats>, String> {
    conn.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .map_err(|e| e.to_string())?;
    diesel::sql_query(
        "SELECT relname::text AS name, n_dead_tup AS dead, n_live_tup AS live, \
                pg_total_relation_size(relid) AS bytes \
         FROM pg_stat_user_tables WHERE schemaname = 'pgfifo' AND relname IN ('job', 'queue_group')",
    )
    .load(conn)
    .await
    .map_err(|e| e.to_string())
}

/// The statistics once the runner's backends have reported theirs: a backend
/// flushes its table counters when it goes idle, at most once a second
/// (PostgreSQL 15), so wait a little and read until two reads agree.
async fn settled_stats(conn: &mut AsyncPgConnection) -> Result<Vec<TableStats>, String> {
    let _ = conn
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut last = read_stats(conn).await?;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = read_stats(conn).await?;
        let key = |s: &[TableStats]| s.iter().map(|t| (t.dead, t.live)).collect::<Vec<_>>();
        if key(&now) == key(&last) {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// Waits until the hold job's outcome is committed.
async fn wait_hold_committed(conn: &mut AsyncPgConnection) -> Result<(), String> {
    for _ in 0..1_000 {
        let open: Count = diesel::sql_query(
            "SELECT count(*) AS n FROM pgfifo.job WHERE queue = $1 AND state = 'queued'",
        )
        .bind::<Text, _>(HoldJob::QUEUE)
        .get_result(conn)
        .await
        .map_err(|e| e.to_string())?;
        if open.n == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("the hold job's outcome did not commit".into())
}

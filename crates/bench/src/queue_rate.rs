//! `queue-rate`: how closely a queue's rate limit (`pgfifo::QueueLimits`,
//! docs/queue-limits.md) holds across several runner processes (issue 33:
//! "a queue rate of R/s holds within 2 % over 60 s across three runners").
//!
//! On a fresh database (`pgfifo_bench_queue_rate`), the queue
//! `bench.qrate` gets a rate of `RATE` per second (default 50; `50`, `50/s`
//! or `3000/m`) and a burst of `BURST` (default 10), then a backlog of
//! instant jobs (`WORK_MS`, default 0) spread over `NGROUPS` groups
//! (default 100), deeper than the rate can start in the run: the queue is
//! at its rate throughout. `RUNNERS` runner processes (default 3; this
//! binary run again as `queue-rate-worker`, each with its own pool and
//! `WORKERS` slots, default 4, and the runner's default poll interval
//! unless `POLL_MS` is set) drain it for `WARMUP_SECS` (default 2: the burst
//! is spent and every runner has started) plus `SECS` (default 60) plus
//! one second, and are then shut down (their stdin closed).
//!
//! Figures, from the attempts' `started_at` (the server's clock, written
//! with the queue's token in the same transaction):
//! - `starts_per_s` over the measured window (`SECS` long, after the
//!   warm-up) and `ratio` to `RATE` (target: within 2 %, `within_goal`);
//! - `worst_window_excess`: over every pair of starts of the whole run,
//!   the starts from one to the other minus `BURST + RATE × t` (must be
//!   ≤ 0, `bound_held`), as `group-rate` computes it;
//! - `starts_per_runner`, and on stderr the starts of each second;
//! - `jobs_run_twice` (attempts beyond the first; 0) and
//!   `order_violations` (a job of a group that started before an older
//!   one of its group; 0).

use std::process::Stdio;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob, QueueLimits,
    RunnerConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::common::{self, round3, Inputs};
use crate::group_controls::{parse_rate, per_second, worst_window_excess};
use crate::progress;

const DATABASE: &str = "pgfifo_bench_queue_rate";
/// The target: the measured rate within this many percent of the set one.
const GOAL_PCT: f64 = 2.0;
/// Excess tolerated for the rounding of `started_at` to µs.
const EXCESS_TOLERANCE: f64 = 0.001;
/// Jobs per `enqueue_batch` call.
const BATCH: u64 = 5_000;
/// How long the first start may take.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// How long a worker may take to shut down once told to.
const STOP_PATIENCE: Duration = Duration::from_secs(60);

/// The scenario's job: sleeps `work_ms`, if any.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.qrate",
    queue = "bench.qrate",
    max_attempts = 3,
    timeout = "60s"
)]
pub struct QueueRateJob {
    /// How long the handler sleeps, in ms.
    pub work_ms: u64,
}

#[async_trait]
impl Handler for QueueRateJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.work_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.work_ms)).await;
        }
        Ok(())
    }
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let rate = parse_rate(&inputs.string("RATE", "50"))?;
    let burst = inputs
        .number("BURST", 10)?
        .clamp(1, u64::from(pgfifo::MAX_RATE_COUNT)) as u32;
    let secs = inputs.number("SECS", 60)?.max(1);
    let warmup = inputs.number("WARMUP_SECS", 2)?;
    let runners = inputs.number("RUNNERS", 3)?.max(1);
    let workers = inputs.number("WORKERS", 4)?.max(1);
    let groups = inputs.number("NGROUPS", 100)?.max(1);
    let work_ms = inputs.number("WORK_MS", 0)?;
    let poll_ms = inputs.string("POLL_MS", "");
    let rate_per_s = per_second(rate);
    let server = inputs.database_url();
    let (pool, url) = common::fresh_database(&server, DATABASE, 4).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;

    let limits = QueueLimits::new().rate(rate).burst(burst);
    pgfifo::admin::set_queue_limits(&mut conn, QueueRateJob::QUEUE, limits)
        .await
        .map_err(|e| e.to_string())?;
    let total_secs = warmup + secs + 1;
    let jobs = u64::from(burst) + (rate_per_s * total_secs as f64 * 1.25).ceil() as u64 + 100;
    progress!("queue-rate: rate {rate}, burst {burst}; enqueueing {jobs} jobs in {groups} groups");
    enqueue(&mut conn, jobs, groups, work_ms).await?;

    progress!(
        "{runners} runner processes of {workers} slots each (poll {}); {warmup}s warm-up, \
         {secs}s measured",
        if poll_ms.is_empty() {
            "default"
        } else {
            &poll_ms
        }
    );
    let mut children = Vec::new();
    for i in 0..runners {
        children.push(spawn_worker(&url, i, workers, &poll_ms)?);
    }
    let started = wait_first_start(&mut conn).await;
    if let Err(err) = started {
        stop_workers(children).await?;
        return Err(err);
    }
    tokio::time::sleep(Duration::from_secs(total_secs)).await;
    stop_workers(children).await?;

    let starts = read_starts(&mut conn).await?;
    let checks = read_checks(&mut conn).await?;
    drop(conn);
    drop(pool);
    let us: Vec<i64> = starts.iter().map(|s| s.us).collect();
    let (from, to) = (
        warmup as i64 * 1_000_000,
        (warmup + secs) as i64 * 1_000_000,
    );
    let in_window = us.iter().filter(|&&t| t >= from && t < to).count();
    let measured = in_window as f64 / secs as f64;
    let ratio = measured / rate_per_s;
    let worst = worst_window_excess(&us, rate_per_s, burst);
    let mut per_runner: Vec<(String, u64)> = Vec::new();
    for start in &starts {
        match per_runner
            .iter_mut()
            .find(|(name, _)| *name == start.runner)
        {
            Some((_, count)) => *count += 1,
            None => per_runner.push((start.runner.clone(), 1)),
        }
    }
    per_runner.sort();
    let mut series = vec![0u64; total_secs as usize + 1];
    for &t in &us {
        if let Some(n) = series.get_mut((t.max(0) / 1_000_000) as usize) {
            *n += 1;
        }
    }
    progress!("starts in each second: {series:?}");
    progress!(
        "{in_window} starts in the {secs}s window: {measured:.3}/s, {:.2} % of {rate_per_s}/s; \
         worst window excess {worst:.4}; per runner {per_runner:?}",
        ratio * 100.0
    );
    Ok(json!({
        "scenario": "queue-rate",
        "rate": rate.to_string(),
        "rate_per_s": rate_per_s,
        "burst": burst,
        "secs": secs,
        "warmup_secs": warmup,
        "runners": runners,
        "workers": workers,
        "groups": groups,
        "work_ms": work_ms,
        "poll_ms": if poll_ms.is_empty() { Value::Null } else { json!(poll_ms) },
        "jobs": jobs,
        "starts": starts.len(),
        "window_starts": in_window,
        "starts_per_s": round3(measured),
        "ratio": (ratio * 1e4).round() / 1e4,
        "goal_pct": GOAL_PCT,
        "within_goal": (ratio - 1.0).abs() * 100.0 <= GOAL_PCT,
        "worst_window_excess": (worst * 1e4).round() / 1e4,
        "bound_held": worst <= EXCESS_TOLERANCE,
        "starts_per_runner": per_runner.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
        "jobs_run_twice": checks.twice,
        "order_violations": checks.order_violations,
    }))
}

/// `queue-rate-worker`: one runner of the scenario's queue, until its stdin
/// closes; then a graceful shutdown.
pub async fn worker(inputs: &Inputs) -> Result<Value, String> {
    let url = inputs.database_url();
    let name = inputs.string("NAME", "queue-rate-worker");
    let workers = inputs.number("WORKERS", 4)?.max(1);
    let pool = pgfifo::connect(&url, workers as u32 * 2 + 4)
        .await
        .map_err(|e| e.to_string())?;
    let mut config = RunnerConfig::default()
        .queues([QueueRateJob::QUEUE])
        .concurrency(workers as usize)
        .name(name.clone());
    if !inputs.string("POLL_MS", "").is_empty() {
        config = config.poll_interval(Duration::from_millis(inputs.number("POLL_MS", 1_000)?));
    }
    let runner = pgfifo::runner::start(pool, inputs.tune(config)?)
        .await
        .map_err(|e| e.to_string())?;
    let mut sink = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut sink).await;
    runner.shutdown().await.map_err(|e| e.to_string())?;
    Ok(json!({ "worker": name }))
}

/// Starts worker `i`: this binary again, its stdin a pipe that
/// [`stop_workers`] closes.
fn spawn_worker(url: &str, i: u64, workers: u64, poll_ms: &str) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the bench binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("queue-rate-worker")
        .args(["--database-url", url])
        .args(["--name", &format!("qrate-{i}")])
        .args(["--workers", &workers.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if !poll_ms.is_empty() {
        cmd.args(["--poll-ms", poll_ms]);
    }
    cmd.spawn().map_err(|e| format!("start worker {i}: {e}"))
}

/// Closes each worker's stdin and waits for it to shut down (killed after
/// [`STOP_PATIENCE`]).
async fn stop_workers(children: Vec<Child>) -> Result<(), String> {
    let mut children = children;
    for child in &mut children {
        drop(child.stdin.take());
    }
    for (i, mut child) in children.into_iter().enumerate() {
        match tokio::time::timeout(STOP_PATIENCE, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => return Err(format!("worker {i} ended with {status}")),
            Ok(Err(err)) => return Err(format!("worker {i}: {err}")),
            Err(_) => {
                let _ = child.kill().await;
                return Err(format!("worker {i} did not stop within {STOP_PATIENCE:?}"));
            }
        }
    }
    Ok(())
}

/// Enqueues `jobs` jobs round robin over `groups` groups, in batches.
async fn enqueue(
    conn: &mut AsyncPgConnection,
    jobs: u64,
    groups: u64,
    work_ms: u64,
) -> Result<(), String> {
    let mut k = 0;
    while k < jobs {
        let end = (k + BATCH).min(jobs);
        let batch = (k..end)
            .map(|k| {
                NewJob::new(
                    &QueueRateJob { work_ms },
                    EnqueueOptions::group(format!("g{}", k % groups)),
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

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Waits until some job of the queue has started.
async fn wait_first_start(conn: &mut AsyncPgConnection) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + START_PATIENCE;
    loop {
        let row: Count = diesel::sql_query("SELECT count(*) AS n FROM pgfifo.job_attempt")
            .get_result(conn)
            .await
            .map_err(|e| e.to_string())?;
        if row.n > 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no job started within {START_PATIENCE:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One attempt's start.
#[derive(QueryableByName)]
struct Start {
    #[diesel(sql_type = Text)]
    runner: String,
    /// Microseconds after the first start (server clock).
    #[diesel(sql_type = BigInt)]
    us: i64,
}

/// Every attempt of the queue's jobs, in the order they started.
async fn read_starts(conn: &mut AsyncPgConnection) -> Result<Vec<Start>, String> {
    diesel::sql_query(
        "SELECT a.runner, \
                (extract(epoch FROM a.started_at - min(a.started_at) OVER ()) * 1000000)::bigint AS us \
         FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id \
         WHERE j.queue = $1 \
         ORDER BY a.started_at, a.job_id",
    )
    .bind::<Text, _>(QueueRateJob::QUEUE)
    .load(conn)
    .await
    .map_err(|e| format!("read the starts: {e}"))
}

#[derive(QueryableByName)]
struct Checks {
    /// Attempts beyond the first.
    #[diesel(sql_type = BigInt)]
    twice: i64,
    /// Starts of a job after a younger job of its group had started.
    #[diesel(sql_type = BigInt)]
    order_violations: i64,
}

async fn read_checks(conn: &mut AsyncPgConnection) -> Result<Checks, String> {
    diesel::sql_query(
        "WITH s AS (
             SELECT a.job_id, a.attempt, j.group_id,
                    max(a.job_id) OVER (PARTITION BY j.group_id ORDER BY a.started_at, a.job_id
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
             FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id
             WHERE j.queue = $1)
         SELECT count(*) FILTER (WHERE attempt > 1) AS twice,
                count(*) FILTER (WHERE before > job_id) AS order_violations
         FROM s",
    )
    .bind::<Text, _>(QueueRateJob::QUEUE)
    .get_result(conn)
    .await
    .map_err(|e| format!("check the runs: {e}"))
}

//! `latency`: enqueue-commit to handler-start at a steady rate.
//!
//! A runner serves queue `bench.latency` with `WORKERS` concurrent jobs (idle
//! workers wait for `NOTIFY`, with the library's default 1 s poll as the
//! fallback; `POLL_MS` changes it). Separate connections (`ENQUEUERS`,
//! default 4) enqueue one job at a time in autocommit (`job.enqueue(&mut conn,
//! group)`, groups round-robin over `NGROUPS`) at `RATE` per second in all for
//! `SECONDS`. Each job's latency is
//! the handler's start minus the instant its enqueue returned (the COMMIT's
//! reply), both on one monotonic clock, matched by job id. The job can start
//! before the enqueuer has read the COMMIT's reply, so a latency can be
//! slightly negative; it is reported as measured.
//!
//! `pg_cpu_ms_per_job` is the CPU time of the server processes serving the
//! scenario's database (the runner's and the enqueuers' backends; see
//! `pg_cpu`), from the first enqueue until every job started, per job: what
//! a job costs the database at this rate. `null` when the server runs on
//! another machine.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob, RunnerConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::MissedTickBehavior;

use crate::common::{self, round3, Inputs};
use crate::pg_cpu;
use crate::progress;

const DATABASE: &str = "pgfifo_bench_latency";
/// How long to wait, after the last enqueue, for every job to start.
const SETTLE: Duration = Duration::from_secs(30);

/// Start instants of [`LatencyJob`] runs, by job id.
static STARTS: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());

/// The job of this scenario: its handler only notes when it started.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.latency",
    queue = "bench.latency",
    max_attempts = 3,
    timeout = "60s",
    backoff = "10ms"
)]
pub struct LatencyJob {
    /// The job's number in the run.
    pub n: u64,
}

#[async_trait]
impl Handler for LatencyJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let started = Instant::now();
        STARTS.lock().expect("starts").push((ctx.id(), started));
        Ok(())
    }
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let rate = inputs.number("RATE", 500)?;
    let seconds = inputs.number("SECONDS", 20)?;
    let groups = inputs.number("NGROUPS", 200)?.max(1);
    let workers = inputs.number("WORKERS", 16)?.max(1);
    let poll_ms = inputs.number("POLL_MS", 1000)?.max(1);
    let enqueuers = inputs.number("ENQUEUERS", 4)?.max(1);
    if rate == 0 || seconds == 0 {
        return Err("RATE and SECONDS must be at least 1".into());
    }
    let server = inputs.database_url();
    let (pool, url) = common::fresh_database(&server, DATABASE, workers as u32 * 2 + 4).await?;
    let config = inputs.tune(
        RunnerConfig::default()
            .queues([LatencyJob::QUEUE])
            .concurrency(workers as usize)
            .poll_interval(Duration::from_millis(poll_ms)),
    )?;
    let runner = pgfifo::runner::start(pool.clone(), config)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = AsyncPgConnection::establish(&url)
        .await
        .map_err(|e| e.to_string())?;

    // Warm-up, not measured: the pool opens its connections and each session
    // plans the pick once.
    let warmup = workers * 4;
    let batch = (0..warmup)
        .map(|n| {
            NewJob::new(
                &LatencyJob { n },
                EnqueueOptions::group(format!("warmup{n}")),
            )
        })
        .collect::<pgfifo::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    pgfifo::enqueue_batch(&mut conn, batch)
        .await
        .map_err(|e| e.to_string())?;
    wait_for_starts(warmup as usize, SETTLE).await;
    STARTS.lock().expect("starts").clear();

    progress!("enqueueing {rate} jobs/s for {seconds}s over {groups} groups; {workers} workers");
    let cpu_before = pg_cpu::Sample::of_database(&mut conn).await;
    drop(conn);
    let enqueue_url = url.clone();
    // The enqueuer runs on a thread and runtime of its own, so that neither
    // its ticks nor the instant it reads the COMMIT's reply wait for the
    // runner's tasks to yield the shared runtime's threads.
    let enqueuer = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(enqueue_steadily(
                &enqueue_url,
                rate,
                seconds,
                groups,
                enqueuers,
            ))
    });
    let Enqueued {
        jobs: enqueued,
        mut call_ms,
        secs: enqueue_secs,
        server_cpu_s: enqueue_cpu_s,
    } = tokio::task::spawn_blocking(move || enqueuer.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the enqueuer thread panicked".to_owned())??;
    let achieved = enqueued.len() as f64 / enqueue_secs;
    progress!(
        "enqueued {} jobs in {enqueue_secs:.2}s ({achieved:.0}/s); waiting for them to start",
        enqueued.len()
    );
    wait_for_starts(enqueued.len(), SETTLE).await;
    // The runner's backends, sampled before its connections close: the
    // enqueuers sampled their own before they closed.
    let mut conn = AsyncPgConnection::establish(&url)
        .await
        .map_err(|e| e.to_string())?;
    let cpu_after = pg_cpu::Sample::of_database(&mut conn).await;
    drop(conn);
    let pg_cpu_ms_per_job = match (cpu_before, cpu_after, enqueue_cpu_s) {
        (Some(before), Some(after), Some(enqueue)) if !enqueued.is_empty() => Some(round3(
            (after.seconds_since(&before) + enqueue) * 1e3 / enqueued.len() as f64,
        )),
        _ => None,
    };
    runner.shutdown().await.map_err(|e| e.to_string())?;
    drop(pool);

    let starts = std::mem::take(&mut *STARTS.lock().expect("starts"));
    let mut first_start: HashMap<i64, Instant> = HashMap::with_capacity(starts.len());
    let mut duplicates = 0u64;
    for (id, at) in starts {
        match first_start.get_mut(&id) {
            Some(earlier) => {
                duplicates += 1;
                *earlier = (*earlier).min(at);
            }
            None => {
                first_start.insert(id, at);
            }
        }
    }
    let mut lost = 0u64;
    let mut latencies: Vec<f64> = Vec::with_capacity(enqueued.len());
    for (id, committed) in &enqueued {
        match first_start.get(id) {
            Some(start) => latencies.push(signed_ms(*start, *committed)),
            None => lost += 1,
        }
    }
    latencies.sort_by(f64::total_cmp);
    call_ms.sort_by(f64::total_cmp);
    common::drop_database(&server, DATABASE).await?;

    let result = json!({
        "scenario": "latency",
        "rate": rate,
        "achieved_rate": achieved.round(),
        "seconds": seconds,
        "enqueuers": enqueuers,
        "jobs": enqueued.len(),
        "groups": groups,
        "workers": workers,
        "poll_ms": poll_ms,
        "p50_ms": round3(common::percentile(&latencies, 0.5)),
        "p99_ms": round3(common::percentile(&latencies, 0.99)),
        "max_ms": round3(latencies.last().copied().unwrap_or(0.0)),
        "min_ms": round3(latencies.first().copied().unwrap_or(0.0)),
        "enqueue_call_p50_ms": round3(common::percentile(&call_ms, 0.5)),
        "enqueue_call_p99_ms": round3(common::percentile(&call_ms, 0.99)),
        "pg_cpu_ms_per_job": pg_cpu_ms_per_job,
        "lost": lost,
        "duplicates": duplicates,
    });
    progress!(
        "enqueue-commit to start: p50 {} ms, p99 {} ms, max {} ms; \
         PostgreSQL CPU per job {} ms; lost {lost}, duplicates {duplicates}",
        result["p50_ms"],
        result["p99_ms"],
        result["max_ms"],
        result["pg_cpu_ms_per_job"]
    );
    Ok(result)
}

/// What the enqueuer did.
struct Enqueued {
    /// Each job's id and the instant its enqueue returned (COMMIT replied).
    jobs: Vec<(i64, Instant)>,
    /// The duration of each enqueue call, in ms.
    call_ms: Vec<f64>,
    /// From the first tick to the last enqueue's return.
    secs: f64,
    /// The CPU seconds the enqueuers' backends spent (`None`: the server's
    /// processes cannot be read).
    server_cpu_s: Option<f64>,
}

/// Enqueues one job per tick, `rate` ticks a second for `seconds`, in
/// autocommit; groups round-robin over `groups`. The ticks are dealt
/// round-robin to `enqueuers` connections: one connection alone cannot keep a
/// steady 500 commits/s when each durable commit waits for its WAL flush
/// (about 3 ms here), and the scenario measures the queue, not the disk.
async fn enqueue_steadily(
    url: &str,
    rate: u64,
    seconds: u64,
    groups: u64,
    enqueuers: u64,
) -> Result<Enqueued, String> {
    let enqueuers = enqueuers.max(1);
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let started = Instant::now();
    let until = tokio::time::Instant::from_std(started + Duration::from_secs(seconds));
    let mut tasks = Vec::new();
    for lane in 0..enqueuers {
        let url = url.to_owned();
        // A thread and runtime per enqueuer: the instant an enqueue returns
        // must not wait for another enqueuer's task to yield.
        tasks.push(std::thread::spawn(move || -> Result<Enqueued, String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let mut conn = AsyncPgConnection::establish(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                let cpu_before = pg_cpu::Sample::of_session(&mut conn).await;
                // This lane's share of a fixed schedule: ticks lane, lane + E, …
                // When an enqueue overruns its slot, the missed ticks are skipped
                // (not fired in a burst to catch up), so the enqueuers never send
                // faster than RATE; `achieved_rate` says whether they kept up.
                let first = tokio::time::Instant::from_std(started) + period * lane as u32;
                let mut ticks = tokio::time::interval_at(first, period * enqueuers as u32);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
                let mut out = Enqueued {
                    jobs: Vec::new(),
                    call_ms: Vec::new(),
                    secs: 0.0,
                    server_cpu_s: None,
                };
                let mut n = lane;
                loop {
                    if ticks.tick().await >= until {
                        break;
                    }
                    let group = format!("g{}", n % groups);
                    let call = Instant::now();
                    let id = LatencyJob { n }
                        .enqueue(&mut conn, &group)
                        .await
                        .map_err(|e| e.to_string())?;
                    let committed = Instant::now();
                    out.jobs.push((id, committed));
                    out.call_ms.push((committed - call).as_secs_f64() * 1e3);
                    n += enqueuers;
                }
                let cpu_after = pg_cpu::Sample::of_session(&mut conn).await;
                out.server_cpu_s = cpu_before
                    .zip(cpu_after)
                    .map(|(before, after)| after.seconds_since(&before));
                Ok::<Enqueued, String>(out)
            })
        }));
    }
    let mut all = Enqueued {
        jobs: Vec::new(),
        call_ms: Vec::new(),
        secs: 0.0,
        server_cpu_s: Some(0.0),
    };
    for task in tasks {
        let part = task
            .join()
            .map_err(|_| "an enqueuer thread panicked".to_owned())??;
        all.jobs.extend(part.jobs);
        all.call_ms.extend(part.call_ms);
        all.server_cpu_s = all.server_cpu_s.zip(part.server_cpu_s).map(|(a, b)| a + b);
    }
    all.secs = started.elapsed().as_secs_f64();
    Ok(all)
}

/// `later - earlier` in ms, negative when `later` is before `earlier`.
fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(earlier - later).as_secs_f64() * 1e3,
    }
}

/// Waits until `count` handler starts were recorded, or `patience` passed.
async fn wait_for_starts(count: usize, patience: Duration) {
    let deadline = Instant::now() + patience;
    while STARTS.lock().expect("starts").len() < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

//! `group-concurrency`: how much faster one group drains when N of its jobs
//! may run at once, and whether they still start in order and never more
//! than N at a time (see the [parent module](super)).

use std::time::{Duration, Instant};

use pgfifo::{GroupLimits, Job};
use serde_json::{json, Value};

use super::{
    enqueue_group, fifo_of_runs, fifo_of_starts, max_concurrency, runs_of, shutdown, start_runners,
    starts, take_runs, ControlJob,
};
use crate::common::{self, round3, Inputs};
use crate::progress;

const DATABASE: &str = "pgfifo_bench_group_concurrency";
const GROUP: &str = "g";
/// The target: drain rate at CONCURRENCY over the rate at 1.
const GOAL_SPEEDUP: f64 = 3.6;
/// With a concurrency above 1, jobs picked together may begin in either
/// order, a moment apart: an older job may begin this long after a younger
/// one (the library's own tests allow as much) but never after a younger
/// one has ended.
const PICKED_TOGETHER_MS: f64 = 30.0;
/// The longest a drain may take.
const PATIENCE: Duration = Duration::from_secs(600);

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let jobs = inputs.number("JOBS", 2_000)?.max(1);
    let work_ms = inputs.number("WORK_MS", 5)?;
    let workers = inputs.number("WORKERS", 16)?;
    let n = inputs.number("CONCURRENCY", 4)?;
    let max_n = u64::from(pgfifo::MAX_GROUP_CONCURRENCY);
    if !(1..=max_n).contains(&n) {
        return Err(format!("CONCURRENCY={n} is outside 1 to {max_n}"));
    }
    if workers < 8 || workers < n {
        return Err(format!(
            "WORKERS={workers}: the runner needs at least 8 slots, and at least CONCURRENCY"
        ));
    }
    let rounds = inputs.number("ROUNDS", 1)?.max(1);
    let server = inputs.database_url();
    // Alternately (1, N, 1, N, …): the machine's speed drifts.
    let (mut singles, mut severals) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        singles.push(drain(inputs, &server, jobs, work_ms, workers, 1).await?);
        severals.push(drain(inputs, &server, jobs, work_ms, workers, n).await?);
    }
    common::drop_database(&server, DATABASE).await?;

    let single = median_rate(&singles);
    let several = median_rate(&severals);
    let speedup = several / single.max(1e-9);
    let holds = |r: &Value, limit: u64| {
        r["max_concurrency"].as_u64().unwrap_or(u64::MAX) <= limit
            && r["fifo_held"].as_bool() == Some(true)
            && r["lost"].as_u64() == Some(0)
            && r["duplicates"].as_u64() == Some(0)
    };
    let correct = singles.iter().all(|r| holds(r, 1)) && severals.iter().all(|r| holds(r, n));
    let most = |runs: &[Value], key: &str| {
        runs.iter()
            .filter_map(|r| r[key].as_f64())
            .fold(0.0, f64::max)
    };
    let peak = |runs: &[Value]| {
        runs.iter()
            .filter_map(|r| r["max_concurrency"].as_u64())
            .max()
    };
    let sum = |runs: &[Value], key: &str| runs.iter().filter_map(|r| r[key].as_u64()).sum::<u64>();
    progress!(
        "speedup at concurrency {n}: {speedup:.2}x (goal >= {GOAL_SPEEDUP}x); limits and order held: {correct}"
    );
    Ok(json!({
        "scenario": "group-concurrency",
        "jobs": jobs,
        "work_ms": work_ms,
        "workers": workers,
        "concurrency": n,
        "rounds": rounds,
        "drain_jobs_per_s_1": single.round(),
        "drain_jobs_per_s": several.round(),
        "speedup": round3(speedup),
        "goal_speedup": GOAL_SPEEDUP,
        "speedup_met": speedup >= GOAL_SPEEDUP,
        "max_concurrency_1": peak(&singles),
        "max_concurrency": peak(&severals),
        "order_violations": sum(&severals, "order_violations"),
        "max_order_lag_ms": most(&severals, "max_order_lag_ms"),
        "passed_over": sum(&severals, "passed_over"),
        "limits_and_order_held": correct,
        "runs": singles.iter().zip(&severals).flat_map(|(a, b)| [a, b]).collect::<Vec<_>>(),
    }))
}

/// The median `drain_jobs_per_s` of `runs` (the mean of the middle two
/// when they are even).
fn median_rate(runs: &[Value]) -> f64 {
    let mut rates: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["drain_jobs_per_s"].as_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    match rates.len() {
        0 => 0.0,
        len if len % 2 == 1 => rates[len / 2],
        len => (rates[len / 2 - 1] + rates[len / 2]) / 2.0,
    }
}

/// Drains `jobs` jobs of one group whose concurrency is `limit`, on a fresh
/// database, with one runner of `workers` slots.
async fn drain(
    inputs: &Inputs,
    server: &str,
    jobs: u64,
    work_ms: u64,
    workers: u64,
    limit: u64,
) -> Result<Value, String> {
    let (pool, url) = common::fresh_database(server, DATABASE, 4).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let limits = GroupLimits::new().concurrency(limit as u32);
    pgfifo::admin::set_group_limits(&mut conn, ControlJob::QUEUE, GROUP, limits)
        .await
        .map_err(|e| e.to_string())?;
    enqueue_group(&mut conn, GROUP, 0, 0, jobs, work_ms).await?;
    common::epoch();
    take_runs();
    progress!("group-concurrency: {jobs} jobs of {work_ms} ms in one group of concurrency {limit}, {workers} slots");
    let runners = start_runners(inputs, &url, 1, workers, "concurrency").await?;
    let deadline = Instant::now() + PATIENCE;
    while super::done(0) < jobs {
        if Instant::now() > deadline {
            return Err(format!(
                "drain did not finish: {} of {jobs} ran",
                super::done(0)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown(runners).await?;
    let runs = runs_of(&take_runs(), 0);
    let db_starts = starts(&mut conn, GROUP).await?;
    drop(conn);
    drop(pool);

    let first = runs.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last = runs.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let drain_secs = last.saturating_sub(first) as f64 / 1e9;
    let drain_rate = runs.len() as f64 / drain_secs.max(1e-9);
    let mean_handler_ms = runs
        .iter()
        .map(|r| r.end_ns.saturating_sub(r.start_ns) as f64 / 1e6)
        .sum::<f64>()
        / runs.len().max(1) as f64;
    let mut ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    ids.dedup();
    let duplicates = runs.len() - ids.len();
    let lost = jobs.saturating_sub(ids.len() as u64);
    let most = max_concurrency(&runs);
    // In the order the attempts were recorded (the server's clock), and in
    // the handlers' own (this process's clock).
    let recorded = fifo_of_starts(&db_starts);
    let handled = fifo_of_runs(&runs);
    let lag_ms = |f: super::Fifo| round3(f.max_lag_ns as f64 / 1e6);
    let fifo_held = if limit == 1 {
        recorded.late_starts == 0 && handled.late_starts == 0
    } else {
        handled.passed_over == 0 && lag_ms(recorded) <= PICKED_TOGETHER_MS
    };
    // What the group could do if only the handlers took time.
    let ideal = limit as f64 * 1e3 / mean_handler_ms.max(1e-9);
    progress!(
        "concurrency {limit}: {drain_rate:.0} jobs/s in {drain_secs:.3}s ({:.0} % of {ideal:.0}, \
         handlers {mean_handler_ms:.3} ms); at most {most} at once; {} jobs began after a \
         younger one (by up to {} ms; in handler order {}, up to {} ms), {} after a younger one \
         ended: FIFO held {fifo_held}; lost {lost}, duplicates {duplicates}",
        drain_rate / ideal * 100.0,
        recorded.late_starts,
        lag_ms(recorded),
        handled.late_starts,
        lag_ms(handled),
        handled.passed_over,
    );
    Ok(json!({
        "group_concurrency": limit,
        "drain_jobs_per_s": (drain_rate * 10.0).round() / 10.0,
        "drain_secs": round3(drain_secs),
        "mean_handler_ms": round3(mean_handler_ms),
        "ideal_jobs_per_s": ideal.round(),
        "max_concurrency": most,
        "order_violations": recorded.late_starts,
        "max_order_lag_ms": lag_ms(recorded),
        "handler_order_violations": handled.late_starts,
        "handler_max_order_lag_ms": lag_ms(handled),
        "passed_over": handled.passed_over,
        "fifo_held": fifo_held,
        "attempts": db_starts.len(),
        "lost": lost,
        "duplicates": duplicates,
    }))
}

//! `group-rate`: how closely a rate-limited group keeps to its rate across
//! several runners, and what it costs a group without limits beside it (see
//! the [parent module](super)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgfifo::{GroupLimits, Job};
use serde_json::{json, Value};

use super::{
    enqueue_group, fifo_of_runs, fifo_of_starts, max_concurrency, parse_rate, per_second, runs_of,
    shutdown, start_runners, starts, states, take_runs, worst_window_excess, ControlJob,
};
use crate::common::{self, round3, Inputs};
use crate::progress;

const DATABASE: &str = "pgfifo_bench_group_rate";
const LIMITED: &str = "limited";
const FREE: &str = "free";
/// Group numbers of the two groups.
const G_LIMITED: u32 = 0;
const G_FREE: u32 = 1;
/// The free group's backlog is topped up by this many jobs when fewer than
/// half of them wait.
const TOP_UP: u64 = 5_000;
/// The target: achieved rate within this many percent of the set one.
const GOAL_ERROR_PCT: f64 = 2.0;
/// Excess tolerated for the rounding of `started_at` to µs (20/s × 1 µs is
/// 0.00002 starts), as in `tests/it/multiprocess/rate.rs`.
const EXCESS_TOLERANCE: f64 = 0.001;
/// How long the first free job may take to run.
const START_PATIENCE: Duration = Duration::from_secs(30);

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let rate = parse_rate(&inputs.string("RATE", "20"))?;
    let burst = inputs
        .number("BURST", 5)?
        .clamp(1, u64::from(pgfifo::MAX_RATE_COUNT)) as u32;
    let secs = inputs.number("SECS", 60)?.max(1);
    let baseline_secs = inputs.number("BASELINE_SECS", 10)?.min(secs);
    let runners = inputs.number("RUNNERS", 3)?.max(1);
    let workers = inputs.number("WORKERS", 4)?.max(1);
    let rate_per_s = per_second(rate);
    let server = inputs.database_url();
    let (pool, url) = common::fresh_database(&server, DATABASE, 4).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    common::epoch();
    take_runs();

    // The free group flows from the start, kept topped up.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = tokio::spawn(feed_free(pool.clone(), stop.clone()));
    progress!("group-rate: {runners} runners of {workers} slots each; the free group runs");
    let handles = start_runners(inputs, &url, runners, workers, "rate").await?;
    let deadline = Instant::now() + START_PATIENCE;
    while super::done(G_FREE) == 0 {
        if Instant::now() > deadline || feeder.is_finished() {
            stop.store(true, Ordering::Relaxed);
            feeder.await.map_err(|e| e.to_string())??;
            return Err("no job of the free group ran within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let free_from_ns = common::now_ns();
    let free_alone = free_rate(baseline_secs, "alone, no limits in the queue").await;

    // The limited group: its limits first (the free group runs on in a
    // queue with group controls), then a backlog deeper than it can start
    // in the run.
    let limits = GroupLimits::new().rate(rate).burst(burst);
    pgfifo::admin::set_group_limits(&mut conn, ControlJob::QUEUE, LIMITED, limits)
        .await
        .map_err(|e| e.to_string())?;
    let free_controlled = free_rate(baseline_secs, "alone, the limited group's limits set").await;
    let limited_jobs = u64::from(burst) + (rate_per_s * secs as f64 * 1.5).ceil() as u64 + 100;
    progress!(
        "limited group: rate {rate}, burst {burst}, {limited_jobs} jobs; measuring for {secs}s"
    );
    enqueue_group(&mut conn, LIMITED, G_LIMITED, 0, limited_jobs, 0).await?;
    let (free_before, began) = (super::done(G_FREE), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let free_beside = (super::done(G_FREE) - free_before) as f64 / began.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    shutdown(handles).await?;
    let free_enqueued = feeder.await.map_err(|e| e.to_string())??;

    let limited = starts(&mut conn, LIMITED).await?;
    let limited_states = states(&mut conn, LIMITED).await?;
    let free_states = states(&mut conn, FREE).await?;
    drop(conn);
    drop(pool);
    let n = limited.len() as u64;
    let us: Vec<i64> = limited.iter().map(|s| s.us).collect();
    let span_s = us.last().copied().unwrap_or(0) as f64 / 1e6;
    let achieved = if span_s > 0.0 {
        n.saturating_sub(u64::from(burst)) as f64 / span_s
    } else {
        0.0
    };
    let error_pct = (achieved / rate_per_s - 1.0) * 100.0;
    let worst = worst_window_excess(&us, rate_per_s, burst);
    let mut per_runner: Vec<(String, u64)> = Vec::new();
    for start in &limited {
        match per_runner
            .iter_mut()
            .find(|(name, _)| *name == start.runner)
        {
            Some((_, count)) => *count += 1,
            None => per_runner.push((start.runner.clone(), 1)),
        }
    }
    per_runner.sort();

    let runs = take_runs();
    let (limited_runs, free_runs) = (runs_of(&runs, G_LIMITED), runs_of(&runs, G_FREE));
    let state = |counts: &std::collections::HashMap<String, i64>, name: &str| {
        counts.get(name).copied().unwrap_or(0)
    };
    // Every job either succeeded or still waits, and ran at most once.
    let limited_lost = limited_jobs as i64
        - state(&limited_states, "succeeded")
        - state(&limited_states, "queued");
    let free_lost =
        free_enqueued as i64 - state(&free_states, "succeeded") - state(&free_states, "queued");
    let duplicates = |runs: &[super::Run]| {
        let mut ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.windows(2).filter(|w| w[0] == w[1]).count() as u64
    };
    let free_ratio = free_alone.map(|alone| round3(free_beside / alone.max(1e-9)));
    let free_ratio_controlled =
        free_controlled.map(|controlled| round3(free_beside / controlled.max(1e-9)));
    progress!(
        "free group, jobs per second of the run (limits set from second {}, the limited \
         group's jobs from second {}): {:?}",
        baseline_secs,
        baseline_secs * 2,
        per_second_series(&free_runs, free_from_ns)
    );
    progress!(
        "limited group: {n} starts over {span_s:.3}s: {achieved:.3}/s after the burst \
         ({error_pct:+.2} % against {rate_per_s}/s); worst window excess {worst:.4}; \
         per runner {per_runner:?}"
    );
    progress!(
        "free group: {free_beside:.0} jobs/s beside the limited group (alone: {free_alone:?}, \
         ratio {free_ratio:?}; limits set: {free_controlled:?}, ratio {free_ratio_controlled:?})"
    );
    Ok(json!({
        "scenario": "group-rate",
        "rate": rate.to_string(),
        "rate_per_s": rate_per_s,
        "burst": burst,
        "secs": secs,
        "baseline_secs": baseline_secs,
        "runners": runners,
        "workers": workers,
        "limited_jobs": limited_jobs,
        "starts": n,
        "span_s": round3(span_s),
        "achieved_rate": round3(achieved),
        "rate_error_pct": round3(error_pct),
        "goal_error_pct": GOAL_ERROR_PCT,
        "rate_within_goal": error_pct.abs() <= GOAL_ERROR_PCT,
        "worst_window_excess": (worst * 1e4).round() / 1e4,
        "bound_held": worst <= EXCESS_TOLERANCE,
        "starts_per_runner": per_runner.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
        "limited_order_violations": fifo_of_starts(&limited).late_starts,
        "limited_max_concurrency": max_concurrency(&limited_runs),
        "limited_lost": limited_lost,
        "limited_duplicates": duplicates(&limited_runs),
        "free_jobs_per_s": free_beside.round(),
        "free_alone_jobs_per_s": free_alone.map(f64::round),
        "free_ratio": free_ratio,
        "free_controlled_jobs_per_s": free_controlled.map(f64::round),
        "free_ratio_controlled": free_ratio_controlled,
        "free_jobs": free_runs.len(),
        "free_order_violations": fifo_of_runs(&free_runs).late_starts,
        "free_max_concurrency": max_concurrency(&free_runs),
        "free_lost": free_lost,
        "free_duplicates": duplicates(&free_runs),
    }))
}

/// Keeps the free group's backlog topped up until `stop`; returns how many
/// jobs it enqueued.
async fn feed_free(pool: pgfifo::Pool, stop: Arc<AtomicBool>) -> Result<u64, String> {
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let mut enqueued = 0;
    while !stop.load(Ordering::Relaxed) {
        if enqueued - super::done(G_FREE).min(enqueued) >= TOP_UP / 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        enqueue_group(&mut conn, FREE, G_FREE, enqueued, enqueued + TOP_UP, 0).await?;
        enqueued += TOP_UP;
    }
    Ok(enqueued)
}

/// Runs started in each whole second after `from_ns`.
fn per_second_series(runs: &[super::Run], from_ns: u64) -> Vec<u64> {
    let mut series = Vec::new();
    for run in runs.iter().filter(|r| r.start_ns >= from_ns) {
        let second = ((run.start_ns - from_ns) / 1_000_000_000) as usize;
        if series.len() <= second {
            series.resize(second + 1, 0);
        }
        series[second] += 1;
    }
    series
}

/// The free group's jobs per second over the next `secs` (`None` when 0).
async fn free_rate(secs: u64, what: &str) -> Option<f64> {
    if secs == 0 {
        return None;
    }
    let (before, began) = (super::done(G_FREE), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let rate = (super::done(G_FREE) - before) as f64 / began.elapsed().as_secs_f64();
    progress!("free group {what}: {rate:.0} jobs/s over {secs}s");
    Some(rate)
}

//! `group-rate` and `group-concurrency`: the group controls (rate limits and
//! concurrency per group, see `pgfifo::GroupLimits`) measured.
//!
//! **`group-rate`** (rate accuracy, [`rate`]): on a fresh database
//! (`pgfifo_bench_group_rate`), `RUNNERS` runners (default 3) run in this
//! process, each started by its own `pgfifo::runner::start` on its own pool
//! with `WORKERS` slots (default 4) and its own name, as separate processes
//! would. One group (`limited`) gets a rate of `RATE` (default 20 per
//! second; `20` or `20/s`, `600/m`…) with a burst of `BURST` (default 5)
//! and a backlog of instant jobs deeper than it can start in `SECS`
//! (default 60); a group without limits (`free`) runs beside it, its backlog
//! kept topped up. The free group first runs alone for `BASELINE_SECS`
//! (default 10, at most `SECS`; 0 skips both baselines) in a queue without
//! limits, then as long again once the limited group's limits are set but
//! before it has jobs (a queue with group controls does more work per
//! start, for every group), then for `SECS` beside the limited group's
//! backlog. Figures, the limited group's from its attempt records
//! (`pgfifo.job_attempt.started_at`, the server's clock, written with the
//! token's take):
//! - `starts`, `span_s` (first start to last) and `achieved_rate`:
//!   (starts − BURST) / span, the rate once the initial burst is spent, and
//!   `rate_error_pct` against `RATE` (target: within ±2 %);
//! - `worst_window_excess`: over every pair of starts i ≤ j, the starts from
//!   i to j minus BURST + RATE × (t_j − t_i), at its largest (the token
//!   bucket's bound, as in `tests/it/multiprocess/rate.rs`; must be ≤ 0,
//!   computed in one pass: it is a maximum of differences of
//!   k − RATE × t_k);
//! - `free_jobs_per_s` beside the limited group against
//!   `free_alone_jobs_per_s` (`free_ratio`) and `free_controlled_jobs_per_s`
//!   (`free_ratio_controlled`): about 1 when the limit slows no one else
//!   (the free group is one group, so its jobs run one at a time and its
//!   rate is the round trips of one job: sensitive to any extra work per
//!   start); the per-second series is on stderr. For both groups: runs that
//!   began after a younger job of their group (0), the most that ran at once
//!   (1), lost and duplicated jobs (0).
//!
//! **`group-concurrency`** (speedup, [`concurrency`]): `JOBS` jobs (default
//! 2,000) in one group, each sleeping `WORK_MS` (default 5;
//! `tokio::time::sleep`, whose whole-millisecond timer makes 5 ms last about
//! 5.9), drained by one runner with `WORKERS` slots (default 16, at least
//! 8), once with the group's concurrency at 1 and once at `CONCURRENCY`
//! (default 4), each on a fresh database (`pgfifo_bench_group_concurrency`);
//! `ROUNDS` (default 1) repeats the pair, alternately, and the rates
//! reported are the medians. Figures per drain (in `runs`):
//! - `drain_jobs_per_s` (first handler start to last end), against
//!   `ideal_jobs_per_s` (the concurrency over the mean handler time);
//! - `max_concurrency`: the most handlers of the group running at once,
//!   from their start and end times (must be ≤ the setting);
//! - FIFO starts: `order_violations`, jobs whose attempt record was written
//!   after that of a younger job of the group, and `max_order_lag_ms`, by
//!   how much at most; the same in the handlers' own start order
//!   (`handler_…`); `passed_over`, jobs whose handler began after a
//!   younger job's handler had ended. With a concurrency of 1 there must be
//!   no violation at all. Above 1, jobs picked at the same moment by
//!   different lanes begin in either order, a moment apart (as the library's
//!   tests allow), so `fifo_held` there means nothing passed over and no
//!   lag above 30 ms;
//! - `lost` and `duplicates` (0).
//!
//! Top level: both rates, their ratio `speedup` (target: ≥ 3.6 at 4), and
//! `limits_and_order_held` (every drain kept its concurrency, FIFO, and ran
//! every job once).

mod concurrency;
mod rate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob, Rate,
    RunnerConfig, RunnerHandle,
};
use serde::{Deserialize, Serialize};

use crate::common::{self, Inputs};

pub use concurrency::run as run_concurrency;
pub use rate::run as run_rate;

/// Jobs per `enqueue_batch` call.
const BATCH: u64 = 5_000;

/// One handler execution of a [`ControlJob`].
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// The job's id.
    pub id: JobId,
    /// Its group's number in the scenario.
    pub g: u32,
    /// Start, ns since [`common::epoch`].
    pub start_ns: u64,
    /// End, ns since [`common::epoch`].
    pub end_ns: u64,
}

static RUNS: Mutex<Vec<Run>> = Mutex::new(Vec::new());
/// Handler executions so far, by group number (0 or 1).
static DONE: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The job of these scenarios: notes its run, after sleeping `work_ms`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.controls",
    queue = "bench.controls",
    max_attempts = 3,
    timeout = "60s",
    backoff = "10ms"
)]
pub struct ControlJob {
    /// Group number (0 or 1).
    pub g: u32,
    /// Position in the group.
    pub s: u64,
    /// How long the handler sleeps (`tokio::time::sleep`), in ms.
    pub work_ms: u64,
}

#[async_trait]
impl Handler for ControlJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start_ns = common::now_ns();
        if self.work_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.work_ms)).await;
        }
        let run = Run {
            id: ctx.id(),
            g: self.g,
            start_ns,
            end_ns: common::now_ns(),
        };
        RUNS.lock().expect("runs").push(run);
        if let Some(done) = DONE.get(self.g as usize) {
            done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Handler executions of group `g` so far.
pub fn done(g: u32) -> u64 {
    DONE.get(g as usize)
        .map_or(0, |done| done.load(Ordering::Relaxed))
}

/// Takes every run noted so far and resets the counts.
pub fn take_runs() -> Vec<Run> {
    for done in &DONE {
        done.store(0, Ordering::Relaxed);
    }
    std::mem::take(&mut *RUNS.lock().expect("runs"))
}

/// `RATE`: `20` (per second) or a rate as `pgfifo` writes it (`20/s`, `600/m`).
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let text = text.trim();
    let parsed = match text.parse::<u32>() {
        Ok(n) => Rate::per_second(n),
        Err(_) => text.parse(),
    };
    parsed.map_err(|e| format!("RATE={text:?}: {e}"))
}

/// A rate in starts per second.
pub fn per_second(rate: Rate) -> f64 {
    f64::from(rate.count()) / rate.period().as_secs_f64()
}

/// Enqueues jobs `from..to` of group `g` (named `group`), in batches.
pub async fn enqueue_group(
    conn: &mut AsyncPgConnection,
    group: &str,
    g: u32,
    from: u64,
    to: u64,
    work_ms: u64,
) -> Result<(), String> {
    let mut s = from;
    while s < to {
        let end = (s + BATCH).min(to);
        let batch = (s..end)
            .map(|s| {
                NewJob::new(
                    &ControlJob { g, s, work_ms },
                    EnqueueOptions::group(group.to_owned()),
                )
            })
            .collect::<pgfifo::Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        pgfifo::enqueue_batch(conn, batch)
            .await
            .map_err(|e| e.to_string())?;
        s = end;
    }
    Ok(())
}

/// Starts `count` runners of [`ControlJob`]'s queue on the database at
/// `url`, each on a pool of its own, named `{prefix}-{i}`.
pub async fn start_runners(
    inputs: &Inputs,
    url: &str,
    count: u64,
    workers: u64,
    prefix: &str,
) -> Result<Vec<RunnerHandle>, String> {
    let mut runners = Vec::new();
    for i in 0..count {
        let pool = pgfifo::connect(url, workers as u32 * 2 + 4)
            .await
            .map_err(|e| e.to_string())?;
        let config = inputs.tune(
            RunnerConfig::default()
                .queues([ControlJob::QUEUE])
                .concurrency(workers as usize)
                .poll_interval(Duration::from_millis(200))
                .name(format!("{prefix}-{i}")),
        )?;
        let runner = pgfifo::runner::start(pool, config)
            .await
            .map_err(|e| e.to_string())?;
        runners.push(runner);
    }
    Ok(runners)
}

/// Stops `runners`, waiting for their running jobs.
pub async fn shutdown(runners: Vec<RunnerHandle>) -> Result<(), String> {
    for runner in runners {
        runner.shutdown().await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One attempt's start, as the runner recorded it.
#[derive(QueryableByName, Debug, Clone)]
pub struct Start {
    /// The job.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// The runner that started it.
    #[diesel(sql_type = Text)]
    pub runner: String,
    /// Microseconds after the group's first start (server clock).
    #[diesel(sql_type = BigInt)]
    pub us: i64,
}

/// The attempts of `group`'s jobs, in the order they started (ties by id).
pub async fn starts(conn: &mut AsyncPgConnection, group: &str) -> Result<Vec<Start>, String> {
    diesel::sql_query(
        "SELECT a.job_id AS id, a.runner, \
                (extract(epoch FROM a.started_at - min(a.started_at) OVER ()) * 1000000)::bigint AS us \
         FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id \
         WHERE j.queue = $1 AND j.group_id = $2 \
         ORDER BY a.started_at, a.job_id",
    )
    .bind::<Text, _>(ControlJob::QUEUE)
    .bind::<Text, _>(group)
    .load(conn)
    .await
    .map_err(|e| format!("read the starts of group {group}: {e}"))
}

#[derive(QueryableByName)]
struct StateCount {
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How many of `group`'s jobs are in each state.
pub async fn states(
    conn: &mut AsyncPgConnection,
    group: &str,
) -> Result<HashMap<String, i64>, String> {
    let rows: Vec<StateCount> = diesel::sql_query(
        "SELECT state, count(*) AS n FROM pgfifo.job \
         WHERE queue = $1 AND group_id = $2 GROUP BY state",
    )
    .bind::<Text, _>(ControlJob::QUEUE)
    .bind::<Text, _>(group)
    .load(conn)
    .await
    .map_err(|e| format!("count the jobs of group {group}: {e}"))?;
    Ok(rows.into_iter().map(|r| (r.state, r.n)).collect())
}

/// How far a group's starts were from FIFO order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fifo {
    /// Jobs that began after a younger job of the group had begun (in FIFO
    /// order: none).
    pub late_starts: u64,
    /// The longest such a job began after the first younger one, in ns.
    pub max_lag_ns: u64,
    /// Jobs that began after a younger job had ended: passed over, not just
    /// picked together with it and begun a moment later.
    pub passed_over: u64,
}

/// Checks `(id, start, end)` of one group's starts (an unknown end:
/// `u64::MAX`). One pass from the youngest job down, with the earliest
/// start and end of the jobs younger than the one looked at.
pub fn fifo(items: &[(JobId, u64, u64)]) -> Fifo {
    let mut by_id = items.to_vec();
    by_id.sort_unstable();
    let (mut first_start, mut first_end) = (u64::MAX, u64::MAX);
    let mut out = Fifo::default();
    for &(_, start, end) in by_id.iter().rev() {
        if start > first_start {
            out.late_starts += 1;
            out.max_lag_ns = out.max_lag_ns.max(start - first_start);
        }
        if start > first_end {
            out.passed_over += 1;
        }
        first_start = first_start.min(start);
        first_end = first_end.min(end);
    }
    out
}

/// [`fifo`] of handler runs.
pub fn fifo_of_runs(runs: &[Run]) -> Fifo {
    let items: Vec<_> = runs.iter().map(|r| (r.id, r.start_ns, r.end_ns)).collect();
    fifo(&items)
}

/// [`fifo`] of attempt records (their ends unknown).
pub fn fifo_of_starts(starts: &[Start]) -> Fifo {
    let items: Vec<_> = starts
        .iter()
        .map(|s| (s.id, s.us.max(0) as u64 * 1_000, u64::MAX))
        .collect();
    fifo(&items)
}

/// The most `runs` running at once (a run that ends when another starts
/// does not overlap it).
pub fn max_concurrency(runs: &[Run]) -> u64 {
    // (time, +1 start / -1 end); ends sort before starts at the same time.
    let mut events: Vec<(u64, i64)> = runs
        .iter()
        .flat_map(|r| [(r.start_ns, 1), (r.end_ns, -1)])
        .collect();
    events.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as u64
}

/// Runs of group `g` ordered by their start.
pub fn runs_of(runs: &[Run], g: u32) -> Vec<Run> {
    let mut out: Vec<Run> = runs.iter().filter(|r| r.g == g).copied().collect();
    out.sort_by_key(|r| (r.start_ns, r.id));
    out
}

/// The largest excess of starts over the token bucket's bound in any window
/// that begins and ends at a start: max over i ≤ j of
/// (j − i + 1) − (burst + rate × (t_j − t_i)), with `us` the starts'
/// times in µs, ascending. That is (a_j − a_i) + 1 − burst with
/// a_k = k − rate × t_k, so one pass with the running minimum of a gives it.
pub fn worst_window_excess(us: &[i64], rate_per_s: f64, burst: u32) -> f64 {
    let mut lowest = f64::INFINITY;
    let mut worst = f64::NEG_INFINITY;
    for (k, &t) in us.iter().enumerate() {
        let a = k as f64 - rate_per_s * t as f64 / 1e6;
        lowest = lowest.min(a);
        worst = worst.max(a - lowest);
    }
    worst + 1.0 - f64::from(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All pairs, the plain way.
    fn worst_pairs(us: &[i64], rate: f64, burst: u32) -> f64 {
        let mut worst = f64::NEG_INFINITY;
        for i in 0..us.len() {
            for j in i..us.len() {
                let bound = f64::from(burst) + rate * (us[j] - us[i]) as f64 / 1e6;
                worst = worst.max((j - i + 1) as f64 - bound);
            }
        }
        worst
    }

    #[test]
    fn one_pass_excess_is_the_all_pairs_one() {
        // A burst of 5 at 0, then one every 50 ms (20/s): the bound, exactly.
        let mut us: Vec<i64> = vec![0; 5];
        us.extend((1..100).map(|k| k * 50_000));
        assert!((worst_window_excess(&us, 20.0, 5) - worst_pairs(&us, 20.0, 5)).abs() < 1e-9);
        assert!(worst_window_excess(&us, 20.0, 5).abs() < 1e-9);
        // Two starts 10 ms apart in the middle: one over.
        us.insert(50, us[50] - 10_000);
        let fast = worst_window_excess(&us, 20.0, 5);
        assert!((fast - worst_pairs(&us, 20.0, 5)).abs() < 1e-9);
        assert!(fast > 0.5, "{fast}");
        // Irregular times.
        let odd: Vec<i64> = (0..200)
            .map(|k| k * 37_000 + (k * k % 11) * 9_000)
            .collect();
        let (a, b) = (
            worst_window_excess(&odd, 25.0, 3),
            worst_pairs(&odd, 25.0, 3),
        );
        assert!((a - b).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn concurrency_and_order() {
        let run = |id, start_ns, end_ns| Run {
            id,
            g: 0,
            start_ns,
            end_ns,
        };
        let runs = [
            run(1, 0, 10),
            run(2, 10, 20),
            run(3, 12, 30),
            run(4, 15, 16),
        ];
        assert_eq!(max_concurrency(&runs), 3);
        assert_eq!(max_concurrency(&runs[..2]), 1);
        let clean = fifo(&[(1, 0, 10), (2, 10, 20), (3, 12, 30), (4, 15, 16)]);
        assert_eq!(clean, Fifo::default());
        // 3 begins 2 ns after 4 (picked together); 5 after 6 ended.
        let found = fifo(&[
            (1, 0, 10),
            (2, 10, 20),
            (4, 12, 30),
            (3, 14, 40),
            (6, 15, 16),
            (5, 17, 50),
        ]);
        assert_eq!(
            found,
            Fifo {
                late_starts: 2,
                max_lag_ns: 2,
                passed_over: 1
            }
        );
        assert_eq!(parse_rate("20").unwrap(), Rate::per_second(20).unwrap());
        assert_eq!(per_second(parse_rate("600/m").unwrap()), 10.0);
        assert!(parse_rate("0").is_err());
    }
}

//! `backlog`: the cost of one pick against the size of the backlog.
//!
//! For each size (`SIZES=jobs:groups,…`; default 10k/100, 100k/1k, 1M/10k,
//! plus 10M/100k with `FULL=1`), on a fresh database:
//! 1. fill the tables with set-based statements (see [`FILL_JOBS`](fill::FILL_JOBS)); no
//!    `ANALYZE` is run, as on a queue whose tables were just created;
//! 2. `EXPLAIN (ANALYZE, BUFFERS)` the pick's group lookups and the head
//!    advance's job lookup, custom and generic plans, under the settings the
//!    functions run with, to show they are index-driven;
//! 3. on one connection, run `PICKS` job cycles the way the runner does —
//!    `BEGIN`, `pgfifo.pick`, `pgfifo.start_attempts` on a second
//!    (autocommit) connection, `pgfifo.complete`, `COMMIT` — timing the pick
//!    alone and the whole cycle.
//!
//! Before the sizes, the fill is checked against the library: a small backlog
//! filled by [`fill`](fill::fill) must leave exactly the rows that `pgfifo::enqueue_batch`
//! followed by the runner's promotion leaves (see [`check_fill`]).
//!
//! The goal is a flat line: the median pick at 1M jobs at most 1.5 times the
//! median at 10k.

mod fill;
mod measure;
mod plans;

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use serde_json::{json, Value};

use crate::common::{self, round3, Inputs};
use crate::progress;

use fill::check_fill;
use measure::measure;

/// The database this scenario recreates for each size (and drops at the end).
const DATABASE: &str = "pgfifo_bench_backlog";
/// Cycles run before timing starts (plan caching, first touches of the indexes).
const WARMUP: usize = 20;
/// The goal: median pick at the largest size / at the smallest.
const GOAL_RATIO: f64 = 1.5;

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Dump {
    #[diesel(sql_type = Text)]
    dump: String,
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let full = matches!(inputs.string("FULL", "0").as_str(), "1" | "true" | "yes");
    let default_sizes = if full {
        "10000:100,100000:1000,1000000:10000,10000000:100000"
    } else {
        "10000:100,100000:1000,1000000:10000"
    };
    let sizes = parse_sizes(&inputs.string("SIZES", default_sizes))?;
    let picks = inputs.number("PICKS", 3000)?.max(1) as usize;
    let server = inputs.database_url();

    check_fill(&server).await?;
    let mut results = Vec::new();
    for &(jobs, groups) in &sizes {
        results.push(measure(&server, jobs, groups, picks).await?);
    }
    common::drop_database(&server, DATABASE).await?;

    let median = |r: &Value| r["pick_median_ms"].as_f64().unwrap_or(0.0);
    // (Slice patterns: diesel's RunQueryDsl::first would shadow `first()`.)
    let ratio = match results.as_slice() {
        [first, .., last] if median(first) > 0.0 => round3(median(last) / median(first)),
        _ => 1.0,
    };
    progress!("median pick, largest vs smallest backlog: {ratio}x (goal <= {GOAL_RATIO}x)");
    Ok(json!({
        "scenario": "backlog",
        "picks": picks,
        "warmup": WARMUP,
        "fill_matches_enqueue": true,
        "pick_median_ratio_largest_vs_smallest": ratio,
        "goal_ratio": GOAL_RATIO,
        "flat": ratio <= GOAL_RATIO,
        "results": results,
    }))
}

/// Parses `jobs:groups,jobs:groups,…`.
fn parse_sizes(text: &str) -> Result<Vec<(u64, u64)>, String> {
    let sizes = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let bad = || format!("SIZES: {pair:?} is not jobs:groups (e.g. 100000:1000)");
            let (jobs, groups) = pair.split_once(':').ok_or_else(bad)?;
            let jobs: u64 = jobs.trim().parse().map_err(|_| bad())?;
            let groups: u64 = groups.trim().parse().map_err(|_| bad())?;
            if jobs == 0 || groups == 0 || jobs > i32::MAX as u64 {
                return Err(bad());
            }
            Ok((jobs, groups))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if sizes.is_empty() {
        return Err("SIZES is empty".into());
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(
            parse_sizes("10000:100, 100000:1000").unwrap(),
            [(10_000, 100), (100_000, 1000)]
        );
        assert!(parse_sizes("10000").is_err());
        assert!(parse_sizes("0:10").is_err());
        assert!(parse_sizes("").is_err());
    }
}

//! Groups that run several jobs at once (group concurrency N > 1; which
//! groups of the `faults` queue: `plan.rs`): their limits, set through
//! `pgfifo::admin::set_group_limits` before the workers start; the trace
//! their checks need (`jobs::FAULT_TRACE`); and what the checks found. How
//! many runs went at once is checked in every group against its N
//! (`run_checks.rs`); their starts (FIFO, and the hold-back after a failed
//! attempt) in `start_checks.rs`, which adds what it finds to [`WideFound`].

use std::collections::{BTreeMap, HashMap, HashSet};

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::GroupLimits;
use pgfifo_tests::faults::runs::Interval;

use crate::monitor::{AttemptRow, LogRow};
use crate::plan::group_name;
use crate::suite::Suite;

/// Sets the limits of the groups of N > 1.
pub(crate) async fn set_limits(conn: &mut AsyncPgConnection, wide: &BTreeMap<u32, u32>) {
    for (&grp, &n) in wide {
        pgfifo::admin::set_group_limits(
            conn,
            "faults",
            &group_name(grp),
            GroupLimits::new().concurrency(n),
        )
        .await
        .expect("set a group's concurrency");
    }
    let list: Vec<String> = wide
        .iter()
        .map(|(g, n)| format!("{}={n}", group_name(*g)))
        .collect();
    println!(
        "faults: {} groups run several jobs at once: {}",
        wide.len(),
        list.join(" ")
    );
}

/// An attempt start the library recorded (`fault_start`).
#[derive(QueryableByName, Debug)]
pub(crate) struct StartRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) attempt: i32,
    #[diesel(sql_type = Text)]
    pub(crate) runner: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) at_us: i64,
}

/// A job's first failed attempt, committed (`fault_hold`), and when the job
/// was done.
#[derive(QueryableByName, Debug)]
pub(crate) struct HoldRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    /// When the failure was written (before its commit).
    #[diesel(sql_type = BigInt)]
    pub(crate) at_us: i64,
    /// When it committed (`track_commit_timestamp`).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) commit_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) finished_us: Option<i64>,
}

/// What the triggers of `FAULT_TRACE` kept.
pub(crate) struct Trace {
    pub(crate) starts: Vec<StartRow>,
    pub(crate) holds: Vec<HoldRow>,
}

/// Loads the trace.
pub(crate) async fn load(conn: &mut AsyncPgConnection) -> Trace {
    let starts = diesel::sql_query(
        "SELECT job_id, attempt, runner, \
         (extract(epoch FROM started_at) * 1000000)::bigint AS at_us FROM fault_start",
    )
    .load(conn)
    .await
    .expect("load fault_start");
    let us = |t: &str| format!("(extract(epoch FROM {t}) * 1000000)::bigint");
    let holds = diesel::sql_query(format!(
        "SELECT h.job_id, {} AS at_us, {} AS commit_us, {} AS finished_us \
         FROM fault_hold AS h JOIN pgfifo.job AS j ON j.id = h.job_id \
         GROUP BY h.job_id, j.finished_at",
        us("min(h.at)"),
        us("min(pg_xact_commit_timestamp(h.xmin))"),
        us("j.finished_at")
    ))
    .load(conn)
    .await
    .expect("load fault_hold");
    Trace { starts, holds }
}

/// A group of N > 1 and how many of its runs went at once.
pub(crate) struct WidePeak {
    pub(crate) grp: u32,
    pub(crate) n: u32,
    pub(crate) recorded: usize,
    pub(crate) committed: usize,
}

/// What the checks of the groups of N > 1 found.
#[derive(Default)]
pub(crate) struct WideFound {
    pub(crate) order_violations: Vec<String>,
    pub(crate) held_back: Vec<String>,
    pub(crate) excused: Vec<String>,
    pub(crate) peaks: Vec<WidePeak>,
    /// Jobs compared with the jobs ahead of them.
    pub(crate) compared: usize,
    /// The longest lead within `start_checks::JITTER` (ms; negative: none
    /// started before an older job could have, by at least that much).
    pub(crate) max_lead_within_ms: Option<f64>,
    /// Jobs that failed an attempt and held back their group of N > 1.
    pub(crate) wide_holds: usize,
    /// Attempt starts the runners recorded and later forgot (handed back
    /// unstarted) or lost (an immediate restart).
    pub(crate) forgotten: usize,
    /// From the pick of each committed run to the record of its attempt
    /// (ms, sorted): how late a pick may show in the attempt records.
    pub(crate) record_delays: Vec<f64>,
}

/// The runs that the checks of the groups of N > 1 look at.
pub(crate) struct Runs<'a> {
    pub(crate) log: &'a [LogRow],
    pub(crate) intervals: &'a [Interval],
    pub(crate) attempt_rows: &'a [AttemptRow],
    pub(crate) committed_peaks: &'a BTreeMap<u32, usize>,
    pub(crate) recorded_peaks: &'a BTreeMap<u32, usize>,
}

/// The peaks of the groups of N > 1, and what the trace tells of the
/// attempts' records. (Their starts: `start_checks::check`.)
pub(crate) fn check(suite: &Suite, trace: &Trace, runs: &Runs<'_>) -> WideFound {
    let mut found = WideFound::default();
    let kept: HashSet<(i64, i32, i64)> = runs
        .attempt_rows
        .iter()
        .map(|a| (a.job_id, a.attempt, a.started_us))
        .collect();
    found.forgotten = trace
        .starts
        .iter()
        .filter(|s| !kept.contains(&(s.job_id, s.attempt, s.at_us)))
        .count();
    let mut recorded_at: HashMap<(i64, i32), Vec<i64>> = HashMap::new();
    for s in &trace.starts {
        recorded_at
            .entry((s.job_id, s.attempt))
            .or_default()
            .push(s.at_us * 1_000);
    }
    // (An attempt number is given again after a start was forgotten: the
    // committed run's record is the first one after its pick.)
    found.record_delays = runs
        .log
        .iter()
        .filter_map(|r| {
            let at = recorded_at
                .get(&(r.job_id, r.attempt))?
                .iter()
                .filter(|&&at| at >= r.picked_ns)
                .min()?;
            Some((at - r.picked_ns) as f64 / 1e6)
        })
        .collect();
    found.record_delays.sort_by(f64::total_cmp);
    found.peaks = suite
        .wide
        .iter()
        .map(|(&grp, &n)| WidePeak {
            grp,
            n,
            recorded: runs.recorded_peaks.get(&grp).copied().unwrap_or(0),
            committed: runs.committed_peaks.get(&grp).copied().unwrap_or(0),
        })
        .collect();
    found
}

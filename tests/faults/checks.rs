//! The suite's checks: every job (here), every committed and recorded run
//! (`run_checks.rs`), the starts in groups of N > 1 (`wide.rs`), the hot
//! groups' recorded runs and followers (`hot_checks.rs`); how soon
//! groups were released is printed (`release.rs`), the report is in
//! `report.rs`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo_tests::faults::private_pg::PrivatePg;
use pgfifo_tests::faults::runs::{self, Cut, Line, Mode};

use crate::hot_checks::{self, HotFound};
use crate::long_runs::{self, LongFound};
use crate::monitor::{AttemptCount, AttemptRow, JobRow, LogRow};
use crate::plan::reason_fits;
use crate::processes::Cause;
use crate::release::print_release_times;
use crate::run_checks::{check_committed, check_runs};
use crate::start_checks;
use crate::suite::Suite;
use crate::wide::{self, WideFound};

/// What the checks found.
pub(crate) struct Found {
    pub(crate) lost: Vec<String>,
    pub(crate) duplicates: usize,
    pub(crate) wrong_outcome: Vec<String>,
    pub(crate) failed_as_expected: usize,
    pub(crate) order_violations: Vec<String>,
    pub(crate) overlaps: Vec<String>,
    pub(crate) torn: usize,
    pub(crate) runs: usize,
    pub(crate) interrupted: usize,
    pub(crate) mid_handler_kills: usize,
    pub(crate) hang_timeouts: i64,
    pub(crate) panics: i64,
    pub(crate) poison_aborts: usize,
    pub(crate) unexpected: Vec<String>,
    pub(crate) groups_used: usize,
    pub(crate) frozen_release: Duration,
    /// The groups of N > 1: their starts and peaks.
    pub(crate) wide: WideFound,
    /// The long-mode jobs.
    pub(crate) long: LongFound,
    /// The hot groups.
    pub(crate) hot: HotFound,
}

/// The database's final state.
struct Loaded {
    job_rows: Vec<JobRow>,
    log: Vec<LogRow>,
    attempt_counts: Vec<AttemptCount>,
    attempt_rows: Vec<AttemptRow>,
    hang_timeouts: i64,
    panics: i64,
    trace: wide::Trace,
}

/// What the checks of every job found.
struct JobChecks {
    lost: Vec<String>,
    duplicates: usize,
    wrong_outcome: Vec<String>,
    failed_as_expected: usize,
}

/// Checks every job and run after the drain.
pub(crate) async fn check(suite: &mut Suite, pg: &PrivatePg, url: &str, began: Instant) -> Found {
    let loaded = load(suite, url).await;
    let JobChecks {
        lost,
        duplicates,
        wrong_outcome,
        failed_as_expected,
    } = check_jobs(suite, &loaded);
    let mut order_violations = Vec::new();
    let mut overlaps = Vec::new();
    let committed_peaks = check_committed(suite, &loaded.log, &mut order_violations, &mut overlaps);
    let (lines, torn) = read_records(suite);
    let (intervals, recorded_peaks) = check_runs(
        suite,
        &loaded.attempt_rows,
        &lines,
        began,
        &mut order_violations,
        &mut overlaps,
    );
    let runs = wide::Runs {
        log: &loaded.log,
        intervals: &intervals,
        attempt_rows: &loaded.attempt_rows,
        committed_peaks: &committed_peaks,
        recorded_peaks: &recorded_peaks,
    };
    let mut wide = wide::check(suite, &loaded.trace, &runs);
    start_checks::check(suite, &loaded.trace, &runs, began, &mut wide);
    let mid_handler_kills = suite
        .seen
        .kills
        .iter()
        .filter(|(pid, _)| {
            intervals
                .iter()
                .any(|i| i.pid == *pid && i.cut == Cut::Died)
        })
        .count();
    let interrupted = intervals.iter().filter(|i| i.cut == Cut::Died).count();
    let long = long_runs::check(suite, &intervals, &lines, &loaded.log);
    let hot = hot_checks::check(suite, &intervals, &lines, &loaded.log);
    print_release_times(suite, pg, &intervals);
    let poison_aborts = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| d.cause == Cause::Poison)
        .count();
    let unexpected: Vec<String> = suite
        .fleet
        .unexpected()
        .iter()
        .map(|d| format!("{} ({:?}, pid {}): {:?}", d.app, d.role, d.pid, d.cause))
        .collect();
    let groups_used = suite
        .jobs
        .iter()
        .filter(|j| j.queue == "faults")
        .map(|j| j.grp)
        .collect::<HashSet<_>>()
        .len();
    let frozen_release = suite
        .seen
        .freezes
        .iter()
        .map(|f| f.release)
        .max()
        .unwrap_or_default();
    Found {
        lost,
        duplicates,
        wrong_outcome,
        failed_as_expected,
        order_violations,
        overlaps,
        torn,
        runs: intervals.len(),
        interrupted,
        mid_handler_kills,
        hang_timeouts: loaded.hang_timeouts,
        panics: loaded.panics,
        poison_aborts,
        unexpected,
        groups_used,
        frozen_release,
        wide,
        long,
        hot,
    }
}

/// Loads the jobs, the committed runs and the attempts.
async fn load(suite: &mut Suite, url: &str) -> Loaded {
    let mut conn = AsyncPgConnection::establish(url).await.expect("connect");
    let job_rows: Vec<JobRow> = diesel::sql_query(
        "SELECT id, state, attempts, coalesce(last_error, '') AS last_error FROM pgfifo.job",
    )
    .load(&mut conn)
    .await
    .expect("load jobs");
    let log: Vec<LogRow> = diesel::sql_query(
        "SELECT job_id, attempt, grp, seq, pid, start_ns, end_ns, picked_ns, xact FROM fault_log",
    )
    .load(&mut conn)
    .await
    .expect("load fault_log");
    let attempt_counts: Vec<AttemptCount> =
        diesel::sql_query("SELECT job_id, count(*) AS n FROM pgfifo.job_attempt GROUP BY job_id")
            .load(&mut conn)
            .await
            .expect("load attempts");
    let attempt_rows: Vec<AttemptRow> = diesel::sql_query(
        "SELECT job_id, attempt, runner, \
         (extract(epoch FROM started_at) * 1000000)::bigint AS started_us, \
         coalesce(error, '') AS error FROM pgfifo.job_attempt",
    )
    .load(&mut conn)
    .await
    .expect("load attempt rows");
    let hang_timeouts = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%timed out%'")
        .await;
    let panics = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%panicked%'")
        .await;
    let trace = wide::load(&mut conn).await;
    drop(conn);
    Loaded {
        job_rows,
        log,
        attempt_counts,
        attempt_rows,
        hang_timeouts,
        panics,
        trace,
    }
}

/// Every enqueued job: succeeded exactly once, or failed with its reason.
fn check_jobs(suite: &Suite, loaded: &Loaded) -> JobChecks {
    let Loaded {
        job_rows,
        log,
        attempt_counts,
        ..
    } = loaded;
    let state: HashMap<i64, &JobRow> = job_rows.iter().map(|r| (r.id, r)).collect();
    let attempts_of: HashMap<i64, i64> = attempt_counts.iter().map(|a| (a.job_id, a.n)).collect();
    let mut logs_of: HashMap<i64, Vec<&LogRow>> = HashMap::new();
    for row in log {
        logs_of.entry(row.job_id).or_default().push(row);
    }
    let mut lost = Vec::new();
    let mut duplicates = 0usize;
    let mut wrong_outcome = Vec::new();
    let mut failed_as_expected = 0usize;
    let enqueued_ids: HashSet<i64> = suite.jobs.iter().map(|j| j.id).collect();
    for job in &suite.jobs {
        let committed = logs_of.get(&job.id).map_or(0, Vec::len);
        duplicates += committed.saturating_sub(1);
        let Some(row) = state.get(&job.id) else {
            lost.push(format!("job {} is missing from pgfifo.job", job.id));
            continue;
        };
        if job.mode.succeeds() {
            match (row.state.as_str(), committed) {
                ("succeeded", 1..) => {
                    let run = logs_of[&job.id][0];
                    if run.attempt != row.attempts {
                        wrong_outcome.push(format!(
                            "job {}: committed run is attempt {}, the job says {}",
                            job.id, run.attempt, row.attempts
                        ));
                    }
                }
                ("queued", _) => lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                )),
                ("succeeded", 0) => lost.push(format!(
                    "job {} succeeded without its handler's committed write",
                    job.id
                )),
                (other, _) => wrong_outcome.push(format!(
                    "job {} ({:?}) ended {other}: {}",
                    job.id, job.mode, row.last_error
                )),
            }
        } else {
            let attempts = attempts_of.get(&job.id).copied().unwrap_or(0);
            if row.state == "queued" {
                lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                ));
            } else if row.state != "failed" || committed > 0 {
                wrong_outcome.push(format!(
                    "job {} ({:?}) ended {} with {committed} committed runs",
                    job.id, job.mode, row.state
                ));
            } else if !reason_fits(job.mode, &row.last_error) {
                wrong_outcome.push(format!(
                    "job {} ({:?}) failed with an unexpected reason: {:?}",
                    job.id, job.mode, row.last_error
                ));
            } else if job.mode == Mode::Poison && attempts < i64::from(job.max_attempts) {
                wrong_outcome.push(format!(
                    "poison job {} failed after {attempts} recorded attempts of {}",
                    job.id, job.max_attempts
                ));
            } else {
                failed_as_expected += 1;
                println!(
                    "faults: job {} ({:?}) failed as it must after {attempts} attempts: {}",
                    job.id, job.mode, row.last_error
                );
            }
        }
    }
    let strangers = log
        .iter()
        .filter(|r| !enqueued_ids.contains(&r.job_id))
        .count();
    if strangers > 0 {
        wrong_outcome.push(format!("{strangers} fault_log rows of jobs never enqueued"));
    }
    JobChecks {
        lost,
        duplicates,
        wrong_outcome,
        failed_as_expected,
    }
}

/// Every run, committed or not, from the workers' records, and how many
/// records were torn.
fn read_records(suite: &Suite) -> (Vec<Line>, usize) {
    let mut lines = Vec::new();
    let mut torn = 0usize;
    for (_, path) in &suite.fleet.records {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let (mut l, bad) = runs::parse_all(&text);
        torn += bad.len();
        lines.append(&mut l);
    }
    (lines, torn)
}

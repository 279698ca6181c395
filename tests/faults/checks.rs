//! The suite's checks: every job, every committed and recorded run, how soon
//! groups were released (the report is in `report.rs`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo_tests::faults::private_pg::PrivatePg;
use pgfifo_tests::faults::runs::{self, Cut, Line, Mode};
use pgfifo_tests::records::now_ns;

use crate::jobs::{FAULT_TIMEOUT, FREEZE_TIMEOUT};
use crate::monitor::{log_line_ns, AttemptCount, AttemptRow, JobRow, LogRow};
use crate::plan::reason_fits;
use crate::processes::Cause;
use crate::suite::Suite;

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
}

/// The database's final state.
struct Loaded {
    job_rows: Vec<JobRow>,
    log: Vec<LogRow>,
    attempt_counts: Vec<AttemptCount>,
    attempt_rows: Vec<AttemptRow>,
    hang_timeouts: i64,
    panics: i64,
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
    let (mut order_violations, mut overlaps) = check_committed(&loaded.log);
    let (lines, torn) = read_records(suite);
    let intervals = check_runs(
        suite,
        &loaded,
        &lines,
        began,
        &mut order_violations,
        &mut overlaps,
    );
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
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, attempt, grp, seq, pid, start_ns, end_ns FROM fault_log")
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
    drop(conn);
    Loaded {
        job_rows,
        log,
        attempt_counts,
        attempt_rows,
        hang_timeouts,
        panics,
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

/// Committed runs: per group, in order and never overlapping. The order
/// violations and the overlaps.
fn check_committed(log: &[LogRow]) -> (Vec<String>, Vec<String>) {
    let mut committed_by_group: BTreeMap<i32, Vec<&LogRow>> = BTreeMap::new();
    for row in log {
        committed_by_group.entry(row.grp).or_default().push(row);
    }
    let mut order_violations = Vec::new();
    let mut overlaps = Vec::new();
    for (grp, rows) in &mut committed_by_group {
        rows.sort_by_key(|r| (r.start_ns, r.job_id));
        for pair in rows.windows(2) {
            if pair[1].seq <= pair[0].seq {
                order_violations.push(format!(
                    "group {grp}: committed seq {} (job {}) started after seq {} (job {})",
                    pair[1].seq, pair[1].job_id, pair[0].seq, pair[0].job_id
                ));
            }
            if pair[1].start_ns <= pair[0].end_ns {
                overlaps.push(format!(
                    "group {grp}: committed job {} (pid {}) started before job {} (pid {}) ended",
                    pair[1].job_id, pair[1].pid, pair[0].job_id, pair[0].pid
                ));
            }
        }
    }
    (order_violations, overlaps)
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

/// The runs' intervals from the records; adds their overlaps and order
/// violations, with the evidence for each.
fn check_runs(
    suite: &Suite,
    loaded: &Loaded,
    lines: &[Line],
    began: Instant,
    order_violations: &mut Vec<String>,
    overlaps: &mut Vec<String>,
) -> Vec<runs::Interval> {
    let attempt_rows = &loaded.attempt_rows;
    let mut ctx = runs::Context {
        db_faults: suite.seen.db_faults.clone(),
        ..runs::Context::default()
    };
    for d in &suite.fleet.deaths {
        if matches!(d.cause, Cause::Killed | Cause::Poison) {
            ctx.deaths.insert(d.pid, d.ns);
        }
    }
    for job in &suite.jobs {
        let timeout = if job.queue == "freeze" {
            FREEZE_TIMEOUT
        } else {
            FAULT_TIMEOUT
        };
        ctx.timeout_ns.insert(job.id, timeout.as_nanos() as i64);
    }
    let intervals = runs::intervals(lines, &ctx);
    // Evidence for an overlap: when each run's attempt was recorded (after
    // its pick, before its handler), its handler's span and how it ended, in
    // seconds since the run began, next to the database faults.
    let t_base = now_ns() - began.elapsed().as_nanos() as i64;
    let secs = |ns: i64| (ns - t_base) as f64 / 1e9;
    let attempt_info: HashMap<(i64, i32), &AttemptRow> = attempt_rows
        .iter()
        .map(|a| ((a.job_id, a.attempt), a))
        .collect();
    let end_text: HashMap<(u32, u64), String> = lines
        .iter()
        .filter_map(|l| match l {
            Line::End {
                pid, n, outcome, ..
            } => Some(((*pid, *n), outcome.clone())),
            _ => None,
        })
        .collect();
    let describe = |i: &runs::Interval| {
        let recorded = attempt_info.get(&(i.run.job, i.run.attempt as i32)).map_or(
            "no attempt row".to_owned(),
            |a| {
                format!(
                    "attempt recorded at {:.3}s by {}{}",
                    secs(a.started_us * 1_000),
                    a.runner,
                    if a.error.is_empty() {
                        String::new()
                    } else {
                        format!(" (attempt error: {})", a.error)
                    }
                )
            },
        );
        format!(
            "[job {} attempt {} pid {}: {recorded}; handler {:.3}s..{:.3}s ({:?}, {})]",
            i.run.job,
            i.run.attempt,
            i.pid,
            secs(i.start),
            secs(i.end),
            i.cut,
            end_text
                .get(&(i.pid, i.n))
                .map_or("no end line", String::as_str)
        )
    };
    let fault_times: Vec<String> = suite
        .seen
        .db_faults
        .iter()
        .map(|&t| format!("{:.3}s", secs(t)))
        .collect();
    for (a, b) in runs::overlaps(&intervals) {
        overlaps.push(format!(
            "group {}: {} started while {} ran (database faults at {})",
            b.grp,
            describe(&b),
            describe(&a),
            fault_times.join(", ")
        ));
    }
    for (a, b) in runs::order_violations(&intervals) {
        order_violations.push(format!(
            "group {}: seq {} (run {:?}) started after seq {} (run {:?})",
            b.grp, b.seq, b.run, a.seq, a.run
        ));
    }
    intervals
}

/// How soon groups were released and cut-off jobs ran again, printed.
fn print_release_times(suite: &Suite, pg: &PrivatePg, intervals: &[runs::Interval]) {
    // How soon a cut-off job ran again: from its process's death (or the
    // database fault) to the start of its next attempt's handler. This bounds
    // how long the group stayed held (plus the time to pick and start).
    let mut next_start: HashMap<(i64, u32), i64> = HashMap::new();
    for i in intervals {
        next_start.insert((i.run.job, i.run.attempt), i.start);
    }
    let rerun_delays = |cut: Cut| -> Vec<f64> {
        let mut v: Vec<f64> = intervals
            .iter()
            .filter(|i| i.cut == cut)
            .filter_map(|i| {
                (i.run.attempt + 1..i.run.attempt + 4)
                    .find_map(|a| next_start.get(&(i.run.job, a)))
                    .map(|&next| (next - i.end) as f64 / 1e6)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    // When the server ended each killed process's transactions (its log
    // has a line per session, with the application name): the group release.
    let server_log = pg.log_text();
    let mut kill_release: Vec<f64> = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| matches!(d.cause, Cause::Killed | Cause::Poison))
        .filter_map(|d| {
            server_log
                .lines()
                .filter(|l| {
                    l.contains(&format!(
                        "] {} LOG:  unexpected EOF on client connection",
                        d.app
                    ))
                })
                .filter_map(log_line_ns)
                .filter(|&t| t >= d.ns - 5_000_000 && t < d.ns + 10_000_000_000)
                .max()
                .map(|t| (t - d.ns) as f64 / 1e6)
        })
        .collect();
    kill_release.sort_by(f64::total_cmp);
    if !kill_release.is_empty() {
        println!(
            "faults: process killed or aborted -> the server ended its open transactions after: \
             median {:.0} ms, max {:.0} ms ({} processes, from the server log)",
            kill_release[kill_release.len() / 2],
            kill_release[kill_release.len() - 1],
            kill_release.len()
        );
    }
    for (cut, what) in [
        (Cut::Died, "process killed or aborted"),
        (Cut::DatabaseFault, "connections cut or database restarted"),
    ] {
        let v = rerun_delays(cut);
        if !v.is_empty() {
            println!(
                "faults: {what} -> the cut-off job's next run started after (includes waiting \
                 for a free lane under load): median {:.0} ms, p90 {:.0} ms, max {:.0} ms ({} runs)",
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() - 1],
                v.len()
            );
        }
    }
}

//! The checks of every run, committed (the `fault_log` rows) or recorded
//! (the workers' records): never more runs of a group at once than its
//! concurrency N (1 for most groups: no overlap at all), and, in groups of
//! N = 1, each run after the previous one in `seq` order. (Groups of N > 1
//! start in FIFO order with some jitter: `wide.rs` checks them; the hot
//! groups' runs go back to the head after a batch that did not commit:
//! `hot_checks.rs` checks their order.)

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use pgfifo_tests::faults::runs::{self, Cut, Interval, Line, RunKey};
use pgfifo_tests::records::now_ns;

use crate::hot_checks::is_hot;
use crate::jobs::{FAULT_TIMEOUT, FREEZE_TIMEOUT, HOT_TIMEOUT, LONG_FREEZE_TIMEOUT};
use crate::monitor::{AttemptRow, LogRow};
use crate::processes::Cause;
use crate::suite::Suite;

/// The committed runs as intervals (each held its group, or one of its
/// slots, from its handler's start to its end at least).
fn committed_intervals(log: &[LogRow]) -> Vec<Interval> {
    log.iter()
        .map(|r| Interval {
            run: RunKey {
                job: r.job_id,
                attempt: r.attempt as u32,
            },
            n: 0,
            grp: r.grp as u32,
            seq: r.seq as u32,
            pid: r.pid as u32,
            start: r.start_ns,
            end: r.end_ns,
            cut: Cut::Ended,
        })
        .collect()
}

/// Committed runs: never more than N of a group at once, and in groups of
/// N = 1 in order. Adds the order violations and the overlaps; returns the
/// groups' peaks.
pub(crate) fn check_committed(
    suite: &Suite,
    log: &[LogRow],
    order_violations: &mut Vec<String>,
    overlaps: &mut Vec<String>,
) -> BTreeMap<u32, usize> {
    let intervals = committed_intervals(log);
    let found = runs::at_once(&intervals, |grp| suite.limit_of(grp));
    for (going, run) in &found.over {
        let others: Vec<String> = going
            .iter()
            .map(|g| format!("job {} (pid {})", g.run.job, g.pid))
            .collect();
        overlaps.push(format!(
            "group {}{}: committed job {} (pid {}) started before {} ended",
            run.grp,
            limit_text(suite, run.grp),
            run.run.job,
            run.pid,
            others.join(" and ")
        ));
    }
    for (grp, rows) in runs::by_group(&intervals) {
        if suite.limit_of(grp) > 1 {
            continue;
        }
        for pair in rows.windows(2) {
            if pair[1].seq <= pair[0].seq {
                order_violations.push(format!(
                    "group {grp}: committed seq {} (job {}) started after seq {} (job {})",
                    pair[1].seq, pair[1].run.job, pair[0].seq, pair[0].run.job
                ));
            }
        }
    }
    found.peaks
}

/// " (N=3)" for a group of concurrency N > 1, nothing otherwise.
fn limit_text(suite: &Suite, grp: u32) -> String {
    match suite.limit_of(grp) {
        1 => String::new(),
        n => format!(" (N={n})"),
    }
}

/// The runs' intervals from the records; adds the runs beyond their
/// groups' N and (groups of N = 1) the order violations, with the evidence
/// for each. Returns the intervals and the groups' peaks.
pub(crate) fn check_runs(
    suite: &Suite,
    attempt_rows: &[AttemptRow],
    lines: &[Line],
    began: Instant,
    order_violations: &mut Vec<String>,
    overlaps: &mut Vec<String>,
) -> (Vec<Interval>, BTreeMap<u32, usize>) {
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
        } else if job.queue == "freeze_long" {
            LONG_FREEZE_TIMEOUT
        } else if job.queue == "hot" {
            HOT_TIMEOUT
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
    let describe = |i: &Interval| {
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
        .map(|f| format!("{:.3}s..{:.3}s", secs(f.begin), secs(f.end)))
        .collect();
    let found = runs::at_once(&intervals, |grp| suite.limit_of(grp));
    for (going, run) in &found.over {
        let others: Vec<String> = going.iter().map(describe).collect();
        overlaps.push(format!(
            "group {}{}: {} started while {} ran (database faults at {})",
            run.grp,
            limit_text(suite, run.grp),
            describe(run),
            others.join(" and "),
            fault_times.join(", ")
        ));
    }
    let one_at_a_time: Vec<Interval> = intervals
        .iter()
        .filter(|i| suite.limit_of(i.grp) == 1 && !is_hot(i.grp))
        .copied()
        .collect();
    for (a, b) in runs::order_violations(&one_at_a_time) {
        order_violations.push(format!(
            "group {}: seq {} (run {:?}) started after seq {} (run {:?})",
            b.grp, b.seq, b.run, a.seq, a.run
        ));
    }
    (intervals, found.peaks)
}

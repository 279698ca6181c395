//! The long-mode jobs' part of the suite (`faults.long`, one group in
//! `LONG_EVERY` of N = 1): they go through every fault and every check with
//! the others (their `fault_log` rows are copied in by the transaction
//! that writes their success, see `FAULT_LONG`). Here: how many there were,
//! how many runs a SIGKILL cut off mid-handler, and how soon each of those
//! jobs started again: the holder's session ends with its process, so the
//! next pick that meets the group takes it over, without waiting for its
//! lease. A run whose success committed before the kill reached its
//! worker (which then could not record its end) has nothing to run again.

use std::collections::HashSet;

use pgfifo_tests::faults::runs::{Cut, Interval, Line};

use crate::monitor::LogRow;
use crate::plan::is_long_group;
use crate::suite::Suite;

/// What the long-mode jobs went through.
pub(crate) struct LongFound {
    /// Long-mode jobs enqueued.
    pub(crate) jobs: usize,
    /// Their runs cut off by their process's death.
    pub(crate) killed: usize,
    /// Of those, the runs whose success had committed (no end recorded).
    pub(crate) killed_after_commit: usize,
    /// For each, seconds from its death to the next start of its job.
    pub(crate) rerun_after: Vec<f64>,
    /// Killed runs whose job never started again.
    pub(crate) never_rerun: Vec<String>,
}

/// Looks at the long-mode runs that a death cut off.
pub(crate) fn check(
    suite: &Suite,
    intervals: &[Interval],
    lines: &[Line],
    log: &[LogRow],
) -> LongFound {
    let committed: HashSet<(i64, i32)> = log.iter().map(|r| (r.job_id, r.attempt)).collect();
    let long_ids: HashSet<i64> = suite
        .jobs
        .iter()
        .filter(|j| j.queue == "faults" && is_long_group(j.grp, &suite.wide))
        .map(|j| j.id)
        .collect();
    // A run cut off at its job's last allowed attempt has no next run: its
    // job fails for good (the checks of failed jobs cover it).
    let last_attempt: std::collections::HashMap<i64, u32> =
        suite.jobs.iter().map(|j| (j.id, j.max_attempts)).collect();
    let mut found = LongFound {
        jobs: long_ids.len(),
        killed: 0,
        killed_after_commit: 0,
        rerun_after: Vec::new(),
        never_rerun: Vec::new(),
    };
    for i in intervals
        .iter()
        .filter(|i| i.cut == Cut::Died && long_ids.contains(&i.run.job))
    {
        found.killed += 1;
        if committed.contains(&(i.run.job, i.run.attempt as i32)) {
            found.killed_after_commit += 1;
            continue;
        }
        if last_attempt
            .get(&i.run.job)
            .is_some_and(|max| i.run.attempt as u64 >= u64::from(*max))
        {
            continue;
        }
        let next = lines
            .iter()
            .filter_map(|l| match l {
                Line::Start { run, ns, .. }
                    if run.job == i.run.job && run.attempt > i.run.attempt =>
                {
                    Some(*ns)
                }
                _ => None,
            })
            .min();
        match next {
            Some(ns) => found.rerun_after.push((ns - i.end).max(0) as f64 / 1e9),
            None => found.never_rerun.push(format!(
                "job {} attempt {} (pid {})",
                i.run.job, i.run.attempt, i.pid
            )),
        }
    }
    found.rerun_after.sort_by(f64::total_cmp);
    found
}

/// The line the report prints.
pub(crate) fn summary(found: &LongFound) -> String {
    let at = |q: f64| {
        if found.rerun_after.is_empty() {
            0.0
        } else {
            let k = ((found.rerun_after.len() - 1) as f64 * q).round() as usize;
            found.rerun_after[k]
        }
    };
    format!(
        "long_jobs={} long_killed={} (after their commit: {}) long_rerun_after_kill median={:.2}s max={:.2}s",
        found.jobs,
        found.killed,
        found.killed_after_commit,
        at(0.5),
        at(1.0)
    )
}

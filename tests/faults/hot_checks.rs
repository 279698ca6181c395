//! The checks of the hot groups (`hot.rs`) beyond those of every job and
//! run: the order of their recorded runs, and how many jobs committed as
//! followers.
//!
//! A hot group's runs are not in `seq` order the way the other groups' of
//! N = 1 are: a batch whose transaction never committed (its worker was
//! killed, its connection cut) ran jobs that then run again from the
//! group's head. So, for each run (by start) and the run of its group just
//! before it:
//! * a run of a later job: the run before ended well, and committed or was
//!   in the same process (a follower in its transaction); and it is the next
//!   job, none skipped;
//! * a run of the same or an earlier job: the run before did not commit.

use std::collections::{BTreeMap, HashMap, HashSet};

use pgfifo_tests::faults::runs::{self, Cut, Interval, Line};

use crate::jobs::HOT_GRP;
use crate::monitor::LogRow;
use crate::suite::Suite;

/// What the checks of the hot groups found.
#[derive(Default)]
pub(crate) struct HotFound {
    /// Hot jobs enqueued.
    pub(crate) jobs: usize,
    /// Jobs whose run committed in the same transaction as the previous job
    /// of their group: they started as followers.
    pub(crate) followers: usize,
    /// Transactions that committed more than one job of a group.
    pub(crate) batches: usize,
    /// The most jobs of a group one transaction committed.
    pub(crate) longest: usize,
    /// Runs that ended well and never committed (their batch was cut off).
    pub(crate) rolled_back: usize,
    /// Runs cut off by a kill.
    pub(crate) killed: usize,
    pub(crate) order_violations: Vec<String>,
}

/// Whether group `grp` is a hot group.
pub(crate) fn is_hot(grp: u32) -> bool {
    grp >= HOT_GRP
}

/// Checks the hot groups' runs (`intervals`: every recorded run; `log`:
/// every committed run).
pub(crate) fn check(
    suite: &Suite,
    intervals: &[Interval],
    lines: &[Line],
    log: &[LogRow],
) -> HotFound {
    let mut found = HotFound {
        jobs: suite.jobs.iter().filter(|j| j.queue == "hot").count(),
        ..HotFound::default()
    };
    let hot_log: Vec<&LogRow> = log.iter().filter(|r| is_hot(r.grp as u32)).collect();
    count_followers(&hot_log, &mut found);
    let committed: HashSet<(i64, u32, i64)> = hot_log
        .iter()
        .map(|r| (r.job_id, r.pid as u32, r.start_ns))
        .collect();
    let outcome: HashMap<(u32, u64), &str> = lines
        .iter()
        .filter_map(|l| match l {
            Line::End {
                pid, n, outcome, ..
            } => Some(((*pid, *n), outcome.as_str())),
            _ => None,
        })
        .collect();
    let hot: Vec<Interval> = intervals
        .iter()
        .filter(|i| is_hot(i.grp))
        .copied()
        .collect();
    let is_committed = |i: &Interval| committed.contains(&(i.run.job, i.pid, i.start));
    let ended_well = |i: &Interval| outcome.get(&(i.pid, i.n)) == Some(&"ok");
    for i in &hot {
        if ended_well(i) && !is_committed(i) {
            found.rolled_back += 1;
        }
        if i.cut == Cut::Died {
            found.killed += 1;
        }
    }
    let show = |i: &Interval| {
        format!(
            "seq {} (job {} attempt {} pid {}{})",
            i.seq,
            i.run.job,
            i.run.attempt,
            i.pid,
            if is_committed(i) { ", committed" } else { "" }
        )
    };
    for (grp, runs) in runs::by_group(&hot) {
        if let Some(first) = runs.first().filter(|i| i.seq > 0) {
            found
                .order_violations
                .push(format!("hot group {grp}: the first run is {}", show(first)));
        }
        for pair in runs.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let wrong = if b.seq > a.seq {
                if !ended_well(a) {
                    Some("after a run that did not succeed,")
                } else if !is_committed(a) && a.pid != b.pid {
                    Some("in another process while the success of")
                } else if b.seq > a.seq + 1 {
                    Some("skipping a job after")
                } else {
                    None
                }
            } else if is_committed(a) {
                Some("after the committed run of")
            } else {
                None
            };
            if let Some(wrong) = wrong {
                found.order_violations.push(format!(
                    "hot group {grp}: {} started {wrong} {}",
                    show(b),
                    show(a)
                ));
            }
        }
    }
    found
}

/// Followers, batches and the longest batch, from the committed runs: jobs
/// of a group next to each other that committed in one transaction.
fn count_followers(hot_log: &[&LogRow], found: &mut HotFound) {
    let mut by_group: BTreeMap<i32, Vec<&LogRow>> = BTreeMap::new();
    for r in hot_log {
        by_group.entry(r.grp).or_default().push(r);
    }
    for rows in by_group.values_mut() {
        rows.sort_by_key(|r| r.seq);
        let mut length = 1;
        for pair in rows.windows(2) {
            if pair[1].xact == pair[0].xact {
                found.followers += 1;
                length += 1;
                if length == 2 {
                    found.batches += 1;
                }
            } else {
                length = 1;
            }
            found.longest = found.longest.max(length);
        }
    }
}

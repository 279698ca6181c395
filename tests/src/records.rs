//! Run records of the multi-process test (`tests/it/multiprocess.rs`): what
//! each `fifo-worker` process appends to its records file for every handler
//! run, and the checks made on them.
//!
//! Times are nanoseconds since the Unix epoch read from `SystemTime`
//! (`CLOCK_REALTIME`), one clock shared by every process on the machine, so
//! runs recorded by different processes can be compared directly.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch, from the machine's real-time clock.
pub fn now_ns() -> i64 {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    i64::try_from(ns).expect("nanoseconds fit in i64 until 2262")
}

/// One handler run as a worker recorded it, committed or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The job's group number.
    pub grp: u32,
    /// The job's position in its group (enqueue order).
    pub seq: u32,
    /// When the handler started (ns since the epoch).
    pub start_ns: i64,
    /// When the handler had done all its work (ns since the epoch).
    pub end_ns: i64,
    /// The worker process.
    pub pid: u32,
    /// The job's id.
    pub job_id: i64,
}

impl Run {
    /// The record line: `grp\tseq\tstart_ns\tend_ns\tpid\tjob_id\n`.
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            self.grp, self.seq, self.start_ns, self.end_ns, self.pid, self.job_id
        )
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    pub fn parse(line: &str) -> Result<Run, String> {
        let fields: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        if fields.len() != 6 {
            return Err(format!("expected 6 tab-separated fields: {line:?}"));
        }
        let bad = |what: &str| format!("bad {what} in {line:?}");
        Ok(Run {
            grp: fields[0].parse().map_err(|_| bad("grp"))?,
            seq: fields[1].parse().map_err(|_| bad("seq"))?,
            start_ns: fields[2].parse().map_err(|_| bad("start_ns"))?,
            end_ns: fields[3].parse().map_err(|_| bad("end_ns"))?,
            pid: fields[4].parse().map_err(|_| bad("pid"))?,
            job_id: fields[5].parse().map_err(|_| bad("job_id"))?,
        })
    }
}

/// Reads every run of a records file. A torn last line (a worker killed
/// mid-write) is an error: the test only reads files of workers that exited
/// cleanly.
pub fn read_runs(path: &Path) -> Result<Vec<Run>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(Run::parse)
        .collect()
}

/// Runs per group, each group sorted by start time (then end, then job id).
pub fn by_group(runs: &[Run]) -> BTreeMap<u32, Vec<Run>> {
    let mut groups: BTreeMap<u32, Vec<Run>> = BTreeMap::new();
    for run in runs {
        groups.entry(run.grp).or_default().push(*run);
    }
    for group in groups.values_mut() {
        group.sort_by_key(|r| (r.start_ns, r.end_ns, r.job_id));
    }
    groups
}

/// Pairs of runs of one group whose closed `[start, end]` intervals
/// intersect: `(earlier, later)` where `later` started before (or when) some
/// earlier run of the group ended.
pub fn overlaps(runs: &[Run]) -> Vec<(Run, Run)> {
    let mut found = Vec::new();
    for group in by_group(runs).values() {
        // The run that ends last among those started so far.
        let mut latest: Option<Run> = None;
        for run in group {
            if let Some(prev) = latest {
                if run.start_ns <= prev.end_ns {
                    found.push((prev, *run));
                }
            }
            if latest.is_none_or(|prev| run.end_ns > prev.end_ns) {
                latest = Some(*run);
            }
        }
    }
    found
}

/// Consecutive runs of one group (by start time) whose `seq` goes down:
/// a job started before a job enqueued ahead of it in its group.
pub fn order_violations(runs: &[Run]) -> Vec<(Run, Run)> {
    let mut found = Vec::new();
    for group in by_group(runs).values() {
        for pair in group.windows(2) {
            if pair[1].seq < pair[0].seq {
                found.push((pair[0], pair[1]));
            }
        }
    }
    found
}

/// Consecutive runs of one group (by start time) made by different
/// processes: how often a group passed from one process to another.
pub fn handoffs(runs: &[Run]) -> usize {
    by_group(runs)
        .values()
        .map(|group| group.windows(2).filter(|p| p[0].pid != p[1].pid).count())
        .sum()
}

/// The most runs in progress at one instant, across all groups and processes.
pub fn peak_parallelism(runs: &[Run]) -> usize {
    // Ends sort before starts at the same instant: touching is not overlapping.
    let mut edges: Vec<(i64, i32)> = runs
        .iter()
        .flat_map(|r| [(r.start_ns, 1), (r.end_ns, -1)])
        .collect();
    edges.sort_unstable();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    usize::try_from(peak).unwrap_or(0)
}

/// The most runs of each group in progress at one instant (see
/// [`peak_parallelism`]).
pub fn peak_per_group(runs: &[Run]) -> BTreeMap<u32, usize> {
    by_group(runs)
        .into_iter()
        .map(|(grp, group)| (grp, peak_parallelism(&group)))
        .collect()
}

/// Reads a records file that may end in a torn line (its worker was killed
/// mid-write): the complete lines only.
pub fn read_runs_lenient(path: &Path) -> Vec<Run> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| Run::parse(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(grp: u32, seq: u32, start_ns: i64, end_ns: i64, pid: u32) -> Run {
        Run {
            grp,
            seq,
            start_ns,
            end_ns,
            pid,
            job_id: i64::from(grp * 1000 + seq),
        }
    }

    #[test]
    fn lines_round_trip() {
        let r = run(
            7,
            3,
            1_700_000_000_000_000_000,
            1_700_000_000_000_500_000,
            4242,
        );
        assert_eq!(Run::parse(&r.to_line()), Ok(r));
        assert!(Run::parse("1\t2\t3").is_err());
        assert!(Run::parse("1\t2\t3\t4\t5\tx").is_err());
    }

    #[test]
    fn finds_overlaps_within_a_group_only() {
        let runs = [
            run(1, 0, 0, 10, 1),
            run(1, 1, 11, 20, 2),
            // Group 2 runs at the same time as group 1: fine.
            run(2, 0, 5, 15, 1),
            // Starts inside a long earlier run that a shorter one follows.
            run(3, 0, 0, 100, 1),
            run(3, 1, 101, 110, 2),
            run(3, 2, 105, 120, 3),
            // Touching ends count as overlapping (closed intervals).
            run(4, 0, 0, 10, 1),
            run(4, 1, 10, 20, 2),
        ];
        let found = overlaps(&runs);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].0.grp, found[0].1.seq), (3, 2));
        assert_eq!((found[1].0.grp, found[1].1.seq), (4, 1));
    }

    #[test]
    fn finds_order_violations_and_handoffs() {
        let runs = [
            run(1, 1, 0, 1, 1),
            run(1, 0, 2, 3, 2),
            run(1, 2, 4, 5, 2),
            run(2, 0, 0, 1, 1),
        ];
        let found = order_violations(&runs);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].0.seq, found[0].1.seq), (1, 0));
        assert_eq!(handoffs(&runs), 1);
        assert_eq!(peak_parallelism(&runs), 2);
    }
}

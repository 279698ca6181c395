//! What `fault-worker` processes record about every handler run, and the
//! checks the fault-injection suite makes on those records.
//!
//! Each worker appends lines to a file of its own, one `write` per line (an
//! `O_APPEND` file: a SIGKILL cannot tear a line):
//! * `S` when a handler starts;
//! * `E` when it ends (returned, failed, or is about to panic), with whether
//!   its write to the database went through;
//! * `A` just before a poison handler aborts its process.
//!
//! A run that has an `S` but no `E` line was cut off: its process died
//! (SIGKILL, abort), or the runner dropped it at its timeout. Times are ns of
//! `CLOCK_REALTIME`, shared by every process on the machine.
//!
//! The records cover every run, committed or not, so they show what the
//! committed log in the database cannot: a run that was rolled back while
//! another run of its group was already going.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// What a fault-suite job does when it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Sleeps its `work_ms`, logs the run in the job's transaction, succeeds.
    Normal,
    /// Hangs past its timeout until one of its attempts has timed out (as
    /// recorded in `pgfifo.job_attempt`), then behaves normally: an attempt
    /// cut off by another fault does not spare it its timeout.
    HangOnce,
    /// Hangs past its timeout on every attempt: fails at max attempts.
    HangAlways,
    /// Logs the run, then panics (the log row rolls back), until one of its
    /// attempts has panicked; then behaves normally.
    PanicOnce,
    /// Logs the run, then panics on every attempt: fails at max attempts.
    PanicAlways,
    /// Aborts its process (`std::process::abort`) on every attempt.
    Poison,
}

impl Mode {
    /// Whether the job must end `succeeded` (otherwise `failed`).
    pub fn succeeds(self) -> bool {
        matches!(self, Mode::Normal | Mode::HangOnce | Mode::PanicOnce)
    }
}

/// One record line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A handler started.
    Start {
        /// The run's job and attempt.
        run: RunKey,
        /// The run's number in its process (joins its `E` or `A` line).
        n: u64,
        /// Its group (the suite's group number).
        grp: u32,
        /// Its place in the group (enqueue order).
        seq: u32,
        /// The worker process.
        pid: u32,
        /// When (ns since the epoch).
        ns: i64,
    },
    /// A handler ended.
    End {
        /// The run's job and attempt.
        run: RunKey,
        /// The worker process.
        pid: u32,
        /// The run's number in its process.
        n: u64,
        /// When (ns since the epoch).
        ns: i64,
        /// `ok` (the log row was written in the job's transaction),
        /// `dberr:` and the error (a statement through the job's connection
        /// failed: the transaction is gone) or `panic` (written, then the
        /// handler panics).
        outcome: String,
    },
    /// A poison handler is about to abort its process.
    Abort {
        /// The run's job and attempt.
        run: RunKey,
        /// The worker process.
        pid: u32,
        /// The run's number in its process.
        n: u64,
        /// When (ns since the epoch).
        ns: i64,
    },
}

/// A run's job and attempt number. Not always unique: a server crash can
/// lose the newest attempt records (they are written without waiting for the
/// WAL flush), and the number is then given again. A run is identified by
/// its process and its number there (`pid`, `n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    /// The job's id.
    pub job: i64,
    /// The attempt.
    pub attempt: u32,
}

impl Line {
    /// The record line, with its newline.
    pub fn to_line(&self) -> String {
        match self {
            Line::Start {
                run,
                n,
                grp,
                seq,
                pid,
                ns,
            } => format!(
                "S\t{}\t{}\t{grp}\t{seq}\t{pid}\t{ns}\t{n}\n",
                run.job, run.attempt
            ),
            Line::End {
                run,
                pid,
                n,
                ns,
                outcome,
            } => format!(
                "E\t{}\t{}\t{pid}\t{n}\t{ns}\t{outcome}\n",
                run.job, run.attempt
            ),
            Line::Abort { run, pid, n, ns } => {
                format!("A\t{}\t{}\t{pid}\t{ns}\t{n}\n", run.job, run.attempt)
            }
        }
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    pub fn parse(line: &str) -> Result<Line, String> {
        let f: Vec<&str> = line.trim_end_matches('\n').split('\t').collect();
        let bad = || format!("bad record line {line:?}");
        let num = |i: usize| -> Result<i64, String> {
            f.get(i).and_then(|s| s.parse().ok()).ok_or_else(bad)
        };
        let small = |i: usize| -> Result<u32, String> {
            f.get(i).and_then(|s| s.parse().ok()).ok_or_else(bad)
        };
        let count = |i: usize| -> Result<u64, String> {
            f.get(i).and_then(|s| s.parse().ok()).ok_or_else(bad)
        };
        let key = || -> Result<RunKey, String> {
            Ok(RunKey {
                job: num(1)?,
                attempt: small(2)?,
            })
        };
        match (f.first().copied(), f.len()) {
            (Some("S"), 8) => Ok(Line::Start {
                run: key()?,
                grp: small(3)?,
                seq: small(4)?,
                pid: small(5)?,
                ns: num(6)?,
                n: count(7)?,
            }),
            (Some("E"), 7) => Ok(Line::End {
                run: key()?,
                pid: small(3)?,
                n: count(4)?,
                ns: num(5)?,
                outcome: f[6].to_owned(),
            }),
            (Some("A"), 6) => Ok(Line::Abort {
                run: key()?,
                pid: small(3)?,
                ns: num(4)?,
                n: count(5)?,
            }),
            _ => Err(bad()),
        }
    }
}

/// Parses a records file's text. Unparsable lines are returned apart (there
/// should be none).
pub fn parse_all(text: &str) -> (Vec<Line>, Vec<String>) {
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    for l in text.lines().filter(|l| !l.is_empty()) {
        match Line::parse(l) {
            Ok(line) => lines.push(line),
            Err(_) => bad.push(l.to_owned()),
        }
    }
    (lines, bad)
}

/// Runs that started and have not ended (no `E` or `A` line yet).
pub fn in_flight(lines: &[Line]) -> usize {
    let mut open = std::collections::HashSet::new();
    for line in lines {
        match line {
            Line::Start { pid, n, .. } => {
                open.insert((*pid, *n));
            }
            Line::End { pid, n, .. } | Line::Abort { pid, n, .. } => {
                open.remove(&(*pid, *n));
            }
        }
    }
    open.len()
}

/// One run as far as exclusivity is concerned: the interval during which it
/// may have held its group's lock (or one of its slots, for a group that
/// runs several jobs at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// The run's job and attempt.
    pub run: RunKey,
    /// The run's number in its process.
    pub n: u64,
    /// Its group.
    pub grp: u32,
    /// Its place in the group.
    pub seq: u32,
    /// Its process.
    pub pid: u32,
    /// When the handler started.
    pub start: i64,
    /// When the run lost (or gave up) the group at the latest.
    pub end: i64,
    /// Why the run ended at `end`.
    pub cut: Cut,
}

/// How a run's interval ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The handler's `E` line.
    Ended,
    /// Its process died (SIGKILL or abort) then.
    Died,
    /// Every pgfifo connection was cut then (terminate or restart): the run's
    /// transaction, and with it the group's lock, was gone after that moment.
    DatabaseFault,
    /// The handler's timeout: the runner drops a handler then, so no run
    /// executes longer (a frozen process aside).
    TimedOut,
}

/// A database fault (every connection terminated, or a server restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbFault {
    /// When the suite began cutting the connections (ns).
    pub begin: i64,
    /// When every connection that existed at `begin` was gone (ns).
    pub end: i64,
}

/// What the suite knows about the run besides the records.
#[derive(Debug, Default)]
pub struct Context {
    /// When each process died (SIGKILL sent, or the poison's `A` line).
    pub deaths: HashMap<u32, i64>,
    /// The database faults (every connection cut in each).
    pub db_faults: Vec<DbFault>,
    /// The handler timeout of each job (ns); runs without an end are bounded
    /// by it.
    pub timeout_ns: HashMap<i64, i64>,
}

/// Builds the intervals of every run from all processes' records.
pub fn intervals(lines: &[Line], ctx: &Context) -> Vec<Interval> {
    // Each run's end, and whether its write found its transaction gone.
    let mut ends: HashMap<(u32, u64), (i64, bool)> = HashMap::new();
    for line in lines {
        match line {
            Line::End {
                pid,
                n,
                ns,
                outcome,
                ..
            } => {
                ends.insert((*pid, *n), (*ns, outcome.starts_with("dberr")));
            }
            Line::Abort { pid, n, ns, .. } => {
                ends.insert((*pid, *n), (*ns, false));
            }
            Line::Start { .. } => {}
        }
    }
    let mut faults = ctx.db_faults.clone();
    faults.sort_unstable_by_key(|f| f.begin);
    let mut out = Vec::new();
    for line in lines {
        let Line::Start {
            run,
            n,
            grp,
            seq,
            pid,
            ns,
        } = *line
        else {
            continue;
        };
        let mut candidates: Vec<(i64, Cut)> = Vec::new();
        let mut lost_transaction = false;
        if let Some(&(end, dberr)) = ends.get(&(pid, n)) {
            candidates.push((end, Cut::Ended));
            // Its transaction gone, and no later fault that could have
            // ended it instead.
            lost_transaction = dberr && !faults.iter().any(|f| f.begin > ns && f.begin <= end);
        }
        if let Some(&death) = ctx.deaths.get(&pid) {
            if death >= ns {
                candidates.push((death, Cut::Died));
            }
        }
        if let Some(fault) = faults.iter().find(|f| f.begin >= ns) {
            candidates.push((fault.begin, Cut::DatabaseFault));
        }
        // A run that began while a fault was cutting connections, and whose
        // write then found its transaction gone (no later fault between),
        // was picked on a connection that fault cut: its lock may have been
        // gone when its handler began.
        if lost_transaction && faults.iter().any(|f| f.begin <= ns && ns <= f.end) {
            candidates.push((ns, Cut::DatabaseFault));
        }
        // The runner drops a handler at its timeout: no run executes longer
        // (a frozen process aside, which the suite checks on its own).
        match ctx.timeout_ns.get(&run.job) {
            Some(&timeout) => candidates.push((ns + timeout, Cut::TimedOut)),
            None if candidates.is_empty() => candidates.push((ns, Cut::TimedOut)),
            None => {}
        }
        let (end, cut) = candidates
            .into_iter()
            .min_by_key(|c| c.0)
            .expect("one candidate at least");
        out.push(Interval {
            run,
            n,
            grp,
            seq,
            pid,
            start: ns,
            end,
            cut,
        });
    }
    out
}

/// Intervals per group, sorted by start.
pub fn by_group(intervals: &[Interval]) -> BTreeMap<u32, Vec<Interval>> {
    let mut groups: BTreeMap<u32, Vec<Interval>> = BTreeMap::new();
    for i in intervals {
        groups.entry(i.grp).or_default().push(*i);
    }
    for g in groups.values_mut() {
        g.sort_by_key(|i| (i.start, i.end, i.run));
    }
    groups
}

/// How many runs of each group went at once, and where a group went over
/// its limit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AtOnce {
    /// Every run that started while its group's limit of runs (or more)
    /// still went: `(those runs, the run)`.
    pub over: Vec<(Vec<Interval>, Interval)>,
    /// The most runs of each group at the same instant.
    pub peaks: BTreeMap<u32, usize>,
}

/// Counts the runs of each group that went at once; `limit(grp)` is how
/// many the group may run at the same instant (its concurrency N). A run
/// that starts at the very instant another ends counts as overlapping it.
pub fn at_once(intervals: &[Interval], limit: impl Fn(u32) -> usize) -> AtOnce {
    let mut found = AtOnce::default();
    for (grp, group) in by_group(intervals) {
        let limit = limit(grp).max(1);
        let mut going: Vec<Interval> = Vec::new();
        let mut peak = 0usize;
        for i in group {
            going.retain(|g| g.end >= i.start);
            if going.len() >= limit {
                found.over.push((going.clone(), i));
            }
            going.push(i);
            peak = peak.max(going.len());
        }
        found.peaks.insert(grp, peak);
    }
    found
}

/// Pairs of runs of one group that overlap in time: `(earlier, later)` where
/// `later` started before `earlier` lost its group (for groups that run one
/// job at a time; [`at_once`] for any limit).
pub fn overlaps(intervals: &[Interval]) -> Vec<(Interval, Interval)> {
    at_once(intervals, |_| 1)
        .over
        .into_iter()
        .map(|(going, later)| {
            let earlier = going
                .into_iter()
                .max_by_key(|g| g.end)
                .expect("a run went on");
            (earlier, later)
        })
        .collect()
}

/// Consecutive runs of one group (by start) whose `seq` goes down: a job
/// started before a job enqueued ahead of it in its group had finished (for
/// groups that run one job at a time; `starts` checks the others).
pub fn order_violations(intervals: &[Interval]) -> Vec<(Interval, Interval)> {
    let mut found = Vec::new();
    for group in by_group(intervals).values() {
        for pair in group.windows(2) {
            if pair[1].seq < pair[0].seq {
                found.push((pair[0], pair[1]));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests;

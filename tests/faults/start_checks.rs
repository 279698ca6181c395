//! The start checks of the groups of N > 1 (see
//! `pgfifo_tests::faults::starts`): FIFO starts, and the hold-back after a
//! failed attempt (checked in every group but the hot ones: with N = 1 it
//! holds by construction; a hot group's jobs behind a held job are picked
//! with its next attempt, as followers, and its `finished_at` is its
//! batch's commit, after they ran: `hot_checks.rs` checks that none starts
//! before the held job's run has succeeded).
//!
//! When was a job picked? No record says exactly; the suite bounds it:
//! * by then at the latest: its attempt's record (every start the library
//!   recorded, kept by the `fault_start` trigger also when the runner later
//!   forgets it, as for a job handed back unstarted) or its handler's start
//!   (the workers' records, the committed runs);
//! * not before: the start of the transaction that picked it, for the
//!   committed run (`fault_log.picked_ns`: the runner sends BEGIN with the
//!   pick). A pick whose transaction did not commit (cut off, handed back)
//!   is bounded by its record less [`PICK_SLACK`] (the measured delay from
//!   pick to record is printed).
//!
//! A job whose first pick left no trace (its runner died, or the database
//! went, between the pick and the record; an immediate restart loses the
//! newest records) may seem to start after jobs behind it: an early start
//! close to such a fault, whose older job's start is only known after it,
//! is excused (and listed).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgfifo_tests::faults::starts::{self, Early, Hold, Span};
use pgfifo_tests::records::now_ns;

use crate::hot_checks::is_hot;
use crate::processes::Cause;
use crate::suite::Suite;
use crate::wide::{Runs, Trace, WideFound};

/// How far beyond what the bounds make certain a start may be out of
/// order, for the clocks' and the timestamps' precision.
pub(crate) const JITTER: Duration = Duration::from_millis(50);

/// How long before its record a pick may have been made, for a pick whose
/// transaction never committed (its own start is then unknown). The record
/// waits for the runner's bookkeeping connection, which may be reconnecting
/// after a database fault: the measured delays (printed) are a few ms,
/// exceptionally up to about a second.
const PICK_SLACK: Duration = Duration::from_secs(2);

/// How close to a fault (kill, abort, database fault) an early start may be
/// to be excused: a kill or a cut loses a pick not yet recorded, whose
/// record comes a moment after the pick; an immediate restart loses the
/// attempts recorded in the last fraction of a second (they are written
/// without waiting for the WAL flush).
const DEATH_WINDOW: Duration = Duration::from_millis(500);
const DB_FAULT_WINDOW: Duration = Duration::from_millis(1_500);
/// A fault up to this long before the early start excuses it too.
const FAULT_BEFORE: Duration = Duration::from_millis(300);

fn ns(d: Duration) -> i64 {
    d.as_nanos() as i64
}

/// What the suite knows of one job's picks.
#[derive(Default)]
struct Evidence {
    /// Its attempts' records.
    records: Vec<i64>,
    /// Its handlers' starts.
    handlers: Vec<i64>,
    /// The start of its committed run's transaction.
    committed_pick: Option<i64>,
    /// What to print about it.
    text: Vec<String>,
}

impl Evidence {
    /// When it was first picked: `(earliest, latest)`.
    fn first(&self) -> Option<(i64, i64)> {
        let latest = self.records.iter().chain(&self.handlers).min().copied()?;
        let earliest = match self.committed_pick {
            // Nothing of it before its committed run: that run was its first.
            Some(p) if p <= latest => p,
            _ => latest - ns(PICK_SLACK),
        };
        Some((earliest, latest))
    }

    /// Each of its picks, by its record: `(earliest, latest)`. Records
    /// after the committed run's pick are that run's.
    fn picks(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut committed: Option<i64> = None;
        for &r in &self.records {
            match self.committed_pick {
                Some(p) if r >= p => committed = Some(committed.map_or(r, |c| c.min(r))),
                _ => out.push((r - ns(PICK_SLACK), r)),
            }
        }
        if let (Some(p), Some(c)) = (self.committed_pick, committed) {
            out.push((p, c));
        }
        out
    }
}

/// Runs the start checks; adds what they found to `found`.
pub(crate) fn check(
    suite: &Suite,
    trace: &Trace,
    runs: &Runs<'_>,
    began: Instant,
    found: &mut WideFound,
) {
    let t_base = now_ns() - began.elapsed().as_nanos() as i64;
    let secs = |ns: i64| (ns - t_base) as f64 / 1e9;
    let place: HashMap<i64, (u32, u32)> =
        suite.jobs.iter().map(|j| (j.id, (j.grp, j.seq))).collect();
    let mut of: HashMap<i64, Evidence> = HashMap::new();
    for s in &trace.starts {
        let e = of.entry(s.job_id).or_default();
        e.records.push(s.at_us * 1_000);
        e.text.push(format!(
            "attempt {} recorded at {:.3}s by {}",
            s.attempt,
            secs(s.at_us * 1_000),
            s.runner
        ));
    }
    for i in runs.intervals {
        let e = of.entry(i.run.job).or_default();
        e.handlers.push(i.start);
        e.text.push(format!(
            "handler in pid {} {:.3}s..{:.3}s ({:?})",
            i.pid,
            secs(i.start),
            secs(i.end),
            i.cut
        ));
    }
    for r in runs.log {
        let e = of.entry(r.job_id).or_default();
        e.handlers.push(r.start_ns);
        e.committed_pick = Some(e.committed_pick.map_or(r.picked_ns, |p| p.min(r.picked_ns)));
        e.text.push(format!(
            "committed attempt {} picked at {:.3}s",
            r.attempt,
            secs(r.picked_ns)
        ));
    }
    let span = |job: i64, (earliest, latest): (i64, i64)| {
        let &(grp, seq) = place.get(&job)?;
        Some(Span {
            job,
            grp,
            seq,
            earliest,
            latest,
        })
    };
    let describe = |s: &Span| {
        format!(
            "job {} seq {} (picked {:.3}s..{:.3}s: {})",
            s.job,
            s.seq,
            secs(s.earliest),
            secs(s.latest),
            of.get(&s.job).map_or(String::new(), |e| e.text.join("; "))
        )
    };

    // FIFO starts in the groups of N > 1.
    let firsts: Vec<Span> = of
        .iter()
        .filter_map(|(&job, e)| span(job, e.first()?))
        .filter(|s| suite.limit_of(s.grp) > 1)
        .collect();
    let order = starts::early_starts(&firsts, ns(JITTER));
    found.compared = order.compared;
    found.max_lead_within_ms = order.max_lead_within.map(|l| l as f64 / 1e6);
    let faults = faults(suite);
    let excusing = |e: &Early| {
        faults.iter().copied().find(|&(f, after)| {
            f >= e.start.latest - ns(FAULT_BEFORE)
                && f <= e.start.latest + after
                && f < e.older.earliest
        })
    };
    for e in &order.early {
        let text = format!(
            "group {} (N={}): {} was picked {:.0} ms before {} could have been",
            e.start.grp,
            suite.limit_of(e.start.grp),
            describe(&e.start),
            e.lead() as f64 / 1e6,
            describe(&e.older)
        );
        match excusing(e) {
            Some((f, _)) => found
                .excused
                .push(format!("{text} (a fault at {:.3}s)", secs(f))),
            None => found.order_violations.push(text),
        }
    }

    // The hold-back, in every group but the hot ones.
    let holds: Vec<Hold> = trace
        .holds
        .iter()
        .filter_map(|h| {
            let &(grp, seq) = place.get(&h.job_id)?;
            if is_hot(grp) {
                return None;
            }
            Some(Hold {
                job: h.job_id,
                grp,
                seq,
                from: h.commit_us.unwrap_or(h.at_us) * 1_000,
                until: h.finished_us.map(|u| u * 1_000),
            })
        })
        .collect();
    found.wide_holds = holds.iter().filter(|h| suite.limit_of(h.grp) > 1).count();
    let picks: Vec<Span> = of
        .iter()
        .flat_map(|(&job, e)| e.picks().into_iter().filter_map(move |p| span(job, p)))
        .collect();
    for (h, s) in starts::started_while_held(&holds, &picks, ns(JITTER)) {
        found.held_back.push(format!(
            "group {} (N={}): {} was picked while job {} seq {} held the group back (its failed \
             attempt committed at {:.3}s, done at {})",
            h.grp,
            suite.limit_of(h.grp),
            describe(&s),
            h.job,
            h.seq,
            secs(h.from),
            h.until
                .map_or("never".to_owned(), |u| format!("{:.3}s", secs(u)))
        ));
    }
}

/// The faults that can leave no trace of a pick made just before them, and
/// how long after each an early start may be excused by it.
fn faults(suite: &Suite) -> Vec<(i64, i64)> {
    let mut faults: Vec<(i64, i64)> = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| matches!(d.cause, Cause::Killed | Cause::Poison))
        .map(|d| (d.ns, ns(DEATH_WINDOW)))
        .collect();
    faults.extend(
        suite
            .seen
            .db_faults
            .iter()
            .map(|f| (f.begin, ns(DB_FAULT_WINDOW))),
    );
    faults
}

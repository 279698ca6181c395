//! The start checks of groups that run several jobs at once (group
//! concurrency N > 1): FIFO starts (a job starts only once every job ahead
//! of it in its group has started) and the hold-back of a job that failed
//! an attempt (from the commit of that failure until it is done, nothing
//! behind it starts).
//!
//! With N > 1 the runs of a group overlap, so the strict checks of N = 1
//! (each run starts after the previous one, in `seq` order) do not apply: a
//! job cut off by a crash runs again after later jobs started, and jobs
//! picked at about the same moment begin in either order. What counts is
//! when each job was *picked* (locked for its run), and no record says
//! exactly when: a start is known to lie between a lower bound (the start
//! of the transaction that picked it) and an upper bound (its attempt's
//! record, its handler's start). The checks report only what the bounds
//! make certain, beyond an allowed jitter.

use std::collections::{BTreeMap, HashMap};

/// When a job was picked, as far as the suite can tell: not before
/// `earliest`, and by `latest` (ns since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The job's id.
    pub job: i64,
    /// Its group (the suite's group number).
    pub grp: u32,
    /// Its place in the group (enqueue order).
    pub seq: u32,
    /// It was not picked before this.
    pub earliest: i64,
    /// It was picked by then.
    pub latest: i64,
}

/// A job that was certainly picked before an older job of its group was,
/// by more than the allowed jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Early {
    /// The job's first start.
    pub start: Span,
    /// The first start of the older job whose start was certainly latest.
    pub older: Span,
}

impl Early {
    /// How long before the older job's earliest start the job had started
    /// (ns).
    pub fn lead(&self) -> i64 {
        self.older.earliest - self.start.latest
    }
}

/// What [`early_starts`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Order {
    /// The jobs that started early by more than the jitter.
    pub early: Vec<Early>,
    /// The longest lead within the jitter (ns; `None` when nothing was
    /// compared): how close the run came to the allowance. Negative: every
    /// job was picked after the jobs ahead of it could have been, by at
    /// least that much.
    pub max_lead_within: Option<i64>,
    /// Jobs compared with the jobs ahead of them.
    pub compared: usize,
}

/// Checks FIFO starts on each job's first start (one [`Span`] per job):
/// no job was picked (by its `latest`) more than `jitter_ns` before an older
/// job of its group could have been (its `earliest`).
pub fn early_starts(firsts: &[Span], jitter_ns: i64) -> Order {
    let mut by_group: BTreeMap<u32, Vec<Span>> = BTreeMap::new();
    for s in firsts {
        by_group.entry(s.grp).or_default().push(*s);
    }
    let mut order = Order::default();
    for group in by_group.values_mut() {
        group.sort_by_key(|s| (s.seq, s.job));
        // The latest `earliest` among the jobs of smaller seq.
        let mut older: Option<Span> = None;
        let mut i = 0;
        while i < group.len() {
            let seq = group[i].seq;
            let same = group[i..].iter().take_while(|s| s.seq == seq).count();
            for s in &group[i..i + same] {
                let Some(o) = older else { continue };
                order.compared += 1;
                let e = Early {
                    start: *s,
                    older: o,
                };
                if e.lead() > jitter_ns {
                    order.early.push(e);
                } else {
                    order.max_lead_within = order.max_lead_within.max(Some(e.lead()));
                }
            }
            for s in &group[i..i + same] {
                if older.is_none_or(|o| s.earliest > o.earliest) {
                    older = Some(*s);
                }
            }
            i += same;
        }
    }
    order
}

/// A job that failed an attempt: from the commit of that failure (`from`)
/// until it finished (`until`; `None`: never), no job behind it may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The job's id.
    pub job: i64,
    /// Its group.
    pub grp: u32,
    /// Its place in the group.
    pub seq: u32,
    /// When its first failed attempt committed (ns since the epoch).
    pub from: i64,
    /// When it succeeded or failed for good (at the latest: the commit
    /// follows).
    pub until: Option<i64>,
}

/// Picks (one [`Span`] per pick) of jobs behind a held job that certainly
/// fell within its hold: after `from` (by more than `jitter_ns`), before
/// `until`.
pub fn started_while_held(holds: &[Hold], picks: &[Span], jitter_ns: i64) -> Vec<(Hold, Span)> {
    let mut by_group: HashMap<u32, Vec<&Span>> = HashMap::new();
    for s in picks {
        by_group.entry(s.grp).or_default().push(s);
    }
    let mut found = Vec::new();
    for h in holds {
        for s in by_group.get(&h.grp).into_iter().flatten() {
            if s.seq > h.seq
                && s.earliest > h.from + jitter_ns
                && h.until.is_none_or(|u| s.latest < u)
            {
                found.push((*h, **s));
            }
        }
    }
    found.sort_by_key(|(h, s)| (h.grp, h.seq, s.latest));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start known to the nanosecond.
    fn at(job: i64, seq: u32, ns: i64) -> Span {
        within(job, seq, ns, ns)
    }

    fn within(job: i64, seq: u32, earliest: i64, latest: i64) -> Span {
        Span {
            job,
            grp: 7,
            seq,
            earliest,
            latest,
        }
    }

    #[test]
    fn fifo_starts_allow_the_jitter_and_uncertain_bounds() {
        let firsts = [
            at(1, 0, 100),
            at(2, 1, 95), // 5 ns ahead of job 1: within a jitter of 10
            // Picked between 60 and 100: job 1 was picked at 100, job 2
            // at 95, so it may have been picked after both.
            within(3, 2, 60, 100),
            at(4, 3, 140),
        ];
        let order = early_starts(&firsts, 10);
        assert!(order.early.is_empty(), "{order:?}");
        assert_eq!(order.max_lead_within, Some(5));
        assert_eq!(order.compared, 3);
    }

    #[test]
    fn fifo_starts_catch_a_job_that_started_before_an_older_one() {
        let firsts = [
            at(1, 0, 100),
            within(2, 1, 280, 300),
            at(3, 2, 150), // picked by 150, job 2 not before 280
            at(4, 3, 310),
            Span {
                grp: 8, // another group: not compared with group 7
                ..at(5, 4, 0)
            },
        ];
        let order = early_starts(&firsts, 10);
        assert_eq!(order.early.len(), 1);
        let e = order.early[0];
        assert_eq!((e.start.job, e.older.job, e.lead()), (3, 2, 130));
    }

    #[test]
    fn nothing_behind_a_held_job_starts_during_its_hold() {
        let hold = Hold {
            job: 2,
            grp: 7,
            seq: 1,
            from: 1_000,
            until: Some(2_000),
        };
        let picks = [
            at(1, 0, 1_500),            // ahead of the held job: free to run
            at(2, 1, 1_400),            // the held job itself
            at(3, 2, 1_005),            // within the jitter after the hold began
            at(4, 3, 1_500),            // during the hold: caught
            within(6, 5, 990, 1_500),   // may have been picked before the hold
            within(7, 6, 1_500, 2_100), // may have been picked after it
            at(5, 4, 2_000),            // when it finished: fine
            at(3, 2, 900),              // before the hold
        ];
        let found = started_while_held(&[hold], &picks, 10);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1.job, 4);
        let open = Hold {
            until: None,
            ..hold
        };
        let jobs: Vec<i64> = started_while_held(&[open], &picks, 10)
            .iter()
            .map(|(_, s)| s.job)
            .collect();
        assert_eq!(jobs, vec![4, 5, 7]);
    }
}

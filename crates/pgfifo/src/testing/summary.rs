//! What a drain ran, and the order-aware checks on it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::runner::{JobEvent, JobOutcome};
use crate::JobId;

/// What a [`Drain`](super::Drain) ran: every attempt in the order it ran,
/// counts per outcome, and what it left queued.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DrainSummary {
    /// Every attempt, in the order the drain ran them, with its committed
    /// outcome (never [`JobOutcome::Aborted`]).
    pub runs: Vec<JobEvent>,
    /// Attempts that succeeded.
    pub succeeded: usize,
    /// Attempts that failed and will be retried (attempts were left).
    pub retried: usize,
    /// Jobs that failed for good.
    pub failed: usize,
    /// Jobs their handlers cancelled.
    pub cancelled: usize,
    /// Attempts whose handlers snoozed their groups (they do not count as
    /// attempts).
    pub snoozed: usize,
    /// Queued jobs of the drained queue (or group) left when it stopped:
    /// waiting for a later time, held behind such a job, enqueued during a
    /// drain without recursion, or in a held or paused group.
    pub left_queued: usize,
    /// Of [`left_queued`](Self::left_queued), those whose own time is
    /// still to come (delayed, retrying, snoozed).
    pub left_scheduled: usize,
    /// The drain stopped because a group's rate limit refused a start
    /// (nothing was recorded for it; the job is still queued).
    pub throttled: bool,
}

impl DrainSummary {
    pub(crate) fn record(&mut self, event: JobEvent) {
        match &event.outcome {
            JobOutcome::Succeeded => self.succeeded += 1,
            JobOutcome::Retrying { .. } => self.retried += 1,
            JobOutcome::Failed { .. } => self.failed += 1,
            JobOutcome::Cancelled { .. } => self.cancelled += 1,
            JobOutcome::Snoozed { .. } => self.snoozed += 1,
            _ => {}
        }
        self.runs.push(event);
    }

    /// The ids of group `group`'s jobs in the order their attempts ran (a
    /// retried or snoozed job appears once per attempt).
    pub fn order(&self, group: &str) -> Vec<JobId> {
        self.runs_of(Some(group)).map(|e| e.id).collect()
    }

    /// The kinds of group `group`'s attempts, in the order they ran.
    pub fn kinds<'s>(&'s self, group: &str) -> Vec<&'s str> {
        self.runs
            .iter()
            .filter(|e| e.group.as_deref() == Some(group))
            .map(|e| e.kind.as_str())
            .collect()
    }

    /// Every group's job ids in the order their attempts ran, by group
    /// (ungrouped jobs under `None`).
    pub fn by_group(&self) -> BTreeMap<Option<String>, Vec<JobId>> {
        let mut groups: BTreeMap<Option<String>, Vec<JobId>> = BTreeMap::new();
        for event in &self.runs {
            groups
                .entry(event.group.clone())
                .or_default()
                .push(event.id);
        }
        groups
    }

    fn runs_of<'s>(&'s self, group: Option<&'s str>) -> impl Iterator<Item = &'s JobEvent> + 's {
        self.runs
            .iter()
            .filter(move |e| e.group.as_deref() == group)
    }

    /// Checks that every group's jobs ran in enqueue order (job ids only
    /// ever grow within a group: a job's attempts come before any later
    /// job's) and one at a time (a job's attempts are not interleaved with
    /// another job of its group: the next job started only once the
    /// previous one was final). `Err` says which group broke it and how.
    pub fn check_fifo(&self) -> Result<(), String> {
        for (group, ids) in self.by_group() {
            let Some(group) = group else { continue };
            let mut finished: Vec<JobId> = Vec::new();
            let mut current: Option<JobId> = None;
            for &id in &ids {
                if current == Some(id) {
                    continue;
                }
                if finished.contains(&id) {
                    return Err(format!(
                        "group {group:?}: job {id} ran again after a later job of its group \
                         (the order was {ids:?})"
                    ));
                }
                if let Some(previous) = current {
                    if id < previous {
                        return Err(format!(
                            "group {group:?}: job {id} ran after job {previous}, which was \
                             enqueued after it (the order was {ids:?})"
                        ));
                    }
                    finished.push(previous);
                }
                current = Some(id);
            }
        }
        Ok(())
    }

    /// Asserts [`check_fifo`](Self::check_fifo).
    ///
    /// # Panics
    ///
    /// When a group's jobs ran out of order or interleaved, with what ran.
    #[track_caller]
    pub fn assert_fifo(&self) {
        if let Err(problem) = self.check_fifo() {
            panic!("{problem}; the drain ran: {}", self.describe());
        }
    }

    /// Every attempt as `#id kind (group) attempt n: outcome`, one per line.
    pub fn describe(&self) -> String {
        if self.runs.is_empty() {
            return "nothing".to_owned();
        }
        let mut out = String::new();
        for e in &self.runs {
            let group = e.group.as_deref().unwrap_or("ungrouped");
            let outcome = match &e.outcome {
                JobOutcome::Succeeded => "succeeded".to_owned(),
                JobOutcome::Retrying { error, .. } => format!("retrying ({error})"),
                JobOutcome::Failed { error } => format!("failed ({error})"),
                JobOutcome::Cancelled { reason } => format!("cancelled ({reason})"),
                JobOutcome::Snoozed { reason, .. } => format!("snoozed ({reason})"),
                other => format!("{other:?}"),
            };
            let _ = write!(
                out,
                "\n  #{} {} ({group}) attempt {}: {outcome}",
                e.id, e.kind, e.attempt
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(id: JobId, group: &str) -> JobEvent {
        JobEvent {
            id,
            kind: "k".into(),
            queue: "q".into(),
            group: Some(group.into()),
            attempt: 1,
            outcome: JobOutcome::Succeeded,
        }
    }

    fn summary(runs: &[(JobId, &str)]) -> DrainSummary {
        let mut s = DrainSummary::default();
        for &(id, g) in runs {
            s.record(ran(id, g));
        }
        s
    }

    #[test]
    fn retries_in_place_and_other_groups_between_are_fifo() {
        let s = summary(&[(1, "a"), (2, "b"), (1, "a"), (3, "a"), (4, "b")]);
        assert_eq!(s.check_fifo(), Ok(()));
        assert_eq!(s.order("a"), vec![1, 1, 3]);
        assert_eq!(s.succeeded, 5);
    }

    #[test]
    fn a_later_job_first_or_an_interleaving_is_caught() {
        let backwards = summary(&[(3, "a"), (1, "a")]);
        assert!(backwards
            .check_fifo()
            .unwrap_err()
            .contains("job 1 ran after job 3"));
        let interleaved = summary(&[(1, "a"), (3, "a"), (1, "a")]);
        assert!(interleaved.check_fifo().unwrap_err().contains("ran again"));
    }
}

//! Dependencies between jobs: a job that waits until other jobs, or
//! batches, have succeeded ([`EnqueueOptions::depends_on`],
//! [`EnqueueOptions::after_batch`]), and what it does when one of them fails
//! for good ([`DependencyFailure`]). See `docs/batches.md`, "Dependencies".
//!
//! [`EnqueueOptions::depends_on`]: crate::EnqueueOptions::depends_on
//! [`EnqueueOptions::after_batch`]: crate::EnqueueOptions::after_batch

use std::fmt;

use serde::Serialize;

use crate::{BatchId, JobId};

/// What a waiting job does when one of its dependencies fails for good, is
/// cancelled or is skipped (a batch: completes without every job
/// succeeding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyFailure {
    /// The dependent is cancelled, with `last_error` naming the dependency,
    /// and so are its own dependents that cancel in turn; its group moves on.
    /// The default, as in Oban and Hatchet: work downstream of a failure does
    /// not run on its own, and the group is not held by it (as with the
    /// failure policy `continue`).
    #[default]
    Cancel,
    /// The dependent keeps waiting, and keeps holding its group: an
    /// operator retries the failed dependency (when it then succeeds, the
    /// dependent runs) or cancels the dependent.
    Hold,
    /// The failed dependency counts as done: the dependent runs when the
    /// others are done.
    Run,
}

impl DependencyFailure {
    /// The name the SQL functions take (`pgfifo.enqueue_after`).
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyFailure::Cancel => "cancel",
            DependencyFailure::Hold => "hold",
            DependencyFailure::Run => "run",
        }
    }
}

/// One dependency of a job: a job or a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dependency {
    /// A job, by id: done when it succeeded.
    Job(JobId),
    /// A batch, by id: done when it is closed and every job of it succeeded.
    Batch(BatchId),
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dependency::Job(id) => write!(f, "job {id}"),
            Dependency::Batch(id) => write!(f, "batch {id}"),
        }
    }
}

impl Dependency {
    /// Parses what [`Display`](fmt::Display) writes (`job 17`, `batch 5`),
    /// as the database's errors carry it.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (what, id) = text.split_once(' ')?;
        let id = id.parse().ok()?;
        match what {
            "job" => Some(Dependency::Job(id)),
            "batch" => Some(Dependency::Batch(id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dependency;

    #[test]
    fn a_dependency_reads_back_what_it_writes() {
        for d in [Dependency::Job(17), Dependency::Batch(5)] {
            assert_eq!(Dependency::parse(&d.to_string()), Some(d));
        }
        assert_eq!(Dependency::parse("row 3"), None);
    }
}

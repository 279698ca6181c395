//! What a runner tells observers: one [`JobEvent`] per attempt whose outcome
//! committed (see [`RunnerHandle::subscribe`](super::RunnerHandle::subscribe)).

use std::time::Duration;

use tokio::sync::broadcast;

use crate::JobId;

/// What happened to a job run, as broadcast by
/// [`RunnerHandle::subscribe`](super::RunnerHandle::subscribe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEvent {
    /// The job's id.
    pub id: JobId,
    /// The job's kind (its type's stored name, [`Job::KIND`](crate::Job::KIND)).
    pub kind: String,
    /// The queue.
    pub queue: String,
    /// The group, `None` for ungrouped jobs.
    pub group: Option<String>,
    /// The attempt number (from 1).
    pub attempt: u32,
    /// What the attempt came to.
    pub outcome: JobOutcome,
}

/// What one attempt led to: an outcome, once committed, or a run that
/// shutdown aborted. A run cut short by a lost connection sends no event
/// (the job runs again; the `pgfifo_jobs_aborted_total` metric counts it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobOutcome {
    /// The handler succeeded and the job is done.
    Succeeded,
    /// The attempt failed; the job runs again after a delay, still its
    /// group's head.
    Retrying {
        /// The error.
        error: String,
        /// The delay before the next attempt.
        delay: Duration,
    },
    /// The job failed for good (permanent error, attempts used up, unknown
    /// type, bad payload). It is kept with its error.
    Failed {
        /// The error.
        error: String,
    },
    /// The handler cancelled the job.
    Cancelled {
        /// The reason.
        reason: String,
    },
    /// The handler snoozed the job's group ([`JobError::snooze`](crate::JobError::snooze)):
    /// the job runs again after the delay, still its group's head, and the
    /// attempt does not count.
    Snoozed {
        /// The handler's reason.
        reason: String,
        /// How long the group sleeps.
        delay: Duration,
    },
    /// Shutdown aborted the run before an outcome could be written; the job
    /// runs again later, and the attempt does not count.
    Aborted {
        /// Why.
        reason: String,
    },
}

/// The sending side of a runner's events.
#[derive(Debug, Clone)]
pub(crate) struct Events(broadcast::Sender<JobEvent>);

impl Events {
    /// Events are kept for slow receivers up to this many; beyond, a
    /// receiver misses the oldest.
    const KEPT: usize = 4096;

    pub(crate) fn new() -> Self {
        Events(broadcast::channel(Self::KEPT).0)
    }

    /// Broadcasts `event` (nobody listening is fine).
    pub(crate) fn send(&self, event: JobEvent) {
        let _ = self.0.send(event);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.0.subscribe()
    }
}

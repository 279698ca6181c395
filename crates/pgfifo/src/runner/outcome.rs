//! What an attempt comes to. A handler says one of five things (success,
//! retry, fail for good, cancel, snooze: [`JobError`]'s kinds); a job that cannot run
//! at all fails for good. [`Done`] holds the decided [`JobOutcome`] until it
//! commits, and is the one place that turns it into what `pgfifo.complete`
//! writes, and into the event broadcast afterwards.

use std::time::Duration;

use super::events::{JobEvent, JobOutcome};
use super::jitter::random_fraction;
use super::metrics::Run;
use crate::db::runner::{Completed, Completion, PickedJob};
use crate::{FailureKind, JobError};

/// The longest delay `JobError::retry_after` may ask for (a year): longer
/// ones are cut to it rather than overflow the database's interval type.
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a job waits before its next attempt: its type's base delay,
/// doubled per attempt up to `max` (with jitter), unless the handler asked
/// for a delay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Exponential from the base delay, capped, with jitter (half fixed,
    /// half random) so retries of many jobs spread out.
    fn after(&self, attempt: i32) -> Duration {
        let exponent = (attempt.max(1) - 1).min(30) as u32;
        let full = self.base.saturating_mul(1u32 << exponent).min(self.max);
        full / 2 + full.mul_f64(random_fraction() / 2.0)
    }
}

/// A job whose attempt's outcome is decided: written by `pgfifo.complete`
/// at the end of its pick's run, then committed.
pub(crate) struct Done {
    pub job: PickedJob,
    pub attempt: i32,
    /// Never [`JobOutcome::Aborted`]: an aborted run has no outcome to write.
    pub outcome: JobOutcome,
    /// What a successful handler stored with the job.
    pub result: Option<serde_json::Value>,
    /// The handler used the job's connection (and succeeded): its deferred
    /// constraints are checked before the outcome is written.
    pub wrote: bool,
    /// The handler's run, if it ran: counted as running until the commit,
    /// and as aborted if the commit fails.
    pub run: Option<Run>,
}

impl Done {
    /// A success, with the handler's result.
    pub fn succeeded(job: PickedJob, attempt: i32, result: Option<serde_json::Value>) -> Self {
        Self {
            job,
            attempt,
            outcome: JobOutcome::Succeeded,
            result,
            wrote: false,
            run: None,
        }
    }

    /// A job that cannot run at all (unknown type, no attempts left): failed
    /// for good.
    pub fn failed(job: PickedJob, attempt: i32, error: String) -> Self {
        Self {
            outcome: JobOutcome::Failed { error },
            ..Self::succeeded(job, attempt, None)
        }
    }

    /// A failed attempt: retried while attempts are left (unless the failure
    /// says otherwise), else failed for good; or cancelled.
    pub fn failure(job: PickedJob, attempt: i32, failure: JobError, backoff: Backoff) -> Self {
        let message = failure.to_string();
        let outcome = match failure.kind() {
            FailureKind::Retry { after } if attempt < job.max_attempts => JobOutcome::Retrying {
                error: message,
                delay: after.map_or_else(
                    || backoff.after(attempt),
                    |delay| delay.min(LONGEST_RETRY_DELAY),
                ),
            },
            FailureKind::Retry { .. } => JobOutcome::Failed {
                error: format!(
                    "{message} (attempt {attempt} of {}, no attempts left)",
                    job.max_attempts
                ),
            },
            FailureKind::Cancel => JobOutcome::Cancelled { reason: message },
            FailureKind::Snooze { duration } => JobOutcome::Snoozed {
                reason: message,
                delay: duration.min(LONGEST_RETRY_DELAY),
            },
            _ => JobOutcome::Failed { error: message },
        };
        Self {
            outcome,
            ..Self::succeeded(job, attempt, None)
        }
    }

    /// The arguments of `pgfifo.complete` for this job.
    pub fn completion(&self) -> Completion<'_> {
        let (state, error, retry_delay) = match &self.outcome {
            JobOutcome::Succeeded => (Completed::Succeeded, None, None),
            JobOutcome::Retrying { error, delay } => (Completed::Retry, Some(error), Some(*delay)),
            JobOutcome::Failed { error } => (Completed::Failed, Some(error), None),
            JobOutcome::Cancelled { reason } => (Completed::Cancelled, Some(reason), None),
            // The reason is logged and broadcast, not stored: the attempt is
            // forgotten.
            JobOutcome::Snoozed { delay, .. } => (Completed::Snoozed, None, Some(*delay)),
            JobOutcome::Aborted { .. } => unreachable!("an aborted run has no outcome to write"),
        };
        Completion {
            job: &self.job,
            attempt: self.attempt,
            state,
            error: error.map(String::as_str),
            result: self.result.as_ref(),
            retry_delay_us: retry_delay.map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        }
    }

    /// Logs the outcome (in the job's span, where the caller has one).
    pub fn log(&self) {
        match &self.outcome {
            JobOutcome::Succeeded => tracing::debug!("job succeeded"),
            JobOutcome::Retrying { error, delay } => {
                let retry_in_ms = delay.as_millis() as u64;
                tracing::warn!(error, retry_in_ms, "job failed; will retry");
            }
            JobOutcome::Failed { error } => {
                tracing::error!(error, "job failed for good; kept as failed")
            }
            JobOutcome::Cancelled { reason } => {
                tracing::info!(reason, "job cancelled by its handler")
            }
            JobOutcome::Snoozed { reason, delay } => {
                let snooze_ms = delay.as_millis() as u64;
                tracing::info!(reason, snooze_ms, "job snoozed its group");
            }
            JobOutcome::Aborted { reason } => tracing::warn!(reason, "job aborted"),
        }
    }

    /// The event to broadcast once the outcome is committed.
    pub fn event(&self) -> JobEvent {
        event(&self.job, self.attempt, self.outcome.clone())
    }
}

/// The event of an attempt of `job`.
pub(crate) fn event(job: &PickedJob, attempt: i32, outcome: JobOutcome) -> JobEvent {
    JobEvent {
        id: job.id,
        kind: job.kind.clone(),
        queue: job.queue.clone(),
        group: job.group_id.clone(),
        attempt: attempt as u32,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(max_attempts: i32) -> PickedJob {
        PickedJob {
            id: 7,
            queue: "q".into(),
            group_id: Some("g".into()),
            kind: "k".into(),
            payload: serde_json::Value::Null,
            max_attempts,
            sweep_slot: Some(1),
            backend_pid: 1,
            under_queue_slot: false,
            batch_id: None,
            shard_parts: None,
            trace: None,
        }
    }

    const BACKOFF: Backoff = Backoff {
        base: Duration::from_secs(2),
        max: Duration::from_secs(60),
    };

    #[test]
    fn a_retry_waits_its_backoff_until_attempts_run_out() {
        let done = Done::failure(job(3), 2, JobError::retry("boom"), BACKOFF);
        match &done.outcome {
            JobOutcome::Retrying { error, delay } => {
                assert_eq!(error, "boom");
                // 2 s doubled once, half of it jittered.
                assert!(*delay >= Duration::from_secs(2) && *delay <= Duration::from_secs(4));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(done.completion().state, Completed::Retry);
        let last = Done::failure(job(3), 3, JobError::retry("boom"), BACKOFF);
        assert_eq!(
            last.outcome,
            JobOutcome::Failed {
                error: "boom (attempt 3 of 3, no attempts left)".into()
            }
        );
    }

    #[test]
    fn a_handler_can_ask_for_its_delay_permanence_or_cancel() {
        let asked = JobError::retry_after(Duration::from_secs(9), "later");
        assert_eq!(
            Done::failure(job(5), 1, asked, BACKOFF).outcome,
            JobOutcome::Retrying {
                error: "later".into(),
                delay: Duration::from_secs(9)
            }
        );
        let far = JobError::retry_after(Duration::MAX, "much later");
        let capped = Done::failure(job(5), 1, far, BACKOFF)
            .completion()
            .retry_delay_us;
        assert_eq!(capped, Some(LONGEST_RETRY_DELAY.as_micros() as i64));
        let permanent = Done::failure(job(5), 1, JobError::permanent("no"), BACKOFF);
        assert_eq!(permanent.completion().state, Completed::Failed);
        let cancelled = Done::failure(job(5), 1, JobError::cancel("stop"), BACKOFF);
        assert_eq!(
            cancelled.outcome,
            JobOutcome::Cancelled {
                reason: "stop".into()
            }
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        for attempt in 1..40 {
            let delay = BACKOFF.after(attempt);
            let exponent = (attempt - 1).min(30) as u32;
            let full = BACKOFF.base.saturating_mul(1 << exponent).min(BACKOFF.max);
            assert!(
                delay >= full / 2 && delay <= full,
                "attempt {attempt}: {delay:?}"
            );
        }
    }
}

//! What an attempt came to: the outcome a finished handler (or a job that
//! could not run) leads to, its message, its retry delay, and the event
//! broadcast once it is committed.

use std::time::Duration;

use super::metrics::Run;
use super::worker::random_fraction;
use super::{JobEvent, JobOutcome, Shared};
use crate::db::sql::{Completion, Outcome, PickedJob};
use crate::job::FailureKind;
use crate::registry::Registration;

/// The longest delay `JobError::retry_after` may ask for (a year): longer
/// ones are cut to it rather than overflow the database's interval type.
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A job whose outcome is decided: written by `pgfifo.complete` at the end of
/// its pick's run, then committed.
pub(super) struct Done {
    pub job: PickedJob,
    pub attempt: i32,
    pub outcome: Outcome,
    pub error: Option<String>,
    pub result: Option<serde_json::Value>,
    pub delay: Option<Duration>,
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
            outcome: Outcome::Succeeded,
            error: None,
            result,
            delay: None,
            wrote: false,
            run: None,
        }
    }

    /// A failure of the job itself, before or without its handler (unknown
    /// type, no attempts left): failed for good.
    pub fn failed(job: PickedJob, attempt: i32, error: String) -> Self {
        Self {
            outcome: Outcome::Failed,
            error: Some(error),
            ..Self::succeeded(job, attempt, None)
        }
    }

    /// A failed attempt: retried while attempts are left (unless the failure
    /// says otherwise), else failed for good.
    pub fn failure(
        shared: &Shared,
        registration: &Registration,
        job: PickedJob,
        attempt: i32,
        failure: FailureText,
    ) -> Self {
        let (outcome, delay) = match failure.kind {
            FailureKind::Retry { after } if attempt < job.max_attempts => (
                Outcome::Retry,
                Some(
                    after
                        .map(|delay| delay.min(LONGEST_RETRY_DELAY))
                        .unwrap_or_else(|| backoff(shared, registration, attempt)),
                ),
            ),
            FailureKind::Cancel => (Outcome::Cancelled, None),
            _ => (Outcome::Failed, None),
        };
        let message =
            if outcome == Outcome::Failed && matches!(failure.kind, FailureKind::Retry { .. }) {
                format!(
                    "{} (attempt {attempt} of {}, no attempts left)",
                    failure.message, job.max_attempts
                )
            } else {
                failure.message
            };
        Self {
            outcome,
            error: Some(message),
            delay,
            ..Self::succeeded(job, attempt, None)
        }
    }

    /// The arguments of `pgfifo.complete` for this job.
    pub fn completion(&self) -> Completion<'_> {
        Completion {
            job: &self.job,
            attempt: self.attempt,
            outcome: self.outcome,
            error: self.error.as_deref(),
            result: self.result.as_ref(),
            retry_delay_us: self
                .delay
                .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)),
        }
    }

    /// Logs the outcome (in the job's span, where the caller has one).
    pub fn log(&self) {
        let error = self.error.as_deref().unwrap_or_default();
        match self.outcome {
            Outcome::Succeeded => tracing::debug!("job succeeded"),
            Outcome::Retry => {
                let retry_in_ms = self.delay.unwrap_or_default().as_millis() as u64;
                tracing::warn!(error, retry_in_ms, "job failed; will retry");
            }
            Outcome::Failed => tracing::error!(error, "job failed for good; kept as failed"),
            Outcome::Cancelled => tracing::info!(reason = error, "job cancelled by its handler"),
        }
    }

    /// The event to broadcast once the outcome is committed.
    pub fn event(&self) -> JobEvent {
        let error = self.error.clone().unwrap_or_default();
        let outcome = match self.outcome {
            Outcome::Succeeded => JobOutcome::Succeeded,
            Outcome::Retry => JobOutcome::Retrying {
                error,
                delay: self.delay.unwrap_or_default(),
            },
            Outcome::Failed => JobOutcome::Failed { error },
            Outcome::Cancelled => JobOutcome::Cancelled { reason: error },
        };
        event(&self.job, self.attempt, outcome)
    }
}

/// A failure's message and what to do about it.
pub(super) struct FailureText {
    pub kind: FailureKind,
    pub message: String,
}

impl FailureText {
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            kind: FailureKind::Retry { after: None },
            message: message.into(),
        }
    }

    pub fn permanent(message: String) -> Self {
        Self {
            kind: FailureKind::Permanent,
            message,
        }
    }

    pub fn from_job_error(err: crate::JobError) -> Self {
        Self {
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// The event of an attempt of `job`.
pub(super) fn event(job: &PickedJob, attempt: i32, outcome: JobOutcome) -> JobEvent {
    JobEvent {
        id: job.id,
        kind: job.kind.clone(),
        queue: job.queue.clone(),
        group: job.group_id.clone(),
        attempt: attempt as u32,
        outcome,
    }
}

/// Exponential backoff from the type's base delay, capped, with jitter (half
/// fixed, half random) so retries of many jobs spread out.
fn backoff(shared: &Shared, registration: &Registration, attempt: i32) -> Duration {
    let exponent = (attempt.max(1) - 1).min(30) as u32;
    let full = registration
        .backoff
        .saturating_mul(1u32 << exponent)
        .min(shared.config.max_backoff);
    full / 2 + full.mul_f64(random_fraction() / 2.0)
}

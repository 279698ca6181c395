//! What a handler can report when it does not succeed: retry (later), fail
//! for good, cancel, or snooze its group.

use std::error::Error as StdError;
use std::fmt;
use std::time::{Duration, SystemTime};

/// How a failed run should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Retry after backoff (or after the given delay), until `max_attempts`.
    Retry {
        /// Wait this long instead of the computed backoff.
        after: Option<Duration>,
    },
    /// Mark the job failed now, whatever attempts remain.
    Permanent,
    /// Stop the job: it is marked `cancelled` and its group goes on.
    Cancel,
    /// Put the job back at the head of its group and start nothing of the
    /// group for this long; the attempt does not count.
    Snooze {
        /// How long the group sleeps.
        duration: Duration,
    },
}

/// A handler's failure: an error message plus what to do about it.
///
/// Any `std::error::Error` converts into a retryable `JobError` with `?`:
///
/// ```
/// # use pgfifo::JobError;
/// fn parse(s: &str) -> Result<i64, JobError> {
///     Ok(s.parse::<i64>()?) // a ParseIntError becomes a retryable failure
/// }
/// assert!(parse("x").is_err());
/// ```
pub struct JobError {
    kind: FailureKind,
    source: Box<dyn StdError + Send + Sync + 'static>,
}

impl JobError {
    /// A failure to retry after the usual backoff.
    pub fn retry(err: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            kind: FailureKind::Retry { after: None },
            source: err.into(),
        }
    }

    /// A failure to retry after `delay` (at most a year) instead of the
    /// computed backoff. The attempt still counts towards `max_attempts`.
    pub fn retry_after(
        delay: Duration,
        err: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            kind: FailureKind::Retry { after: Some(delay) },
            source: err.into(),
        }
    }

    /// A failure that retrying cannot fix: the job is marked failed now.
    pub fn permanent(err: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            kind: FailureKind::Permanent,
            source: err.into(),
        }
    }

    /// Cancels the job: it is marked `cancelled` with this reason and its
    /// group goes on.
    pub fn cancel(reason: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            kind: FailureKind::Cancel,
            source: reason.into(),
        }
    }

    /// Snoozes the job's group for `duration` (at most a year): the job goes
    /// back to the head of its group, its attempt does not count towards
    /// `max_attempts`, and no job of the group starts until the time has
    /// passed. Status shows the group as "snoozed until T, by job J". An
    /// ungrouped job is snoozed alone.
    ///
    /// For a handler that learns the group cannot make progress for a
    /// while: the tenant's upstream is throttled, its account is being
    /// migrated. What the handler wrote through the job's connection is
    /// discarded, as for a failure.
    ///
    /// ```
    /// # use pgfifo::JobError;
    /// # use std::time::Duration;
    /// fn throttled(retry_after_secs: u64) -> JobError {
    ///     JobError::snooze(Duration::from_secs(retry_after_secs), "upstream throttled the tenant")
    /// }
    /// # let _ = throttled(30);
    /// ```
    pub fn snooze(
        duration: Duration,
        reason: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            kind: FailureKind::Snooze { duration },
            source: reason.into(),
        }
    }

    /// Snoozes the job's group until `until`, read on this process's clock
    /// now (an instant that has passed snoozes for no time). See
    /// [`snooze`](Self::snooze).
    pub fn snooze_until(
        until: SystemTime,
        reason: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        let duration = until
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        Self::snooze(duration, reason)
    }

    /// What the runner does with this failure.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The underlying error.
    pub fn source_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }
}

impl<E> From<E> for JobError
where
    E: Into<Box<dyn StdError + Send + Sync + 'static>>,
{
    fn from(err: E) -> Self {
        Self::retry(err)
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)?;
        let mut cause = self.source.source();
        while let Some(err) = cause {
            write!(f, ": {err}")?;
            cause = err.source();
        }
        Ok(())
    }
}

//! The traits a job type implements, the context a handler receives, and the
//! outcomes a handler can report.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::enqueue::{EnqueueOptions, NewJob};
use crate::JobId;

/// A job type: a serde payload with its static settings.
///
/// Implement it with `#[derive(Job)]`, which also registers the type so that
/// [`runner::start`](crate::runner::start) finds its [`Handler`]. The
/// constants are the defaults of every job of this type; some can be
/// overridden per job with [`EnqueueOptions`].
///
/// ```
/// use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(queue = "billing", max_attempts = 5, timeout = "30s", backoff = "2s")]
/// struct ChargeInvoice {
///     invoice_id: i64,
/// }
///
/// #[async_trait]
/// impl Handler for ChargeInvoice {
///     async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
///         Ok(())
///     }
/// }
///
/// assert_eq!(ChargeInvoice::QUEUE, "billing");
/// assert_eq!(ChargeInvoice::MAX_ATTEMPTS, 5);
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The name stored with each job and used to find its handler. Defaults to
    /// the type's name; set `#[job(name = "...")]` to keep stored jobs runnable
    /// across a rename.
    const NAME: &'static str;
    /// The queue jobs of this type go to (default `"default"`).
    const QUEUE: &'static str;
    /// How many times a job may start before it is marked failed (default 5).
    const MAX_ATTEMPTS: u32;
    /// How long one run may take before it is cancelled and counted as a
    /// failed attempt; `None` uses [`RunnerConfig::default_timeout`](crate::RunnerConfig::default_timeout).
    const TIMEOUT: Option<Duration>;
    /// The first retry delay. Later retries double it (with jitter) up to
    /// [`RunnerConfig::max_backoff`](crate::RunnerConfig::max_backoff).
    const BACKOFF: Duration;
    /// Default priority: among groups whose head is ready, higher priorities
    /// start first. It never reorders jobs inside a group.
    const PRIORITY: i16;

    /// Enqueues this job in group `group` (a tenant, an account, a device…).
    ///
    /// Jobs of one group run one at a time, in enqueue order. Run this inside
    /// the application's own transaction to make the job appear only if that
    /// transaction commits.
    fn enqueue<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        group: &'a str,
    ) -> futures_util::future::BoxFuture<'a, crate::Result<JobId>> {
        Box::pin(async move { self.enqueue_with(conn, EnqueueOptions::group(group)).await })
    }

    /// Enqueues this job with explicit options (group or none, delay,
    /// priority, unique key, max attempts).
    fn enqueue_with<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        options: EnqueueOptions,
    ) -> futures_util::future::BoxFuture<'a, crate::Result<JobId>> {
        Box::pin(async move {
            let job = NewJob::new(self, options)?;
            let ids = crate::enqueue::enqueue_batch(conn, [job]).await?;
            Ok(ids[0])
        })
    }
}

/// What a job does when it runs.
///
/// The handler runs inside the job's transaction: writes made through
/// [`JobContext::conn`] commit together with the job's success, or are rolled
/// back when the handler fails.
#[async_trait::async_trait]
pub trait Handler: Job {
    /// Runs the job once. Return `Ok(())` on success, or a [`JobError`] saying
    /// whether to retry. Any error converts into a retryable `JobError` with `?`.
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError>;
}

/// What a running handler knows about its job, and its transaction connection.
pub struct JobContext<'a> {
    pub(crate) id: JobId,
    pub(crate) queue: &'a str,
    pub(crate) group: Option<&'a str>,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) conn: &'a mut AsyncPgConnection,
    /// Whether the handler took `conn` (see the runner's batching).
    pub(crate) used_conn: bool,
    pub(crate) result: Option<serde_json::Value>,
}

impl<'a> JobContext<'a> {
    /// The job's id.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// The queue the job is in.
    pub fn queue(&self) -> &str {
        self.queue
    }

    /// The job's group, or `None` for an ungrouped job.
    pub fn group(&self) -> Option<&str> {
        self.group
    }

    /// Which attempt this is, starting at 1. Attempts interrupted by a crash
    /// count too.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The most attempts this job may have.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The connection of the job's own transaction. What is written through it
    /// commits atomically with the job's success; a failing handler's writes
    /// are rolled back. Nested `transaction` calls become savepoints. Do not
    /// issue `COMMIT` or `ROLLBACK` on it yourself.
    ///
    /// Taking the connection also tells the runner that this job's writes
    /// are in the transaction: it then commits the job on its own instead of
    /// together with other short jobs (see `RunnerConfig::max_batch`).
    pub fn conn(&mut self) -> &mut AsyncPgConnection {
        self.used_conn = true;
        self.conn
    }

    /// Stores a JSON result with the job when it succeeds (kept in the job's
    /// `result` column for inspection).
    pub fn set_result<T: Serialize>(&mut self, value: &T) -> Result<(), JobError> {
        self.result = Some(serde_json::to_value(value).map_err(JobError::permanent)?);
        Ok(())
    }
}

impl fmt::Debug for JobContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("id", &self.id)
            .field("queue", &self.queue)
            .field("group", &self.group)
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

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

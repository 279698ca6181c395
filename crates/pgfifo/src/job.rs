//! A job type: its payload, its settings, and how it is enqueued.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::enqueue::{EnqueueOptions, KindDefaults, NewJob};
use crate::registry::Registry;
use crate::{Error, JobId, Result};

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
    /// The job's kind: stored with each job (the `kind` column), used to
    /// find its handler, and the `kind` label of the metrics. Defaults to the
    /// type's name; set `#[job(kind = "...")]` to keep stored jobs runnable
    /// across a rename of the type.
    const KIND: &'static str;
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
    /// Whether jobs of this type run in **long mode** (`#[job(long)]`;
    /// default `false`), for handlers that run for minutes or hours.
    ///
    /// In the default mode a job runs inside a database transaction that
    /// holds its group's lock; an open transaction holds back VACUUM's
    /// horizon for the whole server, so one job that runs for an hour leaves
    /// every table's dead rows in place for that hour. In long mode the
    /// group is held without an open transaction: the job's claim is
    /// committed with the id of the runner that holds it, the runner's
    /// connection keeps a session-level advisory lock (no transaction id,
    /// released the moment the session ends, so a crashed worker's job
    /// runs again at once), and the outcome is written by a short
    /// transaction that succeeds only if the claim is still this run's.
    ///
    /// **What long mode gives up: atomic completion.** [`JobContext::conn`](crate::JobContext::conn)
    /// is then a connection in autocommit, and each statement the handler
    /// sends commits on its own, whatever the job's outcome. A run that
    /// fails, times out or dies halfway keeps what it wrote so far, and the
    /// job runs again from the start. Write such handlers to be idempotent:
    /// key what they write by the job id ([`JobContext::id`](crate::JobContext::id))
    /// and upsert (`INSERT ... ON CONFLICT (job_id) DO UPDATE`), or record
    /// each finished step in a row of your own and skip the steps recorded
    /// on a rerun; group writes that must stand or fall together in a
    /// transaction of the handler's own (`conn.transaction(...)`).
    ///
    /// Long mode needs a group: an ungrouped job of a long type runs in the
    /// default mode. A long job holds its whole group, whatever the group's
    /// concurrency. A worker that freezes holds its group until its lease
    /// ([`RunnerConfig::long_lease`](crate::RunnerConfig::long_lease))
    /// passes; see `docs/failure-model.md`.
    const LONG: bool = false;

    /// Enqueues this job in group `group` (a tenant, an account, a device…).
    ///
    /// Jobs of one group run one at a time, in enqueue order. Run this inside
    /// the application's own transaction (opened through diesel,
    /// `conn.transaction(…)`; see [`enqueue_batch`](crate::enqueue_batch)) to
    /// make the job appear only if that transaction commits.
    fn enqueue<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        group: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<JobId>> {
        Box::pin(async move { self.enqueue_with(conn, EnqueueOptions::group(group)).await })
    }

    /// Enqueues this job with explicit options (group or none, delay,
    /// priority, unique key, max attempts).
    fn enqueue_with<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        options: EnqueueOptions,
    ) -> futures_util::future::BoxFuture<'a, Result<JobId>> {
        Box::pin(async move {
            let job = NewJob::new(self, options)?;
            let ids = crate::enqueue_batch(conn, [job]).await?;
            Ok(ids[0])
        })
    }
}

/// Fails unless `J` is registered in this binary under its kind.
pub(crate) fn check_registered<J: Job>() -> Result<()> {
    registration_of::<J>().map(|_| ())
}

/// Fails, as enqueueing a `J` with `options` would, when an option is out
/// of range.
pub(crate) fn check_options<J: Job>(options: &EnqueueOptions) -> Result<()> {
    let defaults = KindDefaults {
        kind: J::KIND,
        queue: J::QUEUE,
        max_attempts: J::MAX_ATTEMPTS,
        priority: J::PRIORITY,
    };
    NewJob::build(defaults, serde_json::Value::Null, options.clone()).map(drop)
}

fn registration_of<J: Job>() -> Result<&'static crate::registry::Registration> {
    Registry::global()?
        .get(J::KIND)
        .filter(|r| (r.rust_type)() == std::any::type_name::<J>())
        .ok_or_else(|| Error::UnknownJobType(J::KIND.to_owned()))
}

impl NewJob {
    /// Serializes `job` and checks its options. Fails, writing nothing, when
    /// the queue or group name is empty or too long, an option is out of
    /// range, or the job type is not registered in this binary.
    pub fn new<J: Job>(job: &J, options: EnqueueOptions) -> Result<Self> {
        let registration = registration_of::<J>()?;
        let defaults = KindDefaults {
            kind: registration.kind,
            queue: registration.queue,
            max_attempts: registration.max_attempts,
            priority: registration.priority,
        };
        let payload = serde_json::to_value(job).map_err(Error::Serialize)?;
        NewJob::build(defaults, payload, options)
    }
}

//! What was enqueued: the jobs of a queue or group, decoded into the
//! user's types, in enqueue order; and the assertion on them.

use std::fmt::Debug;

use diesel_async::AsyncPgConnection;
use serde::de::DeserializeOwned;

use crate::db::testing::{self as tsql, JobQuery, JobRow};
use crate::names::{validate_group, validate_queue};
use crate::{Error, Job, JobId, Result};

/// Which jobs to list: by queue, group, kind and state. Every part is
/// optional; an empty filter lists every job.
///
/// ```
/// use pgfifo::testing::Jobs;
///
/// let filter = Jobs::in_queue("billing").group("tenant-1").state("queued");
/// # let _ = filter;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Jobs {
    queue: Option<String>,
    group: Option<String>,
    ungrouped: bool,
    kind: Option<String>,
    state: Option<String>,
}

impl Jobs {
    /// Every job.
    pub fn all() -> Jobs {
        Jobs::default()
    }

    /// The jobs of queue `queue`.
    pub fn in_queue(queue: impl Into<String>) -> Jobs {
        Jobs {
            queue: Some(queue.into()),
            ..Jobs::default()
        }
    }

    /// The jobs of job type `J` (its kind, in its queue unless another
    /// queue is named).
    pub fn of<J: Job>() -> Jobs {
        Jobs::default().kind_of::<J>()
    }

    /// Only jobs of queue `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> Jobs {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs of group `group`.
    pub fn group(mut self, group: impl Into<String>) -> Jobs {
        self.group = Some(group.into());
        self
    }

    /// Only ungrouped jobs.
    pub fn ungrouped(mut self) -> Jobs {
        self.ungrouped = true;
        self
    }

    /// Only jobs of kind `kind` ([`Job::KIND`]).
    pub fn kind(mut self, kind: impl Into<String>) -> Jobs {
        self.kind = Some(kind.into());
        self
    }

    /// Only jobs of type `J`: its kind, and its queue unless one is set.
    pub fn kind_of<J: Job>(mut self) -> Jobs {
        self.kind = Some(J::KIND.to_owned());
        self.queue.get_or_insert_with(|| J::QUEUE.to_owned());
        self
    }

    /// Only jobs in state `state`: `queued`, `succeeded`, `failed` or
    /// `cancelled` (see `docs/state-machine.md`).
    pub fn state(mut self, state: impl Into<String>) -> Jobs {
        self.state = Some(state.into());
        self
    }

    fn check(&self) -> Result<()> {
        if let Some(queue) = &self.queue {
            validate_queue(queue)?;
        }
        if let Some(group) = &self.group {
            validate_group(group)?;
            if self.ungrouped {
                return Err(Error::InvalidArgument(
                    "a job filter cannot ask for a group and for ungrouped jobs".into(),
                ));
            }
        }
        if let Some(state) = &self.state {
            if !["queued", "succeeded", "failed", "cancelled"].contains(&state.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "unknown job state {state:?}: one of queued, succeeded, failed, cancelled"
                )));
            }
        }
        Ok(())
    }

    fn query(&self) -> JobQuery<'_> {
        JobQuery {
            queue: self.queue.as_deref(),
            group: self.group.as_deref(),
            ungrouped: self.ungrouped,
            kind: self.kind.as_deref(),
            state: self.state.as_deref(),
        }
    }
}

/// One stored job, its payload decoded into `T` (a raw
/// [`serde_json::Value`] by default).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Enqueued<T = serde_json::Value> {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its group (`None`: ungrouped).
    pub group: Option<String>,
    /// Its kind ([`Job::KIND`]).
    pub kind: String,
    /// Its state: `queued`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// Attempts whose outcome was written.
    pub attempts: u32,
    /// The most attempts it may have.
    pub max_attempts: u32,
    /// Its priority (higher runs first).
    pub priority: i16,
    /// Whether it waits for a time still to come (delayed, retrying,
    /// snoozed).
    pub scheduled: bool,
    /// Its payload.
    pub job: T,
}

impl<T: DeserializeOwned> Enqueued<T> {
    fn decode(row: JobRow) -> Result<Enqueued<T>> {
        let job = T::deserialize(&row.payload).map_err(|err| {
            Error::InvalidArgument(format!(
                "job {} (kind {:?}) does not decode into {}: {err}; its payload is {}",
                row.id,
                row.kind,
                std::any::type_name::<T>(),
                row.payload
            ))
        })?;
        Ok(Enqueued {
            id: row.id,
            queue: row.queue,
            group: row.group_id,
            kind: row.kind,
            state: row.state,
            attempts: row.attempts.max(0) as u32,
            max_attempts: row.max_attempts.max(0) as u32,
            priority: row.priority,
            scheduled: row.scheduled,
            job,
        })
    }
}

/// The jobs `filter` selects, in enqueue order, with raw JSON payloads. On
/// the caller's connection: inside a transaction it has open, it sees that
/// transaction's own enqueues.
pub async fn enqueued_jobs(conn: &mut AsyncPgConnection, filter: &Jobs) -> Result<Vec<Enqueued>> {
    filter.check()?;
    let rows = tsql::list_jobs(conn, &filter.query()).await?;
    rows.into_iter().map(Enqueued::decode).collect()
}

/// The jobs of type `J` that `filter` selects (its kind is added, and its
/// queue unless the filter names one), decoded into `J`, in enqueue order.
/// Works inside the caller's open transaction.
///
/// ```no_run
/// # use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Job, Serialize, Deserialize, Debug, PartialEq)]
/// # #[job(queue = "mail")]
/// # struct SendMail { to: String }
/// # #[async_trait]
/// # impl Handler for SendMail {
/// #     async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> { Ok(()) }
/// # }
/// # async fn demo(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::testing::{enqueued, Jobs};
///
/// let mails = enqueued::<SendMail>(conn, &Jobs::all().group("tenant-1")).await?;
/// assert_eq!(mails[0].job.to, "a@example.com");
/// # Ok(())
/// # }
/// ```
pub async fn enqueued<J: Job + DeserializeOwned>(
    conn: &mut AsyncPgConnection,
    filter: &Jobs,
) -> Result<Vec<Enqueued<J>>> {
    let filter = filter.clone().kind_of::<J>();
    filter.check()?;
    let rows = tsql::list_jobs(conn, &filter.query()).await?;
    rows.into_iter().map(Enqueued::decode).collect()
}

/// Asserts that the jobs of type `J` that `filter` selects are exactly
/// `expected`, in enqueue order (compared by payload).
///
/// # Panics
///
/// When they differ, listing every job the filter selected (of any kind,
/// with ids, groups, states and payloads) so the message shows what was
/// enqueued instead; or when the jobs cannot be read or decoded.
pub async fn assert_enqueued<J>(conn: &mut AsyncPgConnection, filter: &Jobs, expected: &[J])
where
    J: Job + DeserializeOwned + PartialEq + Debug,
{
    let found = enqueued::<J>(conn, filter)
        .await
        .unwrap_or_else(|err| panic!("assert_enqueued: {err}"));
    let payloads: Vec<&J> = found.iter().map(|e| &e.job).collect();
    let wanted: Vec<&J> = expected.iter().collect();
    if payloads == wanted {
        return;
    }
    let mut all_kinds = filter.clone();
    all_kinds.kind = None;
    all_kinds.queue.get_or_insert_with(|| J::QUEUE.to_owned());
    let listing = match enqueued_jobs(conn, &all_kinds).await {
        Ok(jobs) => describe(&jobs),
        Err(err) => format!("(could not list them: {err})"),
    };
    panic!(
        "expected these {} jobs of kind {:?} ({:?}):\n  {wanted:?}\nbut found {}:\n  \
         {payloads:?}\nevery job the filter selects, of any kind, in enqueue order:{listing}",
        wanted.len(),
        J::KIND,
        all_kinds,
        payloads.len(),
    );
}

/// The jobs as lines `#id kind (group) state: payload`.
fn describe(jobs: &[Enqueued]) -> String {
    if jobs.is_empty() {
        return " none".to_owned();
    }
    jobs.iter()
        .map(|j| {
            format!(
                "\n  #{} {} ({}) {}: {}",
                j.id,
                j.kind,
                j.group.as_deref().unwrap_or("ungrouped"),
                j.state,
                j.job
            )
        })
        .collect()
}

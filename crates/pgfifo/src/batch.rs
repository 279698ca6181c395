//! Batches: jobs enqueued together, counted together, with callback jobs
//! enqueued when their outcomes decide an event (docs/batches.md).
//!
//! | event | fires when | at most |
//! |---|---|---|
//! | [`BatchEvent::Failure`] | a job of the batch fails for good | once |
//! | [`BatchEvent::Success`] | the batch is closed and every job succeeded | once |
//! | [`BatchEvent::Complete`] | the batch is closed and every job ended, whatever the outcome | once |
//!
//! A callback is an ordinary job of its own type, group and options. It is
//! enqueued in the transaction that writes the deciding outcome, with the
//! batch's row locked: once, even when the last jobs end at the same moment
//! in different runners, and not at all if that transaction rolls back (the
//! job then runs again, and its outcome decides later). Its handler reads
//! the batch with [`JobContext::batch`](crate::JobContext::batch).
//!
//! ```no_run
//! # use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Job, Serialize, Deserialize)]
//! # struct CloseAccount { account: i64 }
//! # #[async_trait] impl Handler for CloseAccount {
//! #     async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> { Ok(()) }
//! # }
//! # #[derive(Job, Serialize, Deserialize)]
//! # struct SendReport { tenant: String }
//! # #[async_trait] impl Handler for SendReport {
//! #     async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> { Ok(()) }
//! # }
//! # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
//! use pgfifo::{Batch, EnqueueOptions, NewJob};
//!
//! let jobs = (1..=100)
//!     .map(|account| NewJob::new(&CloseAccount { account }, EnqueueOptions::group("tenant-42")))
//!     .collect::<pgfifo::Result<Vec<_>>>()?;
//! let report = SendReport { tenant: "tenant-42".into() };
//! let batch = Batch::new()
//!     .description("month-end close, tenant-42")
//!     .on_complete(NewJob::new(&report, EnqueueOptions::ungrouped())?)
//!     .enqueue(conn, jobs)
//!     .await?;
//! println!("batch {} with {} jobs", batch.id, batch.job_ids.len());
//! # Ok(())
//! # }
//! ```

use std::time::SystemTime;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::db;
use crate::db::batch::CallbackArrays;
use crate::db::batch::{BatchRow, CallbackRow, MemberRow};
use crate::db::enqueue::EnqueueArrays;
use crate::db::pooler::pinned;
use crate::enqueue::NewJob;
use crate::time::{from_micros, ser_opt_time, ser_time};
use crate::{BatchId, Error, JobId, Result};

/// The longest description a batch may have, in bytes.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// An event of a batch that enqueues a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchEvent {
    /// Every job of the closed batch succeeded.
    Success,
    /// Every job of the closed batch ended, whatever the outcomes.
    Complete,
    /// A job of the batch failed for good (the first one).
    Failure,
}

impl BatchEvent {
    /// Its name in SQL, the CLI and the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchEvent::Success => "success",
            BatchEvent::Complete => "complete",
            BatchEvent::Failure => "failure",
        }
    }
}

/// A batch to enqueue: its description and callbacks. See the [module
/// docs](self).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    description: Option<String>,
    keep_open: bool,
    callbacks: Vec<(BatchEvent, NewJob)>,
}

/// What [`Batch::enqueue`] created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueuedBatch {
    /// The batch's id.
    pub id: BatchId,
    /// Its jobs' ids, in input order.
    pub job_ids: Vec<JobId>,
}

impl Batch {
    /// A batch without a description or callbacks, closed once enqueued.
    pub fn new() -> Self {
        Self::default()
    }

    /// A description shown by `pgfifo batches` and the dashboard (at most
    /// [`MAX_DESCRIPTION_LEN`] bytes).
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// Keeps the batch open after [`enqueue`](Self::enqueue): jobs can be
    /// added with [`add`] until [`close`] is called, and it completes only
    /// after that.
    pub fn keep_open(mut self) -> Self {
        self.keep_open = true;
        self
    }

    /// Enqueues `job` once, when every job of the closed batch has
    /// succeeded. Replaces an earlier success callback.
    pub fn on_success(self, job: NewJob) -> Self {
        self.on(BatchEvent::Success, job)
    }

    /// Enqueues `job` once, when every job of the closed batch has ended,
    /// whatever the outcomes. Replaces an earlier complete callback.
    pub fn on_complete(self, job: NewJob) -> Self {
        self.on(BatchEvent::Complete, job)
    }

    /// Enqueues `job` once, when a job of the batch first fails for good.
    /// Replaces an earlier failure callback.
    pub fn on_failure(self, job: NewJob) -> Self {
        self.on(BatchEvent::Failure, job)
    }

    fn on(mut self, event: BatchEvent, job: NewJob) -> Self {
        self.callbacks.retain(|(e, _)| *e != event);
        self.callbacks.push((event, job));
        self
    }

    /// Creates the batch with `jobs` (any queues and groups, in order within
    /// a group, as [`enqueue_batch`](crate::enqueue_batch) takes them), in
    /// one statement. Like an enqueue, it joins the connection's transaction
    /// if one is open (READ COMMITTED): the batch and its jobs appear when
    /// it commits, and nothing is left if it rolls back.
    ///
    /// A batch closed here with no jobs completes at once: its success and
    /// complete callbacks are enqueued with it. Fails, writing nothing, for
    /// a description too long, or a job or callback with a unique key or a
    /// de-duplication window, or a callback with a start time.
    pub async fn enqueue(
        self,
        conn: &mut AsyncPgConnection,
        jobs: impl IntoIterator<Item = NewJob>,
    ) -> Result<EnqueuedBatch> {
        if let Some(text) = &self.description {
            if text.len() > MAX_DESCRIPTION_LEN || text.contains('\0') {
                return Err(Error::InvalidOption(format!(
                    "a batch's description must have at most {MAX_DESCRIPTION_LEN} bytes and no NUL"
                )));
            }
        }
        let mut callbacks = CallbackArrays::default();
        for (event, job) in self.callbacks {
            job.check_for_batch(true)?;
            callbacks.event.push(event.as_str());
            job.push_into(&mut callbacks.jobs);
        }
        let arrays = job_arrays(jobs)?;
        let (id, job_ids) = db::batch::enqueue(
            conn,
            None,
            self.description.as_deref(),
            self.keep_open,
            callbacks,
            arrays,
        )
        .await?;
        Ok(EnqueuedBatch { id, job_ids })
    }
}

fn job_arrays(jobs: impl IntoIterator<Item = NewJob>) -> Result<EnqueueArrays> {
    let mut arrays = EnqueueArrays::default();
    for job in jobs {
        job.check_for_batch(false)?;
        job.push_into(&mut arrays);
    }
    Ok(arrays)
}

/// Adds `jobs` to the open batch `id`; returns their ids in input order.
/// From a handler, pass the job's connection
/// ([`JobContext::conn`](crate::JobContext::conn)): the jobs join the batch
/// when the handler's job commits, and not at all if it fails.
///
/// It locks the batch's row until the transaction ends, and the batch's
/// other jobs wait for that lock when they end: add late in a long
/// transaction, not early. Fails with [`Error::BatchNotFound`] or
/// [`Error::BatchClosed`], writing nothing.
pub async fn add(
    conn: &mut AsyncPgConnection,
    id: BatchId,
    jobs: impl IntoIterator<Item = NewJob>,
) -> Result<Vec<JobId>> {
    let arrays = job_arrays(jobs)?;
    let (_, ids) = db::batch::enqueue(
        conn,
        Some(id),
        None,
        false,
        CallbackArrays::default(),
        arrays,
    )
    .await?;
    Ok(ids)
}

/// Closes the open batch `id`: no job can be added any more, and it
/// completes when every job has ended (now, if they all have: its
/// callbacks are then enqueued in this transaction). Returns `false` if it
/// was closed already. Fails with [`Error::BatchNotFound`].
pub async fn close(conn: &mut AsyncPgConnection, id: BatchId) -> Result<bool> {
    Ok(db::batch::close(conn, id).await?)
}

/// Batch `id` with its counts, jobs and callbacks; `None` if no batch has
/// this id. The same as [`admin::batch`](crate::admin::batch).
pub async fn summary(conn: &mut AsyncPgConnection, id: BatchId) -> Result<Option<BatchSummary>> {
    pinned(conn, async |conn| {
        let Some(row) = db::batch::batch(conn, id).await? else {
            return Ok(None);
        };
        let jobs = db::batch::members(conn, id).await?;
        let callbacks = db::batch::callbacks(conn, id).await?;
        Ok(Some(BatchSummary {
            progress: progress(row),
            jobs: jobs.into_iter().map(member).collect(),
            callbacks: callbacks.into_iter().map(callback).collect(),
        }))
    })
    .await
}

/// The batch job `job` belongs to, or whose callback it is (`None`: none).
pub async fn of_job(conn: &mut AsyncPgConnection, job: JobId) -> Result<Option<BatchId>> {
    Ok(db::batch::batch_of_job(conn, job).await?)
}

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Jobs may still be added ([`batch::close`](crate::batch::close) ends this).
    Open,
    /// Closed, with jobs that have not ended.
    Running,
    /// Every job has ended (or, after an operator's retry, had: see
    /// [`BatchProgress::completed_at`]).
    Completed,
}

impl BatchState {
    /// Its name as the CLI and the dashboard show it.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Open => "open",
            BatchState::Running => "running",
            BatchState::Completed => "completed",
        }
    }
}

/// A batch's counts (see [`batches`]). A job counts once it has a terminal
/// outcome; a failed job an operator retries stops counting as failed
/// until it ends again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchProgress {
    /// The batch's id.
    pub id: BatchId,
    /// Its description, if it was given one.
    pub description: Option<String>,
    /// Open, running or completed.
    pub state: BatchState,
    /// When it was created.
    #[serde(serialize_with = "ser_time")]
    pub created_at: SystemTime,
    /// When it was closed (`None`: open).
    #[serde(serialize_with = "ser_opt_time")]
    pub closed_at: Option<SystemTime>,
    /// When every job first had a terminal outcome (the `complete` event).
    /// Stays set when an operator retries a failed job later.
    #[serde(serialize_with = "ser_opt_time")]
    pub completed_at: Option<SystemTime>,
    /// When a job of it first failed for good.
    #[serde(serialize_with = "ser_opt_time")]
    pub first_failed_at: Option<SystemTime>,
    /// Its jobs.
    pub total: u32,
    /// Jobs that succeeded.
    pub succeeded: u32,
    /// Jobs that failed for good (a skipped head, a head held by the `hold`
    /// failure policy included).
    pub failed: u32,
    /// Jobs cancelled (by their handler or an operator).
    pub cancelled: u32,
    /// Jobs without a terminal outcome yet (queued, waiting for a retry,
    /// running, or retried by an operator).
    pub pending: u32,
}

/// One job of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchMember {
    /// The job's id.
    pub id: JobId,
    /// Its state (`queued`, `succeeded`, `failed`, `cancelled`); `None`
    /// when retention has purged the job.
    pub state: Option<String>,
}

/// One callback of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchCallback {
    /// `success`, `complete` or `failure`.
    pub event: String,
    /// The callback job's type.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Its group (`None`: ungrouped).
    pub group: Option<String>,
    /// The id of the job enqueued when the event fired (`None`: not yet).
    pub job_id: Option<JobId>,
}

/// A batch with its jobs and callbacks (see [`batch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchSummary {
    /// Its counts.
    #[serde(flatten)]
    pub progress: BatchProgress,
    /// Its jobs, in id order.
    pub jobs: Vec<BatchMember>,
    /// Its callbacks, in the order they are enqueued when they fire at once
    /// (failure, success, complete).
    pub callbacks: Vec<BatchCallback>,
}

impl BatchSummary {
    /// The ids of its jobs whose state is `state`.
    pub fn job_ids(&self, state: &str) -> Vec<JobId> {
        self.jobs
            .iter()
            .filter(|j| j.state.as_deref() == Some(state))
            .map(|j| j.id)
            .collect()
    }
}

fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

pub(crate) fn progress(row: BatchRow) -> BatchProgress {
    let done = row.succeeded + row.failed + row.cancelled;
    let state = if row.closed_at_us.is_none() {
        BatchState::Open
    } else if row.completed_at_us.is_some() {
        BatchState::Completed
    } else {
        BatchState::Running
    };
    BatchProgress {
        id: row.id,
        description: row.description,
        state,
        created_at: from_micros(row.created_at_us),
        closed_at: row.closed_at_us.map(from_micros),
        completed_at: row.completed_at_us.map(from_micros),
        first_failed_at: row.first_failed_at_us.map(from_micros),
        total: count(row.total),
        succeeded: count(row.succeeded),
        failed: count(row.failed),
        cancelled: count(row.cancelled),
        pending: count(row.total - done),
    }
}

fn member(row: MemberRow) -> BatchMember {
    BatchMember {
        id: row.job_id,
        state: row.state,
    }
}

fn callback(row: CallbackRow) -> BatchCallback {
    BatchCallback {
        event: row.event,
        kind: row.kind,
        queue: row.queue,
        group: row.group_id,
        job_id: row.job_id,
    }
}

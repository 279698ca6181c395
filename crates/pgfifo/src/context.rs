//! The context a running handler receives: its job, and its transaction's
//! connection.

use std::fmt;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::job_error::JobError;
use crate::JobId;

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
    /// are in the transaction: it ends the transaction's batch, so the job
    /// commits together with the short jobs run before it in that
    /// transaction (which took no connection, so wrote nothing) but never
    /// with another job's writes (see `RunnerConfig::max_batch`).
    ///
    /// **In long mode** ([`Job::LONG`](crate::Job::LONG), `#[job(long)]`)
    /// there is no job transaction: this is a connection in autocommit,
    /// each statement commits on its own, and nothing is rolled back when
    /// the handler fails. Use `transaction` for writes that belong
    /// together, and make them idempotent (see [`Job::LONG`](crate::Job::LONG)).
    pub fn conn(&mut self) -> &mut AsyncPgConnection {
        self.used_conn = true;
        self.conn
    }

    /// The batch this job belongs to, or whose callback it is, with its
    /// counts, jobs and callbacks (`None`: neither). Read through the job's
    /// connection: in a callback, the counts include the outcome that fired
    /// it. See [`batch`](crate::batch).
    pub async fn batch(&mut self) -> crate::Result<Option<crate::batch::BatchSummary>> {
        let Some(id) = crate::batch::of_job(self.conn, self.id).await? else {
            return Ok(None);
        };
        crate::batch::summary(self.conn, id).await
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

//! What a job does when it runs: the [`Handler`] trait.

use crate::context::JobContext;
use crate::job::Job;
use crate::job_error::JobError;

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

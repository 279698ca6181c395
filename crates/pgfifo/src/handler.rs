//! What a job does when it runs: the [`Handler`] trait, and the
//! registration the derive submits for a handler.

use crate::context::JobContext;
use futures_util::future::BoxFuture;

use crate::job::Job;
use crate::job_error::JobError;
use crate::registry::Registration;

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

/// The registration of handler type `T`, which the derive submits (in a
/// `const` context). A free function rather than `Registration::of`: the
/// registry stays below the handler, and a type that lacks its `Handler`
/// impl gets an error naming this function's public path.
pub const fn registration<T: Handler>() -> Registration {
    Registration {
        kind: T::KIND,
        queue: T::QUEUE,
        rust_type: std::any::type_name::<T>,
        max_attempts: T::MAX_ATTEMPTS,
        timeout: T::TIMEOUT,
        backoff: T::BACKOFF,
        priority: T::PRIORITY,
        long: T::LONG,
        run: run_erased::<T>,
        schema: crate::registry::no_schema,
    }
}

/// Deserializes the payload into `T` and runs its handler. A payload that
/// does not deserialize is a permanent failure: retrying cannot fix it.
fn run_erased<'a, 'b, T: Handler>(
    payload: &'a serde_json::Value,
    ctx: &'a mut JobContext<'b>,
) -> BoxFuture<'a, Result<(), JobError>> {
    Box::pin(async move {
        let job = T::deserialize(payload).map_err(|err| {
            // Again, on the failure path only, to name where it went wrong
            // (`items[2].qty: invalid type…`): the payload may come from a
            // producer in another language (docs/enqueue-from-sql.md).
            let detail = match serde_path_to_error::deserialize::<_, T>(payload) {
                Err(located) if located.path().to_string() != "." => located.to_string(),
                _ => err.to_string(),
            };
            JobError::permanent(format!(
                "the payload does not deserialize into {}: {detail}",
                std::any::type_name::<T>()
            ))
        })?;
        job.handle(ctx).await
    })
}

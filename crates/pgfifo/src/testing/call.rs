//! Running one handler directly, with a real [`JobContext`] on a connection
//! the test chooses.

use diesel_async::AsyncPgConnection;

use crate::context::JobContext;
use crate::handler::{registration, Handler};
use crate::names::{validate_group, validate_queue};
use crate::{Error, JobError, JobId};

/// One call of a handler, outside any runner: the job's payload goes
/// through serde as the runner's does (so a type that does not round-trip
/// fails here as it would there), then its [`Handler::handle`] runs with a
/// [`JobContext`] on the connection given.
///
/// Nothing is stored about the job: no row, no attempt, no outcome. Its
/// writes go wherever the connection goes; inside a transaction the test
/// rolls back, they are inspected and discarded. A panic in the handler is
/// not caught (the test fails with it).
///
/// ```no_run
/// # use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Job, Serialize, Deserialize)]
/// # #[job(queue = "mail")]
/// # struct SendMail { to: String }
/// # #[async_trait]
/// # impl Handler for SendMail {
/// #     async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> { Ok(()) }
/// # }
/// # async fn demo(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::testing::Call;
///
/// let job = SendMail { to: "a@example.com".into() };
/// let outcome = Call::new().group("tenant-1").attempt(2)?.run(conn, &job).await;
/// assert!(outcome.is_ok());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Call {
    id: JobId,
    queue: Option<String>,
    group: Option<String>,
    attempt: u32,
    max_attempts: Option<u32>,
}

impl Default for Call {
    fn default() -> Self {
        Call::new()
    }
}

impl Call {
    /// A first attempt of an ungrouped job with id 0, in its type's queue,
    /// with its type's `max_attempts`.
    pub fn new() -> Call {
        Call {
            id: 0,
            queue: None,
            group: None,
            attempt: 1,
            max_attempts: None,
        }
    }

    /// The id [`JobContext::id`] reports (default 0).
    pub fn id(mut self, id: JobId) -> Call {
        self.id = id;
        self
    }

    /// The queue [`JobContext::queue`] reports (default: the type's).
    pub fn queue(mut self, queue: impl Into<String>) -> Call {
        self.queue = Some(queue.into());
        self
    }

    /// The group [`JobContext::group`] reports (default: none).
    pub fn group(mut self, group: impl Into<String>) -> Call {
        self.group = Some(group.into());
        self
    }

    /// The attempt [`JobContext::attempt`] reports (default 1). Must be at
    /// least 1.
    pub fn attempt(mut self, attempt: u32) -> crate::Result<Call> {
        if attempt == 0 {
            return Err(Error::InvalidArgument("attempts count from 1".into()));
        }
        self.attempt = attempt;
        Ok(self)
    }

    /// The most attempts [`JobContext::max_attempts`] reports (default: the
    /// type's).
    pub fn max_attempts(mut self, max_attempts: u32) -> Call {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Runs `job`'s handler once on `conn` and returns its result. `Ok`
    /// carries what the handler stored with
    /// [`JobContext::set_result`] (`None` if nothing).
    ///
    /// Invalid settings (a bad queue or group name, an attempt above
    /// `max_attempts`) and a payload that does not round-trip through
    /// serde come back as a permanent [`JobError`] saying so.
    pub async fn run<J: Handler>(
        &self,
        conn: &mut AsyncPgConnection,
        job: &J,
    ) -> Result<Option<serde_json::Value>, JobError> {
        let queue = self.queue.as_deref().unwrap_or(J::QUEUE);
        let max_attempts = self.max_attempts.unwrap_or(J::MAX_ATTEMPTS);
        validate_queue(queue).map_err(JobError::permanent)?;
        if let Some(group) = &self.group {
            validate_group(group).map_err(JobError::permanent)?;
        }
        if self.attempt > max_attempts {
            return Err(JobError::permanent(format!(
                "attempt {} is above max_attempts {max_attempts}",
                self.attempt
            )));
        }
        let payload = serde_json::to_value(job).map_err(JobError::permanent)?;
        let mut ctx = JobContext {
            id: self.id,
            queue,
            group: self.group.as_deref(),
            attempt: self.attempt,
            max_attempts,
            conn,
            used_conn: false,
            result: None,
        };
        (registration::<J>().run)(&payload, &mut ctx).await?;
        Ok(ctx.result.take())
    }
}

//! FIFO background jobs on PostgreSQL, with at most one running job per
//! `(queue, group)`: the semantics of SQS FIFO message groups, on the database
//! your application already has.
//!
//! A job is a serde struct with `#[derive(Job)]` and a [`Handler`]. Enqueue it
//! for a group (a tenant, an account, a device…): jobs of one group run one at
//! a time in enqueue order, different groups run in parallel. The runner holds
//! the group's row lock in the job's own transaction while the handler runs, so
//! a crashed worker releases the group at once and the job runs again; what the
//! handler writes through its connection commits with the job's success.
//!
//! ```no_run
//! use pgfifo::{async_trait, Handler, Job, JobContext, JobError, RunnerConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(queue = "billing", max_attempts = 5, timeout = "30s")]
//! struct ChargeInvoice {
//!     invoice_id: i64,
//! }
//!
//! #[async_trait]
//! impl Handler for ChargeInvoice {
//!     async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
//!         // ctx.conn() is the job's transaction: writes commit with its success.
//!         println!("charging invoice {} for {:?}", self.invoice_id, ctx.group());
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> pgfifo::Result<()> {
//! let pool = pgfifo::connect("postgres://localhost/app", 20).await?;
//! pgfifo::migrate(&pool).await?; // explicit: creates or upgrades the `pgfifo` schema
//!
//! let mut conn = pool.get().await?;
//! ChargeInvoice { invoice_id: 7 }.enqueue(&mut conn, "tenant-42").await?;
//! drop(conn);
//!
//! let runner = pgfifo::runner::start(pool, RunnerConfig::default()).await?;
//! runner.shutdown_on_signal().await?; // SIGINT/SIGTERM: drain, then stop
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/` in the repository for the job state machine and the locking
//! design.

extern crate self as pgfifo;

pub mod admin;
pub mod batch;
mod context;
mod controls;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod db;
mod dependency;
mod enqueue;
mod error;
mod handler;
mod job;
mod job_error;
mod job_types;
pub mod migrate;
mod names;
#[cfg(feature = "otel")]
mod otel;
mod queue_limits;
mod registry;
pub mod runner;
pub mod schedule;
#[cfg(feature = "testing")]
pub mod testing;
mod time;

pub use async_trait::async_trait;
pub use batch::{Batch, BatchEvent, EnqueuedBatch};
pub use context::JobContext;
pub use controls::{
    GroupLimits, GroupLimitsChange, LimitChange, Rate, MAX_GROUP_CONCURRENCY, MAX_RATE_COUNT,
    MAX_RATE_PERIOD,
};
pub use db::{connect, connect_with, ConnectOptions, Pool};
pub use dependency::{Dependency, DependencyFailure};
/// The diesel version pgfifo is built on, for handlers that use the job's connection.
pub use diesel;
/// The diesel-async version pgfifo is built on (`AsyncPgConnection`, `RunQueryDsl`).
pub use diesel_async;
pub use enqueue::{enqueue_batch, EnqueueOptions, NewJob};
pub use enqueue::{enqueue_batch_outcomes, EnqueueOutcome, Enqueued, Window, WindowMode};
pub use error::{Error, RegistrationProblem, Result, ScheduleProblem};
pub use handler::Handler;
pub use job::Job;
pub use job_error::{FailureKind, JobError};
pub use job_types::{job_types, JobType};
pub use migrate::migrate;
pub use names::{MAX_GROUP_LEN, MAX_KIND_LEN, MAX_QUEUE_LEN};
pub use queue_limits::{QueueLimits, MAX_QUEUE_CONCURRENCY};
pub use runner::{Retention, RunnerConfig, RunnerHandle};
pub use schedule::{Missed, Schedule};

/// Derives [`Job`] for a serde type and registers its [`Handler`] with the
/// runner. See the [`Job`] trait for the `#[job(...)]` attributes.
pub use pgfifo_macros::Job;

/// The id of a stored job.
pub type JobId = i64;

/// The id of a [`Batch`] of jobs.
pub type BatchId = i64;

/// Items the derive macro's output refers to. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::handler::registration;
    pub use crate::job_types::{NoPayloadSchema, PayloadSchema, SchemaProbe};
    pub use crate::registry::Registration;
    pub use inventory;
    pub use serde_json::Value as JsonValue;
}

//! The runner's periodic tasks, each on a pooled connection taken for one
//! tick and given back (retention's on a connection of its own):
//!
//! * the heartbeat (`heartbeat.rs`): the runner's row in `pgfifo.runner`
//!   (who is alive, what runs where), written at start and every
//!   [`RunnerConfig::heartbeat_interval`](crate::RunnerConfig::heartbeat_interval),
//!   deleted on shutdown;
//! * the gauge sampler (`gauges.rs`): the per-queue gauges of
//!   [`metrics`](super::metrics), read every
//!   [`RunnerConfig::metrics_interval`](crate::RunnerConfig::metrics_interval);
//! * retention (`retention.rs`, [`Retention`]): deleting old finished jobs
//!   and idle groups, in short batches, by one runner at a time;
//! * the dependencies' sweep (`dependencies.rs`): waiting dependents that
//!   no completion decided (a dependency that ended before the dependent's
//!   enqueue committed), every two seconds.
//!
//! None of them ever stops the runner: a failure is logged (once, until the
//! task works again) and the next tick tries again.

mod dependencies;
mod gauges;
mod heartbeat;
pub(crate) mod retention;

use std::time::Duration;

pub(crate) use dependencies::Sweep;
pub(crate) use gauges::Gauges;
pub(crate) use heartbeat::Heartbeat;
pub use retention::Retention;

use crate::db::{Pool, PooledConnection};
use crate::Result;

/// Logs a periodic task's failures once, not every tick, until it works again.
pub(crate) struct Complaints {
    task: &'static str,
    failing: bool,
}

impl Complaints {
    pub(crate) fn new(task: &'static str) -> Self {
        Self {
            task,
            failing: false,
        }
    }

    pub(crate) fn report<T>(&mut self, result: Result<T>) -> Option<T> {
        match result {
            Ok(value) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(task = self.task, "pgfifo: runner task works again");
                }
                Some(value)
            }
            Err(err) if self.failing => {
                tracing::debug!(task = self.task, error = %err, "pgfifo: runner task still failing");
                None
            }
            Err(err) => {
                self.failing = true;
                tracing::warn!(task = self.task, error = %err, "pgfifo: runner task failed; retrying every tick");
                None
            }
        }
    }
}

/// A pooled connection for one tick, waiting at most `patience` for it (a
/// busy pool must not pile up ticks).
pub(crate) async fn pooled(pool: &Pool, patience: Duration) -> Result<PooledConnection> {
    match tokio::time::timeout(patience, pool.get_owned()).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(bb8::RunError::TimedOut.into()),
    }
}

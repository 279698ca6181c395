//! [`RunnerConfig`]'s limits: the defaults of a queue's groups and a whole
//! queue's limits, written to the database when the runner starts.

use super::config::RunnerConfig;
use crate::{GroupLimits, QueueLimits};

impl RunnerConfig {
    /// Sets the default limits for the groups of `queue` (those without
    /// limits of their own), such as a rate limit per tenant. They live in
    /// the database, where every runner reads them: this runner writes them
    /// at start, replacing the queue's defaults (the last runner to start
    /// wins, so give every runner the same), and an operator can change
    /// them at run time with `pgfifo group set QUEUE --defaults ...` until
    /// the next runner starts. Checked at start: a bad value is an
    /// [`Error::InvalidArgument`] naming it. See `docs/group-controls.md`.
    ///
    /// ```
    /// use pgfifo::{GroupLimits, Rate, RunnerConfig};
    ///
    /// let config = RunnerConfig::default()
    ///     .group_limits("sync", GroupLimits::new().rate(Rate::per_second(10)?));
    /// # Ok::<(), pgfifo::Error>(())
    /// ```
    pub fn group_limits(mut self, queue: impl Into<String>, limits: GroupLimits) -> Self {
        self.group_limits.push((queue.into(), limits));
        self
    }

    /// Sets the limits of a whole queue when the runner starts, replacing
    /// those it had (as [`admin::set_queue_limits`](crate::admin::set_queue_limits)
    /// does): at most `concurrency` of its jobs run at once across all
    /// runners, and its starts draw from one token bucket. Several runners
    /// with different values: the last one started wins.
    ///
    /// ```
    /// use pgfifo::{QueueLimits, Rate, RunnerConfig};
    ///
    /// let config = RunnerConfig::default()
    ///     .queue_limits("payments", QueueLimits::new().concurrency(20).rate(Rate::per_minute(100)?));
    /// # Ok::<(), pgfifo::Error>(())
    /// ```
    pub fn queue_limits(mut self, queue: impl Into<String>, limits: QueueLimits) -> Self {
        self.queue_limits.push((queue.into(), limits));
        self
    }
}

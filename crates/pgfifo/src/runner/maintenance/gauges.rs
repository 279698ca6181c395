//! Sampling the per-queue gauges of the runner's metrics from the database.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{pooled, Complaints};
use crate::admin;
use crate::db::Pool;
use crate::runner::metrics::Metrics;

/// What the gauge sampler reads and where it puts it.
pub(crate) struct Gauges {
    pub pool: Pool,
    pub queues: Vec<String>,
    pub interval: Duration,
    /// How long the server gets to answer the sampling query.
    pub round_trip: Duration,
    pub metrics: Arc<Metrics>,
}

impl Gauges {
    /// Samples every `interval` until `service` is cancelled.
    pub(crate) async fn run(self, service: CancellationToken) {
        let mut complaints = Complaints::new("metrics");
        loop {
            let sampled = async {
                let mut conn = pooled(&self.pool, self.interval).await?;
                admin::gauges(&mut conn, &self.queues).await
            };
            let deadline = self.interval + self.round_trip;
            let sampled = tokio::time::timeout(deadline, sampled)
                .await
                .unwrap_or_else(|_| {
                    Err(crate::Error::Database(crate::db::error::timed_out(
                        deadline,
                    )))
                });
            if let Some(gauges) = complaints.report(sampled) {
                self.metrics.set_gauges(&gauges);
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = service.cancelled() => return,
            }
        }
    }
}

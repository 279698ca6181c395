//! The runner's heartbeat row in `pgfifo.runner`: written at start and every
//! interval with the jobs running now, deleted on shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use tokio_util::sync::CancellationToken;

use super::{pooled, Complaints};
use crate::admin::RUNNER_ALIVE;
use crate::db;
use crate::db::maintenance::RunnerRow;
use crate::db::Pool;
use crate::migrate::{latest_version, RELEASE};
use crate::runner::hung::HungSignal;
use crate::runner::metrics::Metrics;
use crate::Result;

/// A runner row without a heartbeat for this long is deleted by the next
/// runner that starts.
const STALE_RUNNER_ROW: Duration = Duration::from_secs(24 * 3600);
/// How long the heartbeat's final delete may take at shutdown.
const FAREWELL_PATIENCE: Duration = Duration::from_secs(5);

/// What the heartbeat writes.
pub(crate) struct Heartbeat {
    pub pool: Pool,
    pub name: String,
    pub queues: Vec<String>,
    pub interval: Duration,
    /// How long the server gets to answer a heartbeat's statements.
    pub round_trip: Duration,
    /// Where a heartbeat that got no answer in time says so (see
    /// `runner/hung.rs`).
    pub hung: HungSignal,
    pub metrics: Arc<Metrics>,
    /// The schedules this runner declares, `{"name": definition}`: stored
    /// with the heartbeat so that a schedule no live runner declares shows
    /// as stale.
    pub schedules: serde_json::Value,
    /// Recording finished jobs failed last time (it was said once).
    pub chart_failing: AtomicBool,
}

impl Heartbeat {
    /// Writes the row until `service` is cancelled, then deletes it.
    pub(crate) async fn run(self, service: CancellationToken) {
        let mut complaints = Complaints::new("heartbeat");
        let mut starting = true;
        let mut upgrade_noted = false;
        loop {
            // The checkout waits up to the interval, the statements up to
            // the round-trip deadline.
            let deadline = self.interval + self.round_trip;
            let beat = tokio::time::timeout(deadline, self.beat(starting))
                .await
                .unwrap_or_else(|_| Err(crate::Error::Database(db::error::timed_out(deadline))));
            if let Some(schema) = complaints.report(beat) {
                starting = false;
                if !upgrade_noted && schema.is_some_and(|v| v > latest_version()) {
                    upgrade_noted = true;
                    tracing::warn!(
                        schema_version = schema,
                        runner_release = RELEASE,
                        "pgfifo: the schema was migrated to a newer version while this runner \
                         runs; it keeps working (the new functions accept this release's calls), \
                         but restart it with the new release (see docs/upgrading.md)"
                    );
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = service.cancelled() => break,
            }
        }
        let farewell = async {
            let mut conn = pooled(&self.pool, FAREWELL_PATIENCE).await?;
            self.record_finished(&mut conn).await;
            db::maintenance::delete_runner(&mut conn, &self.name).await?;
            Ok::<(), crate::Error>(())
        };
        match tokio::time::timeout(FAREWELL_PATIENCE, farewell).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "pgfifo: could not delete the runner's heartbeat row");
            }
            Err(_) => tracing::warn!("pgfifo: deleting the runner's heartbeat row timed out"),
        }
    }

    /// Adds the jobs finished since the last heartbeat to the per-minute
    /// counts the dashboard charts. A failure only costs the chart: it is
    /// logged (at debug level after the first), the counts wait for the next
    /// heartbeat, and the heartbeat itself goes on.
    async fn record_finished(&self, conn: &mut AsyncPgConnection) {
        let finished = self.metrics.take_finished();
        if finished.is_empty() {
            return;
        }
        match db::maintenance::record_finished(conn, &finished).await {
            Ok(()) => self.chart_failing.store(false, Ordering::Relaxed),
            Err(err) => {
                self.metrics.unfinish(&finished);
                if !self.chart_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %err, "pgfifo: could not record finished jobs for the dashboard's chart; retrying with each heartbeat");
                } else {
                    tracing::debug!(error = %err, "pgfifo: recording finished jobs still fails");
                }
            }
        }
    }

    /// One heartbeat: upserts the runner's row with the running counts, and
    /// returns the schema version it read. The first (`starting`) also
    /// resets `started_at`, clears rows of long-dead runners, and warns when
    /// another live runner has the same name.
    async fn beat(&self, starting: bool) -> Result<Option<i64>> {
        let mut conn = pooled(&self.pool, self.interval).await?;
        match tokio::time::timeout(self.round_trip, self.beat_on(&mut conn, starting)).await {
            Ok(beat) => beat,
            Err(_) => {
                // The server hung: the lanes hear of it, and the pool
                // closes the connection.
                self.hung.note(db::pooler::host_of(&mut conn));
                db::discard(&mut conn);
                Err(crate::Error::Database(db::error::timed_out(
                    self.round_trip,
                )))
            }
        }
    }

    /// [`beat`](Self::beat)'s statements, on `conn`.
    async fn beat_on(&self, conn: &mut AsyncPgConnection, starting: bool) -> Result<Option<i64>> {
        let row = RunnerRow {
            name: &self.name,
            release: RELEASE,
            queues: &self.queues,
            running: self.metrics.running(),
            starting,
            schedules: &self.schedules,
        };
        let beat = db::maintenance::beat(conn, row).await?;
        self.record_finished(conn).await;
        if starting {
            // Rows of runners that died without shutting down (killed,
            // crashed) stay behind; status ignores them once stale. Clear out
            // old ones.
            db::maintenance::delete_stale_runners(conn, STALE_RUNNER_ROW).await?;
            if let Some(age) = beat
                .previous_age_s
                .filter(|age| *age < RUNNER_ALIVE.as_secs_f64())
            {
                tracing::warn!(
                    name = %self.name,
                    previous_heartbeat_s = age,
                    "pgfifo: another live runner has this name (or a process of this name stopped \
                     without shutting down moments ago); runner names must be unique, or status \
                     reports them as one"
                );
            }
        }
        Ok(beat.schema_version)
    }
}

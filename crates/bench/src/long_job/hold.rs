//! The long job of `long-job`, in either mode, and the watch on what the
//! runners' connections hold while it runs.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, Double, Integer};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub(super) static HOLD_STARTED: Notify = Notify::const_new();
pub(super) static HOLD_RELEASE: Notify = Notify::const_new();
pub(super) static HOLD_DONE: Notify = Notify::const_new();
/// When the hold job's handler started and ended.
pub(super) static HOLD_TIMES: Mutex<(Option<Instant>, Option<Instant>)> = Mutex::new((None, None));

/// The long job the old way (`LONG_MODE=0`): keeps its transaction open
/// until the benchmark releases it (or `max_ms` passes, a safety net).
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.hold",
    queue = "bench.hold",
    max_attempts = 1,
    timeout = "24h"
)]
pub struct HoldJob {
    /// The longest it may hold, in ms.
    pub max_ms: u64,
}

/// The same job in long mode (`#[job(long)]`, the default): it holds its
/// group without an open transaction.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.hold_long",
    queue = "bench.hold",
    long,
    max_attempts = 1,
    timeout = "24h"
)]
pub struct LongHoldJob {
    /// The longest it may hold, in ms.
    pub max_ms: u64,
}

#[async_trait]
impl Handler for HoldJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        // The pick's row locks already gave the transaction an xid; make
        // sure, whatever the pick does: an xid is what holds the horizon back.
        ctx.conn()
            .batch_execute("SELECT pg_current_xact_id()")
            .await?;
        hold(self.max_ms).await;
        Ok(())
    }
}

#[async_trait]
impl Handler for LongHoldJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        // A statement on its connection, as a long handler would send: it
        // commits at once and holds nothing afterwards.
        ctx.conn().batch_execute("SELECT 1").await?;
        hold(self.max_ms).await;
        Ok(())
    }
}

/// Waits until released (or `max_ms`), noting when.
async fn hold(max_ms: u64) {
    HOLD_TIMES.lock().expect("hold times").0 = Some(Instant::now());
    HOLD_STARTED.notify_one();
    let _ = tokio::time::timeout(Duration::from_millis(max_ms), HOLD_RELEASE.notified()).await;
    HOLD_TIMES.lock().expect("hold times").1 = Some(Instant::now());
    HOLD_DONE.notify_one();
}

#[derive(QueryableByName)]
struct Age {
    #[diesel(sql_type = Double)]
    age: f64,
}

/// The longest any client backend of the database (but the watcher's own
/// and those in `exclude`) has held a transaction id or a snapshot
/// (`backend_xid` or `backend_xmin`), as the age of its transaction.
const OLDEST: &str =
    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8 AS age \
     FROM pg_stat_activity \
     WHERE datname = current_database() AND backend_type = 'client backend' \
       AND pid <> pg_backend_pid() AND pid <> ALL ($1) \
       AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)";

/// Every 100 ms until `stop`, reads how long the runners' connections have
/// held a transaction id or a snapshot (the benchmark's own enqueuer,
/// `feeder`, is left out); returns the longest, in seconds.
pub(super) async fn watch_xids(
    mut conn: AsyncPgConnection,
    feeder: Arc<AtomicI32>,
    stop: Arc<AtomicBool>,
) -> Result<f64, String> {
    let mut longest = 0.0f64;
    while !AtomicBool::load(&stop, Ordering::Relaxed) {
        let exclude = vec![AtomicI32::load(&feeder, Ordering::Relaxed)];
        let row: Age = diesel::sql_query(OLDEST)
            .bind::<Array<Integer>, _>(exclude)
            .get_result(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        longest = longest.max(row.age);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(longest)
}

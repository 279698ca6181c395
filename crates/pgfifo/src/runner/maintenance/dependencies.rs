//! The dependencies' sweep: every [`SWEEP_INTERVAL`], decides the waiting
//! dependents that no completion did (`pgfifo.release_dependents`). A
//! dependency that ends while its dependent's enqueue has not committed
//! cannot see the dependent; the sweep releases (or cancels) it within an
//! interval of that commit. See `docs/batches.md`, "Dependencies".

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{pooled, Complaints};
use crate::db::Pool;

/// How often the sweep looks.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

/// Dependents decided per statement (it runs again at once while it finds
/// that many).
const SWEEP_BATCH: i32 = 500;

/// What the sweep needs.
pub(crate) struct Sweep {
    pub pool: Pool,
    /// How long the server gets to answer one statement.
    pub round_trip: Duration,
}

impl Sweep {
    /// Sweeps every [`SWEEP_INTERVAL`] until `service` is cancelled.
    pub(crate) async fn run(self, service: CancellationToken) {
        let mut complaints = Complaints::new("dependencies");
        loop {
            let swept = async {
                let mut conn = pooled(&self.pool, SWEEP_INTERVAL).await?;
                loop {
                    let n =
                        crate::db::dependency::release_dependents(&mut conn, SWEEP_BATCH).await?;
                    if n < SWEEP_BATCH {
                        return Ok::<_, crate::Error>(());
                    }
                }
            };
            let deadline = SWEEP_INTERVAL + self.round_trip;
            let swept = tokio::time::timeout(deadline, swept)
                .await
                .unwrap_or_else(|_| {
                    Err(crate::Error::Database(crate::db::error::timed_out(
                        deadline,
                    )))
                });
            complaints.report(swept);
            tokio::select! {
                () = tokio::time::sleep(SWEEP_INTERVAL) => {}
                () = service.cancelled() => return,
            }
        }
    }
}

//! The dependencies' sweep: every [`SWEEP_INTERVAL`], decides the waiting
//! dependents that no completion did (`pgfifo.release_dependents`). A
//! dependency that ends while its dependent's enqueue has not committed
//! cannot see the dependent; the sweep releases (or cancels) it within an
//! interval of that commit. It looks at [`SWEEP_PAGE`] waiting dependents a
//! tick, going round the table: with more waiting, a round takes more
//! ticks, and a tick's cost stays bounded. See `docs/batches.md`,
//! "Dependencies".

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{pooled, Complaints};
use crate::db::Pool;

/// How often the sweep looks.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

/// Waiting dependents looked at per tick (about 4 µs each on the test
/// machine: 20 ms a tick at most).
pub(crate) const SWEEP_PAGE: i32 = 5_000;

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
        let mut after = 0;
        loop {
            let swept = async {
                let mut conn = pooled(&self.pool, SWEEP_INTERVAL).await?;
                let page =
                    crate::db::dependency::release_dependents(&mut conn, after, SWEEP_PAGE).await?;
                if page.settled > 0 {
                    tracing::debug!(
                        settled = page.settled,
                        "pgfifo: the dependencies' sweep decided dependents that no completion did"
                    );
                }
                Ok::<_, crate::Error>(page.next_after)
            };
            let deadline = SWEEP_INTERVAL + self.round_trip;
            let swept = tokio::time::timeout(deadline, swept)
                .await
                .unwrap_or_else(|_| {
                    Err(crate::Error::Database(crate::db::error::timed_out(
                        deadline,
                    )))
                });
            if let Some(next) = complaints.report(swept) {
                after = next;
            }
            tokio::select! {
                () = tokio::time::sleep(SWEEP_INTERVAL) => {}
                () = service.cancelled() => return,
            }
        }
    }
}

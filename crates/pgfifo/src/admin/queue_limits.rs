//! Setting a whole queue's limits at run time: its concurrency across all
//! runners and its rate (see [`QueueLimits`]). Each call is one short
//! transaction that never waits for a running job; a change applies to the
//! next starts (jobs running keep their slots; a lower concurrency lets no
//! new job start until enough of them have ended).

use diesel_async::AsyncPgConnection;

use crate::admin::controls::rate_of;
use crate::db;
use crate::db::admin::queue_limits::QueueControlRow;
use crate::db::pooler::pinned;
use crate::names::validate_queue;
use crate::{QueueLimits, Rate, Result};

/// Sets `queue`'s limits, replacing those it had (a field left `None`: no
/// limit of that kind; all `None` removes them). Bad values are an
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) and write
/// nothing.
///
/// ```no_run
/// # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// use pgfifo::{admin, QueueLimits, Rate};
///
/// let limits = QueueLimits::new().concurrency(20).rate(Rate::per_minute(100)?);
/// admin::set_queue_limits(conn, "payments", limits).await?;
/// # Ok(())
/// # }
/// ```
pub async fn set_queue_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    limits: QueueLimits,
) -> Result<Option<QueueLimits>> {
    change_queue_limits(conn, queue, &["concurrency", "rate", "burst"], limits).await
}

/// Changes the limits of `queue` named in `change` (`"concurrency"`,
/// `"rate"`, `"burst"`) to the values in `limits` (`None`: unset) and keeps
/// the others, in one statement. Returns what is set now, `None` when no
/// limit is left.
pub async fn change_queue_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
    change: &[&str],
    limits: QueueLimits,
) -> Result<Option<QueueLimits>> {
    validate_queue(queue)?;
    limits.validate_values()?;
    let values = QueueControlRow {
        concurrency: limits.concurrency.map(|n| n as i32),
        rate_count: limits.rate.map(|rate| rate.count() as i32),
        rate_period_ms: limits.rate.map(Rate::period_ms),
        burst: limits.burst.map(|b| b as i32),
    };
    pinned(conn, async |conn| {
        let row = db::admin::queue_limits::change_queue_control(conn, queue, change, values)
            .await
            .map_err(|err| match &err {
                // The burst left set after the change has no rate to go
                // with: a bad argument (nothing was written), not a failure.
                diesel::result::Error::DatabaseError(_, info)
                    if info.constraint_name() == Some("pgfifo_queue_burst_needs_rate") =>
                {
                    crate::Error::InvalidArgument(
                        "queue burst: a burst needs a rate (set the rate too, or clear the burst)"
                            .into(),
                    )
                }
                _ => err.into(),
            })?;
        Ok(row.map(queue_limits_of_row))
    })
    .await
}

/// Removes `queue`'s limits. Returns `false` if it had none.
pub async fn reset_queue_limits(conn: &mut AsyncPgConnection, queue: &str) -> Result<bool> {
    let had = queue_limits(conn, queue).await?.is_some();
    set_queue_limits(conn, queue, QueueLimits::new()).await?;
    Ok(had)
}

/// The limits set for `queue`, `None` when it has none.
pub async fn queue_limits(
    conn: &mut AsyncPgConnection,
    queue: &str,
) -> Result<Option<QueueLimits>> {
    validate_queue(queue)?;
    pinned(conn, async |conn| {
        let row = db::admin::queue_limits::queue_control(conn, queue).await?;
        Ok(row.map(queue_limits_of_row))
    })
    .await
}

/// The limits of `queue` on a connection already pinned (for status).
pub(super) async fn read(conn: &mut AsyncPgConnection, queue: &str) -> Result<Option<QueueLimits>> {
    let row = db::admin::queue_limits::queue_control(conn, queue).await?;
    Ok(row.map(queue_limits_of_row))
}

pub(super) fn queue_limits_of_row(row: QueueControlRow) -> QueueLimits {
    QueueLimits {
        concurrency: row.concurrency.map(|n| n as u32),
        rate: rate_of(row.rate_count, row.rate_period_ms),
        burst: row.burst.map(|b| b as u32),
    }
}

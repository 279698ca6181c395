//! Batches' progress: the listing ([`batches`]) and one batch with its jobs
//! and callbacks ([`batch`]). Read-only (docs/batches.md). The types are
//! [`crate::batch`]'s.

use diesel_async::AsyncPgConnection;

use crate::batch::{progress, BatchProgress, BatchSummary};
use crate::db;
use crate::db::pooler::pinned;
use crate::{BatchId, Error, Result};

/// The newest batches first: at most `limit` (1 to 1,000), with ids below
/// `before` (`None`: from the newest; pass the last id shown to page on),
/// only those not completed when `unfinished_only`.
pub async fn batches(
    conn: &mut AsyncPgConnection,
    before: Option<BatchId>,
    limit: u32,
    unfinished_only: bool,
) -> Result<Vec<BatchProgress>> {
    if !(1..=1_000).contains(&limit) {
        return Err(Error::InvalidArgument(format!(
            "limit must be between 1 and 1000, got {limit}"
        )));
    }
    let rows = db::batch::batches(conn, before, i64::from(limit), unfinished_only).await?;
    Ok(rows.into_iter().map(progress).collect())
}

/// Batch `id` with its counts, jobs and callbacks; `None` if no batch has
/// this id (the same as [`crate::batch::summary`]).
pub async fn batch(conn: &mut AsyncPgConnection, id: BatchId) -> Result<Option<BatchSummary>> {
    crate::batch::summary(conn, id).await
}

/// Deletes up to `limit` batches that retention has emptied: completed, with
/// none of their jobs and none of their callbacks' jobs left (a failed job
/// kept for an operator keeps its batch). Their counts, members and
/// callbacks go with them. Returns how many. Runners with retention call it
/// on every pass (docs/batches.md, "Retention").
pub async fn clean_batches(conn: &mut AsyncPgConnection, limit: i32) -> Result<u64> {
    pinned(conn, async |conn| {
        Ok(db::admin::ops::clean_batches(conn, limit)
            .await?
            .unsigned_abs())
    })
    .await
}

//! The statements of [`crate::admin`]'s queue limits: one call of
//! `pgfifo.change_queue_control` (`db/functions/16_queue_limits.sql`), and
//! reading its row.

use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// A queue's limits as stored; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, QueryableByName)]
pub(crate) struct QueueControlRow {
    #[diesel(sql_type = Nullable<Integer>)]
    pub concurrency: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub rate_count: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub rate_period_ms: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub burst: Option<i32>,
}

/// Changes the limits named in `change` (`"concurrency"`, `"rate"`,
/// `"burst"`) of `queue` to `values`, keeping the others. Returns the row
/// as it is now, `None` when no limit is left.
pub(crate) async fn change_queue_control(
    conn: &mut AsyncPgConnection,
    queue: &str,
    change: &[&str],
    values: QueueControlRow,
) -> diesel::QueryResult<Option<QueueControlRow>> {
    let rows: Vec<QueueControlRow> = diesel::sql_query(
        "SELECT concurrency, rate_count, rate_period_ms, burst \
         FROM pgfifo.change_queue_control($1, $2, $3, $4, $5, $6)",
    )
    .bind::<Text, _>(queue)
    .bind::<Array<Text>, _>(change)
    .bind::<Nullable<Integer>, _>(values.concurrency)
    .bind::<Nullable<Integer>, _>(values.rate_count)
    .bind::<Nullable<BigInt>, _>(values.rate_period_ms)
    .bind::<Nullable<Integer>, _>(values.burst)
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

/// The limits of `queue`, `None` when it has none.
pub(crate) async fn queue_control(
    conn: &mut AsyncPgConnection,
    queue: &str,
) -> diesel::QueryResult<Option<QueueControlRow>> {
    let rows: Vec<QueueControlRow> = diesel::sql_query(
        "SELECT concurrency, rate_count, rate_period_ms, burst \
         FROM pgfifo.queue_control WHERE queue = $1",
    )
    .bind::<Text, _>(queue)
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

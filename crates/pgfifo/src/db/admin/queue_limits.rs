//! The statements of [`crate::admin`]'s queue limits: one call of
//! `pgfifo.change_queue_control` (`db/functions/16_queue_limits.sql`), and
//! reading its row.

use diesel::sql_types::{Array, BigInt, Double, Integer, Nullable, Text};
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

/// A queue's limits with what they hold back now (see
/// [`queue_usage`]).
#[derive(Debug, Clone, Copy, QueryableByName)]
pub(crate) struct QueueUsageRow {
    #[diesel(embed)]
    pub limits: QueueControlRow,
    /// Its slots held now (with a concurrency), of every slot row.
    #[diesel(sql_type = Nullable<Integer>)]
    pub slots_held: Option<i32>,
    /// Of those, the slots a pick may take (0 .. concurrency-1): at the
    /// concurrency, the queue is at its limit.
    #[diesel(sql_type = Nullable<Integer>)]
    pub slots_held_below_limit: Option<i32>,
    /// Tokens in its bucket now (with a rate).
    #[diesel(sql_type = Nullable<Double>)]
    pub tokens: Option<f64>,
    /// When its next start is allowed by its rate, µs since the epoch
    /// (now, when it has a token).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub next_token_us: Option<i64>,
}

/// The limits of `queue` and what they hold back now, `None` when it has
/// no limits. A slot is held while the advisory lock that goes with its
/// row (class 1885824625, 'pgfq', see `16_queue_limits.sql`) is granted to
/// some session: a pick's transaction takes it with the row and keeps it
/// while its lane runs the queue's jobs, and a long run keeps it at
/// session level. Reading `pg_locks` takes no lock, and counts what the
/// server holds, not what runners say.
pub(crate) async fn queue_usage(
    conn: &mut AsyncPgConnection,
    queue: &str,
) -> diesel::QueryResult<Option<QueueUsageRow>> {
    let rows: Vec<QueueUsageRow> = diesel::sql_query(
        "WITH held AS (
             SELECT DISTINCT l.objid::integer AS key FROM pg_locks AS l
             WHERE l.locktype = 'advisory' AND l.granted
               AND l.classid = 1885824625 AND l.objsubid = 2
               AND l.database = (SELECT d.oid FROM pg_database AS d
                                 WHERE d.datname = current_database())),
         slots AS (
             SELECT s.slot FROM pgfifo.queue_slot AS s
             WHERE s.queue = $1
               AND pgfifo.queue_slot_key(s.queue, s.slot) IN (SELECT h.key FROM held AS h))
         SELECT c.concurrency, c.rate_count, c.rate_period_ms, c.burst,
                CASE WHEN c.concurrency IS NOT NULL
                     THEN (SELECT count(*) FROM slots)::integer END AS slots_held,
                CASE WHEN c.concurrency IS NOT NULL
                     THEN (SELECT count(*) FROM slots WHERE slots.slot < c.concurrency)::integer
                END AS slots_held_below_limit,
                CASE WHEN c.rate_count IS NOT NULL
                     THEN pgfifo.queue_bucket_tokens(c.queue, now(), c.rate_count,
                                                     c.rate_period_ms,
                                                     coalesce(c.burst, c.rate_count)) END AS tokens,
                CASE WHEN c.rate_count IS NOT NULL
                     THEN (extract(epoch FROM pgfifo.queue_bucket_due(
                               c.queue, now(), c.rate_count, c.rate_period_ms,
                               coalesce(c.burst, c.rate_count))) * 1e6)::bigint END AS next_token_us
         FROM pgfifo.queue_control AS c WHERE c.queue = $1",
    )
    .bind::<Text, _>(queue)
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

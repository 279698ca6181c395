//! The statement of [`enqueue_batch_outcomes`](crate::enqueue_batch_outcomes),
//! and of [`enqueue_batch`](crate::enqueue_batch) for jobs with a
//! de-duplication window.

use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::pooler::pinned;
use super::statement::{bind, cached};
use crate::db::enqueue::EnqueueArrays;

/// The window arguments of `pgfifo.enqueue_outcomes`, one element per job
/// (`None`: no window).
#[derive(Debug, Default)]
pub(crate) struct WindowArrays {
    pub key: Vec<Option<String>>,
    pub mode: Vec<Option<&'static str>>,
    pub period_us: Vec<Option<i64>>,
}

#[derive(QueryableByName)]
struct OutcomesRow {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
    #[diesel(sql_type = Array<Text>)]
    outcomes: Vec<String>,
}

const ENQUEUE_OUTCOMES: &str = "SELECT o.ids, o.outcomes \
     FROM pgfifo.enqueue_outcomes($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) AS o";

/// Enqueues a batch, with windows, in the caller's transaction if one is
/// open; returns each row's job id and outcome (`created`, `deduplicated`,
/// `debounced`, `throttled`) in input order.
pub(crate) async fn enqueue_outcomes(
    conn: &mut AsyncPgConnection,
    jobs: EnqueueArrays,
    windows: WindowArrays,
) -> diesel::QueryResult<(Vec<i64>, Vec<String>)> {
    let statement = cached(
        ENQUEUE_OUTCOMES,
        (
            bind::<Array<Text>, _>(jobs.queue),
            bind::<Array<Nullable<Text>>, _>(jobs.group),
            bind::<Array<Text>, _>(jobs.kind),
            bind::<Array<Jsonb>, _>(jobs.payload),
            bind::<Array<SmallInt>, _>(jobs.priority),
            bind::<Array<Integer>, _>(jobs.max_attempts),
            bind::<Array<Nullable<Text>>, _>(jobs.unique_key),
            bind::<Array<Nullable<BigInt>>, _>(jobs.run_at_us),
            bind::<Array<Nullable<BigInt>>, _>(jobs.delay_us),
            bind::<Array<Nullable<Text>>, _>(windows.key),
            bind::<Array<Nullable<Text>>, _>(windows.mode),
            bind::<Array<Nullable<BigInt>>, _>(windows.period_us),
        ),
    );
    let row: OutcomesRow = pinned(conn, async |conn| statement.get_result(conn).await).await?;
    Ok((row.ids, row.outcomes))
}

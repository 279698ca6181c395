//! The statements of [`crate::admin`]'s operations: one call of a schema
//! function each (`db/functions/7*.sql`, `80_retention.sql`, where the
//! locking of each is described).

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Double, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// What `pgfifo.retry_jobs` did with one job: `retried`, `not_failed`,
/// `unique_key_taken` or `missing`.
#[derive(QueryableByName, Debug)]
pub(crate) struct RetryRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub result: String,
}

/// Retries failed jobs `ids`.
pub(crate) async fn retry_jobs(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<RetryRow>> {
    diesel::sql_query("SELECT id, result FROM pgfifo.retry_jobs($1)")
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)
        .await
}

/// Retries every failed job of `queue` (of `group` only, if given), in id
/// order, in one call.
pub(crate) async fn retry_failed(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> diesel::QueryResult<Vec<RetryRow>> {
    diesel::sql_query(
        "SELECT id, result FROM pgfifo.retry_jobs(ARRAY(
             SELECT j.id FROM pgfifo.job AS j
             WHERE j.queue = $1 AND j.state = 'failed'
               AND ($2::text IS NULL OR j.group_id = $2)
             ORDER BY j.id))",
    )
    .bind::<Text, _>(queue)
    .bind::<Nullable<Text>, _>(group)
    .load(conn)
    .await
}

#[derive(QueryableByName)]
struct TextRow {
    #[diesel(sql_type = Text)]
    value: String,
}

/// Cancels job `id`: `cancelled`, `running`, `not_queued` or `missing`.
pub(crate) async fn cancel_job(
    conn: &mut AsyncPgConnection,
    id: i64,
    reason: Option<&str>,
) -> diesel::QueryResult<String> {
    let row: TextRow = diesel::sql_query("SELECT pgfifo.cancel_job($1, $2) AS value")
        .bind::<BigInt, _>(id)
        .bind::<Nullable<Text>, _>(reason)
        .get_result(conn)
        .await?;
    Ok(row.value)
}

/// Job `id`'s stored state, if it exists.
pub(crate) async fn job_state(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Option<String>> {
    let rows: Vec<TextRow> =
        diesel::sql_query("SELECT state AS value FROM pgfifo.job WHERE id = $1")
            .bind::<BigInt, _>(id)
            .load(conn)
            .await?;
    Ok(rows.into_iter().next().map(|r| r.value))
}

#[derive(QueryableByName)]
struct OptIdRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
}

/// Skips the head of a group; the skipped job, if any. Raises
/// [`Refusal::GroupBusy`](crate::db::error::Refusal::GroupBusy) when the head
/// is running.
pub(crate) async fn skip_head(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
    reason: Option<&str>,
) -> diesel::QueryResult<Option<i64>> {
    let row: OptIdRow = diesel::sql_query("SELECT pgfifo.skip_head($1, $2, $3) AS id")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .bind::<Nullable<Text>, _>(reason)
        .get_result(conn)
        .await?;
    Ok(row.id)
}

#[derive(QueryableByName)]
struct BoolRow {
    #[diesel(sql_type = Nullable<Bool>)]
    value: Option<bool>,
}

/// Pauses a group; `false` if it was paused already.
pub(crate) async fn pause_group(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> diesel::QueryResult<bool> {
    let row: BoolRow = diesel::sql_query("SELECT pgfifo.pause_group($1, $2) AS value")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .get_result(conn)
        .await?;
    Ok(row.value.unwrap_or(false))
}

/// Resumes a group; `false` if it was not paused.
pub(crate) async fn resume_group(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> diesel::QueryResult<bool> {
    let row: BoolRow = diesel::sql_query("SELECT pgfifo.resume_group($1, $2) AS value")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .get_result(conn)
        .await?;
    Ok(row.value.unwrap_or(false))
}

/// Sets a queue's paused flag; returns the previous one.
pub(crate) async fn set_queue_paused(
    conn: &mut AsyncPgConnection,
    queue: &str,
    paused: bool,
) -> diesel::QueryResult<bool> {
    let row: BoolRow = diesel::sql_query("SELECT pgfifo.set_queue_paused($1, $2) AS value")
        .bind::<Text, _>(queue)
        .bind::<Bool, _>(paused)
        .get_result(conn)
        .await?;
    Ok(row.value.unwrap_or(false))
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Sets a queue's failure policy (`continue` or `hold`); the number of held
/// groups it released.
pub(crate) async fn set_failure_policy(
    conn: &mut AsyncPgConnection,
    queue: &str,
    policy: &str,
) -> diesel::QueryResult<i64> {
    let row: CountRow = diesel::sql_query("SELECT pgfifo.set_failure_policy($1, $2)::bigint AS n")
        .bind::<Text, _>(queue)
        .bind::<Text, _>(policy)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// What one batch of `pgfifo.purge_jobs` did.
#[derive(QueryableByName, Debug)]
pub(crate) struct PurgeRow {
    #[diesel(sql_type = BigInt)]
    pub deleted: i64,
    #[diesel(sql_type = BigInt)]
    pub last_id: i64,
    #[diesel(sql_type = Bool)]
    pub done: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub first_pending: Option<i64>,
}

/// Deletes jobs in `states` finished more than `older_than` ago, among the
/// `batch` jobs after `after_id`, and their trace contexts.
pub(crate) async fn purge_batch(
    conn: &mut AsyncPgConnection,
    older_than: Duration,
    states: &[&str],
    after_id: i64,
    batch: i32,
) -> diesel::QueryResult<PurgeRow> {
    diesel::sql_query(
        // The trace contexts of the jobs deleted go with them (the range
        // walked; `purge_job_traces` runs after the purge, and sees it).
        "SELECT p.deleted, p.last_id, p.done, p.first_pending,
                pgfifo.purge_job_traces($3, p.last_id) AS traces
         FROM pgfifo.purge_jobs(now() - make_interval(secs => $1), $2, $3, $4) AS p",
    )
    .bind::<Double, _>(older_than.as_secs_f64())
    .bind::<Array<Text>, _>(states)
    .bind::<BigInt, _>(after_id)
    .bind::<Integer, _>(batch)
    .get_result(conn)
    .await
}

/// Deletes up to `limit` groups idle for more than `idle_for`; how many.
pub(crate) async fn clean_groups(
    conn: &mut AsyncPgConnection,
    idle_for: Duration,
    limit: i32,
) -> diesel::QueryResult<i64> {
    let row: CountRow =
        diesel::sql_query("SELECT pgfifo.clean_groups(now() - make_interval(secs => $1), $2) AS n")
            .bind::<Double, _>(idle_for.as_secs_f64())
            .bind::<Integer, _>(limit)
            .get_result(conn)
            .await?;
    Ok(row.n)
}

/// Deletes up to `limit` de-duplication window rows that hold nothing any
/// more; how many.
pub(crate) async fn clean_windows(
    conn: &mut AsyncPgConnection,
    limit: i32,
) -> diesel::QueryResult<i64> {
    let row: CountRow = diesel::sql_query("SELECT pgfifo.clean_windows($1) AS n")
        .bind::<Integer, _>(limit)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// Deletes up to `limit` completed batches whose jobs and callback jobs
/// retention has all purged; how many.
pub(crate) async fn clean_batches(
    conn: &mut AsyncPgConnection,
    limit: i32,
) -> diesel::QueryResult<i64> {
    let row: CountRow = diesel::sql_query("SELECT pgfifo.clean_batches($1) AS n")
        .bind::<Integer, _>(limit)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// Deletes up to `limit` rows each of the slots, buckets and snooze marks
/// of groups that no longer have a group row; returns how many.
pub(crate) async fn clean_group_controls(
    conn: &mut AsyncPgConnection,
    limit: i32,
) -> diesel::QueryResult<i64> {
    let row: CountRow = diesel::sql_query("SELECT pgfifo.clean_group_controls($1) AS n")
        .bind::<Integer, _>(limit)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

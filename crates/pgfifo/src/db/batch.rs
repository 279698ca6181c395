//! The statements of [`crate::batch`]: enqueue into a batch, close it, read
//! its summary. The counting happens in the schema's functions
//! (`functions/17_batches.sql`), called by those that write outcomes.

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::enqueue::EnqueueArrays;
use crate::db::pooler::pinned;

/// A batch's callbacks, one array element per callback: its event and the
/// arguments of `pgfifo.enqueue` for its job.
#[derive(Debug, Default)]
pub(crate) struct CallbackArrays {
    pub event: Vec<&'static str>,
    pub jobs: EnqueueArrays,
}

#[derive(QueryableByName)]
struct EnqueuedRow {
    #[diesel(sql_type = BigInt)]
    batch_id: i64,
    #[diesel(sql_type = Array<BigInt>)]
    job_ids: Vec<i64>,
}

const BATCH_ENQUEUE: &str = "SELECT batch_id, job_ids FROM pgfifo.batch_enqueue(\
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";

/// Enqueues `jobs` into batch `batch` (`None`: a new batch with
/// `description` and `callbacks`, closed unless `keep_open`), in one
/// statement; returns the batch's id and the jobs' ids in input order.
pub(crate) async fn enqueue(
    conn: &mut AsyncPgConnection,
    batch: Option<i64>,
    description: Option<&str>,
    keep_open: bool,
    callbacks: CallbackArrays,
    jobs: EnqueueArrays,
) -> diesel::QueryResult<(i64, Vec<i64>)> {
    let cb = callbacks.jobs;
    let query = diesel::sql_query(BATCH_ENQUEUE)
        .bind::<Nullable<BigInt>, _>(batch)
        .bind::<Nullable<Text>, _>(description)
        .bind::<Bool, _>(keep_open)
        .bind::<Array<Text>, _>(callbacks.event)
        .bind::<Array<Text>, _>(cb.queue)
        .bind::<Array<Nullable<Text>>, _>(cb.group)
        .bind::<Array<Text>, _>(cb.kind)
        .bind::<Array<Jsonb>, _>(cb.payload)
        .bind::<Array<SmallInt>, _>(cb.priority)
        .bind::<Array<Integer>, _>(cb.max_attempts)
        .bind::<Array<Text>, _>(jobs.queue)
        .bind::<Array<Nullable<Text>>, _>(jobs.group)
        .bind::<Array<Text>, _>(jobs.kind)
        .bind::<Array<Jsonb>, _>(jobs.payload)
        .bind::<Array<SmallInt>, _>(jobs.priority)
        .bind::<Array<Integer>, _>(jobs.max_attempts)
        .bind::<Array<Nullable<BigInt>>, _>(jobs.run_at_us)
        .bind::<Array<Nullable<BigInt>>, _>(jobs.delay_us);
    let row: EnqueuedRow = pinned(conn, async |conn| query.get_result(conn).await).await?;
    Ok((row.batch_id, row.job_ids))
}

#[derive(QueryableByName)]
struct ClosedRow {
    #[diesel(sql_type = Bool)]
    closed: bool,
}

/// Closes batch `id`; false when it was closed already.
pub(crate) async fn close(conn: &mut AsyncPgConnection, id: i64) -> diesel::QueryResult<bool> {
    let row: ClosedRow = diesel::sql_query("SELECT pgfifo.batch_close($1) AS closed")
        .bind::<BigInt, _>(id)
        .get_result(conn)
        .await?;
    Ok(row.closed)
}

/// A batch as its summary shows it.
#[derive(QueryableByName, Debug)]
pub(crate) struct BatchRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub description: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub created_at_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub closed_at_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub completed_at_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub first_failed_at_us: Option<i64>,
    #[diesel(sql_type = Integer)]
    pub total: i32,
    #[diesel(sql_type = Integer)]
    pub succeeded: i32,
    #[diesel(sql_type = Integer)]
    pub failed: i32,
    #[diesel(sql_type = Integer)]
    pub cancelled: i32,
}

/// The select list of a [`BatchRow`] from `pgfifo.batch AS b`, its counts
/// summed over its shards.
macro_rules! batch_columns {
    () => {
        "SELECT b.id, b.description,
                (extract(epoch FROM b.created_at) * 1e6)::bigint AS created_at_us,
                (extract(epoch FROM b.closed_at) * 1e6)::bigint AS closed_at_us,
                (extract(epoch FROM b.completed_at) * 1e6)::bigint AS completed_at_us,
                (extract(epoch FROM b.first_failed_at) * 1e6)::bigint AS first_failed_at_us,
                b.total, s.succeeded, s.failed, s.cancelled
         FROM pgfifo.batch AS b
         CROSS JOIN LATERAL (
             SELECT coalesce(sum(x.succeeded), 0)::integer AS succeeded,
                    coalesce(sum(x.failed), 0)::integer AS failed,
                    coalesce(sum(x.cancelled), 0)::integer AS cancelled
             FROM pgfifo.batch_shard AS x WHERE x.batch_id = b.id) AS s "
    };
}

/// Batch `id`, if it exists.
pub(crate) async fn batch(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Option<BatchRow>> {
    diesel::sql_query(concat!(batch_columns!(), "WHERE b.id = $1"))
        .bind::<BigInt, _>(id)
        .get_result(conn)
        .await
        .map(Some)
        .or_else(not_found_is_none)
}

/// The newest batches first: at most `limit`, with ids below `before`
/// (`None`: from the newest), only those not completed if `open_only`.
pub(crate) async fn batches(
    conn: &mut AsyncPgConnection,
    before: Option<i64>,
    limit: i64,
    open_only: bool,
) -> diesel::QueryResult<Vec<BatchRow>> {
    diesel::sql_query(concat!(
        batch_columns!(),
        "WHERE ($1::bigint IS NULL OR b.id < $1) AND (NOT $2 OR b.completed_at IS NULL)
         ORDER BY b.id DESC LIMIT $3"
    ))
    .bind::<Nullable<BigInt>, _>(before)
    .bind::<Bool, _>(open_only)
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// One job of a batch, with its state (NULL: purged).
#[derive(QueryableByName, Debug)]
pub(crate) struct MemberRow {
    #[diesel(sql_type = BigInt)]
    pub job_id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
}

/// The jobs of batch `id`, in id order, with their states.
pub(crate) async fn members(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Vec<MemberRow>> {
    diesel::sql_query(
        "SELECT m.job_id, j.state FROM pgfifo.batch_job AS m
         LEFT JOIN pgfifo.job AS j ON j.id = m.job_id
         WHERE m.batch_id = $1 ORDER BY m.job_id",
    )
    .bind::<BigInt, _>(id)
    .load(conn)
    .await
}

/// One callback of a batch.
#[derive(QueryableByName, Debug)]
pub(crate) struct CallbackRow {
    #[diesel(sql_type = Text)]
    pub event: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub group_id: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub job_id: Option<i64>,
}

/// The callbacks of batch `id`, in the order they fire when at once.
pub(crate) async fn callbacks(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Vec<CallbackRow>> {
    diesel::sql_query(
        "SELECT c.event, c.kind, c.queue, c.group_id, c.job_id FROM pgfifo.batch_callback AS c
         WHERE c.batch_id = $1
         ORDER BY array_position(ARRAY['failure', 'success', 'complete'], c.event)",
    )
    .bind::<BigInt, _>(id)
    .load(conn)
    .await
}

#[derive(QueryableByName)]
struct BatchIdRow {
    #[diesel(sql_type = BigInt)]
    batch_id: i64,
}

/// The batch job `job` belongs to, or whose callback it is.
pub(crate) async fn batch_of_job(
    conn: &mut AsyncPgConnection,
    job: i64,
) -> diesel::QueryResult<Option<i64>> {
    diesel::sql_query(
        "SELECT m.batch_id FROM pgfifo.batch_job AS m WHERE m.job_id = $1
         UNION ALL
         SELECT c.batch_id FROM pgfifo.batch_callback AS c WHERE c.job_id = $1
         LIMIT 1",
    )
    .bind::<BigInt, _>(job)
    .get_result::<BatchIdRow>(conn)
    .await
    .map(|row| Some(row.batch_id))
    .or_else(not_found_is_none)
}

fn not_found_is_none<T>(err: diesel::result::Error) -> diesel::QueryResult<Option<T>> {
    match err {
        diesel::result::Error::NotFound => Ok(None),
        err => Err(err),
    }
}

//! The statements of [`crate::admin`]'s job listings: jobs, one job and
//! its attempts (the groups' are in `group_list`). Read-only: none takes a
//! lock or changes a row.

use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::layout::{expand, Layout};

/// A job in a listing. `status` is the stored state, or for a queued job
/// `running`, `retrying`, `scheduled` or `queued`.
#[derive(QueryableByName, Debug)]
pub(crate) struct JobRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub group_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_error: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub created_us: i64,
    #[diesel(sql_type = BigInt)]
    pub run_after_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub finished_us: Option<i64>,
}

/// The select list of a [`JobRow`] from `pgfifo.job AS j`; a macro so that
/// it can be `concat!`ed into the statements that use it.
macro_rules! job_columns {
    () => {
        "j.id, j.queue, j.group_id, j.kind,
         CASE WHEN j.state <> 'queued' THEN j.state
              WHEN EXISTS (SELECT 1 FROM pgfifo.job_attempt AS a
                           WHERE /*@dist a.part = j.part AND */ a.job_id = j.id
                             AND a.attempt > j.attempts) THEN 'running'
              WHEN j.run_after >= '9999-12-31 00:00:00+00' THEN 'waiting'
              WHEN j.run_after > now() AND j.attempts > 0 THEN 'retrying'
              WHEN j.run_after > now() THEN 'scheduled'
              ELSE 'queued' END AS status,
         greatest(j.attempts, coalesce((SELECT max(a.attempt) FROM pgfifo.job_attempt AS a
                                        WHERE /*@dist a.part = j.part AND */ a.job_id = j.id),
                                       0)) AS attempts,
         j.max_attempts + j.attempt_base AS max_attempts,
         j.last_error,
         (extract(epoch FROM j.created_at) * 1e6)::bigint AS created_us,
         (extract(epoch FROM j.run_after) * 1e6)::bigint AS run_after_us,
         (extract(epoch FROM j.finished_at) * 1e6)::bigint AS finished_us"
    };
}

/// The filters of a job listing (`None`: any).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobFilter<'a> {
    pub queue: Option<&'a str>,
    pub group: Option<&'a str>,
    pub state: Option<&'a str>,
    /// Continue after this id, in the listing's order.
    pub after: Option<i64>,
    pub limit: i64,
}

macro_rules! jobs_statement {
    ($cmp:literal, $order:literal) => {
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM pgfifo.job AS j
             WHERE ($1::text IS NULL OR j.queue = $1)
               AND ($2::text IS NULL OR j.group_id = $2)
               AND ($3::text IS NULL OR j.state = $3)
               AND ($4::bigint IS NULL OR j.id ",
            $cmp,
            " $4)
             ORDER BY j.id ",
            $order,
            " LIMIT $5"
        )
    };
}

/// Jobs matching `filter`, newest first, or oldest first.
pub(crate) async fn jobs(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    filter: JobFilter<'_>,
    oldest_first: bool,
) -> diesel::QueryResult<Vec<JobRow>> {
    let text = if oldest_first {
        jobs_statement!(">", "ASC")
    } else {
        jobs_statement!("<", "DESC")
    };
    diesel::sql_query(expand(text, layout))
        .bind::<Nullable<Text>, _>(filter.queue)
        .bind::<Nullable<Text>, _>(filter.group)
        .bind::<Nullable<Text>, _>(filter.state)
        .bind::<Nullable<BigInt>, _>(filter.after)
        .bind::<BigInt, _>(filter.limit)
        .load(conn)
        .await
}

/// The finished jobs of one group among the queue's newest `window` job
/// ids, newest first (at most `limit`). No index lists a group's finished
/// jobs (one would cost every job's updates), so the walk is bounded by the
/// window instead of the table.
pub(crate) async fn group_history(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    group: &str,
    window: i64,
    limit: i64,
) -> diesel::QueryResult<Vec<JobRow>> {
    let text = concat!(
        "SELECT ",
        job_columns!(),
        " FROM pgfifo.job AS j
         WHERE j.id > (SELECT coalesce(max(m.id), 0) FROM pgfifo.job AS m) - $3
           AND j.queue = $1 AND j.group_id = $2 AND j.state <> 'queued'
         ORDER BY j.id DESC
         LIMIT $4"
    );
    diesel::sql_query(expand(text, layout))
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .bind::<BigInt, _>(window)
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await
}

/// One job with everything stored about it.
#[derive(QueryableByName, Debug)]
pub(crate) struct DetailRow {
    #[diesel(embed)]
    pub job: JobRow,
    #[diesel(sql_type = Jsonb)]
    pub payload: serde_json::Value,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub result: Option<serde_json::Value>,
    #[diesel(sql_type = SmallInt)]
    pub priority: i16,
    #[diesel(sql_type = Nullable<Text>)]
    pub unique_key: Option<String>,
    /// It is its group's head (runs next, is running, or holds the group).
    #[diesel(sql_type = Bool)]
    pub is_head: bool,
}

/// Job `id`, or `None`.
pub(crate) async fn job(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    id: i64,
) -> diesel::QueryResult<Option<DetailRow>> {
    let text = concat!(
        "SELECT ",
        job_columns!(),
        ", j.payload, j.result, j.priority, j.unique_key,
           EXISTS (SELECT 1 FROM pgfifo.queue_group AS g
                   WHERE /*@dist g.part = j.part AND */ g.queue = j.queue
                     AND g.group_id = j.group_id AND g.head_id = j.id) AS is_head
         FROM pgfifo.job AS j WHERE j.id = $1"
    );
    let rows: Vec<DetailRow> = diesel::sql_query(expand(text, layout))
        .bind::<BigInt, _>(id)
        .load(conn)
        .await?;
    Ok(rows.into_iter().next())
}

/// One recorded attempt.
#[derive(QueryableByName, Debug)]
pub(crate) struct AttemptRow {
    #[diesel(sql_type = Integer)]
    pub attempt: i32,
    #[diesel(sql_type = Text)]
    pub runner: String,
    #[diesel(sql_type = BigInt)]
    pub started_us: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub finished_us: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
}

/// Every recorded attempt of job `id`, oldest first.
pub(crate) async fn attempts(
    conn: &mut AsyncPgConnection,
    id: i64,
) -> diesel::QueryResult<Vec<AttemptRow>> {
    diesel::sql_query(
        "SELECT attempt, runner,
                (extract(epoch FROM started_at) * 1e6)::bigint AS started_us,
                (extract(epoch FROM finished_at) * 1e6)::bigint AS finished_us,
                error
         FROM pgfifo.job_attempt WHERE job_id = $1 ORDER BY attempt",
    )
    .bind::<BigInt, _>(id)
    .load(conn)
    .await
}

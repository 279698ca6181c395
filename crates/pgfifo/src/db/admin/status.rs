//! The statements of [`crate::admin`]'s status and of the runner's sampled
//! gauges. Nothing here counts the whole job table (see
//! [`crate::admin::queue_status`] for what is counted and what estimated).

use std::time::Duration;

use diesel::sql_types::{BigInt, Bool, Double, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::db::layout::{expand, Layout};

/// Index-driven plans even before the first ANALYZE: a bitmap scan and a
/// sort of a fresh table's backlog took twice as long as walking the index.
/// (SET LOCAL: gone with the status transaction.)
const COUNTING_SETTINGS: &str = "SET LOCAL enable_bitmapscan = off;
     SET LOCAL enable_seqscan = off;
     SET LOCAL enable_sort = off;
     SET LOCAL jit = off;";

#[derive(QueryableByName)]
struct QueueRow {
    #[diesel(sql_type = Text)]
    queue: String,
}

/// Every queue with groups (or groups waiting for a runner), unfinished
/// ungrouped or failed jobs, a setting, or a runner alive within `alive`.
pub(crate) async fn queues(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    alive: Duration,
) -> diesel::QueryResult<Vec<String>> {
    // Loose index scans: one index probe per distinct queue, not per row.
    // (The distributed layout reads each shard's queues instead: Citus runs
    // a recursive CTE only within one shard.)
    let text = "/*@plain*/
         WITH RECURSIVE
             g(q) AS (SELECT min(queue) FROM pgfifo.queue_group
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.queue_group WHERE queue > g.q)
                      FROM g WHERE g.q IS NOT NULL),
             u(q) AS (SELECT min(queue) FROM pgfifo.job WHERE state = 'queued' AND group_id IS NULL
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.job
                              WHERE state = 'queued' AND group_id IS NULL AND queue > u.q)
                      FROM u WHERE u.q IS NOT NULL),
             f(q) AS (SELECT min(queue) FROM pgfifo.job WHERE state = 'failed'
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.job WHERE state = 'failed' AND queue > f.q)
                      FROM f WHERE f.q IS NOT NULL)
         SELECT q AS queue FROM g WHERE q IS NOT NULL
         UNION SELECT q FROM u WHERE q IS NOT NULL
         UNION SELECT q FROM f WHERE q IS NOT NULL
         /*@end*/
         /*@dist SELECT DISTINCT queue FROM pgfifo.queue_group
         UNION SELECT DISTINCT queue FROM pgfifo.job
               WHERE state = 'queued' AND group_id IS NULL OR state = 'failed' */
         UNION SELECT DISTINCT queue FROM pgfifo.group_wake
         UNION SELECT queue FROM pgfifo.queue_setting
         UNION SELECT unnest(queues) FROM pgfifo.runner
               WHERE heartbeat_at > now() - make_interval(secs => $1)
         ORDER BY 1";
    let rows: Vec<QueueRow> = diesel::sql_query(expand(text, layout))
        .bind::<Double, _>(alive.as_secs_f64())
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.queue).collect())
}

/// Unfinished jobs of a queue, counted up to a cap.
#[derive(QueryableByName, Debug)]
pub(crate) struct UnfinishedRow {
    /// Grouped and ungrouped, each counted up to the cap.
    #[diesel(sql_type = BigInt)]
    pub total: i64,
    /// A count stopped at the cap.
    #[diesel(sql_type = Bool)]
    pub capped: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub oldest_age_us: Option<i64>,
    /// The largest backlogs: `[{"group": g, "backlog": n}, …]`.
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub top: Option<serde_json::Value>,
}

/// The blocked groups of queue `$1`, as select items (see [`BlockedRow`]);
/// a macro so that it can be `concat!`ed into the statements that use it.
macro_rules! blocked_groups_sql {
    () => {
        "(SELECT count(*) FROM pgfifo.queue_group AS g
          WHERE g.queue = $1 AND g.ready_at IS NULL AND g.head_id IS NOT NULL) AS held_groups,
         (SELECT count(*) FROM pgfifo.group_pause AS p WHERE p.queue = $1) AS paused_groups,
         (SELECT count(*) FROM pgfifo.queue_group AS g
          JOIN pgfifo.job AS j ON j.id = g.head_id /*@dist AND j.part = g.part */
          WHERE g.queue = $1 AND g.ready_at IS NOT NULL AND g.ready_at > now()
            AND j.state = 'queued' AND j.attempts > 0
            AND NOT EXISTS (SELECT 1 FROM pgfifo.group_snooze AS z
                            WHERE z.queue = g.queue AND z.group_id = g.group_id /*@dist AND z.part = g.part */
                              AND z.until > now() AND z.job_id = g.head_id)) AS retrying_groups,
         (SELECT count(*) FROM pgfifo.group_snooze AS z
          JOIN pgfifo.queue_group AS g
            ON g.queue = z.queue AND g.group_id = z.group_id /*@dist AND g.part = z.part */
          WHERE z.queue = $1 AND z.until > now() AND z.job_id = g.head_id
            AND g.ready_at > now()) AS snoozed_groups"
    };
}

/// Groups of a queue that cannot run now, by reason.
#[derive(QueryableByName, Debug)]
pub(crate) struct BlockedRow {
    #[diesel(sql_type = BigInt)]
    pub held_groups: i64,
    #[diesel(sql_type = BigInt)]
    pub paused_groups: i64,
    #[diesel(sql_type = BigInt)]
    pub retrying_groups: i64,
    #[diesel(sql_type = BigInt)]
    pub snoozed_groups: i64,
}

/// The small figures of a queue: settings, runners, capped counts of the
/// states with partial indexes, and the planner's estimates.
#[derive(QueryableByName, Debug)]
pub(crate) struct SmallCounts {
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    #[diesel(sql_type = Text)]
    pub policy: String,
    #[diesel(sql_type = BigInt)]
    pub running: i64,
    #[diesel(sql_type = BigInt)]
    pub runners: i64,
    #[diesel(sql_type = BigInt)]
    pub retrying: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub succeeded_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub cancelled_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub queued_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub failed_est: Option<i64>,
    #[diesel(embed)]
    pub blocked: BlockedRow,
}

/// A queue's figures: the small ones and its unfinished jobs (counted up to
/// `cap`, with the `top` largest group backlogs), in one transaction.
pub(crate) async fn queue_figures(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    cap: i64,
    top: i64,
    alive: Duration,
) -> diesel::QueryResult<(SmallCounts, UnfinishedRow)> {
    conn.transaction(async |conn| {
        conn.batch_execute(COUNTING_SETTINGS).await?;
        let small = small_counts(conn, layout, queue, cap, alive).await?;
        let unfinished = unfinished(conn, layout, queue, cap, top).await?;
        Ok((small, unfinished))
    })
    .await
}

async fn small_counts(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    cap: i64,
    alive: Duration,
) -> diesel::QueryResult<SmallCounts> {
    let text = concat!(
        "SELECT
             coalesce((SELECT s.paused FROM pgfifo.queue_setting AS s WHERE s.queue = $1), false) AS paused,
             coalesce((SELECT s.failure_policy FROM pgfifo.queue_setting AS s WHERE s.queue = $1),
                      'continue') AS policy,
             coalesce((SELECT sum((r.running ->> $1)::bigint) FROM pgfifo.runner AS r
                       WHERE r.heartbeat_at > now() - make_interval(secs => $3)), 0)::bigint AS running,
             (SELECT count(*) FROM pgfifo.runner AS r
              WHERE r.heartbeat_at > now() - make_interval(secs => $3) AND $1 = ANY (r.queues)) AS runners,
             (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.queue = $1 AND j.state = 'queued' AND j.attempts > 0
                                      AND j.run_after > now() LIMIT $2) AS s) AS retrying,
             (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.queue = $1 AND j.state = 'failed' LIMIT $2) AS s) AS failed,
             pgfifo.estimate_jobs($1, 'succeeded') AS succeeded_est,
             pgfifo.estimate_jobs($1, 'cancelled') AS cancelled_est,
             pgfifo.estimate_jobs($1, 'queued') AS queued_est,
             pgfifo.estimate_jobs($1, 'failed') AS failed_est,",
        blocked_groups_sql!()
    );
    diesel::sql_query(expand(text, layout))
        .bind::<Text, _>(queue)
        .bind::<BigInt, _>(cap)
        .bind::<Double, _>(alive.as_secs_f64())
        .get_result(conn)
        .await
}

async fn unfinished(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    cap: i64,
    top: i64,
) -> diesel::QueryResult<UnfinishedRow> {
    // The oldest job's age: the plain layout reads the creation time of the
    // lowest id; Citus refuses that correlated lookup beside the CTEs, so
    // the distributed layout takes the least creation time of the rows read.
    let text = "WITH per AS (
             SELECT s.group_id, count(*) AS n, min(s.id) AS oldest /*@dist , min(s.created_at) AS oldest_at */
             FROM (SELECT j.group_id, j.id /*@dist , j.created_at */ FROM pgfifo.job AS j
                   WHERE j.queue = $1 AND j.state = 'queued' AND j.group_id IS NOT NULL
                   LIMIT $2) AS s
             GROUP BY s.group_id),
         solo AS (
             SELECT count(*) AS n, min(s.id) AS oldest /*@dist , min(s.created_at) AS oldest_at */
             FROM (SELECT j.id /*@dist , j.created_at */ FROM pgfifo.job AS j
                   WHERE j.queue = $1 AND j.state = 'queued' AND j.group_id IS NULL
                   LIMIT $2) AS s),
         sums AS (
             SELECT coalesce((SELECT sum(n) FROM per), 0)::bigint AS grouped,
                    (SELECT n FROM solo) AS ungrouped,
                    least((SELECT min(oldest) FROM per), (SELECT oldest FROM solo)) AS oldest
                    /*@dist , least((SELECT min(oldest_at) FROM per),
                                    (SELECT oldest_at FROM solo)) AS oldest_at */)
         SELECT s.grouped + s.ungrouped AS total,
                s.grouped >= $2 OR s.ungrouped >= $2 AS capped,
                /*@plain*/ (SELECT (extract(epoch FROM now() - j.created_at) * 1e6)::bigint
                 FROM pgfifo.job AS j WHERE j.id = s.oldest) /*@end*/
                /*@dist (extract(epoch FROM now() - s.oldest_at) * 1e6)::bigint */ AS oldest_age_us,
                (SELECT jsonb_agg(jsonb_build_object('group', t.group_id, 'backlog', t.n))
                 FROM (SELECT group_id, n FROM per ORDER BY n DESC, group_id LIMIT $3) AS t) AS top
         FROM sums AS s";
    diesel::sql_query(expand(text, layout))
        .bind::<Text, _>(queue)
        .bind::<BigInt, _>(cap)
        .bind::<BigInt, _>(top)
        .get_result(conn)
        .await
}

/// What the runner samples for a queue's gauges.
#[derive(QueryableByName, Debug)]
pub(crate) struct GaugeRow {
    #[diesel(sql_type = BigInt)]
    pub depth: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub lag_us: Option<i64>,
    #[diesel(embed)]
    pub blocked: BlockedRow,
}

/// Samples the gauges of one queue: unfinished jobs up to `cap`, the oldest
/// active head's age, the blocked groups.
pub(crate) async fn gauges(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    cap: i64,
) -> diesel::QueryResult<GaugeRow> {
    let text = concat!(
        "SELECT
             (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.queue = $1 AND j.state = 'queued' LIMIT $2) AS s) AS depth,
             (SELECT (extract(epoch FROM now() - min(j.created_at)) * 1e6)::bigint
              FROM pgfifo.queue_group AS g
              JOIN pgfifo.job AS j ON j.id = g.head_id /*@dist AND j.part = g.part */
              WHERE g.queue = $1 AND g.ready_at IS NOT NULL AND j.state = 'queued') AS lag_us,",
        blocked_groups_sql!()
    );
    diesel::sql_query(expand(text, layout))
        .bind::<Text, _>(queue)
        .bind::<BigInt, _>(cap)
        .get_result(conn)
        .await
}

/// A live runner's row.
#[derive(QueryableByName, Debug)]
pub(crate) struct RunnerRow {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = diesel::sql_types::Array<Text>)]
    pub queues: Vec<String>,
    #[diesel(sql_type = BigInt)]
    pub running: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub release: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub started_at_us: i64,
    #[diesel(sql_type = BigInt)]
    pub heartbeat_age_us: i64,
}

/// The runners whose heartbeat is younger than `alive`, by name, with the
/// jobs each runs now (summed over its queues).
pub(crate) async fn runners(
    conn: &mut AsyncPgConnection,
    alive: Duration,
) -> diesel::QueryResult<Vec<RunnerRow>> {
    diesel::sql_query(
        "SELECT r.name, r.queues, r.release,
                coalesce((SELECT sum(v::bigint) FROM jsonb_each_text(r.running) AS e(k, v)), 0)::bigint
                    AS running,
                (extract(epoch FROM r.started_at) * 1e6)::bigint AS started_at_us,
                (extract(epoch FROM now() - r.heartbeat_at) * 1e6)::bigint AS heartbeat_age_us
         FROM pgfifo.runner AS r
         WHERE r.heartbeat_at > now() - make_interval(secs => $1)
         ORDER BY r.name",
    )
    .bind::<Double, _>(alive.as_secs_f64())
    .load(conn)
    .await
}

/// Jobs finished in one minute (of one queue, or of all).
#[derive(QueryableByName, Debug)]
pub(crate) struct MinuteRow {
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = BigInt)]
    pub minute_us: i64,
    #[diesel(sql_type = BigInt)]
    pub succeeded: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
}

/// The per-minute counts of the last `minutes` minutes (the current one
/// included), by queue and minute.
pub(crate) async fn finished_per_minute(
    conn: &mut AsyncPgConnection,
    minutes: i32,
) -> diesel::QueryResult<Vec<MinuteRow>> {
    diesel::sql_query(
        "SELECT queue, (extract(epoch FROM minute) * 1e6)::bigint AS minute_us, succeeded, failed
         FROM pgfifo.queue_minute
         WHERE minute > date_trunc('minute', now()) - make_interval(mins => $1)
         ORDER BY queue, minute",
    )
    .bind::<diesel::sql_types::Integer, _>(minutes)
    .load(conn)
    .await
}

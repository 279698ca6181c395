//! The statements of the runner's periodic tasks: its heartbeat row in
//! `pgfifo.runner`, and retention's session lock. (Retention's deletes are
//! the admin API's, in [`super::admin`].)

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Double, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::pooler::pinned;

/// What one heartbeat learnt.
#[derive(QueryableByName, Debug)]
pub(crate) struct Beat {
    /// Seconds since the previous heartbeat of a row of the same name.
    #[diesel(sql_type = Nullable<Double>)]
    pub previous_age_s: Option<f64>,
    /// The database's schema version now (a rolling deploy may have
    /// migrated it since the runner started).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub schema_version: Option<i64>,
}

/// A runner's heartbeat row, as written.
#[derive(Debug)]
pub(crate) struct RunnerRow<'a> {
    pub name: &'a str,
    pub release: &'a str,
    pub queues: &'a [String],
    /// Jobs running now, per queue: `{"queue": n}`.
    pub running: serde_json::Value,
    /// The first beat of this runner: resets `started_at`.
    pub starting: bool,
    /// The schedules it declares: `{"name": definition}`.
    pub schedules: &'a serde_json::Value,
}

/// Upserts the runner's heartbeat row.
pub(crate) async fn beat(
    conn: &mut AsyncPgConnection,
    row: RunnerRow<'_>,
) -> diesel::QueryResult<Beat> {
    pinned(conn, async |conn| {
        // The CTE reads the row as it was before this statement's upsert.
        diesel::sql_query(
            "WITH previous AS (SELECT r.heartbeat_at FROM pgfifo.runner AS r WHERE r.name = $1)
             INSERT INTO pgfifo.runner AS r (name, started_at, heartbeat_at, queues, running, release,
                                             schedules)
             VALUES ($1, now(), now(), $2, $3, $5, $6)
             ON CONFLICT (name) DO UPDATE
             SET started_at = CASE WHEN $4 THEN now() ELSE r.started_at END,
                 heartbeat_at = now(), queues = EXCLUDED.queues, running = EXCLUDED.running,
                 release = EXCLUDED.release, schedules = EXCLUDED.schedules
             RETURNING (SELECT extract(epoch FROM now() - p.heartbeat_at)::float8
                        FROM previous AS p) AS previous_age_s,
                       (SELECT max(m.version) FROM pgfifo.schema_migrations AS m) AS schema_version",
        )
        .bind::<Text, _>(row.name)
        .bind::<Array<Text>, _>(row.queues)
        .bind::<Jsonb, _>(row.running)
        .bind::<Bool, _>(row.starting)
        .bind::<Text, _>(row.release)
        .bind::<Jsonb, _>(row.schedules)
        .get_result(conn)
        .await
    })
    .await
}

/// Deletes the rows of runners whose heartbeat is older than `age` (they
/// died without shutting down).
pub(crate) async fn delete_stale_runners(
    conn: &mut AsyncPgConnection,
    age: Duration,
) -> diesel::QueryResult<usize> {
    pinned(conn, async |conn| {
        diesel::sql_query(
            "DELETE FROM pgfifo.runner WHERE heartbeat_at < now() - make_interval(secs => $1)",
        )
        .bind::<Double, _>(age.as_secs_f64())
        .execute(conn)
        .await
    })
    .await
}

/// Deletes runner `name`'s row (it shuts down).
pub(crate) async fn delete_runner(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> diesel::QueryResult<usize> {
    pinned(conn, async |conn| {
        diesel::sql_query("DELETE FROM pgfifo.runner WHERE name = $1")
            .bind::<Text, _>(name)
            .execute(conn)
            .await
    })
    .await
}

#[derive(QueryableByName)]
struct LockRow {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

/// Takes session advisory lock `key` without waiting; whether it was granted.
pub(crate) async fn try_session_lock(
    conn: &mut AsyncPgConnection,
    key: i64,
) -> diesel::QueryResult<bool> {
    let row: LockRow = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
        .bind::<BigInt, _>(key)
        .get_result(conn)
        .await?;
    Ok(row.locked)
}

/// Adds jobs finished to the current minute's row of each queue
/// (`pgfifo.queue_minute`), and deletes its rows older than two hours, in
/// one transaction (so that counts put back after a failure are never
/// counted twice). `finished` is `(queue, succeeded, failed)`, sorted here
/// by queue so that runners lock the rows in one order.
pub(crate) async fn record_finished(
    conn: &mut AsyncPgConnection,
    finished: &[(String, i64, i64)],
) -> diesel::QueryResult<()> {
    let mut rows = finished.to_vec();
    rows.sort();
    let queues: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let succeeded: Vec<i64> = rows.iter().map(|r| r.1).collect();
    let failed: Vec<i64> = rows.iter().map(|r| r.2).collect();
    conn.transaction(async |conn| {
        diesel::sql_query(
            "INSERT INTO pgfifo.queue_minute AS m (queue, minute, succeeded, failed)
             SELECT t.q, date_trunc('minute', now()), t.s, t.f
             FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS t(q, s, f)
             ON CONFLICT (queue, minute) DO UPDATE
             SET succeeded = m.succeeded + EXCLUDED.succeeded, failed = m.failed + EXCLUDED.failed",
        )
        .bind::<Array<Text>, _>(&queues)
        .bind::<Array<BigInt>, _>(&succeeded)
        .bind::<Array<BigInt>, _>(&failed)
        .execute(conn)
        .await?;
        diesel::sql_query(
            "DELETE FROM pgfifo.queue_minute
             WHERE queue = ANY ($1) AND minute < now() - interval '2 hours'",
        )
        .bind::<Array<Text>, _>(&queues)
        .execute(conn)
        .await?;
        Ok(())
    })
    .await
}

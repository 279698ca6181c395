//! The statements of `pgfifo::testing` (the `testing` feature): reading
//! what was enqueued, making delayed work due for a drain, holding back the
//! work a drain must not pick, and creating test databases.
//!
//! A drain itself runs the runner's own statements (`db::runner`: promote,
//! pick, start_attempts, complete); only what a runner never does lives here.

use diesel::sql_types::{BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

/// One stored job, as the testing helpers list it.
#[derive(Debug, QueryableByName)]
pub(crate) struct JobRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub group_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Jsonb)]
    pub payload: serde_json::Value,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Integer)]
    pub max_attempts: i32,
    #[diesel(sql_type = SmallInt)]
    pub priority: i16,
    /// Whether `run_after` is in the future (delayed, retrying, snoozed).
    #[diesel(sql_type = Bool)]
    pub scheduled: bool,
}

/// Jobs in enqueue order (their ids come from one sequence, taken in the
/// order of the enqueues). A NULL argument does not filter.
const LIST_JOBS: &str = "SELECT id, queue, group_id, kind, payload, state, attempts, \
                                max_attempts, priority, run_after > now() AS scheduled \
                         FROM pgfifo.job \
                         WHERE ($1::text IS NULL OR queue = $1) \
                           AND ($2::text IS NULL OR group_id = $2) \
                           AND (NOT $3 OR group_id IS NULL) \
                           AND ($4::text IS NULL OR kind = $4) \
                           AND ($5::text IS NULL OR state = $5) \
                         ORDER BY id";

/// What to list; `None` does not filter.
#[derive(Debug, Default)]
pub(crate) struct JobQuery<'a> {
    pub queue: Option<&'a str>,
    pub group: Option<&'a str>,
    pub ungrouped: bool,
    pub kind: Option<&'a str>,
    pub state: Option<&'a str>,
}

/// Lists jobs in enqueue order, on the caller's connection (and so inside
/// its transaction, if one is open).
pub(crate) async fn list_jobs(
    conn: &mut AsyncPgConnection,
    query: &JobQuery<'_>,
) -> diesel::QueryResult<Vec<JobRow>> {
    diesel::sql_query(LIST_JOBS)
        .bind::<Nullable<Text>, _>(query.queue)
        .bind::<Nullable<Text>, _>(query.group)
        .bind::<Bool, _>(query.ungrouped)
        .bind::<Nullable<Text>, _>(query.kind)
        .bind::<Nullable<Text>, _>(query.state)
        .load(conn)
        .await
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The newest job id so far (0 when there is none): the jobs a drain
/// without recursion may run are those up to it.
const NEWEST_JOB: &str = "SELECT coalesce(max(id), 0) AS n FROM pgfifo.job";

/// See [`NEWEST_JOB`].
pub(crate) async fn newest_job(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i64> {
    let row: Count = diesel::sql_query(NEWEST_JOB).get_result(conn).await?;
    Ok(row.n)
}

/// Makes the queued work of a queue (or of one group of it, `$2`) due now:
/// delayed jobs and retries (`run_after`), groups waiting for their head's
/// time or a snooze (`ready_at`), and snoozes (`group_snooze.until`, which
/// the group's `ready_at` carries). A group that waits only for its rate
/// limit's next token is left alone: the pick would push it back again. So
/// is a dependent waiting for its dependencies (its run_after is
/// `pgfifo.dependency_wait_at()`, 9999-12-31, spelt out here so that the
/// statement also runs on a schema without it): it is not waiting for a time.
/// Autocommit (each part sees the rows as they were before the statement).
/// Returns how many rows it moved.
const MAKE_DUE: &str = "WITH jobs AS ( \
                            UPDATE pgfifo.job SET run_after = now() \
                            WHERE queue = $1 AND ($2::text IS NULL OR group_id = $2) \
                              AND state = 'queued' AND run_after > now() \
                              AND run_after < '9999-12-31 00:00:00+00' RETURNING 1), \
                        snoozes AS ( \
                            UPDATE pgfifo.group_snooze SET until = now() \
                            WHERE queue = $1 AND ($2::text IS NULL OR group_id = $2) \
                              AND until > now() RETURNING 1), \
                        groups AS ( \
                            UPDATE pgfifo.queue_group AS g SET ready_at = now() \
                            WHERE g.queue = $1 AND ($2::text IS NULL OR g.group_id = $2) \
                              AND g.ready_at > now() \
                              AND (EXISTS (SELECT 1 FROM pgfifo.job AS h \
                                           WHERE h.id = g.head_id AND h.run_after > now() \
                                             AND h.run_after < '9999-12-31 00:00:00+00') \
                                   OR EXISTS (SELECT 1 FROM pgfifo.group_snooze AS z \
                                              WHERE z.queue = g.queue \
                                                AND z.group_id = g.group_id \
                                                AND z.until > now())) \
                            RETURNING 1) \
                        SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM groups) AS n";

/// See [`MAKE_DUE`].
pub(crate) async fn make_due(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> diesel::QueryResult<i64> {
    let row: Count = diesel::sql_query(MAKE_DUE)
        .bind::<Text, _>(queue)
        .bind::<Nullable<Text>, _>(group)
        .get_result(conn)
        .await?;
    Ok(row.n)
}

/// Locks what a drain must not pick (SKIP LOCKED: it never waits), in a
/// transaction of its own held only while the drain's pick runs: then
/// `pgfifo.pick`, which skips locked groups and jobs, sees what another
/// runner is running. Held back: with a group (`$2`), every other group of
/// the queue (its row and its slot rows) and its ungrouped jobs; without
/// recursion, every group whose head and every ungrouped job whose id is
/// newer than `$3`.
const HOLD_BACK: &str = "SELECT \
    (SELECT count(*) FROM (SELECT 1 FROM pgfifo.queue_group AS g \
                           WHERE g.queue = $1 AND (($2::text IS NOT NULL AND g.group_id <> $2) \
                                                   OR g.head_id > $3) \
                           FOR UPDATE SKIP LOCKED) AS a) \
  + (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j \
                           WHERE j.queue = $1 AND j.group_id IS NULL AND j.state = 'queued' \
                             AND ($2::text IS NOT NULL OR j.id > $3) \
                           FOR UPDATE SKIP LOCKED) AS b) \
  + (SELECT count(*) FROM (SELECT 1 FROM pgfifo.group_slot AS s \
                           WHERE s.queue = $1 AND $2::text IS NOT NULL AND s.group_id <> $2 \
                           FOR UPDATE SKIP LOCKED) AS c) AS n";

/// Opens a transaction on `conn` holding back what a drain must not pick
/// (see [`HOLD_BACK`]); the caller commits it after its pick.
pub(crate) async fn hold_back(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
    newer_than: i64,
) -> diesel::QueryResult<()> {
    conn.batch_execute("BEGIN").await?;
    diesel::sql_query(HOLD_BACK)
        .bind::<Text, _>(queue)
        .bind::<Nullable<Text>, _>(group)
        .bind::<BigInt, _>(newer_than)
        .execute(conn)
        .await
        .map(drop)
}

/// The queued jobs of a queue (or group) left after a drain, and how many
/// of them wait for a time in the future.
const LEFT: &str = "SELECT count(*) AS n, count(*) FILTER (WHERE run_after > now()) AS later \
                    FROM pgfifo.job \
                    WHERE queue = $1 AND ($2::text IS NULL OR group_id = $2) \
                      AND state = 'queued'";

#[derive(QueryableByName)]
struct LeftRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = BigInt)]
    later: i64,
}

/// See [`LEFT`]: `(queued, of them waiting for a later time)`.
pub(crate) async fn left(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: Option<&str>,
) -> diesel::QueryResult<(i64, i64)> {
    let row: LeftRow = diesel::sql_query(LEFT)
        .bind::<Text, _>(queue)
        .bind::<Nullable<Text>, _>(group)
        .get_result(conn)
        .await?;
    Ok((row.n, row.later))
}

/// Whether a database of that name exists.
const DATABASE_EXISTS: &str = "SELECT count(*) AS n FROM pg_database WHERE datname = $1";

/// See [`DATABASE_EXISTS`].
pub(crate) async fn database_exists(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> diesel::QueryResult<bool> {
    let row: Count = diesel::sql_query(DATABASE_EXISTS)
        .bind::<Text, _>(name)
        .get_result(conn)
        .await?;
    Ok(row.n > 0)
}

/// Takes the session advisory lock under which templates are built; the
/// same key as pgfifo's own test harness, so the two never build one
/// template at once.
const TEMPLATE_LOCK: &str = "SELECT count(*) AS n FROM pg_advisory_lock($1)";
/// Releases [`TEMPLATE_LOCK`].
const TEMPLATE_UNLOCK: &str = "SELECT count(*) AS n FROM pg_advisory_unlock($1)";

/// The key of [`TEMPLATE_LOCK`].
const TEMPLATE_LOCK_KEY: i64 = 8_099_555_043_121_823_745;

/// Takes (`true`) or releases the template lock (see [`TEMPLATE_LOCK`]).
pub(crate) async fn template_lock(
    conn: &mut AsyncPgConnection,
    take: bool,
) -> diesel::QueryResult<()> {
    let sql = if take { TEMPLATE_LOCK } else { TEMPLATE_UNLOCK };
    let _: Count = diesel::sql_query(sql)
        .bind::<BigInt, _>(TEMPLATE_LOCK_KEY)
        .get_result(conn)
        .await?;
    Ok(())
}

/// Utility statements on databases take no bind parameters, so names are
/// quoted here, and only names that [`plain_name`] accepts get this far
/// (lower-case letters, digits and underscores: nothing to escape).
fn quoted(name: &str) -> String {
    debug_assert!(plain_name(name));
    format!("\"{name}\"")
}

/// Whether `name` is a database name the testing helpers create or drop:
/// 1 to 63 bytes of `[a-z0-9_]`.
pub(crate) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Creates database `name`, cloned from `template` (or from PostgreSQL's
/// default template).
pub(crate) async fn create_database(
    conn: &mut AsyncPgConnection,
    name: &str,
    template: Option<&str>,
) -> diesel::QueryResult<()> {
    let sql = match template {
        Some(template) => format!(
            "CREATE DATABASE {} TEMPLATE {}",
            quoted(name),
            quoted(template)
        ),
        None => format!("CREATE DATABASE {}", quoted(name)),
    };
    conn.batch_execute(&sql).await
}

/// Drops database `name` if it exists, ending its sessions.
pub(crate) async fn drop_database(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> diesel::QueryResult<()> {
    conn.batch_execute(&format!(
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        quoted(name)
    ))
    .await
}

/// Renames the freshly migrated `building` to `template`, marks it a
/// template, and notes when it was made (`created`, seconds since the epoch:
/// the sweeper of pgfifo's own harness reads it).
pub(crate) async fn publish_template(
    conn: &mut AsyncPgConnection,
    building: &str,
    template: &str,
    created: u64,
) -> diesel::QueryResult<()> {
    conn.batch_execute(&format!(
        "ALTER DATABASE {b} RENAME TO {t}; ALTER DATABASE {t} WITH IS_TEMPLATE true; \
         COMMENT ON DATABASE {t} IS 'pgfifo test template created {created}'",
        b = quoted(building),
        t = quoted(template),
    ))
    .await
}

/// Test databases (`pgfifo_test_<secs>_…`), for the sweep of those failed
/// runs kept.
const TEST_DATABASES: &str = "SELECT datname::text AS name FROM pg_database \
                              WHERE datname LIKE 'pgfifo\\_test\\_%'";

#[derive(QueryableByName)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

/// See [`TEST_DATABASES`].
pub(crate) async fn test_databases(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Vec<String>> {
    let rows: Vec<NameRow> = diesel::sql_query(TEST_DATABASES).load(conn).await?;
    Ok(rows.into_iter().map(|r| r.name).collect())
}

/// A group's jobs in enqueue order, with their recorded attempt starts
/// (microseconds since the epoch; NULL: never started).
const GROUP_RUNS: &str = "SELECT j.id, j.kind, j.state, \
        (SELECT (extract(epoch FROM min(a.started_at)) * 1000000)::bigint \
         FROM pgfifo.job_attempt AS a WHERE a.job_id = j.id) AS first_start_us, \
        (SELECT (extract(epoch FROM max(a.started_at)) * 1000000)::bigint \
         FROM pgfifo.job_attempt AS a WHERE a.job_id = j.id) AS last_start_us \
    FROM pgfifo.job AS j WHERE j.queue = $1 AND j.group_id = $2 ORDER BY j.id";

/// One job of [`GROUP_RUNS`].
#[derive(Debug, QueryableByName)]
pub(crate) struct GroupRun {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub first_start_us: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_start_us: Option<i64>,
}

/// See [`GROUP_RUNS`].
pub(crate) async fn group_runs(
    conn: &mut AsyncPgConnection,
    queue: &str,
    group: &str,
) -> diesel::QueryResult<Vec<GroupRun>> {
    diesel::sql_query(GROUP_RUNS)
        .bind::<Text, _>(queue)
        .bind::<Text, _>(group)
        .load(conn)
        .await
}

/// Ends whatever a drain that failed half-way left on its job connection:
/// an open transaction, a long run's session-level lock.
const RESET_SESSION: &str = "ROLLBACK; SELECT pg_advisory_unlock_all()";

/// See [`RESET_SESSION`]; best effort (the connection may be gone).
pub(crate) async fn reset_session(conn: &mut AsyncPgConnection) {
    if conn.batch_execute(RESET_SESSION).await.is_err() {
        let _ = conn.batch_execute("SELECT pg_advisory_unlock_all()").await;
    }
}

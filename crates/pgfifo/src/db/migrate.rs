//! The statements of [`crate::migrate`]: its lock, its bookkeeping tables
//! and the function installer's record. The migrations' own SQL is in
//! `migrations/`, the functions' in `db/functions/`.

use diesel::sql_types::{BigInt, Bool, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

/// Creates the schema and the migration runner's own bookkeeping table if
/// they are missing (the only DDL that is not a migration).
const BOOKKEEPING: &str = "\
    CREATE SCHEMA IF NOT EXISTS pgfifo;
    CREATE TABLE IF NOT EXISTS pgfifo.schema_migrations (
        version    bigint      PRIMARY KEY,
        name       text        NOT NULL,
        checksum   text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    );";

/// How long a migration may wait for a lock. A change to a table that a
/// running job holds would otherwise queue every pick and enqueue behind it
/// until that job ends; past this the migration fails, changing nothing.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '10s'";

/// One applied migration, as recorded.
#[derive(QueryableByName, Debug)]
pub(crate) struct AppliedRow {
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub checksum: String,
}

/// The function set recorded as installed.
#[derive(QueryableByName, Debug)]
pub(crate) struct FunctionsRow {
    #[diesel(sql_type = Text)]
    pub checksum: String,
    #[diesel(sql_type = Text)]
    pub release: String,
}

#[derive(QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

#[derive(QueryableByName)]
struct Sum {
    #[diesel(sql_type = Text)]
    sum: String,
}

/// Takes the migrations' transaction-level advisory lock (waiting for a
/// migration in progress elsewhere), bounds lock waits, and creates the
/// bookkeeping table if needed. Runs in the migration's transaction.
pub(crate) async fn lock_and_prepare(
    conn: &mut AsyncPgConnection,
    key: i64,
) -> diesel::QueryResult<()> {
    diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
        .bind::<BigInt, _>(key)
        .execute(conn)
        .await?;
    conn.batch_execute(LOCK_TIMEOUT).await?;
    conn.batch_execute(BOOKKEEPING).await
}

/// Runs the SQL of a migration or a function source.
pub(crate) async fn run_script(conn: &mut AsyncPgConnection, sql: &str) -> diesel::QueryResult<()> {
    conn.batch_execute(sql).await
}

/// Whether relation `name` (schema-qualified) exists.
async fn relation_exists(conn: &mut AsyncPgConnection, name: &str) -> diesel::QueryResult<bool> {
    let row: Exists = diesel::sql_query("SELECT to_regclass($1) IS NOT NULL AS exists")
        .bind::<Text, _>(name)
        .get_result(conn)
        .await?;
    Ok(row.exists)
}

/// The applied migrations, oldest first; `None` when pgfifo's bookkeeping
/// table does not exist (never migrated here).
pub(crate) async fn applied(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<Vec<AppliedRow>>> {
    if !relation_exists(conn, "pgfifo.schema_migrations").await? {
        return Ok(None);
    }
    diesel::sql_query(
        "SELECT version, name, checksum FROM pgfifo.schema_migrations ORDER BY version",
    )
    .load(conn)
    .await
    .map(Some)
}

/// Records migration `version` as applied, with the md5 of `up`.
pub(crate) async fn record(
    conn: &mut AsyncPgConnection,
    version: i64,
    name: &str,
    up: &str,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO pgfifo.schema_migrations (version, name, checksum) VALUES ($1, $2, md5($3))",
    )
    .bind::<BigInt, _>(version)
    .bind::<Text, _>(name)
    .bind::<Text, _>(up)
    .execute(conn)
    .await
    .map(drop)
}

/// Forgets migration `version` (it was reverted).
pub(crate) async fn forget(conn: &mut AsyncPgConnection, version: i64) -> diesel::QueryResult<()> {
    diesel::sql_query("DELETE FROM pgfifo.schema_migrations WHERE version = $1")
        .bind::<BigInt, _>(version)
        .execute(conn)
        .await
        .map(drop)
}

/// The md5 of `text`, as the server computes it (the checksums recorded
/// here are the server's).
pub(crate) async fn md5(conn: &mut AsyncPgConnection, text: &str) -> diesel::QueryResult<String> {
    let row: Sum = diesel::sql_query("SELECT md5($1) AS sum")
        .bind::<Text, _>(text)
        .get_result(conn)
        .await?;
    Ok(row.sum)
}

/// The function set recorded as installed; `None` when none is recorded
/// (schema version 2 or older, or never migrated).
pub(crate) async fn installed_functions(
    conn: &mut AsyncPgConnection,
) -> diesel::QueryResult<Option<FunctionsRow>> {
    if !relation_exists(conn, "pgfifo.schema_functions").await? {
        return Ok(None);
    }
    let rows: Vec<FunctionsRow> =
        diesel::sql_query("SELECT checksum, release FROM pgfifo.schema_functions")
            .load(conn)
            .await?;
    Ok(rows.into_iter().next())
}

/// Records the function set just installed: the md5 of `sources` and the
/// release that installed it.
pub(crate) async fn record_functions(
    conn: &mut AsyncPgConnection,
    sources: &str,
    release: &str,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO pgfifo.schema_functions AS f (id, checksum, release)
         VALUES (true, md5($1), $2)
         ON CONFLICT (id) DO UPDATE
         SET checksum = EXCLUDED.checksum, release = EXCLUDED.release, installed_at = now()",
    )
    .bind::<Text, _>(sources)
    .bind::<Text, _>(release)
    .execute(conn)
    .await
    .map(drop)
}

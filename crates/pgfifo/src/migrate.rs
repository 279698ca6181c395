//! pgfifo's schema migrations, embedded in the library.
//!
//! The SQL is in `migrations/NNNN_name/{up,down}.sql` at the repository root
//! (the crate reaches it through its `migrations` link, so it is packaged with
//! the crate). Migrations are applied only by an explicit call ([`migrate`],
//! or `pgfifo migrate`), never on runner start. They live in the `pgfifo`
//! schema and are recorded in `pgfifo.schema_migrations`, apart from any
//! migrations table of the host application.
//!
//! All changes run in one transaction under a transaction-level advisory lock,
//! so runners or deploys that migrate at the same moment apply each migration
//! once and never see a half-migrated schema.

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::db::Pool;
use crate::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version, increasing from 1.
    pub version: i64,
    /// Its short name (the directory name without the version).
    pub name: &'static str,
    /// The SQL that applies it.
    pub up: &'static str,
    /// The SQL that reverts it.
    pub down: &'static str,
}

/// Every migration this library ships, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        up: include_str!("../migrations/0001_init/up.sql"),
        down: include_str!("../migrations/0001_init/down.sql"),
    },
    Migration {
        version: 2,
        name: "operate",
        up: include_str!("../migrations/0002_operate/up.sql"),
        down: include_str!("../migrations/0002_operate/down.sql"),
    },
];

/// The schema version this library needs.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The base of pgfifo's own single-key advisory locks: "pgff" in the high 32
/// bits. Single bigint keys live apart from the two-integer keys of the
/// groups' locks (`pgfifo.group_lock_key`), so they never collide with them.
/// `+ 0`: migrations; `+ 1`: reserved for test harnesses; `+ 2`: retention.
#[doc(hidden)]
pub const ADVISORY_KEY_BASE: i64 = 0x7067_6666 << 32;

/// The advisory lock that serializes migrations (`ADVISORY_KEY_BASE + 0`).
const LOCK: &str = "SELECT pg_advisory_xact_lock(8099555043121823744)";

const BOOKKEEPING: &str = "\
    CREATE SCHEMA IF NOT EXISTS pgfifo;
    CREATE TABLE IF NOT EXISTS pgfifo.schema_migrations (
        version    bigint      PRIMARY KEY,
        name       text        NOT NULL,
        checksum   text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
    );";

#[cfg(test)]
#[test]
fn migration_lock_uses_the_key_base() {
    assert!(LOCK.contains(&ADVISORY_KEY_BASE.to_string()));
}

#[derive(QueryableByName)]
struct AppliedRow {
    #[diesel(sql_type = BigInt)]
    version: i64,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    checksum: String,
}

/// Whether one migration is applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigrationStatus {
    /// The migration's version.
    pub version: i64,
    /// The migration's name.
    pub name: String,
    /// Whether it is applied in the database.
    pub applied: bool,
}

/// Applies every pending migration. Returns the versions applied (empty when
/// the schema was already current).
pub async fn migrate(pool: &Pool) -> Result<Vec<i64>> {
    let mut conn = pool.get().await?;
    migrate_conn(&mut conn).await
}

/// [`migrate`] on a connection you already hold (not inside a transaction).
pub async fn migrate_conn(conn: &mut AsyncPgConnection) -> Result<Vec<i64>> {
    conn.transaction::<_, Error, _>(async |conn| {
        lock_and_prepare(conn).await?;
        let applied = applied(conn).await?;
        if let Some(newest) = applied.last() {
            if newest.version > latest_version() {
                return Err(Error::SchemaTooNew(newest.version));
            }
        }
        let mut done = Vec::new();
        for m in MIGRATIONS {
            if applied.iter().any(|a| a.version == m.version) {
                continue;
            }
            conn.batch_execute(m.up).await?;
            record(conn, m).await?;
            tracing::info!(
                version = m.version,
                name = m.name,
                "applied pgfifo migration"
            );
            done.push(m.version);
        }
        Ok(done)
    })
    .await
}

/// Reverts the newest `steps` applied migrations. Returns the versions reverted.
pub async fn rollback(conn: &mut AsyncPgConnection, steps: usize) -> Result<Vec<i64>> {
    conn.transaction::<_, Error, _>(async |conn| {
        lock_and_prepare(conn).await?;
        let applied = applied(conn).await?;
        let mut done = Vec::new();
        for row in applied.iter().rev().take(steps) {
            let m = MIGRATIONS
                .iter()
                .find(|m| m.version == row.version)
                .ok_or(Error::SchemaTooNew(row.version))?;
            conn.batch_execute(m.down).await?;
            diesel::sql_query("DELETE FROM pgfifo.schema_migrations WHERE version = $1")
                .bind::<BigInt, _>(m.version)
                .execute(conn)
                .await?;
            tracing::info!(
                version = m.version,
                name = m.name,
                "reverted pgfifo migration"
            );
            done.push(m.version);
        }
        Ok(done)
    })
    .await
}

/// Lists every known migration and whether it is applied.
pub async fn status(conn: &mut AsyncPgConnection) -> Result<Vec<MigrationStatus>> {
    let applied: Vec<AppliedRow> = applied_if_any(conn).await?.unwrap_or_default();
    let mut out: Vec<MigrationStatus> = MIGRATIONS
        .iter()
        .map(|m| MigrationStatus {
            version: m.version,
            name: m.name.to_owned(),
            applied: applied.iter().any(|a| a.version == m.version),
        })
        .collect();
    for a in applied {
        if !MIGRATIONS.iter().any(|m| m.version == a.version) {
            out.push(MigrationStatus {
                version: a.version,
                name: a.name,
                applied: true,
            });
        }
    }
    Ok(out)
}

/// Fails unless the database has exactly the migrations this library ships,
/// with the same SQL (each applied migration's checksum is compared).
pub async fn check_current(conn: &mut AsyncPgConnection) -> Result<()> {
    #[derive(QueryableByName)]
    struct Sum {
        #[diesel(sql_type = Text)]
        sum: String,
    }
    let applied = applied_if_any(conn).await?.unwrap_or_default();
    for row in &applied {
        if let Some(m) = MIGRATIONS.iter().find(|m| m.version == row.version) {
            let ours: Sum = diesel::sql_query("SELECT md5($1) AS sum")
                .bind::<Text, _>(m.up)
                .get_result(conn)
                .await?;
            if ours.sum != row.checksum {
                return Err(Error::SchemaMismatch(row.version));
            }
        }
    }
    let newest = applied.last().map(|a| a.version);
    match newest {
        Some(v) if v == latest_version() => Ok(()),
        Some(v) if v > latest_version() => Err(Error::SchemaTooNew(v)),
        found => Err(Error::SchemaOutdated {
            found,
            needed: latest_version(),
        }),
    }
}

async fn lock_and_prepare(conn: &mut AsyncPgConnection) -> Result<()> {
    conn.batch_execute(LOCK).await?;
    conn.batch_execute(BOOKKEEPING).await?;
    Ok(())
}

async fn applied(conn: &mut AsyncPgConnection) -> Result<Vec<AppliedRow>> {
    Ok(diesel::sql_query(
        "SELECT version, name, checksum FROM pgfifo.schema_migrations ORDER BY version",
    )
    .load(conn)
    .await?)
}

/// The applied migrations, or `None` when pgfifo was never migrated here.
async fn applied_if_any(conn: &mut AsyncPgConnection) -> Result<Option<Vec<AppliedRow>>> {
    #[derive(QueryableByName)]
    struct Exists {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        exists: bool,
    }
    let exists: Exists =
        diesel::sql_query("SELECT to_regclass('pgfifo.schema_migrations') IS NOT NULL AS exists")
            .get_result(conn)
            .await?;
    if exists.exists {
        Ok(Some(applied(conn).await?))
    } else {
        Ok(None)
    }
}

async fn record(conn: &mut AsyncPgConnection, m: &Migration) -> Result<()> {
    diesel::sql_query(
        "INSERT INTO pgfifo.schema_migrations (version, name, checksum) VALUES ($1, $2, md5($3))",
    )
    .bind::<BigInt, _>(m.version)
    .bind::<Text, _>(m.name)
    .bind::<Text, _>(m.up)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_directory_is_embedded_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut dirs: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations directory")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        dirs.sort();
        let embedded: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}", m.version, m.name))
            .collect();
        assert_eq!(dirs, embedded);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "versions increase by one");
        }
    }
}

//! pgfifo's schema: numbered migrations and reinstallable functions, both
//! embedded in the library.
//!
//! * **Migrations** (`migrations/NNNN_name/{up,down}.sql` at the repository
//!   root, reached through the crate's `migrations` link so that they are
//!   packaged) change tables and indexes. A released migration is never
//!   edited: a change is a new migration.
//! * **Functions** (`src/db/functions/*.sql`, one file per function or
//!   family) are installed whole with `CREATE OR REPLACE`, in file order,
//!   after the migrations, whenever the database's set differs from this
//!   library's. Changing a function is a one-file diff. Arguments or a result
//!   type cannot change in place: such a change is a new function, and the
//!   old one stays, accepting the previous release's calls, until a later
//!   release's migration drops it (see `docs/upgrading.md`).
//!
//! Both are applied only by an explicit call ([`migrate`], or `pgfifo
//! migrate up`), never on runner start, in one transaction under an advisory
//! lock: processes that migrate at the same moment apply each step once and
//! never see a half-migrated schema. A migration waits at most 10 s for a
//! table lock (a running job's), then fails and changes nothing. Everything
//! lives in the `pgfifo` schema; the bookkeeping is in
//! `pgfifo.schema_migrations` and `pgfifo.schema_functions`, apart from the
//! host application's own migrations.
//!
//! A runner checks at start that the schema is exactly this library's
//! ([`check_current`]) and refuses otherwise, naming both versions and the
//! command to run.

mod sources;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde::Serialize;

use crate::db::pooler::pinned;
use crate::db::{self, Pool};
use crate::{Error, Result};

use crate::db::layout;
pub use crate::db::layout::Layout;
pub use sources::{FunctionSource, Migration, FUNCTIONS, MIGRATIONS};

/// This library's release.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The schema version this library needs: its newest migration.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The release that introduced schema version `version`, if known here.
pub fn release_of(version: i64) -> Option<&'static str> {
    MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .map(|m| m.release)
}

/// The base of pgfifo's own single-key advisory locks: "pgff" in the high 32
/// bits. Single bigint keys live apart from the two-integer keys of the
/// groups' locks (`pgfifo.group_lock_key`), so they never collide with them.
/// `+ 0`: migrations; `+ 1`: reserved for test harnesses; `+ 2`: retention.
#[doc(hidden)]
pub const ADVISORY_KEY_BASE: i64 = 0x7067_6666 << 32;

/// The advisory lock that serializes migrations.
const MIGRATION_LOCK: i64 = ADVISORY_KEY_BASE;

/// All function sources in installation order, in their form for
/// `layout`, as one text (what the recorded checksum is taken of).
fn function_sources(layout: Layout) -> String {
    FUNCTIONS
        .iter()
        .map(|f| layout::expand(f.sql, layout))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether one migration is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrationStatus {
    /// The migration's version.
    pub version: i64,
    /// The migration's name.
    pub name: String,
    /// The release that introduced it (`None`: unknown to this library).
    pub release: Option<String>,
    /// Whether it is applied in the database.
    pub applied: bool,
}

/// Whether the database's functions are this library's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FunctionsStatus {
    /// Installed from this library's sources.
    Current,
    /// Installed from other sources: another release's, or another build's.
    Different {
        /// The release that installed them.
        installed_by: String,
    },
    /// No set is recorded: the schema is older than version 3 (its functions
    /// are those of its migrations), or missing.
    Unrecorded,
}

/// The schema of a database against this library's (see [`status`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SchemaStatus {
    /// Every migration this library ships, and any applied one it does not
    /// know (newer), oldest first.
    pub migrations: Vec<MigrationStatus>,
    /// The functions.
    pub functions: FunctionsStatus,
    /// Where the tables live.
    pub layout: Layout,
}

impl SchemaStatus {
    /// The migrations not applied yet.
    pub fn pending(&self) -> impl Iterator<Item = &MigrationStatus> {
        self.migrations.iter().filter(|m| !m.applied)
    }

    /// Whether [`migrate`] has nothing to do.
    pub fn is_current(&self) -> bool {
        self.pending().next().is_none() && self.functions == FunctionsStatus::Current
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Migrated {
    /// The versions of the migrations it applied, oldest first.
    pub applied: Vec<i64>,
    /// Whether it installed the functions.
    pub functions_installed: bool,
}

impl Migrated {
    /// Whether the schema was current already.
    pub fn nothing_to_do(&self) -> bool {
        self.applied.is_empty() && !self.functions_installed
    }
}

/// Applies every pending migration, then installs the functions if the
/// database's set is not this library's.
pub async fn migrate(pool: &Pool) -> Result<Migrated> {
    let mut conn = pool.get().await?;
    migrate_conn(&mut conn).await
}

/// [`migrate`] on a connection you already hold (not inside a transaction).
pub async fn migrate_conn(conn: &mut AsyncPgConnection) -> Result<Migrated> {
    conn.transaction::<_, Error, _>(async |conn| {
        refuse_worker(conn).await?;
        db::migrate::lock_and_prepare(conn, MIGRATION_LOCK).await?;
        let layout = layout(conn).await?;
        let applied = db::migrate::applied(conn).await?.unwrap_or_default();
        if let Some(newest) = applied.last() {
            if newest.version > latest_version() {
                return Err(Error::SchemaTooNew(newest.version));
            }
        }
        let mut done = Migrated::default();
        for m in MIGRATIONS {
            if applied.iter().any(|a| a.version == m.version) {
                continue;
            }
            db::migrate::run_script(conn, &layout::expand(m.up, layout)).await?;
            db::migrate::record(conn, m.version, m.name, m.up).await?;
            tracing::info!(
                version = m.version,
                name = m.name,
                "applied pgfifo migration"
            );
            done.applied.push(m.version);
        }
        done.functions_installed = install_functions(conn, layout, false).await?;
        Ok(done)
    })
    .await
}

/// The layout of the database's pgfifo tables: plain, or distributed over
/// Citus by [`distribute`].
pub async fn layout(conn: &mut AsyncPgConnection) -> Result<Layout> {
    // (Pinned: through a transaction-mode pooler, its two statements must
    // reach one server connection.)
    pinned(conn, async |conn| Ok(db::citus::layout(conn).await?)).await
}

/// Fails with [`Error::CitusWorker`] on a Citus worker node, where the
/// schema's DDL is refused: it is laid out through the coordinator.
async fn refuse_worker(conn: &mut AsyncPgConnection) -> Result<()> {
    if db::citus::citus_version(conn).await?.is_some() && db::citus::on_worker(conn).await? {
        return Err(Error::CitusWorker);
    }
    Ok(())
}

/// Installs the functions in their form for `layout` unless the database
/// has that set already (or always, with `force`). Returns whether it
/// installed them. Runs in the caller's migration transaction.
async fn install_functions(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    force: bool,
) -> Result<bool> {
    let sources = function_sources(layout);
    let ours = db::migrate::md5(conn, &sources).await?;
    let installed = db::migrate::installed_functions(conn).await?;
    if !force && installed.is_some_and(|f| f.checksum == ours) {
        return Ok(false);
    }
    for source in FUNCTIONS {
        db::migrate::run_script(conn, &layout::expand(source.sql, layout)).await?;
    }
    db::migrate::record_functions(conn, &sources, RELEASE).await?;
    tracing::info!(release = RELEASE, ?layout, "installed pgfifo functions");
    Ok(true)
}

/// What [`distribute`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Distributed {
    /// The tables were spread over the cluster and the functions
    /// reinstalled in their distributed form.
    Now,
    /// The database had the distributed layout already.
    Already,
}

/// Lays pgfifo's tables out over a Citus cluster, on its coordinator:
/// every row of a group (its row, jobs, attempts, bucket, slots…) gets the
/// group's part and the tables are distributed by it, co-located; the
/// batches' rows are distributed by batch; the queue settings become a
/// reference table; the runners, the minute counts, the schedules and the
/// group and queue limits stay on the coordinator (see
/// `db/citus/distribute.sql` and docs/scaling.md). In one transaction,
/// under the migrations' lock; it copies every row, so run it with runners
/// stopped. There is no way back to the plain layout. The CLI's `pgfifo
/// migrate distribute` calls it.
///
/// On the distributed layout, enqueue, the runner's cycle (promote, pick,
/// attempts, completion, retries, snoozes), group limits (rate, burst,
/// concurrency), queue limits, long mode, pausing, the operator's reads
/// and actions, the dashboard, retention, schedules, de-duplication windows
/// and the SQL enqueue API run as on one server; weights, batches and
/// dependencies refuse there, naming what is missing, and so does
/// [`rollback`]. The application changes only its URL (the coordinator's).
///
/// ```no_run
/// # async fn f(conn: &mut diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
/// pgfifo::migrate::migrate_conn(conn).await?; // the plain schema first
/// pgfifo::migrate::distribute(conn).await?;   // then spread it
/// # Ok(())
/// # }
/// ```
///
/// Fails, changing nothing, with [`Error::CitusMissing`] when the database
/// has no citus extension, [`Error::CitusWorker`] on a worker node,
/// [`Error::SchemaOutdated`] or [`Error::FunctionsDiffer`] unless this
/// library's [`migrate`] ran first, and [`Error::NotDistributed`] when a
/// group's weight above 1 is set.
pub async fn distribute(conn: &mut AsyncPgConnection) -> Result<Distributed> {
    conn.transaction::<_, Error, _>(async |conn| {
        if db::citus::citus_version(conn).await?.is_none() {
            return Err(Error::CitusMissing);
        }
        refuse_worker(conn).await?;
        db::migrate::lock_and_prepare(conn, MIGRATION_LOCK).await?;
        if layout(conn).await? == Layout::Distributed {
            return Ok(Distributed::Already);
        }
        let applied = db::migrate::applied(conn).await?.unwrap_or_default();
        let newest = applied.last().map(|a| a.version);
        if newest != Some(latest_version()) {
            return Err(Error::SchemaOutdated {
                found: newest,
                needed: latest_version(),
            });
        }
        // The layout's DDL calls this library's helpers (pgfifo.part_of).
        if let FunctionsStatus::Different { installed_by } =
            functions_status(conn, Layout::Plain).await?
        {
            return Err(Error::FunctionsDiffer { installed_by });
        }
        if let Some(queues) = db::citus::weighted_queues(conn).await? {
            return Err(Error::NotDistributed(format!(
                "weights (group controls), set in {queues}; set them back to 1 first"
            )));
        }
        db::citus::distribute(conn).await?;
        install_functions(conn, Layout::Distributed, true).await?;
        tracing::info!("laid pgfifo's tables out over the Citus cluster");
        Ok(Distributed::Now)
    })
    .await
}

/// Reverts the newest `steps` applied migrations. Returns the versions
/// reverted. The functions stay as installed (see `docs/upgrading.md`).
/// Refused on a Citus worker node and on the distributed layout.
pub async fn rollback(conn: &mut AsyncPgConnection, steps: usize) -> Result<Vec<i64>> {
    conn.transaction::<_, Error, _>(async |conn| {
        refuse_worker(conn).await?;
        db::migrate::lock_and_prepare(conn, MIGRATION_LOCK).await?;
        let layout = layout(conn).await?;
        if layout == Layout::Distributed {
            return Err(Error::NotDistributed("reverting migrations".into()));
        }
        let applied = db::migrate::applied(conn).await?.unwrap_or_default();
        let mut done = Vec::new();
        for row in applied.iter().rev().take(steps) {
            let m = MIGRATIONS
                .iter()
                .find(|m| m.version == row.version)
                .ok_or(Error::SchemaTooNew(row.version))?;
            db::migrate::run_script(conn, &layout::expand(m.down, layout)).await?;
            db::migrate::forget(conn, m.version).await?;
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

/// Lists every known migration and whether it is applied, and whether the
/// functions are this library's.
pub async fn status(conn: &mut AsyncPgConnection) -> Result<SchemaStatus> {
    pinned(conn, async |conn| {
        let applied = db::migrate::applied(conn).await?.unwrap_or_default();
        let mut migrations: Vec<MigrationStatus> = MIGRATIONS
            .iter()
            .map(|m| MigrationStatus {
                version: m.version,
                name: m.name.to_owned(),
                release: Some(m.release.to_owned()),
                applied: applied.iter().any(|a| a.version == m.version),
            })
            .collect();
        for a in applied {
            if release_of(a.version).is_none() {
                migrations.push(MigrationStatus {
                    version: a.version,
                    name: a.name,
                    release: None,
                    applied: true,
                });
            }
        }
        let layout = layout(conn).await?;
        let functions = functions_status(conn, layout).await?;
        Ok(SchemaStatus {
            migrations,
            functions,
            layout,
        })
    })
    .await
}

async fn functions_status(conn: &mut AsyncPgConnection, layout: Layout) -> Result<FunctionsStatus> {
    Ok(match db::migrate::installed_functions(conn).await? {
        None => FunctionsStatus::Unrecorded,
        Some(installed) => {
            if installed.checksum == db::migrate::md5(conn, &function_sources(layout)).await? {
                FunctionsStatus::Current
            } else {
                FunctionsStatus::Different {
                    installed_by: installed.release,
                }
            }
        }
    })
}

/// Fails unless the database has exactly this library's schema: every
/// migration it ships applied with the same SQL (checksums compared), none
/// newer, and its functions installed. Each error names the database's
/// version, this library's, and what to run.
pub async fn check_current(conn: &mut AsyncPgConnection) -> Result<()> {
    pinned(conn, async |conn| {
        let applied = db::migrate::applied(conn).await?.unwrap_or_default();
        for row in &applied {
            if let Some(m) = MIGRATIONS.iter().find(|m| m.version == row.version) {
                if db::migrate::md5(conn, m.up).await? != row.checksum {
                    return Err(Error::SchemaMismatch(row.version));
                }
            }
        }
        match applied.last().map(|a| a.version) {
            Some(v) if v > latest_version() => return Err(Error::SchemaTooNew(v)),
            Some(v) if v == latest_version() => {}
            found => {
                return Err(Error::SchemaOutdated {
                    found,
                    needed: latest_version(),
                })
            }
        }
        let layout = layout(conn).await?;
        match functions_status(conn, layout).await? {
            FunctionsStatus::Current => Ok(()),
            FunctionsStatus::Different { installed_by } => {
                Err(Error::FunctionsDiffer { installed_by })
            }
            FunctionsStatus::Unrecorded => Err(Error::SchemaOutdated {
                found: applied.last().map(|a| a.version),
                needed: latest_version(),
            }),
        }
    })
    .await
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

    #[test]
    fn every_function_file_is_installed_in_name_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/db/functions");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("functions directory")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let embedded: Vec<&str> = FUNCTIONS.iter().map(|f| f.file).collect();
        assert_eq!(files, embedded);
    }

    #[test]
    fn function_files_replace_rather_than_create() {
        for f in FUNCTIONS {
            let creates = f.sql.matches("CREATE FUNCTION").count();
            assert_eq!(creates, 0, "{}: use CREATE OR REPLACE FUNCTION", f.file);
            assert!(f.sql.contains("CREATE OR REPLACE FUNCTION"), "{}", f.file);
        }
    }

    #[test]
    fn releases_are_known_for_every_version() {
        assert_eq!(release_of(2), Some("0.1.0"));
        assert_eq!(release_of(latest_version()), Some(RELEASE));
        assert_eq!(release_of(latest_version() + 1), None);
    }
}

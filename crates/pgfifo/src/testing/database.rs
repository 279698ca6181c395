//! A database per test, cloned from a template migrated once per schema.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::db::testing as tsql;
use crate::{Error, Pool, Result};

/// The server a test database is made on when no URL is given.
pub const DEFAULT_SERVER_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database of its own for one test, with pgfifo's schema migrated, and a
/// pool on it. Tests that each take one run in parallel without seeing each
/// other's jobs.
///
/// It is cloned (`CREATE DATABASE … TEMPLATE`) from a template database
/// that is migrated once per schema: its name carries a hash of pgfifo's
/// migrations, its SQL functions and its release, so a new pgfifo gets a
/// new template. The template is created under an advisory lock, so test
/// processes starting together build it once; cloning takes a fraction of
/// a second. pgfifo's own test suite uses the same templates.
///
/// Dropping it drops the database, unless the thread is panicking (the
/// test failed): then the database is kept for inspection and its name
/// printed. Databases kept more than a day are dropped the next time a
/// template is built. The name is `pgfifo_test_<unix seconds>_<pid>_<n>`.
///
/// The connecting user needs the `CREATEDB` privilege.
///
/// ```no_run
/// # async fn demo() -> pgfifo::Result<()> {
/// use pgfifo::testing::TestDatabase;
///
/// let db = TestDatabase::new().await?; // from DATABASE_URL
/// let mut conn = db.pool().get().await?;
/// # let _ = &mut conn;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    server_url: String,
    pool: Pool,
}

impl TestDatabase {
    /// A fresh database on the server that `DATABASE_URL` names (default
    /// [`DEFAULT_SERVER_URL`]), with a pool of 10 connections.
    pub async fn new() -> Result<TestDatabase> {
        let server = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_SERVER_URL.into());
        Self::on(&server, 10).await
    }

    /// A fresh database on the server of `server_url` (a URL to any of its
    /// databases: only the host, port, user and options are used), with a
    /// pool of `pool_size` connections.
    pub async fn on(server_url: &str, pool_size: u32) -> Result<TestDatabase> {
        if pool_size == 0 {
            return Err(Error::InvalidArgument(
                "a test database's pool needs at least 1 connection".into(),
            ));
        }
        let mut admin = AsyncPgConnection::establish(server_url).await?;
        let template = ensure_template(&mut admin, server_url).await?;
        let name = unique_name();
        tsql::create_database(&mut admin, &name, Some(&template)).await?;
        let url = url_for(server_url, &name)?;
        let pool = crate::connect(&url, pool_size).await?;
        Ok(TestDatabase {
            name,
            url,
            server_url: server_url.to_owned(),
            pool,
        })
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The pool on it.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// A connection of its own (not from the pool), e.g. for a test
    /// transaction.
    pub async fn connect(&self) -> Result<AsyncPgConnection> {
        Ok(AsyncPgConnection::establish(&self.url).await?)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: database {} kept for inspection", self.name);
            return;
        }
        // Drop cannot await, and the test's runtime may be shutting down:
        // a runtime of its own, on a thread of its own.
        let (name, server) = (self.name.clone(), self.server_url.clone());
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut admin) = AsyncPgConnection::establish(&server).await {
                    let _ = tsql::drop_database(&mut admin, &name).await;
                }
            });
        })
        .join();
    }
}

/// The template's name for this pgfifo's schema (the same as pgfifo's own
/// harness computes).
pub fn template_name() -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    "schema_migrations with checksum".hash(&mut hasher);
    for m in crate::migrate::MIGRATIONS {
        m.version.hash(&mut hasher);
        m.up.hash(&mut hasher);
    }
    for f in crate::migrate::FUNCTIONS {
        f.file.hash(&mut hasher);
        f.sql.hash(&mut hasher);
    }
    crate::migrate::RELEASE.hash(&mut hasher);
    format!("pgfifo_template_{:016x}", hasher.finish())
}

/// Makes sure the template of this schema exists (building it under the
/// advisory lock if not) and returns its name. Cached per process.
async fn ensure_template(admin: &mut AsyncPgConnection, server_url: &str) -> Result<String> {
    static READY: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let template = template_name();
    if READY.get().is_some_and(|t| *t == template) {
        return Ok(template);
    }
    tsql::template_lock(admin, true).await?;
    let built = build_template(admin, server_url, &template).await;
    let unlocked = tsql::template_lock(admin, false).await;
    built?;
    unlocked?;
    let _ = READY.set(template.clone());
    Ok(template)
}

async fn build_template(
    admin: &mut AsyncPgConnection,
    server_url: &str,
    template: &str,
) -> Result<()> {
    if tsql::database_exists(admin, template).await? {
        return Ok(());
    }
    sweep_stale(admin).await;
    let building = format!("{template}_building");
    tsql::drop_database(admin, &building).await?;
    tsql::create_database(admin, &building, None).await?;
    {
        let mut conn = AsyncPgConnection::establish(&url_for(server_url, &building)?).await?;
        crate::migrate::migrate_conn(&mut conn).await?;
    }
    tsql::publish_template(admin, &building, template, epoch_secs()).await?;
    Ok(())
}

/// Drops test databases that failed runs kept more than a day ago.
async fn sweep_stale(admin: &mut AsyncPgConnection) {
    let now = epoch_secs();
    for name in tsql::test_databases(admin).await.unwrap_or_default() {
        let created = name
            .strip_prefix("pgfifo_test_")
            .and_then(|rest| rest.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if created.is_some_and(|c| now.saturating_sub(c) > 86_400) && tsql::plain_name(&name) {
            let _ = tsql::drop_database(admin, &name).await;
        }
    }
}

fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "pgfifo_test_{}_{}_t{}",
        epoch_secs(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `url` with its database name replaced by `db`.
fn url_for(url: &str, db: &str) -> Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let Some(scheme_end) = base.find("://").map(|i| i + 3) else {
        return Err(Error::InvalidArgument(format!(
            "not a postgres:// URL: {url:?}"
        )));
    };
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    Ok(match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    })
}

#[cfg(test)]
mod tests {
    use super::url_for;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            url_for("postgres://u@h:5432/postgres", "x").unwrap(),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            url_for("postgres://u@h/db?sslmode=disable", "x").unwrap(),
            "postgres://u@h/x?sslmode=disable"
        );
        assert!(url_for("nonsense", "x").is_err());
    }
}

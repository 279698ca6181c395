//! Test support for pgfifo's integration tests: one real PostgreSQL database
//! per test, cloned from a template that is migrated once per schema version.
//!
//! `DATABASE_URL` names the server (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). A test's database is
//! dropped when its [`TestDb`] is dropped after the test passed, and kept for
//! inspection when it failed (its name is printed); kept databases older than
//! a day are swept when the template is next checked.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{Job, JobId, Pool, RunnerConfig, RunnerHandle};

pub mod faults;
pub mod records;
pub mod release_0_1_0;
pub mod worker;

/// The server tests run against.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `db`.
pub fn url_for(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    }
}

/// A database of its own for one test, with pgfifo migrated.
pub struct TestDb {
    /// The database's name.
    pub name: String,
    /// Its connection URL.
    pub url: String,
    /// A pool on it (20 connections).
    pub pool: Pool,
}

impl TestDb {
    /// Creates a fresh migrated database.
    pub async fn new() -> TestDb {
        Self::with_pool_size(20).await
    }

    /// Like [`new`](Self::new) with a pool of `size` connections.
    pub async fn with_pool_size(size: u32) -> TestDb {
        let template = ensure_template().await;
        Self::create(Some(&template), size).await
    }

    /// An empty database without pgfifo's schema (from PostgreSQL's default
    /// template), with a pool of 20: for tests that install an older
    /// release's schema and upgrade it.
    pub async fn unmigrated() -> TestDb {
        Self::create(None, 20).await
    }

    async fn create(template: Option<&str>, size: u32) -> TestDb {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("PGFIFO_TEST_LOG")
                    .unwrap_or_else(|_| "off".into()),
            )
            .with_test_writer()
            .try_init();
        let name = unique_name();
        let mut admin = admin().await;
        let create = match template {
            Some(template) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
            None => format!("CREATE DATABASE \"{name}\""),
        };
        admin
            .batch_execute(&create)
            .await
            .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
        let url = url_for(&server_url(), &name);
        let pool = pgfifo::connect(&url, size)
            .await
            .expect("connect to the test database");
        TestDb { name, url, pool }
    }

    /// A connection from the test's pool.
    pub async fn conn(&self) -> pgfifo::db::PooledConnection {
        self.pool.get_owned().await.expect("pooled connection")
    }

    /// A connection of its own (not from the pool).
    pub async fn direct(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect")
    }

    /// Runs `sql` and returns the single bigint it yields.
    pub async fn scalar(&self, sql: &str) -> i64 {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = BigInt)]
            v: i64,
        }
        let mut conn = self.conn().await;
        let row: Row = diesel::sql_query(format!("SELECT ({sql})::bigint AS v"))
            .get_result(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.v
    }

    /// Runs `sql` and returns the single text it yields (NULL as `None`).
    pub async fn text(&self, sql: &str) -> Option<String> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
            v: Option<String>,
        }
        let mut conn = self.conn().await;
        let row: Row = diesel::sql_query(format!("SELECT ({sql})::text AS v"))
            .get_result(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.v
    }

    /// Runs statements without results.
    pub async fn exec(&self, sql: &str) {
        let mut conn = self.conn().await;
        conn.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Waits until `sql` (a bigint) equals `expected`, polling; panics after `limit`.
    pub async fn wait_for(&self, sql: &str, expected: i64, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let value = self.scalar(sql).await;
            if value == expected {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("waited {limit:?} for `{sql}` = {expected}; it is {value}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `n` jobs in all have succeeded; panics after `limit`.
    pub async fn wait_succeeded(&self, n: i64, limit: Duration) {
        self.wait_for(
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
            n,
            limit,
        )
        .await;
    }

    /// Waits until job `id` has succeeded; panics after `limit`.
    pub async fn wait_job_succeeded(&self, id: JobId, limit: Duration) {
        self.wait_for(
            &format!("SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'succeeded'"),
            1,
            limit,
        )
        .await;
    }

    /// Waits until job `id` has `n` `pgfifo.job_attempt` rows (started
    /// attempts); panics after `limit`.
    pub async fn wait_attempt_rows(&self, id: JobId, n: i64, limit: Duration) {
        self.wait_for(
            &format!("SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {id}"),
            n,
            limit,
        )
        .await;
    }

    /// Job `id`'s state and attempts as `"<state> <attempts>"`, e.g.
    /// `"succeeded 1"`; panics if there is no such job.
    pub async fn job_state(&self, id: JobId) -> String {
        self.text(&format!(
            "SELECT state || ' ' || attempts FROM pgfifo.job WHERE id = {id}"
        ))
        .await
        .unwrap_or_else(|| panic!("no job {id}"))
    }

    /// Job `id`'s `last_error` (`None` when it has none).
    pub async fn last_error(&self, id: JobId) -> Option<String> {
        self.text(&format!(
            "SELECT last_error FROM pgfifo.job WHERE id = {id}"
        ))
        .await
    }

    /// How many `pgfifo.job_attempt` rows (started attempts) job `id` has.
    pub async fn attempt_rows(&self, id: JobId) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {id}"
        ))
        .await
    }

    /// The `error` noted for attempt `attempt` of job `id` (`None` when it
    /// has none or there is no such attempt).
    pub async fn attempt_error(&self, id: JobId, attempt: u32) -> Option<String> {
        self.text(&format!(
            "SELECT error FROM pgfifo.job_attempt WHERE job_id = {id} AND attempt = {attempt}"
        ))
        .await
    }

    /// Waits until every job of `ids` is in `state` (`queued`, `succeeded`,
    /// `failed` or `cancelled`); panics after `limit`.
    pub async fn wait_jobs_in(&self, ids: &[JobId], state: &str, limit: Duration) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND state = '{state}'",
                id_list(ids)
            ),
            ids.len() as i64,
            limit,
        )
        .await;
    }

    /// How many `pgfifo.job_attempt` rows (started attempts) the jobs `ids`
    /// have, all together.
    pub async fn attempts_of(&self, ids: &[JobId]) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({})",
            id_list(ids)
        ))
        .await
    }

    /// Starts a runner with `config` on the test's pool.
    pub async fn start_runner(&self, config: RunnerConfig) -> RunnerHandle {
        pgfifo::runner::start(self.pool.clone(), config)
            .await
            .expect("start the runner")
    }

    /// Enqueues `job` in group `group` on a pooled connection of its own
    /// (given back at once) and returns its id.
    pub async fn enqueue<J: Job>(&self, job: J, group: &str) -> JobId {
        let mut conn = self.conn().await;
        job.enqueue(&mut conn, group).await.expect("enqueue")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_unless_failed(&self.name);
    }
}

/// Drops database `name` at the end of a test that passed; keeps it (and
/// says so) when the test failed. From a thread of its own: Drop cannot
/// await, and the test's runtime may be shutting down.
fn drop_unless_failed(name: &str) {
    if std::thread::panicking() {
        eprintln!("test failed: database {name} kept for inspection");
        return;
    }
    let name = name.to_owned();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            if let Ok(mut admin) = AsyncPgConnection::establish(&server_url()).await {
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            }
        });
    })
    .join();
}

/// `ids` as a SQL list, for `id IN (…)` (`NULL` when empty, which matches
/// nothing).
pub fn id_list(ids: &[JobId]) -> String {
    if ids.is_empty() {
        return "NULL".to_owned();
    }
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// A runner configuration for tests: short polls and timeouts.
pub fn test_config() -> RunnerConfig {
    RunnerConfig::default()
        .poll_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(10))
}

/// Polls `probe` every 20 ms until it returns `Ok`, and returns that value.
/// After `limit`, panics with `what` and the last `Err` (what the probe saw).
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) if tokio::time::Instant::now() > deadline => {
                panic!("waited {limit:?} for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn admin() -> AsyncPgConnection {
    AsyncPgConnection::establish(&server_url())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e} (is PostgreSQL running?)", server_url()))
}

fn unique_name() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    format!(
        "pgfifo_test_{secs}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The template database for the current migrations, created on first use
/// under an advisory lock (parallel test processes create it once).
async fn ensure_template() -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    // The migration runner's own bookkeeping table is part of the template
    // too: bump this when its shape changes.
    "schema_migrations with checksum".hash(&mut hasher);
    for m in pgfifo::migrate::MIGRATIONS {
        m.version.hash(&mut hasher);
        m.up.hash(&mut hasher);
    }
    for f in pgfifo::migrate::FUNCTIONS {
        f.file.hash(&mut hasher);
        f.sql.hash(&mut hasher);
    }
    pgfifo::migrate::RELEASE.hash(&mut hasher);
    let template = format!("pgfifo_template_{:016x}", hasher.finish());

    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut admin = admin().await;
    admin
        .batch_execute("SELECT pg_advisory_lock(8099555043121823745)")
        .await
        .expect("template lock");
    let existing: Count =
        diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
            .bind::<Text, _>(&template)
            .get_result(&mut admin)
            .await
            .expect("look for the template");
    if existing.n == 0 {
        sweep_stale(&mut admin).await;
        let building = format!("{template}_building");
        for sql in [
            format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{building}\""),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create the template database");
        }
        {
            let mut conn = AsyncPgConnection::establish(&url_for(&server_url(), &building))
                .await
                .expect("connect to the template");
            pgfifo::migrate::migrate_conn(&mut conn)
                .await
                .expect("migrate the template");
        }
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{building}\" RENAME TO \"{template}\"; \
                 ALTER DATABASE \"{template}\" WITH IS_TEMPLATE true; \
                 COMMENT ON DATABASE \"{template}\" IS 'pgfifo test template created {}'",
                epoch_secs()
            ))
            .await
            .expect("publish the template");
    }
    admin
        .batch_execute("SELECT pg_advisory_unlock(8099555043121823745)")
        .await
        .expect("template unlock");
    template
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Drops test databases left by failed runs more than a day ago, and
/// templates of other schema versions made more than an hour ago (a test
/// run of another checkout may still be cloning a younger one).
async fn sweep_stale(admin: &mut AsyncPgConnection) {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        datname: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
        comment: Option<String>,
    }
    let names: Vec<Name> = diesel::sql_query(
        "SELECT datname::text AS datname, shobj_description(oid, 'pg_database') AS comment
         FROM pg_database WHERE datname LIKE 'pgfifo\\_te%'",
    )
    .load(admin)
    .await
    .unwrap_or_default();
    let now = epoch_secs();
    let older_than = |created: Option<u64>, secs: u64| {
        created.is_none_or(|created| now.saturating_sub(created) > secs)
    };
    for Name { datname, comment } in names {
        let stale = if let Some(rest) = datname.strip_prefix("pgfifo_test_") {
            let created = rest.split('_').next().and_then(|s| s.parse::<u64>().ok());
            created.is_some() && older_than(created, 86_400)
        } else if datname.starts_with("pgfifo_template_") {
            let created = comment
                .as_deref()
                .and_then(|c| c.rsplit(' ').next())
                .and_then(|s| s.parse::<u64>().ok());
            older_than(created, 3_600)
        } else {
            false
        };
        if stale {
            let _ = admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{datname}\" WITH IS_TEMPLATE false"
                ))
                .await;
            let _ = admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{datname}\" WITH (FORCE)"
                ))
                .await;
        }
    }
}

/// An empty database (from PostgreSQL's default template, not pgfifo's
/// migrated one), dropped when the test passes and kept when it fails.
pub struct FreshDb {
    name: String,
    /// Its URL.
    pub url: String,
}

impl FreshDb {
    /// Creates it; `tag` goes into its name (which follows the harness's
    /// naming scheme, so databases of failed runs are swept).
    pub async fn new(tag: &str) -> FreshDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let name = format!(
            "pgfifo_test_{secs}_{}_{tag}{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = AsyncPgConnection::establish(&server_url())
            .await
            .expect("admin connection");
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .expect("create database");
        let url = url_for(&server_url(), &name);
        FreshDb { name, url }
    }

    /// A direct connection to it.
    pub async fn connect(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to the fresh database")
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        drop_unless_failed(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::url_for;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            url_for("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(url_for("postgres://u@h:5432", "x"), "postgres://u@h:5432/x");
        assert_eq!(
            url_for("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}

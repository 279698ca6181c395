//! Test support for pgfifo's integration tests: one real PostgreSQL database
//! per test, cloned from a template that is migrated once per schema version.
//!
//! `DATABASE_URL` names the server (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). A test's database is
//! dropped when its [`TestDb`] is dropped after the test passed, and kept for
//! inspection when it failed (its name is printed); kept databases older than
//! a day are swept when the template is next checked.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{Job, JobId, Pool, RunnerConfig, RunnerHandle};

pub mod acked_worker;
pub mod browser;
pub mod citus;
pub mod failover;
pub mod faults;
pub mod pgbouncer;
pub mod query;
pub mod rates;
pub mod records;
pub mod release_0_1_0;
mod server;
pub mod worker;

use server::{create_database, drop_unless_failed, ensure_template, unique_name};
pub use server::{server_url, url_for, FreshDb};

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
        let name = unique_name("");
        create_database(&name, template).await;
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
        query::scalar(&mut *self.conn().await, sql).await
    }

    /// Runs `sql` and returns the single text it yields (NULL as `None`).
    pub async fn text(&self, sql: &str) -> Option<String> {
        query::text(&mut *self.conn().await, sql).await
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

//! Connections and every SQL statement pgfifo sends.
//!
//! One home for SQL: each statement lives in the file named for its
//! consumer ([`runner`], [`enqueue`], [`admin`], [`maintenance`],
//! [`schedule`], [`migrate`]), with the rows it returns; [`pooler`] adapts
//! them to a transaction-mode pooler. The schema's functions, which
//! implement enqueue, pick and completion, are in `functions/` (installed by
//! [`crate::migrate`]); its tables in `migrations/` at the repository root.
//! Values always reach SQL as bound parameters, and no statement is built
//! from runtime text. [`error`] tells database errors apart.

pub(crate) mod admin;
pub(crate) mod enqueue;
pub(crate) mod error;
pub(crate) mod long_run;
pub(crate) mod maintenance;
pub(crate) mod migrate;
pub mod pooler;
pub(crate) mod runner;
pub(crate) mod schedule;
pub(crate) mod session_sql;
pub(crate) mod statement;
#[cfg(feature = "testing")]
pub(crate) mod testing;

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use std::time::Duration;

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::pooled_connection::{ManagerConfig, RecyclingMethod};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

use crate::{Error, Result};

/// The connection pool pgfifo works with: bb8 over diesel-async's PostgreSQL
/// connection. Build it yourself (any settings) or with [`connect`].
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of a [`Pool`] for as long as the holder needs it.
pub type PooledConnection =
    bb8::PooledConnection<'static, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// How long [`connect`] waits for the server to answer (TCP connect, TLS and
/// the startup exchange), per connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Server-side TCP keepalives put on every connection [`connect`] opens: a
/// peer that vanished from the network (a dead machine, a partition) is
/// noticed within about 25 s, its session ends and its jobs' locks are
/// released. A frozen process is caught by the idle bound of each job's
/// transaction instead (its kernel still answers keepalives).
const KEEPALIVES: &str =
    "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3";

/// Builds a pool of at most `max_size` connections to `database_url`.
///
/// A runner holds one connection per lane (`concurrency + prefetch`, see
/// [`RunnerConfig::prefetch`](crate::RunnerConfig::prefetch)) plus two of its
/// own (the LISTEN connection and the attempt bookkeeper), and for moments
/// up to two more (the heartbeat and metrics sampling, a retention pass), so
/// size the pool at least `concurrency + prefetch + 4` plus what the
/// application uses.
///
/// Fails at once with a clear error when the database cannot be reached, and
/// within [`CONNECT_TIMEOUT`] when a server accepts the connection but never
/// answers. Each connection gets TCP keepalives (see `docs/failure-model.md`).
pub async fn connect(database_url: &str, max_size: u32) -> Result<Pool> {
    connect_with(database_url, ConnectOptions::new(max_size)).await
}

/// How [`connect_with`] builds a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    max_size: u32,
    transaction_pooler: bool,
}

impl ConnectOptions {
    /// A pool of at most `max_size` connections, straight to PostgreSQL or
    /// through a pooler in session mode.
    pub fn new(max_size: u32) -> Self {
        ConnectOptions {
            max_size,
            transaction_pooler: false,
        }
    }

    /// The URL leads to a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`, or a managed proxy that multiplexes
    /// transactions): each connection is
    /// [prepared for it](pooler::prepare_for_transaction_pooler), and gets
    /// no session settings (the pooler's own `tcp_keepalive` settings apply
    /// instead). See `docs/deploying.md`.
    pub fn transaction_pooler(mut self, yes: bool) -> Self {
        self.transaction_pooler = yes;
        self
    }
}

/// [`connect`] with [`ConnectOptions`]: the same checks and timeouts.
pub async fn connect_with(database_url: &str, options: ConnectOptions) -> Result<Pool> {
    let pooled = options.transaction_pooler;
    // bb8 connects lazily and retries until its timeout; connect once directly
    // so a bad URL or a down server is reported now, with the server's reason.
    let first = tokio::time::timeout(CONNECT_TIMEOUT, open(database_url, pooled))
        .await
        .map_err(|_| Error::ConnectTimeout(CONNECT_TIMEOUT))?;
    drop(first.map_err(Error::Connection)?);
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(move |url| Box::pin(establish(url.to_owned(), pooled)));
    if pooled {
        // bb8's default check on checkout is a prepared `SELECT 1` outside a
        // transaction; a simple-protocol query is one message the pooler
        // cannot split.
        config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
            Box::pin(conn.batch_execute("SELECT 1"))
        }));
    }
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(database_url, config);
    bb8::Pool::builder()
        .max_size(options.max_size)
        .connection_timeout(Duration::from_secs(30))
        .build(manager)
        .await
        .map_err(|err| Error::Pool(bb8::RunError::User(err)))
}

/// Opens one connection: with the keepalive settings, or, through a
/// transaction-mode pooler (`pooled`), prepared for it.
async fn open(url: &str, pooled: bool) -> ConnectionResult<AsyncPgConnection> {
    if pooled {
        return pooler::establish(url).await;
    }
    let mut conn = AsyncPgConnection::establish(url).await?;
    conn.batch_execute(KEEPALIVES)
        .await
        .map_err(ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// Opens one connection straight to PostgreSQL, with the keepalive
/// settings, within [`CONNECT_TIMEOUT`]: for what a pooler cannot carry
/// (LISTEN, session locks).
pub(crate) async fn open_direct(url: &str) -> ConnectionResult<AsyncPgConnection> {
    establish(url.to_owned(), false).await
}

/// [`open`] within [`CONNECT_TIMEOUT`]: how the pool connects.
async fn establish(url: String, pooled: bool) -> ConnectionResult<AsyncPgConnection> {
    tokio::time::timeout(CONNECT_TIMEOUT, open(&url, pooled))
        .await
        .unwrap_or_else(|_| {
            Err(ConnectionError::BadConnection(format!(
                "the database server did not answer within {CONNECT_TIMEOUT:?}"
            )))
        })
}

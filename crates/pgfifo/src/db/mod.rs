//! Connections and every SQL statement pgfifo sends.
//!
//! One home for SQL: each statement lives in the file named for its
//! consumer ([`runner`], [`enqueue`], [`admin`], [`maintenance`],
//! [`schedule`], [`migrate`]), with the rows it returns. The schema's functions, which
//! implement enqueue, pick and completion, are in `functions/` (installed by
//! [`crate::migrate`]); its tables in `migrations/` at the repository root.
//! Values always reach SQL as bound parameters, and no statement is built
//! from runtime text. [`error`] tells database errors apart.

pub(crate) mod admin;
pub(crate) mod enqueue;
pub(crate) mod error;
pub(crate) mod maintenance;
pub(crate) mod migrate;
pub(crate) mod runner;
pub(crate) mod schedule;
pub(crate) mod statement;

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use std::time::Duration;

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::pooled_connection::ManagerConfig;
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
    // bb8 connects lazily and retries until its timeout; connect once directly
    // so a bad URL or a down server is reported now, with the server's reason.
    let first = tokio::time::timeout(CONNECT_TIMEOUT, open(database_url))
        .await
        .map_err(|_| Error::ConnectTimeout(CONNECT_TIMEOUT))?;
    drop(first.map_err(Error::Connection)?);
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(|url| Box::pin(establish(url.to_owned())));
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(database_url, config);
    bb8::Pool::builder()
        .max_size(max_size)
        .connection_timeout(Duration::from_secs(30))
        .build(manager)
        .await
        .map_err(|err| Error::Pool(bb8::RunError::User(err)))
}

/// Opens one connection with the keepalive settings.
async fn open(url: &str) -> ConnectionResult<AsyncPgConnection> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    conn.batch_execute(KEEPALIVES)
        .await
        .map_err(ConnectionError::CouldntSetupConfiguration)?;
    Ok(conn)
}

/// [`open`] within [`CONNECT_TIMEOUT`]: how the pool connects.
async fn establish(url: String) -> ConnectionResult<AsyncPgConnection> {
    tokio::time::timeout(CONNECT_TIMEOUT, open(&url))
        .await
        .unwrap_or_else(|_| {
            Err(ConnectionError::BadConnection(format!(
                "the database server did not answer within {CONNECT_TIMEOUT:?}"
            )))
        })
}

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
pub(crate) mod batch;
pub(crate) mod citus;
pub(crate) mod dependency;
pub(crate) mod enqueue;
pub(crate) mod enqueue_window;
pub(crate) mod error;
pub(crate) mod hosts;
pub(crate) mod layout;
pub(crate) mod long_run;
pub(crate) mod maintenance;
pub(crate) mod migrate;
pub(crate) mod pick;
pub mod pooler;
pub(crate) mod queue_rate;
pub(crate) mod runner;
pub(crate) mod schedule;
pub(crate) mod session_sql;
pub(crate) mod statement;
#[cfg(feature = "testing")]
pub(crate) mod testing;
pub(crate) mod trace;

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use std::time::Duration;

use std::sync::Arc;

use diesel::ConnectionResult;
use diesel_async::pooled_connection::{ManagerConfig, RecyclingMethod};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

use crate::{Error, Result};

/// The connection pool pgfifo works with: bb8 over diesel-async's PostgreSQL
/// connection. Build it yourself (any settings) or with [`connect`].
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of a [`Pool`] for as long as the holder needs it.
pub type PooledConnection =
    bb8::PooledConnection<'static, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// How long pgfifo waits for one server to answer a new connection (TCP
/// connect, TLS, the start-up exchange and the read-write check) before it
/// tries the URL's next host: the default of
/// [`ConnectOptions::connect_timeout_per_host`], and the deadline of the
/// runner's [`direct_url`](crate::RunnerConfig::direct_url) connections.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the pool's check of an idle connection, before it hands it
/// out, may take by default ([`ConnectOptions::check_timeout`]).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Builds a pool of at most `max_size` connections to `database_url`.
///
/// A runner holds one connection per lane (`concurrency + prefetch`, see
/// [`RunnerConfig::prefetch`](crate::RunnerConfig::prefetch)) plus two of its
/// own (the LISTEN connection and the attempt bookkeeper), and for moments
/// up to two more (the heartbeat and metrics sampling, a retention pass), so
/// size the pool at least `concurrency + prefetch + 4` plus what the
/// application uses.
///
/// The URL may name several hosts
/// (`postgres://app@a:5432,b:5432/app?target_session_attrs=read-write`):
/// each new connection tries them in turn, each within
/// [`CONNECT_TIMEOUT`], and with `target_session_attrs=read-write` skips
/// servers that take no writes, so that after a failover new connections
/// reach the new primary (`docs/failover.md`). A `pgbouncer=true`
/// parameter says that the URL leads to a pooler in transaction mode
/// ([`ConnectOptions::transaction_pooler`]); it is taken out of the URL.
///
/// Fails at once with a clear error when the database cannot be reached, and
/// with [`Error::ConnectTimeout`] when every host accepts the connection but
/// none answers in time. Each connection gets TCP keepalives (see
/// `docs/failure-model.md`).
pub async fn connect(database_url: &str, max_size: u32) -> Result<Pool> {
    connect_with(database_url, ConnectOptions::new(max_size)).await
}

/// How [`connect_with`] builds a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    max_size: u32,
    transaction_pooler: bool,
    connect_timeout_per_host: Duration,
    check_timeout: Duration,
}

impl ConnectOptions {
    /// A pool of at most `max_size` connections, straight to PostgreSQL or
    /// through a pooler in session mode.
    pub fn new(max_size: u32) -> Self {
        ConnectOptions {
            max_size,
            transaction_pooler: false,
            connect_timeout_per_host: CONNECT_TIMEOUT,
            check_timeout: CHECK_TIMEOUT,
        }
    }

    /// The URL leads to a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`, or a managed proxy that multiplexes
    /// transactions): each connection is
    /// [prepared for it](pooler::prepare_for_transaction_pooler), and gets
    /// no session settings (the pooler's own `tcp_keepalive` settings apply
    /// instead). See `docs/deploying.md`. A URL with `pgbouncer=true` turns
    /// this on by itself.
    pub fn transaction_pooler(mut self, yes: bool) -> Self {
        self.transaction_pooler = yes;
        self
    }

    /// How long one host of the URL gets to answer a new connection before
    /// the next host is tried (default [`CONNECT_TIMEOUT`], 5 s). It covers
    /// the TCP connect, the start-up exchange and the read-write check, so
    /// a host that accepts connections but hangs (a frozen server) costs
    /// this long, not the whole attempt. tokio-postgres's own
    /// `connect_timeout` URL parameter still bounds each TCP connect.
    pub fn connect_timeout_per_host(mut self, deadline: Duration) -> Self {
        self.connect_timeout_per_host = deadline;
        self
    }

    /// How long the pool's check of an idle connection (a round trip before
    /// it is handed out) may take before the connection is closed and
    /// another one is used (default [`CHECK_TIMEOUT`], 2 s): a connection
    /// to a server that hung is not handed out. With
    /// `target_session_attrs=read-write` in the URL the check also refuses
    /// a connection whose server takes no writes any more (a primary
    /// demoted to a standby).
    pub fn check_timeout(mut self, deadline: Duration) -> Self {
        self.check_timeout = deadline;
        self
    }
}

/// [`connect`] with [`ConnectOptions`]: the same checks and timeouts.
pub async fn connect_with(database_url: &str, options: ConnectOptions) -> Result<Pool> {
    let target = Arc::new(hosts::Target::parse(database_url)?);
    let pooled = options.transaction_pooler || target.transaction_pooler;
    let per_host = options.connect_timeout_per_host;
    // bb8 connects lazily and retries until its timeout; connect once directly
    // so a bad URL or a down server is reported now, with the server's reason.
    match hosts::open(&target, per_host, pooled).await {
        Ok(first) => drop(first),
        Err(hosts::Failure::TimedOut(deadline)) => return Err(Error::ConnectTimeout(deadline)),
        Err(hosts::Failure::Failed(err)) => return Err(Error::Connection(err)),
    }
    let mut config = ManagerConfig::default();
    let setup_target = target.clone();
    config.custom_setup = Box::new(move |_url| {
        Box::pin(hosts::open_for_pool(setup_target.clone(), per_host, pooled))
    });
    // bb8's check on checkout: a simple-protocol statement (one message a
    // transaction-mode pooler cannot split), within a deadline, so that a
    // connection to a hung server is closed rather than handed out.
    let check = target.check();
    let check_timeout = options.check_timeout;
    config.recycling_method = RecyclingMethod::CustomFunction(Box::new(move |conn| {
        Box::pin(async move {
            match tokio::time::timeout(check_timeout, conn.batch_execute(check)).await {
                Ok(checked) => checked,
                Err(_) => Err(error::timed_out(check_timeout)),
            }
        })
    }));
    let manager =
        AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(&target.url, config);
    bb8::Pool::builder()
        .max_size(options.max_size)
        .connection_timeout(Duration::from_secs(30))
        .build(manager)
        .await
        .map_err(|err| Error::Pool(bb8::RunError::User(err)))
}

/// Opens one connection outside any pool, as [`connect`]'s pool opens
/// them: each host of `url` in turn within [`CONNECT_TIMEOUT`],
/// `target_session_attrs` honoured, and, when the URL carries
/// `pgbouncer=true`, [prepared for a transaction-mode pooler](pooler::prepare_for_transaction_pooler).
/// For tools and scripts that want one connection from the same URL as the
/// runner.
pub async fn establish(url: &str) -> ConnectionResult<AsyncPgConnection> {
    let target = hosts::Target::parse(url)?;
    let pooled = target.transaction_pooler;
    hosts::open(&target, CONNECT_TIMEOUT, pooled)
        .await
        .map_err(Into::into)
}

/// Opens one connection from `url` prepared for a transaction-mode pooler,
/// whatever the URL says ([`pooler::establish`]).
pub(crate) async fn open_pooled(url: &str) -> ConnectionResult<AsyncPgConnection> {
    let target = hosts::Target::parse(url)?;
    hosts::open(&target, CONNECT_TIMEOUT, true)
        .await
        .map_err(Into::into)
}

/// Opens one connection straight to PostgreSQL, with the keepalive
/// settings, trying each host of `url` within [`CONNECT_TIMEOUT`]: for what
/// a pooler cannot carry (LISTEN, session locks).
pub(crate) async fn open_direct(url: &str) -> ConnectionResult<AsyncPgConnection> {
    let target = hosts::Target::parse(url)?;
    hosts::open(&target, CONNECT_TIMEOUT, false)
        .await
        .map_err(Into::into)
}

/// Makes the pool close `conn` when it comes back rather than hand it out
/// again, without a round trip: its server hung, or takes no writes.
/// (diesel's transaction manager in error is what the pool's
/// `has_broken` reads.)
pub(crate) fn discard(conn: &mut AsyncPgConnection) {
    use diesel::connection::TransactionManagerStatus;
    use diesel_async::{AnsiTransactionManager, TransactionManager};
    *AnsiTransactionManager::transaction_manager_status_mut(conn) =
        TransactionManagerStatus::InError;
}

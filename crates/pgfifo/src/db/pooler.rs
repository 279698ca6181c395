//! Connections that reach PostgreSQL through a transaction-mode pooler.
//!
//! PgBouncer in transaction mode (and proxies that work like it) hands a
//! client a server connection for one transaction at a time. Two things
//! that diesel-async does by default break there:
//!
//! * **Named prepared statements.** diesel-async prepares every statement
//!   under a name (`s0`, `s1`, …) with one round trip and runs it with
//!   another. Outside a transaction the pooler may send the second to a
//!   different server, which answers `prepared statement "s0" does not
//!   exist`; and a statement kept in the cache lives on one server only.
//! * **Session state.** `SET`, `LISTEN` and session advisory locks stay on
//!   whichever server ran them.
//!
//! diesel-async's own setup runs two such statements as a connection opens
//! (it sets the time zone and the client encoding), and bb8's default
//! check of a connection on checkout is a third. [`establish`] therefore
//! opens the connection inside a transaction, so that its setup runs on one
//! server, and [`connect_with`](super::connect_with) checks pooled
//! connections with a simple-protocol query.
//!
//! A connection prepared with [`prepare_for_transaction_pooler`] keeps no
//! statement cache, so each statement is prepared, run and closed in turn,
//! and is marked: pgfifo then runs each of its statements that would
//! otherwise run alone (autocommit) inside a transaction of its own
//! ([`pinned`]), which the pooler keeps on one server. In the application's
//! own transaction nothing changes. The runner reads the mark to know that
//! it must not LISTEN or take session locks through the pool (see
//! `RunnerConfig::direct_url`).
//!
//! The mark is the connection's diesel [`Instrumentation`]: the one piece of
//! per-connection state diesel lets a library set and read back. It forwards
//! every event to diesel's default instrumentation, if one is set. The same
//! mark also names the host a connection that pgfifo opened went to (see
//! [`host_of`]), for the runner to tell which running handlers a hung
//! server holds.

use diesel::connection::{
    get_default_instrumentation, CacheSize, Instrumentation, InstrumentationEvent,
    TransactionManagerStatus,
};
use diesel::{ConnectionError, ConnectionResult};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, SimpleAsyncConnection,
    TransactionManager,
};

/// pgfifo's mark on a connection: whether it goes through a
/// transaction-mode pooler, and the host it went to.
struct Mark {
    transaction_pooled: bool,
    host: Option<std::sync::Arc<str>>,
    /// diesel's default instrumentation, which the mark replaced.
    inner: Option<Box<dyn Instrumentation>>,
}

impl Mark {
    /// The connection's mark, set now if it has none.
    fn of(conn: &mut AsyncPgConnection) -> &mut Mark {
        if conn.instrumentation().downcast_ref::<Mark>().is_none() {
            conn.set_instrumentation(Mark {
                transaction_pooled: false,
                host: None,
                inner: get_default_instrumentation(),
            });
        }
        conn.instrumentation()
            .downcast_mut::<Mark>()
            .expect("the mark was just set")
    }
}

impl Instrumentation for Mark {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let Some(inner) = self.inner.as_mut() {
            inner.on_connection_event(event);
        }
    }
}

/// Prepares a connection that reaches PostgreSQL through a pooler in
/// transaction mode (PgBouncer `pool_mode = transaction`, or a managed proxy
/// that multiplexes transactions): turns its prepared-statement cache off
/// and marks it, so that pgfifo puts each of its statements in a
/// transaction (see the module's documentation).
///
/// [`connect_with`](super::connect_with) does this for every connection of
/// a pool built with [`ConnectOptions::transaction_pooler`](super::ConnectOptions::transaction_pooler);
/// call it yourself on connections you open another way, e.g. in your own
/// pool's `custom_setup`. It replaces the connection's diesel
/// instrumentation with one that forwards to diesel's default one.
pub fn prepare_for_transaction_pooler(conn: &mut AsyncPgConnection) {
    conn.set_prepared_statement_cache_size(CacheSize::Disabled);
    Mark::of(conn).transaction_pooled = true;
}

/// Notes on `conn` the host (`host:port`) it was opened to.
pub(crate) fn mark_host(conn: &mut AsyncPgConnection, host: &str) {
    Mark::of(conn).host = Some(host.into());
}

/// The host `conn` was opened to, if pgfifo opened it.
pub(crate) fn host_of(conn: &mut AsyncPgConnection) -> Option<std::sync::Arc<str>> {
    conn.instrumentation()
        .downcast_ref::<Mark>()
        .and_then(|mark| mark.host.clone())
}

/// Opens a connection through a transaction-mode pooler and
/// [prepares it for one](prepare_for_transaction_pooler).
///
/// diesel-async's `establish` would send its setup statements (time zone,
/// client encoding) as named prepared statements outside a transaction,
/// which such a pooler may split across servers: the connection fails to
/// open (`prepared statement "s0" does not exist`) or leaves a statement
/// behind on a server, where it later collides with another process's
/// statement of the same name. Here the setup runs inside a transaction.
///
/// `url` may name several hosts; each is tried in turn within
/// [`CONNECT_TIMEOUT`](super::CONNECT_TIMEOUT), as by
/// [`connect`](super::connect). A `pgbouncer=true` parameter is taken out.
pub async fn establish(url: &str) -> ConnectionResult<AsyncPgConnection> {
    super::open_pooled(url).await
}

/// Sets up a connection that tokio-postgres opened through a
/// transaction-mode pooler (see [`establish`]).
pub(crate) async fn setup(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<
        tokio_postgres::Socket,
        tokio_postgres::tls::NoTlsStream,
    >,
) -> ConnectionResult<AsyncPgConnection> {
    let bad = |err: tokio_postgres::Error| {
        ConnectionError::BadConnection(super::error::with_causes(&err))
    };
    // The connection's I/O is driven by polling `connection`: here, until
    // the BEGIN is through; then by the task diesel-async spawns for it.
    {
        let begin = client.batch_execute("BEGIN");
        tokio::pin!(begin);
        tokio::select! {
            begun = &mut begin => begun.map_err(bad)?,
            closed = &mut connection => {
                return Err(ConnectionError::BadConnection(match closed {
                    Ok(()) => "the server closed the connection".to_owned(),
                    Err(err) => super::error::with_causes(&err),
                }));
            }
        }
    }
    let mut conn = AsyncPgConnection::try_from_client_and_connection(client, connection).await?;
    conn.batch_execute("COMMIT")
        .await
        .map_err(ConnectionError::CouldntSetupConfiguration)?;
    prepare_for_transaction_pooler(&mut conn);
    Ok(conn)
}

/// Whether `conn` was prepared with [`prepare_for_transaction_pooler`].
pub fn is_transaction_pooled(conn: &mut AsyncPgConnection) -> bool {
    conn.instrumentation()
        .downcast_ref::<Mark>()
        .is_some_and(|mark| mark.transaction_pooled)
}

/// Whether `conn` has a transaction open, as diesel sees it. A connection
/// whose transaction state is broken counts as open: pgfifo adds nothing to
/// it, and the statement reports the problem.
pub(crate) fn in_transaction(conn: &mut AsyncPgConnection) -> bool {
    match AnsiTransactionManager::transaction_manager_status_mut(conn) {
        TransactionManagerStatus::Valid(status) => status.transaction_depth().is_some(),
        TransactionManagerStatus::InError => true,
    }
}

/// Runs `work` on `conn`: as it is, or, on a transaction-pooled connection
/// outside a transaction, inside a transaction of its own that commits when
/// `work` succeeds and rolls back when it fails.
pub(crate) async fn pinned<R, E>(
    conn: &mut AsyncPgConnection,
    work: impl AsyncFnOnce(&mut AsyncPgConnection) -> Result<R, E>,
) -> Result<R, E>
where
    E: From<diesel::result::Error>,
{
    if !is_transaction_pooled(conn) || in_transaction(conn) {
        return work(conn).await;
    }
    AnsiTransactionManager::begin_transaction(conn).await?;
    match work(conn).await {
        Ok(value) => {
            AnsiTransactionManager::commit_transaction(conn).await?;
            Ok(value)
        }
        Err(err) => {
            // The error that matters is `work`'s; a failed rollback leaves
            // the connection broken, and the pool discards it.
            let _ = AnsiTransactionManager::rollback_transaction(conn).await;
            Err(err)
        }
    }
}

/// [`pinned`] for a connection whose server is known to have no transaction
/// open although diesel may think otherwise (a lane's, between its job
/// transactions): on a transaction-pooled connection, `work` runs between a
/// `BEGIN` and a `COMMIT` (or `ROLLBACK`) that bypass diesel's bookkeeping.
pub(crate) async fn pinned_idle<R>(
    conn: &mut AsyncPgConnection,
    work: impl AsyncFnOnce(&mut AsyncPgConnection) -> diesel::QueryResult<R>,
) -> diesel::QueryResult<R> {
    if !is_transaction_pooled(conn) {
        return work(conn).await;
    }
    conn.batch_execute("BEGIN").await?;
    match work(conn).await {
        Ok(value) => {
            conn.batch_execute("COMMIT").await?;
            Ok(value)
        }
        Err(err) => {
            let _ = conn.batch_execute("ROLLBACK").await;
            Err(err)
        }
    }
}

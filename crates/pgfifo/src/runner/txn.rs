//! The job transaction's plumbing: the statements pgfifo sends itself to
//! open, mark and end it, keeping diesel's transaction manager in step, and
//! rolling back after a handler ended in any way.

use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, TransactionManager};
use futures_util::FutureExt;

use super::Shared;

/// diesel's transaction manager of a connection.
pub(super) type Tm = <AsyncPgConnection as AsyncConnection>::TransactionManager;

/// How long the rollback of a timed-out handler may wait for the handler's
/// last statement before that statement is cancelled on the server.
const ROLLBACK_PATIENCE: Duration = Duration::from_secs(2);
/// How long to wait after cancelling before giving the connection up.
const CANCEL_PATIENCE: Duration = Duration::from_secs(5);
/// What went wrong with the worker's connection; the worker drops it (the
/// pool discards it, the server aborts its transaction) and starts over.
#[derive(Debug)]
pub(super) struct ConnectionLost(pub(super) String);

impl From<diesel::result::Error> for ConnectionLost {
    fn from(err: diesel::result::Error) -> Self {
        ConnectionLost(err.to_string())
    }
}

/// The handler's savepoint: diesel's name for the savepoint of depth 1.
pub(super) const SAVEPOINT: &str = "SAVEPOINT diesel_savepoint_1";
/// Ends the handlers' savepoint, keeping what is in it.
pub(super) const RELEASE: &str = "RELEASE SAVEPOINT diesel_savepoint_1";
/// Ends a job's transaction and opens the next one.
pub(super) const COMMIT_AND_BEGIN: &str = "COMMIT; BEGIN; SET LOCAL pgfifo.job_transaction = on";
/// Opens a job transaction, marked so that `pgfifo.pick` and
/// `pgfifo.complete` can tell it from autocommit (see `pgfifo.pick`). A
/// utility statement: parsed, never planned or executed like a `SELECT`.
pub(super) const BEGIN_JOB: &str = "BEGIN; SET LOCAL pgfifo.job_transaction = on";
/// Checks the handler's deferred constraints before its success is written.
pub(super) const CHECK_CONSTRAINTS: &str = "SET CONSTRAINTS ALL IMMEDIATE";

/// Whether a database error means the connection is gone (as opposed to an
/// SQL error on a working connection).
pub(super) fn is_connection_error(err: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    !matches!(err, Error::DatabaseError(kind, _) if !matches!(kind, DatabaseErrorKind::ClosedConnection))
}

/// Tells diesel's transaction manager the depth after transaction statements
/// pgfifo sent itself, so handlers' nested `transaction` calls still become
/// savepoints and pooled connections are judged correctly.
pub(super) fn set_depth(conn: &mut AsyncPgConnection, target: u32) -> Result<(), ConnectionLost> {
    use diesel::connection::TransactionDepthChange::{DecreaseDepth, IncreaseDepth};
    let status = Tm::transaction_manager_status_mut(conn).transaction_state()?;
    loop {
        let current = status.transaction_depth().map_or(0, |d| d.get());
        match current.cmp(&target) {
            std::cmp::Ordering::Equal => return Ok(()),
            std::cmp::Ordering::Less => status.change_transaction_depth(IncreaseDepth)?,
            std::cmp::Ordering::Greater => status.change_transaction_depth(DecreaseDepth)?,
        }
    }
}

/// The transaction depth diesel tracks (0: none), or `None` if its state is broken.
pub(super) fn depth(conn: &mut AsyncPgConnection) -> Option<u32> {
    Tm::transaction_manager_status_mut(conn)
        .transaction_depth()
        .ok()
        .map(|d| d.map_or(0, |d| d.get()))
}

/// What the connection's driver task has heard from the server while the
/// connection sat idle in its transaction.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// Nothing: as far as the client can tell, the backend is alive.
    Nothing,
    /// The connection failed or closed: the transaction and its locks are
    /// gone.
    Closed,
    /// A notification came first (the pooled connection once listened):
    /// whatever followed it is unknown without a round trip.
    Unsure,
}

/// Reads, without waiting, what the server sent unasked on `conn`, as far
/// as the connection's driver task has read it. A backend that is
/// terminated, or times out idle in its transaction, or whose server shuts
/// down, sends its FATAL error before it releases its locks, and the driver
/// ends the connection on it; a killed backend's socket closes. So a
/// connection that heard nothing still held its locks a moment ago: the time
/// the error takes to reach the driver, which a round trip's answer also
/// takes. (Unlike a round trip, this does not wait out a silent network: the
/// server then still holds the locks, until keepalives end the session.)
pub(super) fn heard(conn: &mut AsyncPgConnection) -> Heard {
    use futures_util::StreamExt;
    let mut stream = pin!(conn.notifications_stream());
    match stream.next().now_or_never() {
        None => Heard::Nothing,
        Some(None | Some(Err(_))) => Heard::Closed,
        Some(Some(Ok(_))) => Heard::Unsure,
    }
}

/// Rolls back to transaction depth `target` after a handler ended in any way
/// (including a dropped future whose statement may still run on the server:
/// after a while that statement is cancelled). `false`: the connection is
/// unusable and must be dropped, which aborts the transaction on the server.
pub(super) async fn rollback_to(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    target: u32,
    backend_pid: i32,
) -> bool {
    let unwind = AssertUnwindSafe(async {
        loop {
            match depth(conn) {
                Some(d) if d > target => Tm::rollback_transaction(conn).await?,
                Some(d) if d == target => return Ok(true),
                _ => return Ok::<_, diesel::result::Error>(false),
            }
        }
    })
    // diesel asserts (in debug builds) when a transaction statement of the
    // handler was cut off mid-flight; treat that as a broken connection.
    .catch_unwind();
    let mut unwind = pin!(unwind);
    let result = tokio::select! {
        result = &mut unwind => result,
        () = tokio::time::sleep(ROLLBACK_PATIENCE) => {
            tracing::warn!(backend_pid, "the handler's statement is still running; cancelling it");
            shared.bookkeeper.cancel_backend(backend_pid).await;
            match tokio::time::timeout(CANCEL_PATIENCE, &mut unwind).await {
                Ok(result) => result,
                Err(_) => return false,
            }
        }
    };
    matches!(result, Ok(Ok(true)))
}

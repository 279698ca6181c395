//! A lane's connection and its job transaction.
//!
//! pgfifo sends its transaction statements itself, so that they share round
//! trips with the statements around them: a pick goes behind `COMMIT;
//! BEGIN`, the handlers' savepoint beside the attempt bookkeeping (on
//! another connection), its release beside the outcomes. Handlers, though,
//! use diesel's transactions on the same connection, and diesel must then
//! know that a transaction is open, so that their `transaction` calls
//! become savepoints rather than `BEGIN` and `COMMIT`. diesel's stable API
//! changes the depth it tracks only with statements it sends itself, so its
//! view is kept true where it matters:
//!
//! * until the first handler of a checkout, diesel sees no transaction;
//! * the handlers' savepoint is opened through diesel
//!   (`AnsiTransactionManager::begin_transaction_sql`), which makes its view
//!   "one transaction open"; from then on that stays true while the lane
//!   keeps the connection, whatever `COMMIT; BEGIN` pgfifo sends between
//!   picks, and a handler's own transactions nest from there;
//! * the lane's last commit or rollback goes through diesel, which sends the
//!   same `COMMIT` or `ROLLBACK` and sees no transaction again, so the pool
//!   takes the connection back as clean;
//! * a handler cut off in flight (its timeout, a panic, shutdown) may leave
//!   diesel's view deeper than the server's: the lane finishes its
//!   transaction with its own statements and then retires the connection,
//!   which the pool closes (its view shows a transaction).
//!
//! A connection the lane gives up on is [`abandon`](JobConn::abandon)ed:
//! rolled back, and left so that the pool closes it.
//!
//! Every statement the lane sends itself (the pick with its opener, the
//! savepoints, the completions, the commit or rollback, a ping) has a
//! deadline, [`RunnerConfig::round_trip_timeout`](crate::RunnerConfig::round_trip_timeout):
//! a server that does not answer in time is taken for hung (or gone
//! without a word, or frozen mid-failover), and the connection is
//! abandoned without another round trip; the lane's next connection, from
//! a multi-host URL, reaches the writable server. A handler's own
//! statements have no such deadline: its job's timeout bounds them.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::time::Duration;

use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, SimpleAsyncConnection, TransactionManager,
};
use futures_util::FutureExt;

use super::{Board, Lanes};
use crate::db::error::timed_out;
use crate::db::runner::{
    self as sql, Completion, LeftWork, PickRequest, Picked, BEGIN_JOB, BEGIN_JOB_NO_SLOTS,
    CHECK_CONSTRAINTS, COMMIT, COMMIT_AND_BEGIN, COMMIT_AND_BEGIN_NO_SLOTS, HANDLER_SAVEPOINT,
    PING, RELEASE_HANDLER_SAVEPOINT, ROLLBACK, ROLLBACK_TO_HANDLER_SAVEPOINT,
};
use crate::db::PooledConnection;
use crate::runner::hung::HungSignal;

type Tm = AnsiTransactionManager;

/// How long the rollback of a handler that ended by itself may take before
/// whatever still runs on the server is cancelled.
const ROLLBACK_PATIENCE: Duration = Duration::from_secs(2);
/// The same for a handler that was cut off (its timeout, a panic, shutdown):
/// its last statement is done or stuck, and a stuck one is cancelled almost
/// at once, so that the group is free soon after the timeout. (A cancel
/// that finds the session idle is ignored by the server; one that lands on
/// the rollback itself fails it, and the lane gives the connection up,
/// which aborts the transaction: the job runs again.)
const CUT_OFF_PATIENCE: Duration = Duration::from_millis(50);
/// How long to wait after cancelling before giving the connection up.
const CANCEL_PATIENCE: Duration = Duration::from_secs(5);
/// How long [`JobConn::abandon`] waits for its rollback.
const ABANDON_PATIENCE: Duration = Duration::from_secs(1);

/// What went wrong with a lane's connection; the lane abandons it (the
/// server aborts its transaction) and starts over with another.
#[derive(Debug)]
pub(crate) struct ConnectionLost(pub(crate) String);

impl From<diesel::result::Error> for ConnectionLost {
    fn from(err: diesel::result::Error) -> Self {
        ConnectionLost(err.to_string())
    }
}

/// What diesel's transaction manager believes of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DieselView {
    /// No transaction (depth 0): the pool takes the connection back.
    NoTransaction,
    /// One transaction open (depth 1).
    InTransaction,
    /// Unknown: a handler was cut off in flight. The connection is retired.
    Unknown,
}

/// What the connection's driver task has heard from the server while the
/// connection sat idle in its transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing: as far as the client can tell, the backend is alive.
    Nothing,
    /// The connection failed or closed: the transaction and its locks are
    /// gone.
    Closed,
    /// A notification came first (the pooled connection once listened):
    /// whatever followed it is unknown without a round trip.
    Unsure,
}

/// A lane's pooled connection and what pgfifo knows of its transaction.
pub(crate) struct JobConn {
    conn: PooledConnection,
    /// A job transaction is open on the server.
    in_transaction: bool,
    diesel: DieselView,
    /// How long the server gets to answer one of the lane's statements.
    deadline: Duration,
    /// The server did not answer in time: the connection is given up
    /// without another round trip.
    hung: bool,
    /// Where the lane says so, for the runner's other tasks.
    signal: HungSignal,
}

impl JobConn {
    pub(crate) fn new(conn: PooledConnection, board: &Board) -> Self {
        JobConn {
            conn,
            in_transaction: false,
            diesel: DieselView::NoTransaction,
            deadline: board.round_trip,
            hung: false,
            signal: board.hung.clone(),
        }
    }

    /// Runs `work` within the deadline; past it the connection is marked
    /// hung (and for the pool to close) and `work`'s error says so.
    async fn bounded<T>(
        deadline: Duration,
        hung: &mut bool,
        work: impl Future<Output = diesel::QueryResult<T>>,
    ) -> diesel::QueryResult<T> {
        match tokio::time::timeout(deadline, work).await {
            Ok(result) => result,
            Err(_) => {
                *hung = true;
                Err(timed_out(deadline))
            }
        }
    }

    /// Runs `work` (statements of the runner's own, not a handler's) on the
    /// connection within the deadline, as the lane's other statements.
    pub(crate) async fn bounded_on<T>(
        &mut self,
        work: impl AsyncFnOnce(&mut AsyncPgConnection) -> diesel::QueryResult<T>,
    ) -> diesel::QueryResult<T> {
        let deadline = self.deadline;
        let result = match tokio::time::timeout(deadline, work(&mut self.conn)).await {
            Ok(result) => result,
            Err(_) => {
                self.hung = true;
                Err(timed_out(deadline))
            }
        };
        self.note_hung();
        result
    }

    /// If the server did not answer a statement in time: marks the
    /// connection for the pool to close, and tells the runner's other
    /// tasks (once).
    fn note_hung(&mut self) {
        if self.hung && !self.must_discard() {
            crate::db::discard(&mut self.conn);
            let host = self.host();
            self.signal.note(host);
        }
    }

    /// The host the connection went to (`None`: pgfifo did not open it).
    pub(crate) fn host(&mut self) -> crate::runner::hung::Host {
        crate::db::pooler::host_of(&mut self.conn)
    }

    /// Marks the connection as on a hung server (another connection found
    /// it so): it is given up without a round trip.
    pub(crate) fn mark_hung(&mut self) {
        self.hung = true;
        crate::db::discard(&mut self.conn);
    }

    /// Whether the pool would close the connection already.
    fn must_discard(&mut self) -> bool {
        use diesel::connection::TransactionManagerStatus;
        matches!(
            Tm::transaction_manager_status_mut(&mut *self.conn),
            TransactionManagerStatus::InError
        )
    }

    /// The connection, for a handler or a statement in the job transaction.
    pub(crate) fn get(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }

    /// Marks the connection to be given up once its transaction ends (a
    /// long job's handler was cut off while using it).
    pub(crate) fn retire(&mut self) {
        self.diesel = DieselView::Unknown;
    }

    /// Whether a handler was cut off on this connection: the lane gives it up
    /// once its transaction ends.
    pub(crate) fn must_retire(&self) -> bool {
        self.diesel == DieselView::Unknown
    }

    /// Ends the current job transaction (committing `commit_first`'s
    /// outcomes) or opens one if none is, and picks, in one round trip: the
    /// simple-query `COMMIT; BEGIN` (or `BEGIN`) is written to the socket
    /// before the pick. If the COMMIT fails, PostgreSQL skips the BEGIN, and
    /// the pick refuses to run outside a job transaction, so no job ever
    /// runs without its locks. `Err` of the opener: the connection is lost.
    pub(crate) async fn open_and_pick(
        &mut self,
        commit_first: bool,
        request: &PickRequest<'_>,
    ) -> (
        Result<(), diesel::result::Error>,
        diesel::QueryResult<Picked>,
    ) {
        // (A pick in a transaction already open keeps its opener's setting.)
        let opener = match (commit_first, request.start_at_once) {
            (true, true) => Some(COMMIT_AND_BEGIN),
            (true, false) => Some(COMMIT_AND_BEGIN_NO_SLOTS),
            (false, _) if self.in_transaction => None,
            (false, true) => Some(BEGIN_JOB),
            (false, false) => Some(BEGIN_JOB_NO_SLOTS),
        };
        let mut shared: &AsyncPgConnection = &self.conn;
        let pick = sql::pick(shared, request);
        let both = async {
            match opener {
                Some(opener) => {
                    let (opened, picked) = tokio::join!(shared.batch_execute(opener), pick);
                    (opened, picked)
                }
                None => (Ok(()), pick.await),
            }
        };
        let (opened, picked) = match tokio::time::timeout(self.deadline, both).await {
            Ok(both) => both,
            Err(_) => {
                self.hung = true;
                self.note_hung();
                let deadline = self.deadline;
                return (Err(timed_out(deadline)), Err(timed_out(deadline)));
            }
        };
        if opener.is_some() && opened.is_ok() {
            self.in_transaction = true;
        }
        (opened, picked)
    }

    /// Opens the handlers' savepoint: through diesel the first time (see the
    /// module documentation), then with pgfifo's own statement.
    pub(crate) async fn open_handler_savepoint(&mut self) -> Result<(), diesel::result::Error> {
        match self.diesel {
            DieselView::NoTransaction => {
                let open = Tm::begin_transaction_sql(&mut *self.conn, HANDLER_SAVEPOINT);
                Self::bounded(self.deadline, &mut self.hung, open).await?;
                self.diesel = DieselView::InTransaction;
                Ok(())
            }
            DieselView::InTransaction | DieselView::Unknown => {
                let open = self.conn.batch_execute(HANDLER_SAVEPOINT);
                let opened = Self::bounded(self.deadline, &mut self.hung, open).await;
                self.note_hung();
                opened
            }
        }
    }

    /// Writes outcomes, releasing the handlers' savepoint in the same round
    /// trip (no handler wrote anything). An update inside a savepoint of a
    /// row its transaction locked outside it makes PostgreSQL record both in
    /// a multixact, which every later reader of the row version must look
    /// up; the job's and the group's rows would each get one per job.
    pub(crate) async fn release_and_complete(
        &mut self,
        done: &[Completion<'_>],
    ) -> diesel::QueryResult<LeftWork> {
        let mut shared: &AsyncPgConnection = &self.conn;
        let both = async {
            let (released, completed) = tokio::join!(
                shared.batch_execute(RELEASE_HANDLER_SAVEPOINT),
                sql::complete(&self.conn, done)
            );
            released.and(completed)
        };
        let result = Self::bounded(self.deadline, &mut self.hung, both).await;
        self.note_hung();
        result
    }

    /// Writes outcomes after the last handler's deferred constraints are
    /// checked, in one round trip (its writes stay in the savepoint until
    /// the commit).
    pub(crate) async fn check_and_complete(
        &mut self,
        done: &[Completion<'_>],
    ) -> diesel::QueryResult<LeftWork> {
        let mut shared: &AsyncPgConnection = &self.conn;
        let both = async {
            let (checked, completed) = tokio::join!(
                shared.batch_execute(CHECK_CONSTRAINTS),
                sql::complete(&self.conn, done)
            );
            checked.and(completed)
        };
        let result = Self::bounded(self.deadline, &mut self.hung, both).await;
        self.note_hung();
        result
    }

    /// Discards what a failed handler wrote, keeping the jobs' locks (the
    /// savepoint stays, for the next handler). `cut_off`: the handler's
    /// future was dropped or unwound, so its last statement may still run on
    /// the server (after a while it is cancelled) and diesel's view is
    /// unknown from now on. `false`: the connection is unusable.
    pub(crate) async fn discard_handler_writes(
        &mut self,
        lanes: &Lanes,
        cut_off: bool,
        backend_pid: i32,
    ) -> bool {
        if cut_off {
            self.diesel = DieselView::Unknown;
        }
        let rollback = AssertUnwindSafe(self.conn.batch_execute(ROLLBACK_TO_HANDLER_SAVEPOINT))
            // (diesel asserts in debug builds when a transaction statement
            // of the handler was cut off mid-flight: a broken connection.)
            .catch_unwind();
        let mut rollback = pin!(rollback);
        let patience = if cut_off {
            CUT_OFF_PATIENCE
        } else {
            ROLLBACK_PATIENCE
        };
        let result = tokio::select! {
            result = &mut rollback => result,
            () = tokio::time::sleep(patience) => {
                tracing::warn!(backend_pid, "the handler's statement is still running; cancelling it");
                lanes.bookkeeper.cancel_backend(backend_pid).await;
                match tokio::time::timeout(CANCEL_PATIENCE, &mut rollback).await {
                    Ok(result) => result,
                    Err(_) => return false,
                }
            }
        };
        matches!(result, Ok(Ok(())))
    }

    /// Commits the job transaction, if one is open.
    pub(crate) async fn commit(&mut self) -> Result<(), diesel::result::Error> {
        self.end(COMMIT).await
    }

    /// Rolls the job transaction back, if one is open.
    pub(crate) async fn rollback(&mut self) -> Result<(), diesel::result::Error> {
        self.end(ROLLBACK).await
    }

    /// Ends the job transaction with `COMMIT` or `ROLLBACK`: through diesel
    /// while it sees the transaction, so that it sees none afterwards.
    async fn end(&mut self, statement: &str) -> Result<(), diesel::result::Error> {
        if !self.in_transaction {
            return Ok(());
        }
        if self.hung {
            return Err(timed_out(self.deadline));
        }
        self.in_transaction = false;
        let deadline = self.deadline;
        let result = match (self.diesel, statement) {
            (DieselView::InTransaction, COMMIT) => {
                self.diesel = DieselView::NoTransaction;
                let commit = Tm::commit_transaction(&mut *self.conn);
                Self::bounded(deadline, &mut self.hung, commit).await
            }
            (DieselView::InTransaction, _) => {
                self.diesel = DieselView::NoTransaction;
                let rollback = Tm::rollback_transaction(&mut *self.conn);
                Self::bounded(deadline, &mut self.hung, rollback).await
            }
            _ => {
                let end = self.conn.batch_execute(statement);
                Self::bounded(deadline, &mut self.hung, end).await
            }
        };
        self.note_hung();
        result
    }

    /// Reads, without waiting, what the server sent unasked on the
    /// connection, as far as its driver task has read it. A backend that is
    /// terminated, or times out idle in its transaction, or whose server
    /// shuts down, sends its FATAL error before it releases its locks, and
    /// the driver ends the connection on it; a killed backend's socket
    /// closes. So a connection that heard nothing still held its locks a
    /// moment ago: the time the error takes to reach the driver, which a
    /// round trip's answer also takes. (Unlike a round trip, this does not
    /// wait out a silent network: the server then still holds the locks,
    /// until keepalives end the session.)
    pub(crate) fn heard(&mut self) -> Heard {
        use futures_util::StreamExt;
        let mut stream = pin!(self.conn.notifications_stream());
        match stream.next().now_or_never() {
            None => Heard::Nothing,
            Some(None | Some(Err(_))) => Heard::Closed,
            Some(Some(Ok(_))) => Heard::Unsure,
        }
    }

    /// Whether the connection still holds its transaction, before a
    /// handler starts: by what its driver heard (no round trip), or else by
    /// a round trip. `settle`: yield first, which lets the runtime read the
    /// sockets, so that an error already in this one is heard (after a
    /// wait; between the handlers of a batch, where a yield per job cost a
    /// few per cent of a drain of no-op jobs, the driver task has had the
    /// handler's run to read it, on the runtime's other threads).
    pub(crate) async fn alive(&mut self, settle: bool) -> Result<(), String> {
        if settle {
            tokio::task::yield_now().await;
        }
        match self.heard() {
            Heard::Nothing => Ok(()),
            Heard::Closed => Err("the connection closed".to_owned()),
            Heard::Unsure => self.ping().await.map_err(|e| e.to_string()),
        }
    }

    /// A round trip that proves the connection alive.
    pub(crate) async fn ping(&mut self) -> Result<(), diesel::result::Error> {
        let ping = self.conn.batch_execute(PING);
        let result = Self::bounded(self.deadline, &mut self.hung, ping).await;
        self.note_hung();
        result
    }

    /// Whether the connection can serve the lane's next pick as it is: no
    /// transaction is open and nothing says it must be retired.
    pub(crate) fn reusable(&self) -> bool {
        !self.in_transaction && !self.must_retire() && !self.hung
    }

    /// Gives the connection back to the pool once its transaction has
    /// ended; a connection to retire (or one whose transaction is still
    /// open) is abandoned instead.
    pub(crate) async fn release(self) {
        if self.in_transaction || self.must_retire() || self.hung {
            self.abandon().await;
        }
    }

    /// Gives the connection up: rolls back whatever is open, and leaves it in
    /// a state the pool closes rather than hands out again. diesel's view is
    /// set to "in a transaction" by a `ROLLBACK` sent as the transaction's
    /// start, or, if it saw one already, stays so; a rollback that does not
    /// answer in time is cut off, which diesel also marks as broken.
    pub(crate) async fn abandon(mut self) {
        if self.hung {
            // The server did not answer: no rollback to wait for either.
            crate::db::discard(&mut self.conn);
            return;
        }
        let rollback = Tm::begin_transaction_sql(&mut *self.conn, ROLLBACK);
        let _ = tokio::time::timeout(ABANDON_PATIENCE, rollback).await;
    }
}

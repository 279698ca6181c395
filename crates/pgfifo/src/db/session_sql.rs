//! The fixed statements of a runner's sessions: opening, committing and
//! rolling back job transactions, the handlers' savepoint, and the
//! notification channels. Utility statements, sent as simple queries:
//! parsed, never planned.

/// Opens a job transaction, marked so that `pgfifo.pick` and
/// `pgfifo.complete` can tell it from autocommit (see `pgfifo.pick`). Utility
/// statements in one simple query: parsed, never planned.
pub(crate) const BEGIN_JOB: &str = "BEGIN; SET LOCAL pgfifo.job_transaction = on";
/// Commits the last jobs' outcomes and opens the next job transaction. If
/// the COMMIT fails, PostgreSQL skips the rest, and a pick sent behind it
/// refuses to run outside a job transaction.
pub(crate) const COMMIT_AND_BEGIN: &str = "COMMIT; BEGIN; SET LOCAL pgfifo.job_transaction = on";
/// [`BEGIN_JOB`] for a lane that could not start a handler at once (no free
/// permit): its pick takes no job of a group whose concurrency is above 1
/// (see "Slots" in `pgfifo.pick`).
pub(crate) const BEGIN_JOB_NO_SLOTS: &str =
    "BEGIN; SET LOCAL pgfifo.job_transaction = on; SET LOCAL pgfifo.pick_slots = off";
/// [`COMMIT_AND_BEGIN`] for a lane that could not start a handler at once.
pub(crate) const COMMIT_AND_BEGIN_NO_SLOTS: &str =
    "COMMIT; BEGIN; SET LOCAL pgfifo.job_transaction = on; SET LOCAL pgfifo.pick_slots = off";
/// Commits a job transaction.
pub(crate) const COMMIT: &str = "COMMIT";
/// Rolls a job transaction back.
pub(crate) const ROLLBACK: &str = "ROLLBACK";
/// The savepoint the handlers of a pick run in: rolling back to it discards
/// a failed handler's writes and keeps the jobs' locks.
pub(crate) const HANDLER_SAVEPOINT: &str = "SAVEPOINT pgfifo_handler";
/// Ends the handlers' savepoint, keeping what is in it.
pub(crate) const RELEASE_HANDLER_SAVEPOINT: &str = "RELEASE SAVEPOINT pgfifo_handler";
/// Discards what a handler wrote (the savepoint stays, for the next one).
pub(crate) const ROLLBACK_TO_HANDLER_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT pgfifo_handler";
/// Checks the handler's deferred constraints before its success is written.
pub(crate) const CHECK_CONSTRAINTS: &str = "SET CONSTRAINTS ALL IMMEDIATE";
/// A round trip that proves the connection alive.
pub(crate) const PING: &str = "SELECT 1";

/// Subscribes a connection to both wake-up channels.
pub(crate) const LISTEN: &str = "LISTEN pgfifo; LISTEN pgfifo_groups";

/// Work may be ready in a queue (payload: the queue name): an ungrouped job,
/// a group an operator released. A runner wakes a lane for it.
pub(crate) const CHANNEL: &str = "pgfifo";

/// Enqueuers woke groups of a queue (payload: the queue name): they become
/// pickable once promoted, and a runner wakes a lane per group it promoted.
pub(crate) const GROUPS_CHANNEL: &str = "pgfifo_groups";

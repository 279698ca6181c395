//! Helpers for testing an application's jobs (cargo feature `testing`):
//! what was enqueued, running jobs without a background runner, calling one
//! handler, and a database per test. See `docs/testing.md` for worked
//! examples.
//!
//! * [`enqueued`], [`enqueued_jobs`] and [`assert_enqueued`] list the jobs
//!   of a queue, group or type in enqueue order, decoded into your types,
//!   on your connection (inside your open transaction too).
//! * [`Drain`] runs a queue's (or a group's) jobs in the test's task, one at
//!   a time, through pgfifo's own SQL (pick, start_attempts, complete), so
//!   FIFO per group, retries, snoozes, cancels and the failure policy behave
//!   as under a runner; [`DrainSummary`] says what ran, in which order, and
//!   checks that each group's jobs ran in enqueue order, one at a time
//!   ([`DrainSummary::assert_fifo`]).
//! * [`assert_group_ran_in_order`] checks the same from the database's
//!   attempt records, after a drain or a real runner.
//! * [`Call`] runs one handler with a real [`JobContext`](crate::JobContext)
//!   on a connection of your choosing, e.g. in a transaction you roll back.
//! * [`TestDatabase`] gives each test a migrated database of its own,
//!   cloned from a template, dropped when the test passes.
//!
//! These helpers are part of pgfifo's public interface and follow its
//! compatibility rules (`docs/upgrading.md`).

mod attempt;
mod call;
mod database;
mod drain;
mod enqueued;
mod order;
mod summary;

pub use call::Call;
pub use database::{template_name, TestDatabase, DEFAULT_SERVER_URL};
pub use drain::{Drain, DEFAULT_MAX_ATTEMPTS, DRAIN_RUNNER};
pub use enqueued::{assert_enqueued, enqueued, enqueued_jobs, Enqueued, Jobs};
pub use order::{assert_group_ran_in_order, check_group_ran_in_order};
pub use summary::DrainSummary;

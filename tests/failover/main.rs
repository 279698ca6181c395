//! Failover tests (issue 30): pgfifo on a primary with a streaming standby,
//! both private servers started by the tests (`pgfifo_tests::failover`).
//!
//! * `connect.rs`: connecting with a multi-host URL moves on to the next
//!   host when the first one hangs in its start-up exchange (its postmaster
//!   is stopped with SIGSTOP), within the per-host deadline.
//! * `hang.rs`: a runner whose only server hangs stops by its shutdown
//!   deadline (plus `pgfifo::runner::ABORT_PATIENCE`), and its handlers
//!   waiting in statements on that server are cut off once the listener's
//!   poll finds the server hung.
//! * `switch.rs`: a runner with a multi-host URL drains jobs in many
//!   groups (three of concurrency 2, two of long-mode jobs, and two hot
//!   groups served by a second runner, `hot.rs`, whose jobs commit in
//!   batches of followers) while the primary is killed (`kill -9` of its postmaster),
//!   stopped (`pg_ctl stop -m fast`), frozen (SIGSTOP of every process) or
//!   demoted (`default_transaction_read_only`) and the standby is promoted;
//!   with synchronous replication nothing acknowledged is lost, no group
//!   runs out of order or overlaps, every job completes without restarting
//!   the runner, its schedule fires on the new primary, and the time from
//!   the promotion to the first job committed there is printed (one run
//!   with asynchronous replication reports what ran again).
//! * `processes.rs`: three `fifo-worker` processes with the multi-host URL
//!   drain jobs in many groups (three of concurrency 2) while the primary
//!   is killed and the synchronous standby promoted; from what committed
//!   and the successes each process reported: nothing lost, nothing
//!   committed twice, no group out of order or overlapping, and every
//!   process commits on the new primary without a restart.
//!
//! `cargo test --workspace` runs `connect.rs` and `hang.rs`; the switches
//! (`switch.rs`, `processes.rs`) are `#[ignore]`d there and run in their
//! own `.ci/run` step, which prints one summary line of their figures:
//! `cargo test -p pgfifo-tests --test failover -- --ignored --nocapture --test-threads=1`.

mod connect;
mod hang;
mod hot;
mod jobs;
mod processes;
mod switch;

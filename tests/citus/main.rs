//! The Citus suite: pgfifo on a private Citus cluster (a coordinator and two
//! workers on free ports of this machine, `pgfifo_tests::citus::Cluster`).
//!
//! Every test is `#[ignore]`: `cargo test --workspace` does not need Citus.
//! `.ci/run` builds and installs Citus (`scripts/citus-build.sh`) and runs
//! them with `-- --ignored --test-threads=1`.
//!
//! * `coordinator`: pgfifo's schema migrated through the coordinator's URL,
//!   unchanged (its tables stay on the coordinator), with the guarantees
//!   that matter checked through the public API.
//! * `controls`: a group of concurrency 3 and the failure policy 'hold'.
//! * `drain`: the layout's job cycle in miniature, drained for real through
//!   the coordinator (one job per call, eight, and one with a handler's
//!   write on the coordinator) and through the workers,
//!   with jobs/s and PostgreSQL CPU per job on each node printed.
//! * `faults`: three `fifo-worker` processes through the coordinator, one
//!   killed with `kill -9` and replaced, one Citus worker node restarted:
//!   nothing lost, nothing twice, every group in order, no overlaps.
//! * `layout`: the premises of the distributed layout that docs/scaling.md
//!   describes, checked on the real cluster: a pick that names its bucket
//!   runs on one shard, a pick that does not is refused, a distributed
//!   function called with its bucket runs on the worker holding it, and
//!   groups hashed to buckets spread over both workers.

mod controls;
mod coordinator;
mod distributed;
mod distributed_admin;
mod distributed_drain;
mod distributed_enqueue;
mod drain;
mod faults;
mod jobs;
mod layout;

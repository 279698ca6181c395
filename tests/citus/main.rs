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
//!   `coordinator` also runs the same on the distributed layout.
//! * `controls`: a group of concurrency 3 and the failure policy 'hold',
//!   on both layouts.
//! * `distributed`: `pgfifo::migrate::distribute` lays out a queue over the
//!   cluster: each table distributed, co-located or copied as designed,
//!   every row on its group's part, the jobs spread over both workers.
//! * `distributed_controls`: group limits on the distributed layout: a
//!   queue's default rate, a group's own rate changed while it waits, a
//!   concurrency of 2, the operator's reads, the cleaning of a gone group's
//!   bucket and slots; weights refuse.
//! * `distributed_queue_limits`: queue limits on the distributed layout
//!   (concurrency across two runners, a rate, the operator's reads).
//! * `distributed_windows`: de-duplication windows on the distributed
//!   layout (unique, throttle, debounce, the SQL API's outcomes, the
//!   operator's view, retention).
//! * `distributed_long`: long mode on the distributed layout: a long job
//!   holds its group without a transaction, and runs again at once when
//!   its session dies, its outcome written once.
//! * `distributed_enqueue`: enqueue on the distributed layout, and that a
//!   single enqueue's statements each touch its group's shard.
//! * `distributed_admin`: cancel, skip-head, retry and a paused queue on
//!   the distributed layout, with a runner.
//! * `distributed_reads`: what an operator reads on the distributed
//!   layout: the admin API's status and listings, and every dashboard page.
//! * `distributed_retention`: purge, idle groups' cleaning and a runner's
//!   retention on the distributed layout.
//! * `distributed_schedules`: a schedule fired by a runner, and the
//!   operator's reads and actions on it, on the distributed layout.
//! * `distributed_drain`: a runner's drain on both layouts, with jobs/s,
//!   CPU per node and statements per job printed for docs/scaling.md.
//! * `drain`: the layout's job cycle in miniature, drained for real through
//!   the coordinator (one job per call, eight, and one with a handler's
//!   write on the coordinator) and through the workers,
//!   with jobs/s and PostgreSQL CPU per job on each node printed.
//! * `faults`: three `fifo-worker` processes through the coordinator, one
//!   killed with `kill -9` and replaced, one Citus worker node restarted:
//!   nothing lost, nothing twice, every group in order, no overlaps; on
//!   both layouts.
//! * `layout`: the premises of the distributed layout that docs/scaling.md
//!   describes, checked on the real cluster: a pick that names its bucket
//!   runs on one shard, a pick that does not is refused, a distributed
//!   function called with its bucket runs on the worker holding it, and
//!   groups hashed to buckets spread over both workers.

mod controls;
mod coordinator;
// The dashboard tests' client (the reads test uses its GETs only).
#[allow(dead_code)]
#[path = "../it/dashboard_support.rs"]
mod dashboard_support;
mod distributed;
mod distributed_admin;
mod distributed_controls;
mod distributed_drain;
mod distributed_enqueue;
mod distributed_long;
mod distributed_queue_limits;
mod distributed_reads;
mod distributed_retention;
mod distributed_schedules;
mod distributed_windows;
mod drain;
mod faults;
// The rendezvous of a test with the handlers it starts.
#[allow(dead_code)]
#[path = "../it/gate.rs"]
mod gate;
mod jobs;
mod layout;

//! Several OS processes on one database: three `fifo-worker` processes (see
//! `tests/src/bin/fifo-worker.rs`) drain 2,000 jobs in 50 groups, and the
//! test checks, from the runs they recorded, that no two jobs of a group ever
//! overlapped in time, every group ran in enqueue order, and every job
//! succeeded exactly once.
//!
//! Evidence comes from two places:
//! * each worker appends every handler run, committed or not, to a records
//!   file of its own (start and end in ns of `CLOCK_REALTIME`, which all
//!   processes on the machine share): the overlap and order evidence;
//! * each handler inserts a row into `mp_log` through the job's transaction,
//!   so the table holds exactly the runs that committed: the exactly-once
//!   evidence (and which process ran what).
//!
//! The same drain runs through PgBouncer in `pooler.rs`.

mod concurrency;
pub(crate) mod harness;
mod rate;
mod start_order;
mod weights;

use pgfifo_tests::TestDb;

use harness::{drain_and_check, Drain};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_keep_groups_exclusive_ordered_and_exactly_once() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let drain = Drain {
        processes: 3,
        url: &db.url,
        env: &[],
    };
    drain_and_check(&db, drain, &mut conn).await;
}

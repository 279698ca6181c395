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

mod batches;
mod concurrency;
pub(crate) mod harness;
mod queue_limits;
mod rate;
mod start_order;
mod weights;

use std::time::{Duration, Instant};

use pgfifo_tests::TestDb;

use harness::{drain_and_check, Drain, Workers};

/// Waits until `total` jobs have succeeded, for at most `limit`, checking
/// meanwhile that no worker has exited.
pub(crate) async fn wait_drained(
    db: &TestDb,
    total: usize,
    workers: &mut Workers,
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    loop {
        let done = db
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'")
            .await;
        if done == total as i64 {
            return;
        }
        workers.assert_running();
        assert!(
            Instant::now() < deadline,
            "only {done} jobs succeeded after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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

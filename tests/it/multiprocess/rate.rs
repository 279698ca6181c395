//! A rate limit holds across runner processes: three `fifo-worker`
//! processes drain a group limited to 20 starts a second with a burst of 5,
//! and a group without a limit beside it, for ten seconds.
//!
//! The bound checked is the token bucket's: in any window of length t, at
//! most burst + rate × t starts, where a start is an attempt's record (the
//! token is taken in the same transaction). Every pair of starts (i, j)
//! bounds the window from start i to start j.

use std::time::{Duration, Instant};

use pgfifo::{GroupLimits, Rate};
use pgfifo_tests::rates::{starts_of, worst_excess};
use pgfifo_tests::{records, TestDb};

use super::harness::{mp_job, Workers, MP_LOG};

const RATE: u32 = 20;
const BURST: u32 = 5;
const RUN_FOR: Duration = Duration::from_secs(10);
/// More than the limited group can start in RUN_FOR.
const LIMITED_JOBS: u32 = 400;
const FREE_JOBS: u32 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_three_processes() {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    let limits = GroupLimits::new()
        .rate(Rate::per_second(RATE).unwrap())
        .burst(BURST);
    pgfifo::admin::set_group_limits(&mut conn, "mp", "g000", limits)
        .await
        .unwrap();

    let mut workers = Workers::start(3, &db.url, &[]).await;
    let began = Instant::now();
    let jobs = (0..LIMITED_JOBS)
        .map(|seq| mp_job(0, seq, 200))
        .chain((0..FREE_JOBS).map(|seq| mp_job(1, seq, 200)));
    pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    while began.elapsed() < RUN_FOR {
        workers.assert_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The group without a limit beside it is not held back: it drains
    // (within RUN_FOR on a quiet machine; about half of it then under the
    // whole suite on two cores, which runs one group's jobs slowly).
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE group_id = 'g001' AND state = 'succeeded'",
        i64::from(FREE_JOBS),
        Duration::from_secs(60),
    )
    .await;
    workers.terminate().await;

    // Starts of the limited group, in seconds on the server's clock.
    let starts = starts_of(&db, "g000").await;
    assert!(!starts.is_empty(), "the limited group started no job");
    let worst = worst_excess(&starts, f64::from(RATE), f64::from(BURST));
    let span = starts.last().unwrap() - starts.first().unwrap();
    println!(
        "limited group: {} starts over {span:.2} s (bound {BURST} + {RATE}/s); worst excess {worst:.4}",
        starts.len()
    );
    // (A microsecond of clock rounding is 0.00002 tokens.)
    assert!(
        worst <= 0.001,
        "a window held {worst:.4} starts more than burst + rate × its length"
    );
    // Starts follow the tokens, not the poll interval (a start per poll
    // would be a tenth of these): at least half the rate on a loaded
    // machine (about 100 % measured on a quiet one).
    assert!(
        starts.len() as f64 >= 0.5 * f64::from(RATE) * RUN_FOR.as_secs_f64(),
        "only {} starts of the limited group in {RUN_FOR:?}",
        starts.len()
    );
    // ...and its starts took no token of the limited group's bucket: the
    // two groups' starts together exceed the bound, which the limited
    // group's alone fill.
    let mut both = starts_of(&db, "g001").await;
    both.extend_from_slice(&starts);
    both.sort_by(f64::total_cmp);
    assert!(
        worst_excess(&both, f64::from(RATE), f64::from(BURST)) > 1.0,
        "the unlimited group's starts fit in the limited group's bucket"
    );

    // Order and exclusivity, from every run the workers recorded.
    let runs = workers.runs();
    assert!(
        records::overlaps(&runs).is_empty(),
        "runs of a group overlapped"
    );
    assert!(
        records::order_violations(&runs).is_empty(),
        "a group's jobs started out of order"
    );
    // Nothing is lost: every limited job either succeeded or still waits.
    let limited_done = db
        .scalar("SELECT count(*) FROM pgfifo.job WHERE group_id = 'g000' AND state = 'succeeded'")
        .await;
    let limited_queued = db
        .scalar("SELECT count(*) FROM pgfifo.job WHERE group_id = 'g000' AND state = 'queued'")
        .await;
    assert_eq!(limited_done + limited_queued, i64::from(LIMITED_JOBS));
}

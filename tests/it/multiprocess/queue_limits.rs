//! Queue limits hold across runner processes and through a SIGKILL: three
//! `fifo-worker` processes with a queue concurrency of 3 (set by each at
//! its start, `RunnerConfig::queue_limits`) drain twelve groups, and one of
//! them is killed while it runs a job. Never more than three run at once,
//! three run again after the kill (its slot was not leaked), and every job
//! commits once, each group in order. A second test checks the queue's
//! token bucket over every window of its recorded starts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgfifo_tests::rates::{starts_in_queue, worst_excess};
use pgfifo_tests::records::{self, Run};
use pgfifo_tests::TestDb;

use super::harness::{mp_job, Workers, MP_LOG};

const GROUPS: u32 = 12;
const PER_GROUP: u32 = 8;
/// Four lanes per worker, more than the queue lets run: smaller pools, so
/// that these tests beside the other multi-process ones stay within the
/// server's connections.
const LANES: (&str, &str) = ("CONCURRENCY", "4");
/// A group of three 3-second jobs, for the kill.
const LONG_GROUP: u32 = 99;

/// The process id in a runner's default name (`host:pid:tag`).
fn pid_of(runner: &str) -> u32 {
    runner.rsplit(':').nth(1).unwrap().parse().unwrap()
}

/// How many times each job committed (by `mp_log`).
async fn commits(db: &TestDb) -> BTreeMap<i64, i64> {
    db.text("SELECT string_agg(job_id || ':' || n, ',') FROM (SELECT job_id, count(*) AS n FROM mp_log GROUP BY job_id) AS c")
        .await
        .unwrap()
        .split(',')
        .map(|p| {
            let (id, n) = p.split_once(':').unwrap();
            (id.parse().unwrap(), n.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_runs_three_at_once_across_processes_and_a_kill_leaks_no_slot() {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    let mut workers = Workers::start(3, &db.url, &[("QUEUE_CONCURRENCY", "3"), LANES]).await;
    // Group LONG_GROUP's jobs run for seconds: the kill lands in one.
    let jobs = (0..PER_GROUP)
        .flat_map(|seq| (0..GROUPS).map(move |g| mp_job(g, seq, 150_000)))
        .chain((0..3).map(|seq| mp_job(LONG_GROUP, seq, 3_000_000)));
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();

    // Kill a worker while it runs a long job, after a few jobs finished.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (victim, killed_job) = loop {
        assert!(Instant::now() < deadline, "no job ran within 60 s");
        workers.assert_running();
        let running = db
            .text(
                "SELECT a.runner || ' ' || a.job_id FROM pgfifo.job_attempt AS a
                 JOIN pgfifo.job AS j ON j.id = a.job_id
                 WHERE j.state = 'queued' AND a.attempt > j.attempts AND a.finished_at IS NULL
                   AND j.group_id = 'g099'
                   AND a.started_at < clock_timestamp() - interval '100 milliseconds'
                   AND (SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded') >= 9
                 ORDER BY a.started_at LIMIT 1",
            )
            .await;
        if let Some(found) = running {
            let (runner, job) = found.split_once(' ').unwrap();
            break (pid_of(runner), job.parse::<i64>().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    workers.kill(victim);
    let killed_at = records::now_ns();
    super::wait_drained(&db, ids.len(), &mut workers, Duration::from_secs(120)).await;
    workers.terminate().await;

    let per_job = commits(&db).await;
    assert_eq!(per_job.len(), ids.len(), "jobs lost");
    assert!(per_job.values().all(|&n| n == 1), "jobs committed twice");
    let rerun_by = db
        .scalar(&format!(
            "SELECT pid FROM mp_log WHERE job_id = {killed_job}"
        ))
        .await;
    assert_ne!(rerun_by, i64::from(victim));

    let runs = workers.runs();
    assert_eq!(records::peak_parallelism(&runs), 3, "the queue's peak");
    assert!(
        records::peak_per_group(&runs).values().all(|&p| p == 1),
        "a group ran two at once"
    );
    assert_eq!(records::order_violations(&runs), vec![], "FIFO per group");
    let after: Vec<Run> = runs
        .iter()
        .filter(|r| r.start_ns > killed_at)
        .copied()
        .collect();
    assert_eq!(
        records::peak_parallelism(&after),
        3,
        "three at once after the kill: no slot leaked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_rate_holds_across_three_processes() {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    let env = [("QUEUE_RATE", "20/s"), ("QUEUE_BURST", "4"), LANES];
    let mut workers = Workers::start(3, &db.url, &env).await;
    let jobs = (0..6).flat_map(|seq| (0..GROUPS).map(move |g| mp_job(g, seq, 1_000)));
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    super::wait_drained(&db, ids.len(), &mut workers, Duration::from_secs(120)).await;
    workers.terminate().await;

    let per_job = commits(&db).await;
    assert_eq!(per_job.len(), ids.len(), "jobs lost");
    assert!(per_job.values().all(|&n| n == 1), "jobs committed twice");
    assert_eq!(
        records::order_violations(&workers.runs()),
        vec![],
        "FIFO per group"
    );
    let starts = starts_in_queue(&db, "mp").await;
    assert_eq!(starts.len(), ids.len(), "one recorded start per job");
    let worst = worst_excess(&starts, 20.0, 4.0);
    assert!(worst <= 0.001, "a window exceeded 4 + 20 × t by {worst}");
}

//! A group's concurrency holds across runner processes and through a
//! SIGKILL: three `fifo-worker` processes drain a group with concurrency 3
//! beside a group without limits, and one of them is killed while it runs a
//! job of the wide group. Its slot frees at once, the job runs again
//! elsewhere, and every job commits exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgfifo::GroupLimits;
use pgfifo_tests::records::{self, Run};
use pgfifo_tests::TestDb;

use super::harness::{mp_job, Workers, MP_LOG};

const WIDE_JOBS: u32 = 45;
const NARROW_JOBS: u32 = 30;

/// The process id in a runner's default name (`host:pid:tag`).
fn pid_of(runner: &str) -> u32 {
    runner.rsplit(':').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_runs_three_at_once_across_processes_and_a_kill_frees_its_slot() {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    pgfifo::admin::set_group_limits(&mut conn, "mp", "g000", GroupLimits::new().concurrency(3))
        .await
        .unwrap();
    let mut workers = Workers::start(3, &db.url, &[]).await;
    let jobs = (0..WIDE_JOBS)
        .map(|seq| mp_job(0, seq, 250_000))
        .chain((0..NARROW_JOBS).map(|seq| mp_job(1, seq, 20_000)));
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();

    // Kill a worker that is running a job of the wide group, after a few
    // of them finished.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (victim, killed_job) = loop {
        assert!(Instant::now() < deadline, "no wide job ran within 60 s");
        workers.assert_running();
        let running = db
            .text(
                "SELECT a.runner || ' ' || a.job_id FROM pgfifo.job_attempt AS a
                 JOIN pgfifo.job AS j ON j.id = a.job_id
                 WHERE j.group_id = 'g000' AND j.state = 'queued' AND a.attempt > j.attempts
                   AND (SELECT count(*) FROM pgfifo.job WHERE group_id = 'g000'
                        AND state = 'succeeded') >= 6
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

    // Everything drains on the two that are left.
    super::wait_drained(&db, ids.len(), &mut workers, Duration::from_secs(90)).await;
    workers.terminate().await;

    // Exactly once, by what committed; the killed job by another process.
    let per_job: BTreeMap<i64, i64> = db
        .text("SELECT string_agg(job_id || ':' || n, ',') FROM (SELECT job_id, count(*) AS n FROM mp_log GROUP BY job_id) AS c")
        .await
        .unwrap()
        .split(',')
        .map(|p| {
            let (id, n) = p.split_once(':').unwrap();
            (id.parse().unwrap(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(per_job.len(), ids.len(), "jobs lost");
    assert!(per_job.values().all(|&n| n == 1), "jobs committed twice");
    let rerun_by = db
        .scalar(&format!(
            "SELECT pid FROM mp_log WHERE job_id = {killed_job}"
        ))
        .await;
    assert_ne!(rerun_by, i64::from(victim));

    // Never more than three of the wide group at once, and three reached
    // again after the kill; the narrow group one at a time.
    let runs = workers.runs();
    let peaks = records::peak_per_group(&runs);
    assert_eq!(peaks[&0], 3, "the wide group's peak");
    assert_eq!(peaks[&1], 1, "the narrow group's peak");
    let after: Vec<Run> = runs
        .iter()
        .filter(|r| r.grp == 0 && r.start_ns > killed_at)
        .copied()
        .collect();
    assert_eq!(
        records::peak_parallelism(&after),
        3,
        "three at once after the kill"
    );
    // The freed slot was taken at once: a wide job started within a second.
    let first_after = after.iter().map(|r| r.start_ns).min().unwrap();
    let gap_ms = (first_after - killed_at) / 1_000_000;
    assert!(
        gap_ms < 1_000,
        "the next wide job started {gap_ms} ms after the kill"
    );
    // FIFO starts within the wide group: every job ahead of a job began
    // before that job was done (jobs picked a moment apart begin their
    // handlers in either order on a loaded machine; a younger job never
    // runs through while an older one waits), except the killed one, which
    // began again later.
    let wide: Vec<&Run> = runs.iter().filter(|r| r.grp == 0).collect();
    for later in &wide {
        let behind: Vec<u32> = wide
            .iter()
            .filter(|r| r.seq < later.seq && r.job_id != killed_job)
            .filter(|r| r.start_ns >= later.end_ns)
            .map(|r| r.seq)
            .collect();
        assert!(
            behind.is_empty(),
            "job seq {} ran before {behind:?} began",
            later.seq
        );
    }
}

//! Batches across runner processes and a SIGKILL: three `fifo-worker`
//! processes drain a batch of 1,000 jobs in 100 groups, one of them is
//! killed mid-drain, and each callback (complete and success, themselves
//! `mp.job`s of a group of their own) commits exactly once, after the last
//! job of the batch committed, and reads the right counts.

use std::time::{Duration, Instant};

use pgfifo::{Batch, EnqueueOptions, NewJob};
use pgfifo_tests::TestDb;

use super::harness::{mp_job, MpJob, Workers, MP_LOG};

const GROUPS: u32 = 100;
const PER_GROUP: u32 = 10;
/// The callbacks' group (its jobs' `seq`: 0 complete, 1 success).
const CALLBACK_GROUP: u32 = 500;
const LANES: (&str, &str) = ("CONCURRENCY", "4");

fn callback(seq: u32) -> NewJob {
    let job = MpJob {
        group: CALLBACK_GROUP,
        seq,
        work_us: 0,
    };
    NewJob::new(&job, EnqueueOptions::group(format!("g{CALLBACK_GROUP}"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_drained_by_three_processes_with_a_kill_fires_each_callback_once_after_its_last_job(
) {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    let mut workers = Workers::start(3, &db.url, &[LANES]).await;
    let jobs = (0..PER_GROUP).flat_map(|seq| (0..GROUPS).map(move |g| mp_job(g, seq, 2_000)));
    let batch = Batch::new()
        .on_complete(callback(0))
        .on_success(callback(1))
        .enqueue(&mut conn, jobs)
        .await
        .unwrap();
    let total = (GROUPS * PER_GROUP) as i64;
    assert_eq!(batch.job_ids.len() as i64, total);

    // SIGKILL a worker once a fifth of the batch has committed: it has jobs
    // in flight whose outcomes roll back and run again elsewhere.
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.scalar("SELECT count(*) FROM mp_log").await < total / 5 {
        assert!(Instant::now() < deadline, "the batch did not progress");
        workers.assert_running();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let victim = workers.pids()[0];
    workers.kill(victim);
    super::wait_drained(
        &db,
        (total + 2) as usize,
        &mut workers,
        Duration::from_secs(180),
    )
    .await;
    workers.terminate().await;

    assert_eq!(
        db.scalar("SELECT count(*) FROM (SELECT job_id FROM mp_log GROUP BY job_id HAVING count(*) > 1) AS d")
            .await,
        0,
        "a job committed twice"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM mp_log WHERE grp = {CALLBACK_GROUP}"
        ))
        .await,
        2,
        "each callback committed once"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(DISTINCT seq) FROM mp_log WHERE grp = {CALLBACK_GROUP}"
        ))
        .await,
        2
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE payload->>'group' = '{CALLBACK_GROUP}'"
        ))
        .await,
        2,
        "each callback enqueued once"
    );
    // After the last job: each callback was enqueued by the transaction
    // that wrote the outcome of a job of the batch (the callback's row and
    // that job's have the same xmin: neither changed since), and
    // started after every job's run had ended.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.batch_callback AS c
             WHERE c.batch_id = {} AND c.job_id IS NOT NULL
               AND EXISTS (SELECT 1 FROM pgfifo.job AS j JOIN pgfifo.batch_job AS m ON m.job_id = j.id
                           WHERE j.xmin::text = c.xmin::text)",
            batch.id
        ))
        .await,
        2,
        "a callback was not enqueued with a job's outcome"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM mp_log AS c WHERE c.grp = {CALLBACK_GROUP}
               AND c.started_ns < (SELECT max(l.ended_ns) FROM mp_log AS l WHERE l.grp <> {CALLBACK_GROUP})"
        ))
        .await,
        0,
        "a callback ran before the last job's run ended"
    );
    let summary = pgfifo::batch::summary(&mut conn, batch.id)
        .await
        .unwrap()
        .unwrap();
    let p = &summary.progress;
    assert_eq!(
        (p.total, p.succeeded, p.failed, p.cancelled, p.pending),
        (1000, 1000, 0, 0, 0)
    );
    assert!(summary.callbacks.iter().all(|c| c.job_id.is_some()));
}

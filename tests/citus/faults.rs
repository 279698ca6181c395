//! A fault run on the cluster: three `fifo-worker` processes drain groups
//! through the coordinator's URL while one of them is killed (`kill -9`,
//! jobs in flight) and started again, and one Citus worker node is
//! restarted. With the unchanged layout pgfifo's rows are on the
//! coordinator, so the worker node's restart tests that Citus's machinery
//! around it (its connections, its maintenance daemon) leaves pgfifo alone.
//! With the distributed layout about half the groups live on the restarted
//! node: their picks and completions fail while it is down, their job
//! transactions abort, and they run again once it is back.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::migrate::Layout;
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::acked_worker::AckedWorker;
use pgfifo_tests::citus::Cluster;
use pgfifo_tests::query::scalar;
use pgfifo_tests::records::now_ns;
use serde::{Deserialize, Serialize};

/// The runner processes' binary.
const WORKER: &str = env!("CARGO_BIN_EXE_fifo-worker");

const PROCESSES: usize = 3;
const GROUPS: u32 = 20;
const PER_GROUP: u32 = 30;

/// `fifo-worker`'s job, declared here to enqueue it; it runs in the
/// workers only.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "mp.job", queue = "mp")]
struct MpJob {
    group: u32,
    seq: u32,
    work_us: u64,
}

#[async_trait]
impl Handler for MpJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent(
            "mp.job runs in fifo-worker processes only",
        ))
    }
}

#[derive(QueryableByName, Debug)]
struct Row {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    grp: i32,
    #[diesel(sql_type = Integer)]
    seq: i32,
    #[diesel(sql_type = BigInt)]
    started_ns: i64,
    #[diesel(sql_type = BigInt)]
    ended_ns: i64,
}

/// Waits until `mp_log` has at least `n` rows.
async fn wait_logged(conn: &mut diesel_async::AsyncPgConnection, n: i64, what: &str) {
    let began = Instant::now();
    while scalar(conn, "SELECT count(*) FROM mp_log").await < n {
        assert!(began.elapsed() < Duration::from_secs(120), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn runner_processes_killed_and_a_worker_node_restarted_lose_nothing() {
    faults(Layout::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_same_faults_on_the_distributed_layout() {
    faults(Layout::Distributed).await;
}

async fn faults(layout: Layout) {
    let cluster = Cluster::start().await.expect("start the Citus cluster");
    let url = cluster.url();
    let mut conn = cluster.coordinator_conn().await.expect("coordinator");
    pgfifo::migrate::migrate_conn(&mut conn)
        .await
        .expect("migrate");
    if layout == Layout::Distributed {
        pgfifo::migrate::distribute(&mut conn)
            .await
            .expect("distribute");
    }
    conn.batch_execute(
        "CREATE TABLE mp_log (job_id bigint NOT NULL, grp integer NOT NULL, \
         seq integer NOT NULL, pid integer NOT NULL, started_ns bigint NOT NULL, \
         ended_ns bigint NOT NULL)",
    )
    .await
    .expect("log table");
    let mut enqueued = HashSet::new();
    for seq in 0..PER_GROUP {
        let jobs = (0..GROUPS).map(|g| {
            NewJob::new(
                &MpJob {
                    group: g,
                    seq,
                    work_us: if seq % 4 == 0 { 0 } else { 2_000 },
                },
                EnqueueOptions::group(format!("g{g}")),
            )
            .expect("new job")
        });
        enqueued.extend(
            pgfifo::enqueue_batch(&mut conn, jobs)
                .await
                .expect("enqueue"),
        );
    }
    let total = i64::from(GROUPS * PER_GROUP);
    assert_eq!(enqueued.len() as i64, total);

    let dir = std::env::temp_dir().join(format!("pgfifo-citus-procs-{}", now_ns()));
    std::fs::create_dir_all(&dir).expect("records dir");
    let mut workers: Vec<AckedWorker> = (0..PROCESSES)
        .map(|i| AckedWorker::start(WORKER, &i.to_string(), &url, &dir, &[]))
        .collect();

    // kill -9 of one process while jobs run, then a new one in its place.
    wait_logged(&mut conn, total / 5, "no drain before the kill").await;
    let killed = &mut workers[0];
    let status = Command::new("kill")
        .args(["-KILL", &killed.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let _ = killed.child.wait();
    workers.push(AckedWorker::start(WORKER, "restarted", &url, &dir, &[]));

    // A restart of one Citus worker node mid-run.
    wait_logged(&mut conn, total / 2, "no drain after the kill").await;
    cluster.workers[1].stop_fast().expect("stop a worker node");
    cluster.workers[1].start().expect("start it again");

    let began = Instant::now();
    loop {
        let done = scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        )
        .await;
        if done == total {
            break;
        }
        for (i, w) in workers.iter_mut().enumerate().skip(1) {
            if let Ok(Some(status)) = w.child.try_wait() {
                panic!("worker {i} exited: {status}");
            }
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "{done} of {total} jobs succeeded 120 s after the faults"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT job_id, grp, seq, started_ns, ended_ns FROM mp_log \
         ORDER BY grp, started_ns, job_id",
    )
    .load(&mut conn)
    .await
    .expect("log");
    for w in workers.iter().skip(1) {
        let status = Command::new("kill")
            .args(["-TERM", &w.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
    for (i, w) in workers.iter_mut().enumerate().skip(1) {
        let status = w.child.wait().expect("wait");
        assert!(status.success(), "worker {i} exited with {status}");
    }

    let mut acknowledged = HashSet::new();
    let mut acks = 0;
    for w in &workers {
        for line in std::fs::read_to_string(&w.acks).unwrap_or_default().lines() {
            acknowledged.insert(line.parse::<i64>().expect("an id"));
            acks += 1;
        }
    }
    let reruns = acks - acknowledged.len();
    let committed: HashSet<i64> = rows.iter().map(|r| r.job_id).collect();
    let duplicates = rows.len() - committed.len();
    let lost = acknowledged
        .iter()
        .filter(|id| !committed.contains(id))
        .count();
    let never = enqueued.iter().filter(|id| !committed.contains(id)).count();
    let mut order_violations = 0;
    let mut overlaps = 0;
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.grp != b.grp {
            continue;
        }
        if b.seq != a.seq + 1 {
            order_violations += 1;
        }
        if b.started_ns < a.ended_ns {
            overlaps += 1;
        }
    }
    // Each group's first committed run is its first job.
    let firsts: Vec<&Row> = rows
        .iter()
        .enumerate()
        .filter(|(i, r)| *i == 0 || rows[i - 1].grp != r.grp)
        .map(|(_, r)| r)
        .collect();
    // Jobs whose attempt the killed process had started (their transaction
    // rolled back with it, and another process ran them again): shows the
    // kill fell mid-handler, when it did.
    let interrupted = scalar(
        &mut conn,
        "SELECT count(*) FROM (SELECT job_id FROM pgfifo.job_attempt GROUP BY job_id
                               HAVING count(*) > 1) s",
    )
    .await;
    println!(
        "citus faults ({layout:?} layout): processes={PROCESSES} killed=1 interrupted_jobs={interrupted} \
         worker_node_restarts=1 jobs={total} \
         acknowledged={} lost={lost} never_committed={never} reruns={reruns} \
         duplicates={duplicates} order_violations={order_violations} overlaps={overlaps}",
        acknowledged.len()
    );
    assert_eq!(
        firsts.len(),
        GROUPS as usize,
        "a group is missing from the log"
    );
    assert!(
        firsts.iter().all(|r| r.seq == 0),
        "a group did not start with its first job"
    );
    assert_eq!(lost, 0, "acknowledged successes lost");
    assert_eq!(never, 0, "jobs never committed");
    assert_eq!(reruns, 0, "acknowledged successes ran again");
    assert_eq!(duplicates, 0, "jobs committed twice");
    assert_eq!(order_violations, 0, "groups out of order");
    assert_eq!(overlaps, 0, "runs of a group overlapped");
    let _ = std::fs::remove_dir_all(&dir);
}

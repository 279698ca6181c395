//! Several runner processes (`fifo-worker`) follow their database through
//! a failover: the primary is killed, the synchronous standby promoted, and
//! every process drains the rest on the new primary without a restart.

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::acked_worker::AckedWorker;
use pgfifo_tests::failover::Node;
use pgfifo_tests::query::scalar;
use serde::{Deserialize, Serialize};

use crate::jobs::{connect, now_ns};
use crate::switch::make_synchronous;

/// The runner processes' binary.
const WORKER: &str = env!("CARGO_BIN_EXE_fifo-worker");

const PROCESSES: usize = 3;
const GROUPS: u32 = 24;
const PER_GROUP: u32 = 30;
/// Groups of concurrency 2 (queue `mp_wide`) and their jobs.
const WIDE_GROUPS: u32 = 3;
const WIDE_PER_GROUP: u32 = 30;
/// Jobs that succeed before the fault.
const BEFORE: i64 = 250;
const DB: &str = "app";

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
    #[diesel(sql_type = Integer)]
    pid: i32,
    #[diesel(sql_type = BigInt)]
    started_ns: i64,
    #[diesel(sql_type = BigInt)]
    ended_ns: i64,
}

fn job(group: u32, seq: u32, wide: bool) -> NewJob {
    let work_us = if seq % 4 == 0 { 0 } else { 1_000 };
    let (prefix, queue) = if wide { ("w", "mp_wide") } else { ("g", "mp") };
    NewJob::new(
        &MpJob {
            group: if wide { 1_000 + group } else { group },
            seq,
            work_us,
        },
        EnqueueOptions::group(format!("{prefix}{group}")).queue(queue),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby, worker processes and a failover; .ci/run runs it with --ignored"]
async fn worker_processes_follow_a_killed_primary_to_a_promoted_synchronous_standby() {
    let primary = Node::primary().expect("start the primary");
    let standby = Node::standby_of(&primary).expect("start the standby");
    make_synchronous(&primary).await;
    let mut admin = connect(&primary.url("postgres")).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .unwrap();
    drop(admin);
    let url = format!(
        "postgres://postgres@{},{}/{DB}?target_session_attrs=read-write",
        primary.host(),
        standby.host()
    );
    let pool = pgfifo::connect(&url, 2).await.expect("connect");
    pgfifo::migrate(&pool).await.expect("migrate");
    let mut enqueued = HashSet::new();
    {
        let mut conn = pool.get().await.unwrap();
        conn.batch_execute(
            "CREATE TABLE mp_log (job_id bigint NOT NULL, grp integer NOT NULL, \
             seq integer NOT NULL, pid integer NOT NULL, started_ns bigint NOT NULL, \
             ended_ns bigint NOT NULL)",
        )
        .await
        .unwrap();
        for seq in 0..PER_GROUP.max(WIDE_PER_GROUP) {
            let mut jobs: Vec<NewJob> = Vec::new();
            if seq < PER_GROUP {
                jobs.extend((0..GROUPS).map(|g| job(g, seq, false)));
            }
            if seq < WIDE_PER_GROUP {
                jobs.extend((0..WIDE_GROUPS).map(|g| job(g, seq, true)));
            }
            let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
            enqueued.extend(ids);
        }
    }
    drop(pool);
    let total = i64::from(GROUPS * PER_GROUP + WIDE_GROUPS * WIDE_PER_GROUP);
    assert_eq!(enqueued.len() as i64, total);

    let dir = std::env::temp_dir().join(format!("pgfifo-failover-procs-{}", now_ns()));
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "failover processes: worker logs and records in {}",
        dir.display()
    );
    let mut workers: Vec<AckedWorker> = (0..PROCESSES)
        .map(|i| {
            AckedWorker::start(
                WORKER,
                &i.to_string(),
                &url,
                &dir,
                &[("WIDE_QUEUE", "mp_wide")],
            )
        })
        .collect();
    let pids: Vec<i32> = workers.iter().map(|w| w.child.id() as i32).collect();

    let mut watcher = connect(&primary.url(DB)).await;
    let began = Instant::now();
    while scalar(&mut watcher, "SELECT count(*) FROM mp_log").await < BEFORE {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "no drain before the fault"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(watcher);
    primary.kill_postmaster().expect("kill -9");
    let asked_ns = now_ns();
    standby.promote().expect("promote the standby");

    let mut checker = connect(&standby.url(DB)).await;
    let began = Instant::now();
    loop {
        let done = scalar(
            &mut checker,
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        )
        .await;
        if done == total {
            break;
        }
        for (i, w) in workers.iter_mut().enumerate() {
            if let Ok(Some(status)) = w.child.try_wait() {
                panic!("worker {i} exited during the failover: {status}");
            }
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "{done} of {total} jobs succeeded 90 s after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_new_ns = scalar(
        &mut checker,
        &format!(
            "SELECT (extract(epoch FROM min(pg_xact_commit_timestamp(xmin))) * 1e9)::bigint \
             FROM mp_log WHERE pg_xact_commit_timestamp(xmin) > to_timestamp({asked_ns} / 1e9)"
        ),
    )
    .await;
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT job_id, grp, seq, pid, started_ns, ended_ns FROM mp_log \
         ORDER BY grp, started_ns, job_id",
    )
    .load(&mut checker)
    .await
    .unwrap();

    // SIGTERM: each worker drains and exits 0.
    for w in &workers {
        let status = Command::new("kill")
            .args(["-TERM", &w.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    for (i, w) in workers.iter_mut().enumerate() {
        let status = w.child.wait().unwrap();
        assert!(status.success(), "worker {i} exited with {status}");
    }
    let mut acknowledged = HashSet::new();
    let mut acks = 0;
    for w in &workers {
        for line in std::fs::read_to_string(&w.acks).unwrap().lines() {
            acknowledged.insert(line.parse::<i64>().unwrap());
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
    let mut wide_peak = 0;
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.grp != b.grp || a.grp >= 1_000 {
            continue;
        }
        if b.seq != a.seq + 1 {
            order_violations += 1;
        }
        if b.started_ns < a.ended_ns {
            overlaps += 1;
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let at_once = rows[..i]
            .iter()
            .filter(|e| e.grp == row.grp && e.ended_ns > row.started_ns)
            .count()
            + 1;
        wide_peak = wide_peak.max(at_once);
    }
    // Each process committed jobs after the promotion: none had to restart.
    let mut after: BTreeMap<i32, usize> = pids.iter().map(|&p| (p, 0)).collect();
    for row in rows.iter().filter(|r| r.started_ns > asked_ns) {
        *after.entry(row.pid).or_default() += 1;
    }
    let recovery_ms = (first_new_ns - asked_ns) as f64 / 1e6;
    println!(
        "failover processes: fault=Killed replication=Synchronous processes={PROCESSES} \
         jobs={total} acknowledged={} lost={lost} never_committed={never} reruns={reruns} \
         duplicates={duplicates} order_violations={order_violations} overlaps={overlaps} \
         wide_peak={wide_peak} first_commit_on_new_primary={recovery_ms:.0}ms_after_promote_asked \
         after_promotion_per_process={:?}",
        acknowledged.len(),
        after.values().collect::<Vec<_>>(),
    );
    assert_eq!(lost, 0, "acknowledged successes lost");
    assert_eq!(never, 0, "jobs never committed");
    assert_eq!(reruns, 0, "acknowledged successes ran again");
    assert_eq!(duplicates, 0, "jobs committed twice");
    assert_eq!(order_violations, 0, "groups out of order");
    assert_eq!(overlaps, 0, "runs of a group overlapped");
    assert!(wide_peak <= 2, "{wide_peak} runs of a group at once");
    assert!(
        after.values().all(|&n| n > 0),
        "a process committed nothing on the new primary: {after:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    drop(checker);
    drop(primary);
}

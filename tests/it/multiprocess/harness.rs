//! The multi-process drain: worker processes, the jobs they run, and the
//! checks on what they recorded (see the parent module).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::records::{self, Run};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

const GROUPS: u32 = 50;
const JOBS: u32 = 2_000;
/// Jobs per `enqueue_batch` call (each its own transaction).
const BATCH: usize = 500;
/// Jobs run at once per process.
const CONCURRENCY: usize = 8;

/// The job `fifo-worker` runs: same name, queue and fields as the worker's
/// type, declared here so that this binary can enqueue it (`NewJob::new`
/// checks the type is registered in the calling binary). It never runs in this
/// binary: the test starts no runner, and other tests' runners work on
/// databases of their own, where no `mp` job exists.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "mp.job", queue = "mp")]
pub(crate) struct MpJob {
    pub group: u32,
    pub seq: u32,
    pub work_us: u64,
}

#[async_trait]
impl Handler for MpJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent(
            "mp.job runs in fifo-worker processes only",
        ))
    }
}

pub(crate) const MP_LOG: &str = "CREATE TABLE mp_log (
    job_id bigint NOT NULL, grp integer NOT NULL, seq integer NOT NULL, pid integer NOT NULL,
    started_ns bigint NOT NULL, ended_ns bigint NOT NULL)";

#[derive(QueryableByName, Debug)]
struct LogRow {
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
}

/// One worker process and what the test keeps of it.
struct Worker {
    child: Child,
    /// Held open: with `EXIT_WITH_STDIN=1` the worker exits when it closes.
    _stdin: ChildStdin,
    /// Reads the worker's stdout; yields every line once the worker exits.
    stdout: Option<std::thread::JoinHandle<Vec<String>>>,
    /// The same for its stderr (its log).
    stderr: Option<std::thread::JoinHandle<Vec<String>>>,
    records: PathBuf,
}

/// The worker processes, killed (SIGKILL) if the test ends before they
/// exited, whether it failed or not. Their records are kept for inspection
/// when the test failed and removed otherwise.
pub(crate) struct Workers {
    procs: Vec<Worker>,
    /// The records files of workers killed with SIGKILL (possibly torn).
    killed: Vec<PathBuf>,
    dir: PathBuf,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.procs {
            if matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "multiprocess test failed: worker records kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Workers {
    /// Starts `n` workers on `url` (with `env` added to their environment)
    /// and waits until each has its runner going.
    pub(crate) async fn start(n: usize, url: &str, env: &[(&str, &str)]) -> Workers {
        let dir = std::env::temp_dir().join(format!(
            "pgfifo-multiprocess-{}-{}",
            std::process::id(),
            records::now_ns()
        ));
        std::fs::create_dir_all(&dir).expect("create the records directory");
        let mut workers = Workers {
            procs: Vec::new(),
            killed: Vec::new(),
            dir,
        };
        let mut ready = Vec::new();
        for i in 0..n {
            let records = workers.dir.join(format!("worker-{i}.tsv"));
            let mut child = Command::new(env!("CARGO_BIN_EXE_fifo-worker"))
                .env("DATABASE_URL", url)
                .env("RECORDS_FILE", &records)
                .env("CONCURRENCY", CONCURRENCY.to_string())
                .env("EXIT_WITH_STDIN", "1")
                .envs(env.iter().copied())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn fifo-worker");
            let stdin = child.stdin.take().expect("piped stdin");
            let stdout = child.stdout.take().expect("piped stdout");
            let stderr = child.stderr.take().expect("piped stderr");
            // Echoed as it comes (the test's output shows it on failure) and
            // kept for the test to check.
            let errors = std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    eprintln!("worker {i}: {line}");
                    lines.push(line);
                }
                lines
            });
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            // Keeps reading after "ready" so the worker's later output never
            // meets a closed pipe.
            let reader = std::thread::spawn(move || {
                let mut lines = Vec::new();
                let mut ready_tx = Some(ready_tx);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if line.starts_with("ready") {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    lines.push(line);
                }
                lines
            });
            ready.push(ready_rx);
            workers.procs.push(Worker {
                child,
                _stdin: stdin,
                stdout: Some(reader),
                stderr: Some(errors),
                records,
            });
        }
        for (i, rx) in ready.into_iter().enumerate() {
            match tokio::time::timeout(Duration::from_secs(60), rx).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!(
                    "worker {i} exited before it was ready: {:?} (its stderr is above)",
                    workers.procs[i].child.wait()
                ),
                Err(_) => panic!("worker {i} not ready after 60 s"),
            }
        }
        workers
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|w| w.child.id()).collect()
    }

    /// Panics if a worker has exited.
    /// Every run the workers recorded (of a killed worker, its whole lines).
    pub(crate) fn runs(&self) -> Vec<Run> {
        let mut runs = Vec::new();
        for w in &self.procs {
            runs.extend(records::read_runs(&w.records).unwrap());
        }
        for path in &self.killed {
            runs.extend(records::read_runs_lenient(path));
        }
        runs
    }

    /// SIGKILLs the worker with process id `pid`, and waits until it is gone.
    pub(crate) fn kill(&mut self, pid: u32) {
        let i = self
            .procs
            .iter()
            .position(|w| w.child.id() == pid)
            .unwrap_or_else(|| panic!("no worker with pid {pid}"));
        let mut worker = self.procs.remove(i);
        worker.child.kill().expect("SIGKILL a worker");
        worker.child.wait().expect("wait for a killed worker");
        self.killed.push(worker.records);
    }

    pub(crate) fn assert_running(&mut self) {
        for (i, w) in self.procs.iter_mut().enumerate() {
            if let Ok(Some(status)) = w.child.try_wait() {
                panic!("worker {i} (pid {}) exited early: {status}", w.child.id());
            }
        }
    }

    /// Sends SIGTERM to every worker, waits for each to drain and exit 0, and
    /// returns their stdout and stderr lines.
    pub(crate) async fn terminate(&mut self) -> Vec<Output> {
        for w in &self.procs {
            let status = Command::new("kill")
                .arg("-TERM")
                .arg(w.child.id().to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill -TERM {}: {status}", w.child.id());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut outputs = Vec::new();
        for (i, w) in self.procs.iter_mut().enumerate() {
            let status = loop {
                if let Some(status) = w.child.try_wait().expect("wait for a worker") {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "worker {i} still running 30 s after SIGTERM"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert!(
                status.success(),
                "worker {i} (pid {}) exited with {status}",
                w.child.id()
            );
            let stdout = w.stdout.take().expect("stdout reader");
            let stderr = w.stderr.take().expect("stderr reader");
            outputs.push(
                tokio::task::spawn_blocking(move || Output {
                    stdout: stdout.join().expect("stdout reader"),
                    stderr: stderr.join().expect("stderr reader"),
                })
                .await
                .unwrap(),
            );
        }
        outputs
    }
}

/// What a worker printed.
pub(crate) struct Output {
    pub stdout: Vec<String>,
    /// Its log (warnings and errors unless `PGFIFO_TEST_LOG` says more).
    pub stderr: Vec<String>,
}

/// A drain by worker processes: how many, where they connect, and what else
/// they are told.
pub(crate) struct Drain<'a> {
    pub processes: usize,
    /// The URL the workers connect to.
    pub url: &'a str,
    /// More environment for the workers.
    pub env: &'a [(&'a str, &'a str)],
}

fn job(k: u32) -> NewJob {
    let (group, seq) = (k % GROUPS, k / GROUPS);
    // Mostly 200–1000 µs of work, with every fifth job instant so that a
    // group's next job is often picked right as the previous one commits.
    let work_us = if k % 5 == 0 {
        0
    } else {
        200 + u64::from(k.wrapping_mul(7919) % 801)
    };
    mp_job(group, seq, work_us)
}

/// Job `seq` of group `g{group:03}`, its handler working `work_us`.
pub(crate) fn mp_job(group: u32, seq: u32, work_us: u64) -> NewJob {
    NewJob::new(
        &MpJob {
            group,
            seq,
            work_us,
        },
        EnqueueOptions::group(format!("g{group:03}")),
    )
    .unwrap()
}

/// Has `drain.processes` workers drain 2,000 jobs in 50 groups, enqueued
/// on `enqueuer` in batches while they run, and checks from their records
/// and `mp_log` that each job ran once, groups never overlapped and kept
/// their order. Returns what each worker printed.
pub(crate) async fn drain_and_check(
    db: &TestDb,
    drain: Drain<'_>,
    enqueuer: &mut AsyncPgConnection,
) -> Vec<Output> {
    let began = Instant::now();
    db.exec(MP_LOG).await;
    let n = i64::from(JOBS);

    // Workers first, so that all of them are polling when the first batch
    // commits: every process gets a fair chance at the work.
    let mut workers = Workers::start(drain.processes, drain.url, drain.env).await;
    let pids = workers.pids();
    let ready_at = Instant::now();

    // Batches in separate transactions while the workers already drain the
    // earlier ones: groups get new tails while their heads run.
    let conn = enqueuer;
    let mut ids = Vec::new();
    let all: Vec<NewJob> = (0..JOBS).map(job).collect();
    for batch in all.chunks(BATCH) {
        ids.extend(pgfifo::enqueue_batch(conn, batch.to_vec()).await.unwrap());
    }
    assert_eq!(ids.len(), JOBS as usize);

    // Wait for the drain, failing fast on a failed job or a dead worker.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = db
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'")
            .await;
        if done == n {
            break;
        }
        let bad = db
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state IN ('failed', 'cancelled')")
            .await;
        if bad > 0 {
            let error = db.text("SELECT last_error FROM pgfifo.job WHERE state IN ('failed', 'cancelled') LIMIT 1").await;
            panic!("{bad} jobs failed or were cancelled, e.g.: {error:?}");
        }
        workers.assert_running();
        assert!(
            Instant::now() < deadline,
            "only {done} of {n} jobs succeeded after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = ready_at.elapsed();
    let outputs = workers.terminate().await;

    // --- What committed (mp_log): exactly once, and by whom. ---
    let mut conn = db.conn().await;
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, grp, seq, pid, started_ns FROM mp_log ORDER BY job_id")
            .load(&mut conn)
            .await
            .unwrap();
    drop(conn);
    let mut per_job = std::collections::BTreeMap::<i64, usize>::new();
    for row in &log {
        *per_job.entry(row.job_id).or_default() += 1;
    }
    let duplicates: usize = per_job.values().map(|c| c - 1).sum();
    let lost = ids.iter().filter(|id| !per_job.contains_key(id)).count();
    let strangers = per_job.keys().filter(|id| !ids.contains(id)).count();
    let per_process: Vec<usize> = pids
        .iter()
        .map(|&pid| {
            log.iter()
                .filter(|r| i64::from(r.pid) == i64::from(pid))
                .count()
        })
        .collect();
    // Committed runs per group by start time must be seq 0, 1, 2, …
    let mut committed_order_violations = 0;
    let mut by_group = std::collections::BTreeMap::<i32, Vec<&LogRow>>::new();
    for row in &log {
        by_group.entry(row.grp).or_default().push(row);
    }
    for rows in by_group.values_mut() {
        rows.sort_by_key(|r| (r.started_ns, r.job_id));
        committed_order_violations += rows
            .iter()
            .enumerate()
            .filter(|(i, r)| usize::try_from(r.seq).ok() != Some(*i))
            .count();
    }

    // --- Every run (records files): overlaps and order. ---
    let mut runs: Vec<Run> = Vec::new();
    for w in &workers.procs {
        runs.extend(records::read_runs(&w.records).unwrap());
    }
    let overlaps = records::overlaps(&runs);
    let order_violations = records::order_violations(&runs);
    let handoffs = records::handoffs(&runs);
    let peak = records::peak_parallelism(&runs);
    let attempts = db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await;
    let retried = db
        .scalar("SELECT count(*) FROM pgfifo.job WHERE attempts <> 1")
        .await;

    println!(
        "jobs={JOBS} groups={GROUPS} processes={} overlaps={} order_violations={} duplicates={duplicates} lost={lost} \
         runs={} attempts={attempts} per_process={per_process:?} handoffs={handoffs} peak_parallel={peak} \
         drain={drained:.2?} total={:.2?}",
        drain.processes,
        overlaps.len(),
        order_violations.len() + committed_order_violations,
        runs.len(),
        began.elapsed(),
    );
    for (i, output) in outputs.iter().enumerate() {
        println!(
            "worker {i} (pid {}): {}",
            pids[i],
            output.stdout.join(" | ")
        );
    }

    assert!(
        overlaps.is_empty(),
        "runs of a group overlapped in time: {:?}",
        &overlaps[..overlaps.len().min(10)]
    );
    assert!(
        order_violations.is_empty(),
        "jobs of a group started out of order: {:?}",
        &order_violations[..order_violations.len().min(10)]
    );
    assert_eq!(
        committed_order_violations, 0,
        "committed runs of a group are not seq 0, 1, 2, … by start time"
    );
    assert_eq!(duplicates, 0, "jobs committed more than once");
    assert_eq!(lost, 0, "jobs without a committed run");
    assert_eq!(
        strangers, 0,
        "mp_log rows of jobs this test did not enqueue"
    );
    assert_eq!(log.len(), JOBS as usize);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'")
            .await,
        n
    );
    // No run failed or was rolled back: one run, one attempt per job.
    assert_eq!(
        runs.len(),
        JOBS as usize,
        "handler runs recorded in the files"
    );
    assert_eq!(attempts, n, "attempts recorded in pgfifo.job_attempt");
    assert_eq!(retried, 0, "jobs whose attempts is not 1");
    // The file runs and the committed runs are the same runs.
    let mut file_runs: Vec<(i64, i64)> = runs.iter().map(|r| (r.job_id, r.start_ns)).collect();
    let mut log_runs: Vec<(i64, i64)> = log.iter().map(|r| (r.job_id, r.started_ns)).collect();
    file_runs.sort_unstable();
    log_runs.sort_unstable();
    assert!(file_runs == log_runs, "records files and mp_log disagree");
    // The processes really shared the work, and groups moved between them.
    for (i, count) in per_process.iter().enumerate() {
        assert!(
            *count > 0,
            "worker {i} (pid {}) ran no job: {per_process:?}",
            pids[i]
        );
    }
    if drain.processes > 1 {
        assert!(
            handoffs > 0,
            "no group ever moved from one process to another"
        );
    }
    for (i, output) in outputs.iter().enumerate() {
        let expected = format!("done pid={} runs={}", pids[i], per_process[i]);
        assert!(
            output.stdout.contains(&expected),
            "worker {i} printed {:?}, expected {expected:?}",
            output.stdout
        );
    }
    outputs
}

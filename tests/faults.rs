//! The fault-injection suite (issue 3): several `fault-worker` processes (see
//! `tests/src/bin/fault-worker.rs`) drain thousands of jobs in more than a
//! hundred groups while the suite
//! 1. SIGKILLs random workers mid-handler and starts replacements;
//! 2. terminates every pgfifo connection (`pg_terminate_backend`), also while
//!    a job waits in a runner's prefetch lane, and restarts PostgreSQL (fast
//!    and immediate), checking that the runners reconnect and carry on by
//!    themselves;
//! 3. SIGSTOPs a worker mid-handler, measures how long its group stays held
//!    (bounded by the job's timeout plus `RunnerConfig::idle_grace`, through
//!    the `idle_in_transaction_session_timeout` that `pgfifo.pick` puts on the
//!    job's transaction), then SIGCONTs it and checks that its run never
//!    commits;
//! 4. runs a poison job that aborts its process on every attempt;
//! 5. runs handlers that hang past their timeout and handlers that panic.
//!
//! It then checks every job: succeeded exactly once, or failed with its
//! reason; none lost; no two runs of a group at once; every group in order;
//! and prints one summary line. Any non-zero violation count fails the run.
//!
//! The suite restarts PostgreSQL, so it runs on a private server of its own
//! (`pgfifo_tests::faults::private_pg`), never on the shared one. Its main
//! test is `#[ignore]`d, so `cargo test --workspace` skips it; `.ci/run` runs
//! it with
//! `cargo test -p pgfifo-tests --test faults -- --ignored --nocapture --test-threads=1`.
//! `FAULTS_SOAK=1` makes it a soak of 20+ minutes; `FAULTS_SEED=<n>` replays
//! a run's random choices (the seed is printed); `FAULTS_WORKER_POOL=<n>`
//! sizes the workers' pools (default `2 * concurrency + 3`, room for every
//! runner lane).
//!
//! The other tests here (pool exhausted, database unreachable at start) are
//! small, not ignored, and use the shared server only to create a database of
//! their own.
//!
//! docs/failure-model.md describes each fault, what happens, how fast the
//! group is released and which settings govern it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::faults::private_pg::{PrivatePg, StopMode};
use pgfifo_tests::faults::runs::{self, Cut, Line, Mode, Rng};
use pgfifo_tests::records::now_ns;
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};
use tracing_subscriber::util::SubscriberInitExt;

// --- The job types (mirrors of fault-worker's; they never run here) -------

/// Same name, queue, settings and fields as `fault-worker`'s type, declared so
/// that this binary can enqueue it. No runner of this binary serves its queue.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    name = "faults.job",
    queue = "faults",
    max_attempts = 25,
    timeout = "4s",
    backoff = "100ms"
)]
struct FaultJob {
    grp: u32,
    seq: u32,
    mode: Mode,
    work_ms: u32,
}

#[async_trait]
impl Handler for FaultJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent("faults.job runs in fault-worker only"))
    }
}

/// Mirror of `fault-worker`'s freeze job.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    name = "faults.freeze",
    queue = "freeze",
    max_attempts = 10,
    timeout = "3s",
    backoff = "100ms"
)]
struct FreezeJob {
    grp: u32,
    seq: u32,
    freeze: bool,
    work_ms: u32,
}

#[async_trait]
impl Handler for FreezeJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent(
            "faults.freeze runs in fault-worker only",
        ))
    }
}

/// `faults.job`'s timeout.
const FAULT_TIMEOUT: Duration = Duration::from_secs(4);
/// `faults.freeze`'s timeout.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(3);
/// `RunnerConfig::idle_grace` of the normal workers.
const WORKER_GRACE: Duration = Duration::from_secs(2);
/// `RunnerConfig::idle_grace` of the worker the suite freezes (and of its
/// rescuer): the frozen group must be free within FREEZE_TIMEOUT + this.
const FREEZER_GRACE: Duration = Duration::from_secs(1);
/// Allowed on top of that bound when measuring it: the server checks the
/// timeout on its own timer, and the suite polls every 20 ms.
const RELEASE_MARGIN: Duration = Duration::from_millis(1500);
/// Group numbers of the freeze scenario's groups start here.
const FREEZE_GRP: u32 = 1_000_000;
/// Group numbers of the prefetch scenario's groups start here.
const PREFETCH_GRP: u32 = 2_000_000;
/// Connections of worker processes carry application names with this prefix.
const APP_PREFIX: &str = "pgfifo-fw-";

const FAULT_LOG: &str = "CREATE TABLE fault_log (
    job_id bigint NOT NULL, attempt integer NOT NULL, queue text NOT NULL,
    grp integer NOT NULL, seq integer NOT NULL, pid integer NOT NULL,
    start_ns bigint NOT NULL, end_ns bigint NOT NULL,
    logged_at timestamptz NOT NULL DEFAULT clock_timestamp())";

// --- The plan ---------------------------------------------------------------

/// How much of everything a run does.
#[derive(Debug, Clone)]
struct Plan {
    soak: bool,
    seed: u64,
    groups: u32,
    min_jobs: usize,
    max_jobs: usize,
    wave: usize,
    backlog: i64,
    workers: usize,
    concurrency: usize,
    kills: usize,
    terminations: usize,
    restarts: usize,
    freezes: usize,
    prefetch_cuts: usize,
    poison: usize,
    hang_once: usize,
    hang_always: usize,
    panic_once: usize,
    panic_always: usize,
    step_ms: (u64, u64),
    work_ms: (u32, u32),
    drain_limit: Duration,
}

impl Plan {
    fn from_env() -> Plan {
        let soak = std::env::var("FAULTS_SOAK").is_ok_and(|v| !v.is_empty() && v != "0");
        let seed = std::env::var("FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| now_ns() as u64);
        if soak {
            Plan {
                soak,
                seed,
                groups: 400,
                min_jobs: 60_000,
                max_jobs: 400_000,
                wave: 1_500,
                backlog: 2_500,
                workers: 5,
                concurrency: 6,
                kills: 400,
                terminations: 12,
                restarts: 8,
                freezes: 5,
                prefetch_cuts: 3,
                poison: 4,
                hang_once: 10,
                hang_always: 4,
                panic_once: 20,
                panic_always: 6,
                step_ms: (1_500, 3_500),
                work_ms: (40, 260),
                drain_limit: Duration::from_secs(300),
            }
        } else {
            Plan {
                soak,
                seed,
                groups: 125,
                min_jobs: 5_000,
                max_jobs: 10_000,
                wave: 1_000,
                backlog: 1_500,
                workers: 4,
                concurrency: 4,
                kills: 22,
                terminations: 2,
                restarts: 2,
                freezes: 1,
                prefetch_cuts: 1,
                poison: 1,
                hang_once: 3,
                hang_always: 1,
                panic_once: 5,
                panic_always: 2,
                step_ms: (1_000, 2_000),
                work_ms: (40, 260),
                drain_limit: Duration::from_secs(90),
            }
        }
    }

    fn specials(&self) -> Vec<Mode> {
        let mut v = Vec::new();
        for (mode, n) in [
            (Mode::Poison, self.poison),
            (Mode::HangOnce, self.hang_once),
            (Mode::HangAlways, self.hang_always),
            (Mode::PanicOnce, self.panic_once),
            (Mode::PanicAlways, self.panic_always),
        ] {
            v.extend(std::iter::repeat_n(mode, n));
        }
        v
    }
}

/// The max attempts a job of `mode` is enqueued with.
fn max_attempts(mode: Mode) -> u32 {
    match mode {
        Mode::Poison => 3,
        Mode::HangAlways | Mode::PanicAlways => 2,
        _ => FaultJob::MAX_ATTEMPTS,
    }
}

/// What the failure reason of a job that must fail must say. An attempt cut
/// off by another fault (kill, restart) on the last attempt legitimately
/// leaves "never finished" instead.
fn reason_fits(mode: Mode, reason: &str) -> bool {
    let cut = reason.contains("never finished");
    match mode {
        Mode::Poison => cut,
        Mode::HangAlways => reason.contains("timed out") || cut,
        Mode::PanicAlways => reason.contains("panicked") || cut,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Kill,
    Terminate,
    Restart(StopMode),
    Freeze,
    /// Terminate while a job waits in a runner's prefetch lane.
    PrefetchCut,
}

/// One enqueued job and what must become of it.
#[derive(Debug, Clone)]
struct Enqueued {
    id: i64,
    queue: &'static str,
    grp: u32,
    seq: u32,
    mode: Mode,
    max_attempts: u32,
}

// --- Worker processes -------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Serves `faults`; killed at random and replaced.
    Worker,
    /// Serves `freeze` with one slot; frozen.
    Freezer,
    /// Serves `freeze` while the freezer is frozen.
    Rescuer,
    /// Serves `prefetch` with one slot (and the runner's prefetch lane).
    Prefetcher,
}

struct Proc {
    role: Role,
    app: String,
    pid: u32,
    child: Child,
    /// Held open: with `EXIT_WITH_STDIN=1` the worker exits when it closes.
    _stdin: ChildStdin,
    stdout: Arc<Mutex<Vec<String>>>,
    records: PathBuf,
    stderr: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Killed,
    Poison,
    Stopped,
    Unexpected(String),
}

#[derive(Debug, Clone)]
struct Death {
    pid: u32,
    app: String,
    role: Role,
    ns: i64,
    cause: Cause,
}

/// Every worker process of the run. Dropping it SIGKILLs those still alive
/// (also frozen ones), so no worker outlives a failed test.
struct Fleet {
    dir: PathBuf,
    url: String,
    alive: Vec<Proc>,
    deaths: Vec<Death>,
    records: Vec<(u32, PathBuf)>,
    stderrs: Vec<(String, PathBuf)>,
    counter: usize,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.alive {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Fleet {
    fn new(dir: PathBuf, url: String) -> Fleet {
        Fleet {
            dir,
            url,
            alive: Vec::new(),
            deaths: Vec::new(),
            records: Vec::new(),
            stderrs: Vec::new(),
            counter: 0,
        }
    }

    /// Starts a worker and waits until its runner runs. Returns its pid.
    async fn spawn(&mut self, role: Role, concurrency: usize) -> u32 {
        self.counter += 1;
        let (kind, queues, grace) = match role {
            Role::Worker => ("w", "faults", WORKER_GRACE),
            Role::Freezer => ("freezer", "freeze", FREEZER_GRACE),
            Role::Rescuer => ("rescuer", "freeze", FREEZER_GRACE),
            Role::Prefetcher => ("pf", "prefetch", WORKER_GRACE),
        };
        let app = format!("{APP_PREFIX}{kind}{}", self.counter);
        let records = self.dir.join(format!("{app}.records"));
        let stderr = self.dir.join(format!("{app}.stderr"));
        let err_file = std::fs::File::create(&stderr).expect("create a worker's stderr file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault-worker"))
            .env("DATABASE_URL", &self.url)
            .env("APP_NAME", &app)
            .env("RECORDS_FILE", &records)
            .env("QUEUES", queues)
            .env("CONCURRENCY", concurrency.to_string())
            .env("IDLE_GRACE_MS", grace.as_millis().to_string())
            .env("EXIT_WITH_STDIN", "1")
            .envs(std::env::var("FAULTS_WORKER_POOL").map(|n| ("POOL_SIZE", n)))
            // Planned panics print one line, not a backtrace each.
            .env("RUST_BACKTRACE", "0")
            .current_dir(&self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file))
            .spawn()
            .expect("spawn fault-worker");
        let pid = child.id();
        let stdin = child.stdin.take().expect("piped stdin");
        let out = child.stdout.take().expect("piped stdout");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let sink = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        self.records.push((pid, records.clone()));
        self.stderrs.push((app.clone(), stderr.clone()));
        let mut proc = Proc {
            role,
            app,
            pid,
            child,
            _stdin: stdin,
            stdout,
            records,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if proc
                .stdout
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.starts_with("ready"))
            {
                break;
            }
            if let Ok(Some(status)) = proc.child.try_wait() {
                panic!(
                    "{} exited before it was ready ({status}): {}",
                    proc.app,
                    tail(&proc.stderr, 20)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after 60 s: {}",
                proc.app,
                tail(&proc.stderr, 20)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.alive.push(proc);
        pid
    }

    fn get(&self, pid: u32) -> Option<&Proc> {
        self.alive.iter().find(|p| p.pid == pid)
    }

    fn pids(&self, role: Role) -> Vec<u32> {
        self.alive
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.pid)
            .collect()
    }

    /// SIGKILLs a process now.
    fn kill(&mut self, pid: u32) -> i64 {
        let i = self.alive.iter().position(|p| p.pid == pid).expect("alive");
        let mut p = self.alive.remove(i);
        let ns = now_ns();
        p.child.kill().expect("SIGKILL a worker");
        let _ = p.child.wait();
        self.deaths.push(Death {
            pid,
            app: p.app,
            role: p.role,
            ns,
            cause: Cause::Killed,
        });
        ns
    }

    /// Notices processes that died on their own, classifies them and starts
    /// replacements for workers (and for the freezer, should it die).
    async fn supervise(&mut self, concurrency: usize) {
        let mut i = 0;
        while i < self.alive.len() {
            let status = match self.alive[i].child.try_wait() {
                Ok(Some(status)) => status,
                _ => {
                    i += 1;
                    continue;
                }
            };
            let p = self.alive.remove(i);
            let abort_ns = (status.signal() == Some(6))
                .then(|| abort_line(&p.records, p.pid))
                .flatten();
            let (ns, cause) = match abort_ns {
                Some(ns) => (ns, Cause::Poison),
                None => {
                    let what = format!("{status}; stderr: {}", tail(&p.stderr, 15));
                    eprintln!(
                        "faults: {} (pid {}) died unexpectedly: {what}",
                        p.app, p.pid
                    );
                    (now_ns(), Cause::Unexpected(what))
                }
            };
            self.deaths.push(Death {
                pid: p.pid,
                app: p.app.clone(),
                role: p.role,
                ns,
                cause,
            });
            match p.role {
                Role::Worker => {
                    self.spawn(Role::Worker, concurrency).await;
                }
                Role::Freezer => {
                    self.spawn(Role::Freezer, 1).await;
                }
                Role::Rescuer | Role::Prefetcher => {}
            }
        }
    }

    /// SIGTERMs a process and waits for its graceful exit.
    async fn stop(&mut self, pid: u32) {
        signal(pid, "TERM");
        let i = self.alive.iter().position(|p| p.pid == pid).expect("alive");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Ok(Some(status)) = self.alive[i].child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut p = self.alive.remove(i);
        let cause = match status {
            Some(s) if s.success() => Cause::Stopped,
            Some(s) => Cause::Unexpected(format!(
                "exit {s} after SIGTERM; stderr: {}",
                tail(&p.stderr, 15)
            )),
            None => {
                let _ = p.child.kill();
                let _ = p.child.wait();
                Cause::Unexpected("still running 30 s after SIGTERM".to_owned())
            }
        };
        self.deaths.push(Death {
            pid,
            app: p.app,
            role: p.role,
            ns: now_ns(),
            cause,
        });
    }

    fn unexpected(&self) -> Vec<&Death> {
        self.deaths
            .iter()
            .filter(|d| matches!(d.cause, Cause::Unexpected(_)))
            .collect()
    }
}

/// The time of the poison `A` line process `pid` wrote, if any.
fn abort_line(records: &Path, pid: u32) -> Option<i64> {
    let text = std::fs::read_to_string(records).ok()?;
    runs::parse_all(&text).0.into_iter().find_map(|l| match l {
        Line::Abort { pid: p, ns, .. } if p == pid => Some(ns),
        _ => None,
    })
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid}: {status}");
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs of `records` started after `since_ns` that have not ended.
fn in_flight_since(records: &Path, since_ns: i64) -> usize {
    let text = std::fs::read_to_string(records).unwrap_or_default();
    let (lines, _) = runs::parse_all(&text);
    let recent: Vec<Line> = lines
        .into_iter()
        .filter(|l| !matches!(l, Line::Start { ns, .. } if *ns < since_ns))
        .collect();
    runs::in_flight(&recent)
}

// --- The suite's own database access ---------------------------------------

/// A connection of the suite's own (not a worker's: its application name
/// does not match theirs) that reconnects after faults.
struct Monitor {
    url: String,
    conn: Option<AsyncPgConnection>,
}

#[derive(QueryableByName)]
struct Scalar {
    #[diesel(sql_type = BigInt)]
    v: i64,
}

impl Monitor {
    fn new(url: &str) -> Monitor {
        Monitor {
            url: format!("{url}?application_name=pgfifo-faults-monitor"),
            conn: None,
        }
    }

    async fn try_scalar(&mut self, sql: &str) -> Result<i64, String> {
        if self.conn.is_none() {
            self.conn = Some(
                AsyncPgConnection::establish(&self.url)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let conn = self.conn.as_mut().expect("set above");
        let result: Result<Scalar, _> = diesel::sql_query(format!("SELECT ({sql})::bigint AS v"))
            .get_result(conn)
            .await;
        match result {
            Ok(row) => Ok(row.v),
            Err(e) => {
                self.conn = None;
                Err(e.to_string())
            }
        }
    }

    /// `sql`'s bigint, retrying through faults for up to a minute.
    async fn scalar(&mut self, sql: &str) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.try_scalar(sql).await {
                Ok(v) => return v,
                Err(e) => {
                    assert!(Instant::now() < deadline, "{sql}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The time of a server log line (`log_line_prefix` starts with `%m`, in
/// UTC), as ns since the epoch.
fn log_line_ns(line: &str) -> Option<i64> {
    // "2026-11-21 16:38:12.928 UTC [pid] app ..."
    let stamp = line.get(..27)?;
    if !stamp.ends_with(" UTC") {
        return None;
    }
    let num = |a: usize, b: usize| stamp.get(a..b).and_then(|s| s.parse::<i64>().ok());
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hh, mm, ss, ms) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) * 1_000_000_000 + ms * 1_000_000)
}

fn us(ns: i64) -> i64 {
    ns / 1_000
}

// --- The run ----------------------------------------------------------------

/// Everything the suite observed, for the checks and the summary.
#[derive(Default)]
struct Observed {
    kills: Vec<(u32, i64)>,
    terminations: usize,
    terminated_backends: i64,
    restarts: usize,
    db_faults: Vec<i64>,
    reconnect_failures: Vec<String>,
    recoveries: Vec<String>,
    freezes: Vec<FreezeReport>,
    failures: Vec<String>,
}

#[derive(Debug)]
struct FreezeReport {
    group: String,
    /// SIGSTOP to the frozen session's end (group free).
    release: Duration,
    /// SIGSTOP to the start of the job's other run.
    rerun_after_stop: Duration,
    /// The frozen run's last statement to the start of the other run.
    rerun_after_last_statement: Duration,
    bound: Duration,
}

struct Suite {
    plan: Plan,
    rng: Rng,
    url: String,
    monitor: Monitor,
    fleet: Fleet,
    jobs: Vec<Enqueued>,
    next_seq: Vec<u32>,
    specials: Vec<Mode>,
    special_groups: HashSet<u32>,
    waves: usize,
    seen: Observed,
}

impl Suite {
    async fn enqueue(&mut self, batch: Vec<(NewJob, Enqueued)>) {
        let mut conn = AsyncPgConnection::establish(&format!(
            "{}?application_name=pgfifo-faults-enqueue",
            self.url
        ))
        .await
        .expect("connect to enqueue");
        for chunk in batch.chunks(500) {
            let ids = pgfifo::enqueue_batch(&mut conn, chunk.iter().map(|(j, _)| j.clone()))
                .await
                .expect("enqueue a batch");
            for (id, (_, e)) in ids.into_iter().zip(chunk) {
                self.jobs.push(Enqueued { id, ..e.clone() });
            }
        }
    }

    /// A wave of `n` jobs over random groups, with the next special jobs.
    fn wave(&mut self, n: usize) -> Vec<(NewJob, Enqueued)> {
        self.waves += 1;
        // Specials go out over the first waves (CI: all in the first), each in
        // a group of its own among the specials, with normal jobs around it.
        let per_wave = if self.plan.soak {
            self.specials.len().div_ceil(8).max(1)
        } else {
            self.specials.len()
        };
        let take = per_wave.min(self.specials.len());
        let mut modes: Vec<Mode> = self.specials.drain(..take).collect();
        modes.resize(n.max(modes.len()), Mode::Normal);
        self.rng.shuffle(&mut modes);
        let mut out = Vec::with_capacity(modes.len());
        for mode in modes {
            let grp = loop {
                let g = self.rng.below(self.plan.groups as usize) as u32;
                if mode == Mode::Normal
                    || (self.special_groups.len() >= self.plan.groups as usize)
                    || self.special_groups.insert(g)
                {
                    break g;
                }
            };
            let seq = self.next_seq[grp as usize];
            self.next_seq[grp as usize] += 1;
            let work_ms = self.rng.range(
                u64::from(self.plan.work_ms.0),
                u64::from(self.plan.work_ms.1),
            ) as u32;
            let attempts = max_attempts(mode);
            let job = NewJob::new(
                &FaultJob {
                    grp,
                    seq,
                    mode,
                    work_ms,
                },
                EnqueueOptions::group(format!("g{grp:04}")).max_attempts(attempts),
            )
            .expect("a valid job");
            out.push((
                job,
                Enqueued {
                    id: 0,
                    queue: "faults",
                    grp,
                    seq,
                    mode,
                    max_attempts: attempts,
                },
            ));
        }
        out
    }

    fn fault_jobs(&self) -> usize {
        self.jobs.iter().filter(|j| j.queue == "faults").count()
    }

    /// Keeps a backlog so that kills always find handlers running.
    async fn top_up(&mut self) {
        if self.fault_jobs() >= self.plan.max_jobs {
            return;
        }
        let queued = self
            .monitor
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued' AND queue = 'faults'")
            .await;
        if queued < self.plan.backlog {
            let n = self.plan.wave.min(self.plan.max_jobs - self.fault_jobs());
            let batch = self.wave(n);
            self.enqueue(batch).await;
        }
    }

    /// Waits `d`, replacing dead workers meanwhile.
    async fn pause(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let now = Instant::now();
            if now >= until {
                return;
            }
            tokio::time::sleep((until - now).min(Duration::from_millis(100))).await;
        }
    }

    /// SIGKILLs a random worker that has a handler running, and replaces it.
    async fn kill_one(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let victim = loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let since = now_ns() - FAULT_TIMEOUT.as_nanos() as i64;
            let busy: Vec<u32> = self
                .fleet
                .alive
                .iter()
                .filter(|p| p.role == Role::Worker && in_flight_since(&p.records, since) > 0)
                .map(|p| p.pid)
                .collect();
            if !busy.is_empty() {
                break busy[self.rng.below(busy.len())];
            }
            if Instant::now() > deadline {
                let all = self.fleet.pids(Role::Worker);
                eprintln!("faults: no worker has a handler running; killing one anyway");
                break all[self.rng.below(all.len())];
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let ns = self.fleet.kill(victim);
        self.seen.kills.push((victim, ns));
        self.fleet.spawn(Role::Worker, self.plan.concurrency).await;
    }

    /// Terminates every pgfifo connection of every worker process.
    async fn terminate_all(&mut self) {
        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        let t0 = now_ns();
        let n = self
            .monitor
            .scalar(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE '{APP_PREFIX}%'"
            ))
            .await;
        self.seen.db_faults.push(t0);
        self.seen.terminations += 1;
        self.seen.terminated_backends += n;
        // Every connection that existed then is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self
                .monitor
                .scalar(&format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '{APP_PREFIX}%' \
                     AND (extract(epoch FROM backend_start) * 1000000)::bigint < {}",
                    us(t0)
                ))
                .await;
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                self.seen.failures.push(format!(
                    "{left} pgfifo connections survived pg_terminate_backend"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("faults: terminated {n} pgfifo connections");
        self.recover(t0, &before, "terminate").await;
    }

    /// A full PostgreSQL restart.
    async fn restart(&mut self, pg: &mut PrivatePg, mode: StopMode) {
        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        let t0 = now_ns();
        let down = pg.restart(mode).expect("restart PostgreSQL");
        self.monitor.conn = None;
        self.seen.db_faults.push(t0);
        self.seen.restarts += 1;
        println!("faults: PostgreSQL restarted ({mode:?}), unavailable for {down:.2?}");
        self.recover(t0, &before, "restart").await;
    }

    /// After a database fault at `t0`: every process that was alive then
    /// (and still is) reconnects by itself, and every such normal worker
    /// commits a job again.
    async fn recover(&mut self, t0: i64, before: &[u32], what: &str) {
        let began = Instant::now();
        let deadline = began + Duration::from_secs(40);
        loop {
            self.fleet.supervise(self.plan.concurrency).await;
            let mut missing = Vec::new();
            let alive: Vec<(u32, String, Role)> = self
                .fleet
                .alive
                .iter()
                .filter(|p| before.contains(&p.pid))
                .map(|p| (p.pid, p.app.clone(), p.role))
                .collect();
            for (pid, app, role) in alive {
                let connected = self
                    .monitor
                    .scalar(&format!(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' \
                         AND (extract(epoch FROM backend_start) * 1000000)::bigint > {}",
                        us(t0)
                    ))
                    .await;
                let committed = if role == Role::Worker {
                    self.monitor
                        .scalar(&format!(
                            "SELECT count(*) FROM fault_log WHERE pid = {pid} AND start_ns > {t0}"
                        ))
                        .await
                } else {
                    1
                };
                if connected == 0 || committed == 0 {
                    missing.push(format!(
                        "{app} (pid {pid}): reconnected={} committed_since={}",
                        connected > 0,
                        committed > 0
                    ));
                }
            }
            if missing.is_empty() {
                let line = format!(
                    "{what}: every runner reconnected and carried on within {:.2?}",
                    began.elapsed()
                );
                println!("faults: {line}");
                self.seen.recoveries.push(line);
                return;
            }
            if Instant::now() > deadline {
                for m in missing {
                    self.seen
                        .reconnect_failures
                        .push(format!("after {what}: {m}"));
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Connections cut while a job waits in a prefetch lane. A runner with
    /// one slot runs a long job of group A and has taken the head of group B
    /// ahead of its slot (picked, locked, attempt recorded), waiting for the
    /// slot. Every pgfifo connection is then terminated and another runner
    /// takes B over. When its slot frees up, the first runner must not start
    /// B's handler: its transaction, and with it B's lock, is gone.
    async fn prefetch_cut(&mut self, k: usize) {
        let pf = self.fleet.spawn(Role::Prefetcher, 1).await;
        let (pf_app, pf_records) = {
            let p = self.fleet.get(pf).expect("alive");
            (p.app.clone(), p.records.clone())
        };
        let grp = PREFETCH_GRP + 2 * k as u32;
        let job = |grp: u32, group: String| {
            (
                NewJob::new(
                    &FaultJob {
                        grp,
                        seq: 0,
                        mode: Mode::Normal,
                        work_ms: 1_500,
                    },
                    EnqueueOptions::group(group).queue("prefetch"),
                )
                .expect("a valid job"),
                Enqueued {
                    id: 0,
                    queue: "prefetch",
                    grp,
                    seq: 0,
                    mode: Mode::Normal,
                    max_attempts: FaultJob::MAX_ATTEMPTS,
                },
            )
        };
        let first = self.jobs.len();
        self.enqueue(vec![
            job(grp, format!("pf-{k}-a")),
            job(grp + 1, format!("pf-{k}-b")),
        ])
        .await;
        let (a, b) = (self.jobs[first].id, self.jobs[first + 1].id);
        let starts = |path: &Path, pid: u32, job: i64| -> Vec<i64> {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            runs::parse_all(&text)
                .0
                .iter()
                .filter_map(|l| match l {
                    Line::Start {
                        run, pid: p, ns, ..
                    } if run.job == job && *p == pid => Some(*ns),
                    _ => None,
                })
                .collect()
        };
        // One handler runs; the other job is taken and waits for the slot.
        let deadline = Instant::now() + Duration::from_secs(15);
        let roles = loop {
            let (sa, sb) = (
                !starts(&pf_records, pf, a).is_empty(),
                !starts(&pf_records, pf, b).is_empty(),
            );
            let recorded = self
                .monitor
                .scalar(&format!(
                    "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({a}, {b})"
                ))
                .await;
            match (sa, sb, recorded) {
                (true, false, 2) => break Some((a, b)),
                (false, true, 2) => break Some((b, a)),
                (true, true, _) => break None,
                _ if Instant::now() > deadline => break None,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        let done_sql = format!(
            "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id IN ({a}, {b})"
        );
        let Some((running, waiting)) = roles else {
            println!(
                "faults: prefetch scenario {k}: {pf_app} did not hold one job running and the other \
                 waiting for its slot (no prefetch lane?): nothing to test"
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.monitor.scalar(&done_sql).await != 2 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.fleet.stop(pf).await;
            return;
        };

        let before: Vec<u32> = self.fleet.alive.iter().map(|p| p.pid).collect();
        let t0 = now_ns();
        let n = self
            .monitor
            .scalar(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE '{APP_PREFIX}%'"
            ))
            .await;
        self.seen.db_faults.push(t0);
        self.seen.terminations += 1;
        self.seen.terminated_backends += n;
        let pf2 = self.fleet.spawn(Role::Prefetcher, 1).await;
        let pf2_records = self.fleet.get(pf2).expect("alive").records.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql).await != 2 {
            assert!(
                Instant::now() < deadline,
                "the prefetch scenario's jobs did not finish after the cut"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The first runner's slot frees up when the running handler ends
        // (about 1.5 s after it began): give a late start time to show.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&pf_records).unwrap_or_default();
            let ended = runs::parse_all(&text)
                .0
                .iter()
                .any(|l| matches!(l, Line::End { run, .. } if run.job == running));
            if ended || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ms = |ns: i64| (ns - t0) as f64 / 1e6;
        let zombie: Vec<i64> = starts(&pf_records, pf, waiting)
            .into_iter()
            .filter(|&ns| ns > t0)
            .collect();
        let other: Vec<i64> = starts(&pf2_records, pf2, waiting);
        println!(
            "faults: prefetch scenario {k}: {pf_app} ran job {running} and held job {waiting} in its \
             prefetch lane; {n} connections terminated; the other runner started job {waiting} at \
             {:?} ms; {pf_app} started it at {:?} ms (after the cut)",
            other.iter().map(|&t| ms(t).round()).collect::<Vec<_>>(),
            zombie.iter().map(|&t| ms(t).round()).collect::<Vec<_>>()
        );
        if !zombie.is_empty() {
            self.seen.failures.push(format!(
                "LIBRARY BUG (prefetch lane): {pf_app} took job {waiting} into its prefetch lane, every \
                 pgfifo connection was terminated, another runner started the job {:?} ms later, and \
                 {pf_app} still started the job's handler {:?} ms after the cut, without its lock, \
                 when its slot freed up",
                other.iter().map(|&t| ms(t).round()).collect::<Vec<_>>(),
                zombie.iter().map(|&t| ms(t).round()).collect::<Vec<_>>()
            ));
        }
        self.recover(t0, &before, "terminate (prefetch lane)").await;
        self.fleet.stop(pf).await;
        self.fleet.stop(pf2).await;
    }

    /// The frozen worker: SIGSTOP mid-handler, group released by the server,
    /// the job's other run commits, SIGCONT, the frozen run does not commit,
    /// the worker carries on.
    async fn freeze(&mut self, k: usize) {
        let grp = FREEZE_GRP + k as u32;
        let group = format!("frz-{k}");
        let freezers = self.fleet.pids(Role::Freezer);
        assert_eq!(freezers.len(), 1, "one freezer runs");
        let freezer = freezers[0];
        let job = |seq: u32, freeze: bool| {
            (
                NewJob::new(
                    &FreezeJob {
                        grp,
                        seq,
                        freeze,
                        work_ms: 10,
                    },
                    EnqueueOptions::group(group.clone()),
                )
                .expect("a valid job"),
                Enqueued {
                    id: 0,
                    queue: "freeze",
                    grp,
                    seq,
                    mode: Mode::Normal,
                    max_attempts: FreezeJob::MAX_ATTEMPTS,
                },
            )
        };
        let first = self.jobs.len();
        self.enqueue((0..5).map(|seq| job(seq, seq == 0)).collect())
            .await;
        let frozen_job = self.jobs[first].id;
        let behind: Vec<i64> = self.jobs[first + 1..].iter().map(|j| j.id).collect();

        // Wait for the freeze point, then stop the process there.
        let prefix = format!("freeze-point job={frozen_job} ");
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            let found = self.fleet.get(freezer).and_then(|p| {
                p.stdout
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| l.starts_with(&prefix))
                    .cloned()
            });
            if let Some(line) = found {
                break line;
            }
            assert!(
                Instant::now() < deadline,
                "the freezer never reached the freeze point of job {frozen_job}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        signal(freezer, "STOP");
        let t_stop = now_ns();
        let field = |name: &str| -> i64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .expect("freeze-point fields")
        };
        let pre_ns = field("pre_ns=");
        let app = self.fleet.get(freezer).expect("alive").app.clone();
        // The frozen job's session: idle in its transaction since the
        // handler's last statement.
        let idle_sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}' \
             AND state = 'idle in transaction' AND query LIKE 'INSERT INTO fault_log%'"
        );
        let mid_handler = self.monitor.scalar(&idle_sql).await;
        if mid_handler != 1 {
            self.seen.failures.push(format!(
                "frozen worker {app}: {mid_handler} sessions idle in transaction at SIGSTOP (expected its job's)"
            ));
        }

        // Someone else to take the group over once the server frees it.
        let rescuer = self.fleet.spawn(Role::Rescuer, 1).await;
        let bound = FREEZE_TIMEOUT + FREEZER_GRACE;
        let deadline = Instant::now() + bound + Duration::from_secs(20);
        let t_gone = loop {
            if self.monitor.scalar(&idle_sql).await == 0 {
                break now_ns();
            }
            assert!(
                Instant::now() < deadline,
                "the frozen worker's transaction was still open {:.1?} after SIGSTOP (bound {bound:?})",
                Duration::from_nanos((now_ns() - t_stop) as u64)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let done_sql = |ids: &[i64]| {
            format!(
                "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND id IN ({})",
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
            )
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql(&[frozen_job])).await != 1 {
            assert!(
                Instant::now() < deadline,
                "job {frozen_job} did not succeed after its worker froze"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rerun_us = self
            .monitor
            .scalar(&format!(
                "SELECT (extract(epoch FROM started_at) * 1000000)::bigint FROM pgfifo.job_attempt \
                 WHERE job_id = {frozen_job} AND attempt = 2"
            ))
            .await;
        let rerun_ns = rerun_us * 1_000;
        let committed_by_rescuer = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE job_id = {frozen_job} AND pid = {rescuer}"
            ))
            .await;
        if committed_by_rescuer != 1 {
            self.seen.failures.push(format!(
                "job {frozen_job}: {committed_by_rescuer} committed runs by the rescuer (expected 1)"
            ));
        }
        while self.monitor.scalar(&done_sql(&behind)).await != behind.len() as i64 {
            assert!(
                Instant::now() < deadline,
                "the jobs behind the frozen one did not run"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.fleet.stop(rescuer).await;

        // Wake the frozen worker: its run must not commit, and it must carry on.
        signal(freezer, "CONT");
        let records = self.fleet.get(freezer).expect("alive").records.clone();
        let stderr = self.fleet.get(freezer).expect("alive").stderr.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&records).unwrap_or_default();
            let ended = runs::parse_all(&text).0.iter().any(
                |l| matches!(l, Line::End { run, .. } if run.job == frozen_job && run.attempt == 1),
            );
            let noticed = std::fs::read_to_string(&stderr)
                .unwrap_or_default()
                .contains("database connection failed");
            if ended && noticed {
                break;
            }
            if Instant::now() > deadline {
                self.seen.failures.push(format!(
                    "after SIGCONT the frozen worker did not finish its handler and notice its lost \
                     connection within 20 s (handler ended: {ended}, noticed: {noticed})"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let first = self.jobs.len();
        self.enqueue((5..10).map(|seq| job(seq, false)).collect())
            .await;
        let after: Vec<i64> = self.jobs[first..].iter().map(|j| j.id).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.monitor.scalar(&done_sql(&after)).await != after.len() as i64 {
            if Instant::now() > deadline {
                self.seen
                    .failures
                    .push("the unfrozen worker did not run new jobs within 30 s".to_owned());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let by_freezer = self
            .monitor
            .scalar(&format!(
                "SELECT count(*) FROM fault_log WHERE pid = {freezer} AND job_id IN ({})",
                after
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .await;
        if by_freezer != after.len() as i64 {
            self.seen.failures.push(format!(
                "the unfrozen worker committed {by_freezer} of the {} jobs enqueued after SIGCONT",
                after.len()
            ));
        }

        let report = FreezeReport {
            group,
            release: Duration::from_nanos((t_gone - t_stop).max(0) as u64),
            rerun_after_stop: Duration::from_nanos((rerun_ns - t_stop).max(0) as u64),
            rerun_after_last_statement: Duration::from_nanos((rerun_ns - pre_ns).max(0) as u64),
            bound,
        };
        println!(
            "faults: frozen worker {app}: group {} released {:.2?} after SIGSTOP, other run started \
             {:.2?} after SIGSTOP ({:.2?} after the frozen run's last statement); bound {:?} \
             (timeout {FREEZE_TIMEOUT:?} + idle_grace {FREEZER_GRACE:?})",
            report.group,
            report.release,
            report.rerun_after_stop,
            report.rerun_after_last_statement,
            report.bound
        );
        if report.release > bound + RELEASE_MARGIN {
            self.seen.failures.push(format!(
                "frozen group released after {:.2?}, more than {bound:?} + {RELEASE_MARGIN:?}",
                report.release
            ));
        }
        // The idle timer starts at the frozen run's last statement: the group
        // must not be released before the bound either.
        if rerun_ns < pre_ns + bound.as_nanos() as i64 - 50_000_000 {
            self.seen.failures.push(format!(
                "frozen group released early: the other run started {:.2?} after the frozen run's \
                 last statement (bound {bound:?})",
                report.rerun_after_last_statement
            ));
        }
        self.seen.freezes.push(report);
    }
}

#[derive(QueryableByName, Debug)]
struct JobRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Text)]
    last_error: String,
}

#[derive(QueryableByName, Debug, Clone)]
struct LogRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
    #[diesel(sql_type = Integer)]
    grp: i32,
    #[diesel(sql_type = Integer)]
    seq: i32,
    #[diesel(sql_type = Integer)]
    pid: i32,
    #[diesel(sql_type = BigInt)]
    start_ns: i64,
    #[diesel(sql_type = BigInt)]
    end_ns: i64,
}

#[derive(QueryableByName, Debug)]
struct AttemptCount {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName, Debug)]
struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
    #[diesel(sql_type = Text)]
    runner: String,
    #[diesel(sql_type = BigInt)]
    started_us: i64,
    #[diesel(sql_type = Text)]
    error: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts its own PostgreSQL for minutes: run by .ci/run (cargo test -p pgfifo-tests --test faults -- --ignored)"]
async fn faults_suite() {
    let began = Instant::now();
    let plan = Plan::from_env();
    println!(
        "faults: {} mode, seed {} (FAULTS_SEED={} replays it)",
        if plan.soak { "soak" } else { "CI" },
        plan.seed,
        plan.seed
    );
    let mut pg = PrivatePg::start().expect("start a private PostgreSQL");
    println!(
        "faults: private PostgreSQL on port {} in {}",
        pg.port(),
        pg.root().display()
    );
    let run_dir = pg.root().join("run");
    std::fs::create_dir_all(&run_dir).expect("create the run directory");
    {
        let mut admin = AsyncPgConnection::establish(&pg.url("postgres"))
            .await
            .expect("connect to the private server");
        admin
            .batch_execute("CREATE DATABASE faults")
            .await
            .expect("create the database");
    }
    let url = pg.url("faults");
    {
        let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
        pgfifo::migrate::migrate_conn(&mut conn)
            .await
            .expect("migrate");
        conn.batch_execute(FAULT_LOG)
            .await
            .expect("create fault_log");
    }

    let mut suite = Suite {
        rng: Rng::new(plan.seed),
        monitor: Monitor::new(&url),
        fleet: Fleet::new(run_dir.clone(), url.clone()),
        url: url.clone(),
        jobs: Vec::new(),
        next_seq: vec![0; plan.groups as usize],
        specials: plan.specials(),
        special_groups: HashSet::new(),
        waves: 0,
        seen: Observed::default(),
        plan: plan.clone(),
    };
    for _ in 0..plan.workers {
        suite.fleet.spawn(Role::Worker, plan.concurrency).await;
    }
    suite.fleet.spawn(Role::Freezer, 1).await;

    // The fault schedule: kills first (the poison job goes off meanwhile),
    // the rest spread at random.
    let mut steps: Vec<Step> = Vec::new();
    steps.extend(std::iter::repeat_n(Step::Kill, plan.kills));
    steps.extend(std::iter::repeat_n(Step::Terminate, plan.terminations));
    for i in 0..plan.restarts {
        let mode = if i % 2 == 1 {
            StopMode::Immediate
        } else {
            StopMode::Fast
        };
        steps.push(Step::Restart(mode));
    }
    steps.extend(std::iter::repeat_n(Step::Freeze, plan.freezes));
    steps.extend(std::iter::repeat_n(Step::PrefetchCut, plan.prefetch_cuts));
    suite.rng.shuffle(&mut steps[..]);
    let first_other = steps.iter().position(|s| *s != Step::Kill).unwrap_or(0);
    if first_other < 2 {
        let kill = steps.iter().rposition(|s| *s == Step::Kill).expect("kills");
        steps.swap(first_other, kill);
        if let Some(again) = steps.iter().position(|s| *s != Step::Kill) {
            if again < 2 {
                let kill = steps.iter().rposition(|s| *s == Step::Kill).expect("kills");
                steps.swap(again, kill);
            }
        }
    }

    let first_wave = suite.wave(plan.wave);
    suite.enqueue(first_wave).await;
    let chaos = Instant::now();
    let mut freezes = 0;
    let mut prefetch_cuts = 0;
    for (i, step) in steps.iter().enumerate() {
        let pause = suite.rng.range(plan.step_ms.0, plan.step_ms.1);
        suite.pause(Duration::from_millis(pause)).await;
        suite.top_up().await;
        match *step {
            Step::Kill => suite.kill_one().await,
            Step::Terminate => suite.terminate_all().await,
            Step::Restart(mode) => suite.restart(&mut pg, mode).await,
            Step::Freeze => {
                suite.freeze(freezes).await;
                freezes += 1;
            }
            Step::PrefetchCut => {
                suite.prefetch_cut(prefetch_cuts).await;
                prefetch_cuts += 1;
            }
        }
        if plan.soak && i % 25 == 24 {
            println!(
                "faults: {} of {} steps after {:.0?}, {} jobs enqueued",
                i + 1,
                steps.len(),
                began.elapsed(),
                suite.jobs.len()
            );
        }
    }
    let chaos = chaos.elapsed();

    // Drain: the remaining jobs, then everything to a final state.
    while suite.fault_jobs() < plan.min_jobs {
        let n = plan.wave.min(plan.min_jobs - suite.fault_jobs());
        let batch = suite.wave(n);
        suite.enqueue(batch).await;
    }
    let drain = Instant::now();
    let drained = loop {
        suite.fleet.supervise(plan.concurrency).await;
        let queued = suite
            .monitor
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued'")
            .await;
        if queued == 0 {
            break true;
        }
        if drain.elapsed() > plan.drain_limit {
            eprintln!(
                "faults: {queued} jobs still queued {:?} after the faults ended",
                plan.drain_limit
            );
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let drain = drain.elapsed();
    let survivors: Vec<u32> = suite.fleet.alive.iter().map(|p| p.pid).collect();
    for pid in survivors {
        suite.fleet.stop(pid).await;
    }

    // --- The checks -------------------------------------------------------
    let mut conn = AsyncPgConnection::establish(&url).await.expect("connect");
    let job_rows: Vec<JobRow> = diesel::sql_query(
        "SELECT id, state, attempts, coalesce(last_error, '') AS last_error FROM pgfifo.job",
    )
    .load(&mut conn)
    .await
    .expect("load jobs");
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, attempt, grp, seq, pid, start_ns, end_ns FROM fault_log")
            .load(&mut conn)
            .await
            .expect("load fault_log");
    let attempt_counts: Vec<AttemptCount> =
        diesel::sql_query("SELECT job_id, count(*) AS n FROM pgfifo.job_attempt GROUP BY job_id")
            .load(&mut conn)
            .await
            .expect("load attempts");
    let attempt_rows: Vec<AttemptRow> = diesel::sql_query(
        "SELECT job_id, attempt, runner, \
         (extract(epoch FROM started_at) * 1000000)::bigint AS started_us, \
         coalesce(error, '') AS error FROM pgfifo.job_attempt",
    )
    .load(&mut conn)
    .await
    .expect("load attempt rows");
    let hang_timeouts = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%timed out%'")
        .await;
    let panics = suite
        .monitor
        .scalar("SELECT count(*) FROM pgfifo.job_attempt WHERE error LIKE '%panicked%'")
        .await;
    drop(conn);

    let state: HashMap<i64, &JobRow> = job_rows.iter().map(|r| (r.id, r)).collect();
    let attempts_of: HashMap<i64, i64> = attempt_counts.iter().map(|a| (a.job_id, a.n)).collect();
    let mut logs_of: HashMap<i64, Vec<&LogRow>> = HashMap::new();
    for row in &log {
        logs_of.entry(row.job_id).or_default().push(row);
    }
    let mut lost = Vec::new();
    let mut duplicates = 0usize;
    let mut wrong_outcome = Vec::new();
    let mut failed_as_expected = 0usize;
    let enqueued_ids: HashSet<i64> = suite.jobs.iter().map(|j| j.id).collect();
    for job in &suite.jobs {
        let committed = logs_of.get(&job.id).map_or(0, Vec::len);
        duplicates += committed.saturating_sub(1);
        let Some(row) = state.get(&job.id) else {
            lost.push(format!("job {} is missing from pgfifo.job", job.id));
            continue;
        };
        if job.mode.succeeds() {
            match (row.state.as_str(), committed) {
                ("succeeded", 1..) => {
                    let run = logs_of[&job.id][0];
                    if run.attempt != row.attempts {
                        wrong_outcome.push(format!(
                            "job {}: committed run is attempt {}, the job says {}",
                            job.id, run.attempt, row.attempts
                        ));
                    }
                }
                ("queued", _) => lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                )),
                ("succeeded", 0) => lost.push(format!(
                    "job {} succeeded without its handler's committed write",
                    job.id
                )),
                (other, _) => wrong_outcome.push(format!(
                    "job {} ({:?}) ended {other}: {}",
                    job.id, job.mode, row.last_error
                )),
            }
        } else {
            let attempts = attempts_of.get(&job.id).copied().unwrap_or(0);
            if row.state == "queued" {
                lost.push(format!(
                    "job {} ({:?}, group {} seq {}) never finished",
                    job.id, job.mode, job.grp, job.seq
                ));
            } else if row.state != "failed" || committed > 0 {
                wrong_outcome.push(format!(
                    "job {} ({:?}) ended {} with {committed} committed runs",
                    job.id, job.mode, row.state
                ));
            } else if !reason_fits(job.mode, &row.last_error) {
                wrong_outcome.push(format!(
                    "job {} ({:?}) failed with an unexpected reason: {:?}",
                    job.id, job.mode, row.last_error
                ));
            } else if job.mode == Mode::Poison && attempts < i64::from(job.max_attempts) {
                wrong_outcome.push(format!(
                    "poison job {} failed after {attempts} recorded attempts of {}",
                    job.id, job.max_attempts
                ));
            } else {
                failed_as_expected += 1;
                println!(
                    "faults: job {} ({:?}) failed as it must after {attempts} attempts: {}",
                    job.id, job.mode, row.last_error
                );
            }
        }
    }
    let strangers = log
        .iter()
        .filter(|r| !enqueued_ids.contains(&r.job_id))
        .count();
    if strangers > 0 {
        wrong_outcome.push(format!("{strangers} fault_log rows of jobs never enqueued"));
    }

    // Committed runs: per group, in order and never overlapping.
    let mut committed_by_group: BTreeMap<i32, Vec<&LogRow>> = BTreeMap::new();
    for row in &log {
        committed_by_group.entry(row.grp).or_default().push(row);
    }
    let mut order_violations = Vec::new();
    let mut overlaps = Vec::new();
    for (grp, rows) in &mut committed_by_group {
        rows.sort_by_key(|r| (r.start_ns, r.job_id));
        for pair in rows.windows(2) {
            if pair[1].seq <= pair[0].seq {
                order_violations.push(format!(
                    "group {grp}: committed seq {} (job {}) started after seq {} (job {})",
                    pair[1].seq, pair[1].job_id, pair[0].seq, pair[0].job_id
                ));
            }
            if pair[1].start_ns <= pair[0].end_ns {
                overlaps.push(format!(
                    "group {grp}: committed job {} (pid {}) started before job {} (pid {}) ended",
                    pair[1].job_id, pair[1].pid, pair[0].job_id, pair[0].pid
                ));
            }
        }
    }
    // Every run, committed or not, from the workers' records.
    let mut lines = Vec::new();
    let mut torn = 0usize;
    for (_, path) in &suite.fleet.records {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let (mut l, bad) = runs::parse_all(&text);
        torn += bad.len();
        lines.append(&mut l);
    }
    let mut ctx = runs::Context {
        db_faults: suite.seen.db_faults.clone(),
        ..runs::Context::default()
    };
    for d in &suite.fleet.deaths {
        if matches!(d.cause, Cause::Killed | Cause::Poison) {
            ctx.deaths.insert(d.pid, d.ns);
        }
    }
    for job in &suite.jobs {
        let timeout = if job.queue == "freeze" {
            FREEZE_TIMEOUT
        } else {
            FAULT_TIMEOUT
        };
        ctx.timeout_ns.insert(job.id, timeout.as_nanos() as i64);
    }
    let intervals = runs::intervals(&lines, &ctx);
    // Evidence for an overlap: when each run's attempt was recorded (after
    // its pick, before its handler), its handler's span and how it ended, in
    // seconds since the run began, next to the database faults.
    let t_base = now_ns() - began.elapsed().as_nanos() as i64;
    let secs = |ns: i64| (ns - t_base) as f64 / 1e9;
    let attempt_info: HashMap<(i64, i32), &AttemptRow> = attempt_rows
        .iter()
        .map(|a| ((a.job_id, a.attempt), a))
        .collect();
    let end_text: HashMap<(u32, u64), String> = lines
        .iter()
        .filter_map(|l| match l {
            Line::End {
                pid, n, outcome, ..
            } => Some(((*pid, *n), outcome.clone())),
            _ => None,
        })
        .collect();
    let describe = |i: &runs::Interval| {
        let recorded = attempt_info.get(&(i.run.job, i.run.attempt as i32)).map_or(
            "no attempt row".to_owned(),
            |a| {
                format!(
                    "attempt recorded at {:.3}s by {}{}",
                    secs(a.started_us * 1_000),
                    a.runner,
                    if a.error.is_empty() {
                        String::new()
                    } else {
                        format!(" (attempt error: {})", a.error)
                    }
                )
            },
        );
        format!(
            "[job {} attempt {} pid {}: {recorded}; handler {:.3}s..{:.3}s ({:?}, {})]",
            i.run.job,
            i.run.attempt,
            i.pid,
            secs(i.start),
            secs(i.end),
            i.cut,
            end_text
                .get(&(i.pid, i.n))
                .map_or("no end line", String::as_str)
        )
    };
    let fault_times: Vec<String> = suite
        .seen
        .db_faults
        .iter()
        .map(|&t| format!("{:.3}s", secs(t)))
        .collect();
    for (a, b) in runs::overlaps(&intervals) {
        overlaps.push(format!(
            "group {}: {} started while {} ran (database faults at {})",
            b.grp,
            describe(&b),
            describe(&a),
            fault_times.join(", ")
        ));
    }
    for (a, b) in runs::order_violations(&intervals) {
        order_violations.push(format!(
            "group {}: seq {} (run {:?}) started after seq {} (run {:?})",
            b.grp, b.seq, b.run, a.seq, a.run
        ));
    }
    let mid_handler_kills = suite
        .seen
        .kills
        .iter()
        .filter(|(pid, _)| {
            intervals
                .iter()
                .any(|i| i.pid == *pid && i.cut == Cut::Died)
        })
        .count();
    let interrupted = intervals.iter().filter(|i| i.cut == Cut::Died).count();
    // How soon a cut-off job ran again: from its process's death (or the
    // database fault) to the start of its next attempt's handler. This bounds
    // how long the group stayed held (plus the time to pick and start).
    let mut next_start: HashMap<(i64, u32), i64> = HashMap::new();
    for i in &intervals {
        next_start.insert((i.run.job, i.run.attempt), i.start);
    }
    let rerun_delays = |cut: Cut| -> Vec<f64> {
        let mut v: Vec<f64> = intervals
            .iter()
            .filter(|i| i.cut == cut)
            .filter_map(|i| {
                (i.run.attempt + 1..i.run.attempt + 4)
                    .find_map(|a| next_start.get(&(i.run.job, a)))
                    .map(|&next| (next - i.end) as f64 / 1e6)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    // When the server ended each killed process's transactions (its log
    // has a line per session, with the application name): the group release.
    let server_log = pg.log_text();
    let mut kill_release: Vec<f64> = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| matches!(d.cause, Cause::Killed | Cause::Poison))
        .filter_map(|d| {
            server_log
                .lines()
                .filter(|l| {
                    l.contains(&format!(
                        "] {} LOG:  unexpected EOF on client connection",
                        d.app
                    ))
                })
                .filter_map(log_line_ns)
                .filter(|&t| t >= d.ns - 5_000_000 && t < d.ns + 10_000_000_000)
                .max()
                .map(|t| (t - d.ns) as f64 / 1e6)
        })
        .collect();
    kill_release.sort_by(f64::total_cmp);
    if !kill_release.is_empty() {
        println!(
            "faults: process killed or aborted -> the server ended its open transactions after: \
             median {:.0} ms, max {:.0} ms ({} processes, from the server log)",
            kill_release[kill_release.len() / 2],
            kill_release[kill_release.len() - 1],
            kill_release.len()
        );
    }
    for (cut, what) in [
        (Cut::Died, "process killed or aborted"),
        (Cut::DatabaseFault, "connections cut or database restarted"),
    ] {
        let v = rerun_delays(cut);
        if !v.is_empty() {
            println!(
                "faults: {what} -> the cut-off job's next run started after (includes waiting \
                 for a free lane under load): median {:.0} ms, p90 {:.0} ms, max {:.0} ms ({} runs)",
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() - 1],
                v.len()
            );
        }
    }
    let poison_aborts = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| d.cause == Cause::Poison)
        .count();
    let unexpected: Vec<String> = suite
        .fleet
        .unexpected()
        .iter()
        .map(|d| format!("{} ({:?}, pid {}): {:?}", d.app, d.role, d.pid, d.cause))
        .collect();
    let groups_used = suite
        .jobs
        .iter()
        .filter(|j| j.queue == "faults")
        .map(|j| j.grp)
        .collect::<HashSet<_>>()
        .len();
    let frozen_release = suite
        .seen
        .freezes
        .iter()
        .map(|f| f.release)
        .max()
        .unwrap_or_default();

    // --- Report -------------------------------------------------------------
    for r in &suite.seen.recoveries {
        println!("faults: {r}");
    }
    let show = |what: &str, items: &[String]| {
        for item in items.iter().take(20) {
            println!("faults: {what}: {item}");
        }
        if items.len() > 20 {
            println!("faults: {what}: … and {} more", items.len() - 20);
        }
    };
    show("LOST", &lost);
    show("WRONG OUTCOME", &wrong_outcome);
    show("ORDER VIOLATION", &order_violations);
    show("OVERLAP", &overlaps);
    show("UNEXPECTED EXIT", &unexpected);
    show("RECONNECT FAILURE", &suite.seen.reconnect_failures);
    show("FAILED CHECK", &suite.seen.failures);
    println!(
        "faults: {} processes started, {} handler runs recorded ({interrupted} cut off by a kill or \
         abort), {} pgfifo connections terminated, chaos {chaos:.1?}, drain {drain:.1?}",
        suite.fleet.records.len(),
        intervals.len(),
        suite.seen.terminated_backends
    );
    let summary = format!(
        "jobs={} groups={groups_used} kills={} mid_handler_kills={mid_handler_kills} restarts={} \
         terminations={} frozen={} frozen_release={:.2}s poison_aborts={poison_aborts} \
         hang_timeouts={hang_timeouts} panics={panics} failed_as_expected={failed_as_expected} \
         lost={} duplicates={duplicates} order_violations={} overlaps={} wrong_outcomes={} \
         unexpected_exits={} reconnect_failures={} failed_checks={} torn_records={torn} duration={:.0}s",
        suite.jobs.len(),
        suite.seen.kills.len(),
        suite.seen.restarts,
        suite.seen.terminations,
        suite.seen.freezes.len(),
        frozen_release.as_secs_f64(),
        lost.len(),
        order_violations.len(),
        overlaps.len(),
        wrong_outcome.len(),
        unexpected.len(),
        suite.seen.reconnect_failures.len(),
        suite.seen.failures.len(),
        began.elapsed().as_secs_f64(),
    );
    println!("{summary}");
    let _ = std::io::stdout().flush();

    let mut problems = Vec::new();
    let mut need = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    need(drained, "jobs still queued at the end".to_owned());
    need(lost.is_empty(), format!("lost={}", lost.len()));
    need(duplicates == 0, format!("duplicates={duplicates}"));
    need(
        order_violations.is_empty(),
        format!("order_violations={}", order_violations.len()),
    );
    need(overlaps.is_empty(), format!("overlaps={}", overlaps.len()));
    need(
        wrong_outcome.is_empty(),
        format!("wrong_outcomes={}", wrong_outcome.len()),
    );
    need(
        unexpected.is_empty(),
        format!("unexpected_exits={}", unexpected.len()),
    );
    need(
        suite.seen.reconnect_failures.is_empty(),
        format!("reconnect_failures={}", suite.seen.reconnect_failures.len()),
    );
    need(
        suite.seen.failures.is_empty(),
        format!("failed_checks={}", suite.seen.failures.len()),
    );
    need(torn == 0, format!("torn_records={torn}"));
    // The minimums.
    need(
        suite.jobs.len() >= plan.min_jobs,
        format!("only {} jobs", suite.jobs.len()),
    );
    need(groups_used >= 100, format!("only {groups_used} groups"));
    need(
        mid_handler_kills >= plan.kills.min(20),
        format!("only {mid_handler_kills} kills hit a running handler"),
    );
    need(
        suite.seen.terminations >= 1 && suite.seen.restarts >= 1,
        "no database fault".to_owned(),
    );
    need(
        suite.seen.freezes.len() >= plan.freezes,
        "no frozen worker".to_owned(),
    );
    need(
        poison_aborts >= plan.poison,
        format!("poison_aborts={poison_aborts}"),
    );
    need(
        hang_timeouts >= (plan.hang_once as i64).max(1)
            && panics >= (plan.panic_once as i64).max(1),
        format!(
            "hang_timeouts={hang_timeouts} panics={panics}: too few handlers timed out or panicked"
        ),
    );
    need(
        failed_as_expected == plan.poison + plan.hang_always + plan.panic_always,
        format!("failed_as_expected={failed_as_expected}"),
    );
    if !problems.is_empty() {
        pg.keep_files();
        panic!(
            "fault-injection suite failed: {}; worker logs and records in {}",
            problems.join(", "),
            run_dir.display()
        );
    }
}

// --- Smaller checks (not ignored; the shared server, a database of their own) ---

/// A log sink for one test: everything pgfifo logs on this thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(name = "faults.pool", queue = "faults-pool", timeout = "10s")]
struct PoolJob {
    n: u32,
}

#[async_trait]
impl Handler for PoolJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        diesel::sql_query("INSERT INTO pool_log (job_id, n) VALUES ($1, $2)")
            .bind::<BigInt, _>(ctx.id())
            .bind::<Integer, _>(self.n as i32)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

/// A pool smaller than the runner needs: workers wait for connections (and
/// say so in the log), nothing panics, every job runs exactly once.
#[tokio::test]
async fn exhausted_pool_makes_jobs_wait_with_a_warning() {
    let logs = Captured::default();
    let sink = logs.clone();
    let _guard = tracing_subscriber::fmt()
        .with_env_filter("pgfifo=warn")
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish()
        .set_default();
    let db = TestDb::new().await;
    db.exec("CREATE TABLE pool_log (job_id bigint NOT NULL, n integer NOT NULL)")
        .await;
    const JOBS: u32 = 300;
    {
        let mut conn = db.direct().await;
        let jobs: Vec<NewJob> = (0..JOBS)
            .map(|n| {
                let options = if n % 10 == 0 {
                    EnqueueOptions::ungrouped()
                } else {
                    EnqueueOptions::group(format!("p{}", n % 12))
                };
                NewJob::new(&PoolJob { n }, options).unwrap()
            })
            .collect();
        pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    }
    // Three connections for a runner that wants concurrency + 2 = 8, and a
    // short checkout timeout so that waits also time out.
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&db.url);
    let pool = bb8::Pool::builder()
        .max_size(3)
        .connection_timeout(Duration::from_secs(2))
        .build(manager)
        .await
        .unwrap();
    let runner = pgfifo::runner::start(
        pool.clone(),
        pgfifo_tests::test_config()
            .queues(["faults-pool"])
            .concurrency(6),
    )
    .await
    .unwrap();
    // The application holds a connection for a while too.
    let held = pool.get_owned().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(held);
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        i64::from(JOBS),
        Duration::from_secs(120),
    )
    .await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pool_log").await,
        i64::from(JOBS)
    );
    assert_eq!(
        db.scalar("SELECT count(DISTINCT job_id) FROM pool_log")
            .await,
        i64::from(JOBS)
    );
    let text = logs.text();
    let warned = text
        .lines()
        .filter(|l| l.contains("pool is exhausted") || l.contains("no pooled connection"))
        .count();
    println!(
        "pool exhausted: {warned} warnings, e.g. {:?}",
        text.lines().find(|l| l.contains("pool"))
    );
    assert!(
        warned > 0,
        "no warning about the exhausted pool; log:\n{text}"
    );
    assert!(!text.contains("panicked"), "log:\n{text}");
}

/// An error with its causes, `: `-separated (what `{:#}` of anyhow prints).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        cause = c.source();
    }
    text
}

/// Nothing listens on the port: `pgfifo::connect` fails at once, saying it
/// could not connect. (It cannot say why: diesel-async turns tokio-postgres's
/// connect error into its bare `Display`, "error connecting to server", and
/// drops the OS error, such as "connection refused", that was its cause.)
#[tokio::test]
async fn unreachable_database_at_start_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("postgres://postgres@127.0.0.1:{port}/app");
    let began = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(30), pgfifo::connect(&url, 4))
        .await
        .expect("pgfifo::connect hung on a closed port")
        .expect_err("connected to a closed port");
    let message = chain(&err);
    println!(
        "closed port: {err} | with its causes: {message} (after {:.2?})",
        began.elapsed()
    );
    assert!(began.elapsed() < Duration::from_secs(10));
    // The OS's reason ("connection refused") does not survive diesel-async's
    // error conversion, so "could not connect" is all there is to check.
    assert!(message.contains("could not connect"), "{message}");

    // A reachable server without that database.
    let url = pgfifo_tests::url_for(&pgfifo_tests::server_url(), "pgfifo_faults_no_such_db");
    let err = pgfifo::connect(&url, 4)
        .await
        .expect_err("connected to a database that does not exist");
    let message = chain(&err);
    println!("missing database: {err} | with its causes: {message}");
    assert!(message.contains("does not exist"), "{message}");
}

/// The server accepts TCP connections but never answers (a frozen or
/// overloaded PostgreSQL, a half-open network path): `pgfifo::connect` must
/// not hang without a word. The bound is bb8's default checkout timeout
/// (30 s), which pgfifo's pooled paths already honour, plus a margin.
#[tokio::test]
async fn unresponsive_database_at_start_is_not_a_silent_hang() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let keep = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/app");
    let began = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(35), pgfifo::connect(&url, 4)).await;
    println!(
        "unresponsive server: {:?} after {:.1?}",
        outcome
            .as_ref()
            .map(|r| r.as_ref().map(|_| "connected").map_err(|e| e.to_string())),
        began.elapsed()
    );
    let result = outcome.unwrap_or_else(|_| {
        panic!(
            "LIBRARY BUG: pgfifo::connect hung for 35 s without an error or a log line against a \
             server that accepts TCP connections but never answers ({} connection(s) accepted). \
             tokio-postgres applies `connect_timeout` to the TCP connect only, and \
             pgfifo::connect puts no bound on the startup exchange",
            accepted.lock().unwrap().len()
        )
    });
    assert!(result.is_err(), "connected to a server that never answers");
}

#[test]
fn server_log_times_parse() {
    // 2026-11-21 16:38:12.928 UTC = 1795279092.928 s since the epoch.
    assert_eq!(
        log_line_ns("2026-11-21 16:38:12.928 UTC [22314] pgfifo-fw-w18 FATAL:  x"),
        Some(1_795_279_092_928_000_000)
    );
    assert_eq!(log_line_ns("2026-11-21 16:38:12.928 CET [1] x"), None);
}

//! `fifo-worker`: one runner process of the multi-process integration test
//! (`tests/it/multiprocess.rs`).
//!
//! Environment:
//! * `DATABASE_URL`: the (migrated) database to work on;
//! * `RECORDS_FILE`: the file each handler run is appended to, one line per
//!   run, committed or not (see `pgfifo_tests::records::Run`);
//! * `CONCURRENCY`: jobs run at once (default 8);
//! * `EXIT_WITH_STDIN=1`: exit as soon as stdin closes, so that a worker never
//!   outlives a test process that died without cleaning up.
//!
//! It serves queue `mp` only, prints `ready pid=<pid>` once the runner runs,
//! drains and exits 0 on SIGTERM or SIGINT after printing
//! `done pid=<pid> runs=<n>`.

use std::fs::File;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, RunnerConfig};
use pgfifo_tests::records::{now_ns, Run};
use serde::{Deserialize, Serialize};

/// The multi-process test's job. The test binary declares the same type
/// (same name, queue and fields) to enqueue it.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(name = "mp.job", queue = "mp")]
struct MpJob {
    group: u32,
    seq: u32,
    work_us: u64,
}

/// The records file, appended with one `write` per run.
static RECORDS: OnceLock<Mutex<File>> = OnceLock::new();
/// Runs recorded by this process.
static RUNS: AtomicU64 = AtomicU64::new(0);

#[async_trait]
impl Handler for MpJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start_ns = now_ns();
        if self.work_us > 0 {
            // A timer, not a spin: the two cores are PostgreSQL's too. It
            // sleeps at least `work_us` (rounded up to the timer's 1 ms tick).
            tokio::time::sleep(Duration::from_micros(self.work_us)).await;
        }
        let pid = std::process::id();
        // Through the job's transaction: the row exists iff the run committed.
        diesel::sql_query(
            "INSERT INTO mp_log (job_id, grp, seq, pid, started_ns, ended_ns) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind::<BigInt, _>(ctx.id())
        .bind::<Integer, _>(i32::try_from(self.group)?)
        .bind::<Integer, _>(i32::try_from(self.seq)?)
        .bind::<Integer, _>(i32::try_from(pid)?)
        .bind::<BigInt, _>(start_ns)
        .bind::<BigInt, _>(now_ns())
        .execute(ctx.conn())
        .await?;
        // The end is taken after the insert: the recorded interval covers all
        // the handler did. The line is written before returning, so it exists
        // for every run whether or not its transaction then commits.
        let run = Run {
            grp: self.group,
            seq: self.seq,
            start_ns,
            end_ns: now_ns(),
            pid,
            job_id: ctx.id(),
        };
        let records = RECORDS.get().expect("records file opened in main");
        records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .write_all(run.to_line().as_bytes())?;
        RUNS.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fifo-worker {}: {message}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFIFO_TEST_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let var = |name: &str| std::env::var(name).map_err(|e| format!("{name}: {e}"));
    let url = var("DATABASE_URL")?;
    let path = var("RECORDS_FILE")?;
    let concurrency: usize = match std::env::var("CONCURRENCY") {
        Ok(n) => n.parse().map_err(|e| format!("CONCURRENCY={n:?}: {e}"))?,
        Err(_) => 8,
    };
    if std::env::var("EXIT_WITH_STDIN").is_ok_and(|v| v == "1") {
        std::thread::spawn(exit_when_stdin_closes);
    }
    let file = File::options()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("open {path}: {e}"))?;
    RECORDS.set(Mutex::new(file)).expect("set once");

    // One connection per running job, plus the runner's LISTEN and
    // bookkeeping connections, plus one spare.
    let pool_size = u32::try_from(concurrency + 3).map_err(|e| e.to_string())?;
    let pool = pgfifo::connect(&url, pool_size)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let config = RunnerConfig::default()
        .queues(["mp"])
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(100));
    let runner = pgfifo::runner::start(pool, config)
        .await
        .map_err(|e| format!("start: {e}"))?;
    say(&format!("ready pid={}", std::process::id()));

    runner
        .shutdown_on_signal()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;

    let file = RECORDS
        .get()
        .expect("set above")
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    file.sync_all().map_err(|e| format!("sync {path}: {e}"))?;
    say(&format!(
        "done pid={} runs={}",
        std::process::id(),
        AtomicU64::load(&RUNS, Ordering::Relaxed)
    ));
    Ok(())
}

/// Prints a line on stdout and flushes it (stdout is a pipe: block-buffered).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Blocks on stdin; when the parent closes it (or dies), exits at once. The
/// running jobs' transactions then roll back on the server.
fn exit_when_stdin_closes() {
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) | Err(_) => {
                eprintln!("fifo-worker {}: stdin closed: exiting", std::process::id());
                std::process::exit(3);
            }
            Ok(_) => {}
        }
    }
}

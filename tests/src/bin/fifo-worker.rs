//! `fifo-worker`: one runner process of the multi-process integration test
//! (`tests/it/multiprocess.rs`).
//!
//! Environment:
//! * `DATABASE_URL`: the (migrated) database to work on;
//! * `RECORDS_FILE`: the file each handler run is appended to, one line per
//!   run, committed or not (see `pgfifo_tests::records::Run`);
//! * `CONCURRENCY`: jobs run at once (default 8);
//! * `TRANSACTION_POOLER=1`: `DATABASE_URL` leads to a transaction-mode
//!   pooler (`ConnectOptions::transaction_pooler`);
//! * `DIRECT_URL`: `RunnerConfig::direct_url`, when set;
//! * `EXIT_WITH_STDIN=1`: exit as soon as stdin closes, so that a worker never
//!   outlives a test process that died without cleaning up;
//! * `WIDE_QUEUE`: also serve this queue, its groups at concurrency 2 (the
//!   failover test enqueues `mp.job` there with `EnqueueOptions::queue`);
//! * `QUEUE_CONCURRENCY`, `QUEUE_RATE` (`COUNT/PERIOD`, e.g. `20/s`),
//!   `QUEUE_BURST`: limits of queue `mp` as a whole, set at the runner's
//!   start (`RunnerConfig::queue_limits`);
//! * `ACKS_FILE`: the file the id of every success the runner reports (its
//!   commit acknowledged by the server) is appended to, one a line.
//!
//! It serves queue `mp` (and `WIDE_QUEUE`) only, prints `ready pid=<pid>` once the runner runs,
//! drains and exits 0 on SIGTERM or SIGINT after printing
//! `done pid=<pid> runs=<n>`.

use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::records::{now_ns, Run};
use pgfifo_tests::worker;
use serde::{Deserialize, Serialize};

/// The multi-process test's job. The test binary declares the same type
/// (same name, queue and fields) to enqueue it.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "mp.job", queue = "mp")]
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
    worker::exit_code("fifo-worker", run().await)
}

/// The limits of queue `mp` from `QUEUE_CONCURRENCY`, `QUEUE_RATE` and
/// `QUEUE_BURST`, if any is set.
fn queue_limits() -> Result<Option<pgfifo::QueueLimits>, String> {
    let mut limits = pgfifo::QueueLimits::new();
    let mut any = false;
    if let Ok(n) = std::env::var("QUEUE_CONCURRENCY") {
        limits = limits.concurrency(n.parse().map_err(|e| format!("QUEUE_CONCURRENCY: {e}"))?);
        any = true;
    }
    if let Ok(rate) = std::env::var("QUEUE_RATE") {
        limits = limits.rate(rate.parse().map_err(|e| format!("QUEUE_RATE: {e}"))?);
        any = true;
    }
    if let Ok(burst) = std::env::var("QUEUE_BURST") {
        limits = limits.burst(burst.parse().map_err(|e| format!("QUEUE_BURST: {e}"))?);
        any = true;
    }
    Ok(any.then_some(limits))
}

async fn run() -> Result<(), String> {
    worker::init_logging(true);
    let url = worker::var("DATABASE_URL")?;
    let path = worker::var("RECORDS_FILE")?;
    let concurrency: usize = worker::number("CONCURRENCY", 8)?;
    worker::exit_with_stdin_if_asked("fifo-worker");
    RECORDS
        .set(Mutex::new(worker::open_records(&path)?))
        .expect("set once");

    // As the runner asks: one connection per lane (concurrency + the
    // default prefetch of concurrency / 2) and four of its own.
    let pool_size =
        u32::try_from(concurrency + (concurrency / 2).max(1) + 4).map_err(|e| e.to_string())?;
    let options = pgfifo::ConnectOptions::new(pool_size)
        .transaction_pooler(std::env::var("TRANSACTION_POOLER").as_deref() == Ok("1"));
    let pool = pgfifo::connect_with(&url, options)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let wide = std::env::var("WIDE_QUEUE").ok();
    let mut config = worker::base_config(
        ["mp".to_owned()].into_iter().chain(wide.clone()),
        concurrency,
    );
    if let Some(wide) = wide {
        config = config.group_limits(wide, pgfifo::GroupLimits::new().concurrency(2));
    }
    if let Some(limits) = queue_limits()? {
        config = config.queue_limits("mp", limits);
    }
    if let Ok(direct) = std::env::var("DIRECT_URL") {
        config = config.direct_url(direct);
    }
    match std::env::var("ACKS_FILE") {
        Ok(acks) => run_with_acks(pool, config, &acks).await?,
        Err(_) => worker::run_until_signal(pool, config).await?,
    }

    let file = RECORDS
        .get()
        .expect("set above")
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    file.sync_all().map_err(|e| format!("sync {path}: {e}"))?;
    worker::say(&format!(
        "done pid={} runs={}",
        std::process::id(),
        AtomicU64::load(&RUNS, Ordering::Relaxed)
    ));
    Ok(())
}

/// `worker::run_until_signal`, appending the id of every success the runner
/// reports to `path` (written by a task fed by the runner's events).
async fn run_with_acks(
    pool: pgfifo::Pool,
    config: pgfifo::RunnerConfig,
    path: &str,
) -> Result<(), String> {
    let mut file = worker::open_records(path)?;
    let runner = pgfifo::runner::start(pool, config)
        .await
        .map_err(|e| format!("start: {e}"))?;
    let mut events = runner.subscribe();
    let writer = tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match events.recv().await {
                Ok(event) if event.outcome == pgfifo::runner::JobOutcome::Succeeded => {
                    file.write_all(format!("{}\n", event.id).as_bytes())
                        .map_err(|e| format!("write acks: {e}"))?;
                }
                Ok(_) => {}
                Err(RecvError::Lagged(n)) => return Err(format!("missed {n} job events")),
                Err(RecvError::Closed) => return file.sync_all().map_err(|e| e.to_string()),
            }
        }
    });
    worker::say(&format!("ready pid={}", std::process::id()));
    runner
        .shutdown_on_signal()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    // Each line went out in its own `write`: the test reads them all even
    // if the events never close.
    match tokio::time::timeout(Duration::from_secs(2), writer).await {
        Ok(written) => written.map_err(|e| e.to_string())?,
        Err(_) => Ok(()),
    }
}

//! `fault-worker`: one runner process of the fault-injection suite
//! (`tests/faults/`), which kills, freezes and disconnects it.
//!
//! Environment:
//! * `DATABASE_URL`: the (migrated) database, with a `fault_log` table;
//! * `APP_NAME`: the `application_name` of every connection of this process
//!   (the suite finds and terminates its connections by it);
//! * `RECORDS_FILE`: where each handler run is recorded (see
//!   `pgfifo_tests::faults::runs`);
//! * `QUEUES`: comma-separated queues to serve (default `faults`);
//! * `CONCURRENCY`: jobs at once (default 4);
//! * `IDLE_GRACE_MS`: `RunnerConfig::idle_grace` (default 2000);
//! * `LONG_LEASE_MS`: `RunnerConfig::long_lease` (default 30000);
//! * `MAX_BATCH`: `RunnerConfig::max_batch` (default the library's; 1 turns
//!   followers off);
//! * `POOL_SIZE`: the pool's size (default `2 * CONCURRENCY + 3`);
//! * `FREEZE_HOLD_MS`: how long a freeze job waits at its freeze point
//!   (default 2000);
//! * `EXIT_WITH_STDIN=1`: exit when stdin closes (the suite died).
//!
//! Stdout carries `ready pid=<pid>` once the runner runs,
//! `freeze-point job=<id> pid=<pid> pre_ns=<ns> done_ns=<ns>` when a freeze
//! job has written its log row and waits to be frozen, and `done pid=<pid>`
//! after a graceful stop (SIGTERM/SIGINT).
//!
//! Every handler writes one `fault_log` row through the job's own
//! transaction (a hot job, through its result and a trigger), so the table
//! holds exactly the runs that committed.

use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::faults::runs::{Line, Mode, RunKey};
use pgfifo_tests::records::now_ns;
use pgfifo_tests::worker;
use serde::{Deserialize, Serialize};

/// The suite's main job. `tests/faults/` declares the same type (same name,
/// queue and fields) to enqueue it.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.job",
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

/// The same job in long mode (`#[job(long)]`): it holds its group without
/// an open transaction, and its log row commits on its own (see
/// `log_run`).
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.long",
    queue = "faults",
    long,
    max_attempts = 25,
    timeout = "4s",
    backoff = "100ms"
)]
struct LongFaultJob {
    grp: u32,
    seq: u32,
    mode: Mode,
    work_ms: u32,
}

/// The frozen-worker scenario's job: with `freeze`, attempt 1 writes its log
/// row, announces its freeze point on stdout and waits, so that the suite can
/// SIGSTOP the process mid-handler.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.freeze",
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

/// The frozen-worker scenario's job in long mode: the same freeze point,
/// with the group held by a long run (no transaction) instead.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.freeze_long",
    queue = "freeze_long",
    long,
    max_attempts = 10,
    timeout = "1s",
    backoff = "100ms"
)]
struct LongFreezeJob {
    grp: u32,
    seq: u32,
    freeze: bool,
    work_ms: u32,
}

/// The hot groups' job (queue `hot`): a quick handler that never takes the
/// job's connection, so that a group with a backlog of them runs a batch of
/// its jobs per transaction (followers, see `pgfifo.pick`). Its run goes in
/// the job's result (`HotRun`), which `pgfifo.complete` writes with the
/// success; a trigger copies it to `fault_log` (`tests/faults/hot.rs`). In
/// `PanicOnce` mode it panics on attempt 1 only: it cannot read its earlier
/// attempts without taking the connection.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.hot",
    queue = "hot",
    max_attempts = 25,
    timeout = "1s",
    backoff = "100ms"
)]
struct HotJob {
    grp: u32,
    seq: u32,
    mode: Mode,
    work_us: u32,
}

/// A hot job's run, stored as its result.
#[derive(Serialize)]
struct HotRun {
    attempt: u32,
    pid: u32,
    start_ns: i64,
    end_ns: i64,
}

static RECORDS: OnceLock<Mutex<File>> = OnceLock::new();
static FREEZE_HOLD: OnceLock<Duration> = OnceLock::new();

fn record(line: &Line) {
    let records = RECORDS.get().expect("records file opened in main");
    let mut file = records.lock().unwrap_or_else(|p| p.into_inner());
    // One write per line: the file is O_APPEND, a kill cannot tear a line.
    if let Err(e) = file.write_all(line.to_line().as_bytes()) {
        eprintln!("fault-worker: cannot write a record: {e}");
        std::process::exit(5);
    }
}

/// Writes the run's `fault_log` row through the job's transaction, with
/// the transaction's start (`now()`): the moment the runner picked the job
/// (it sends BEGIN with the pick). A job in long mode has no transaction:
/// its row goes to `fault_long_stage` at once, and a trigger copies it to
/// `fault_log` in the transaction that writes the job's success, so that
/// `fault_log` still holds exactly the runs that committed (and would show
/// a second completion as a second row). Its `now()` is the statement's,
/// after the pick.
async fn log_run(
    ctx: &mut JobContext<'_>,
    grp: u32,
    seq: u32,
    start_ns: i64,
    end_ns: i64,
    long: bool,
) -> Result<(), diesel::result::Error> {
    let (id, attempt, queue) = (ctx.id(), ctx.attempt(), ctx.queue().to_owned());
    let sql = if long {
        "INSERT INTO fault_long_stage (job_id, attempt, queue, grp, seq, pid, start_ns, end_ns, picked_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, (extract(epoch FROM now()) * 1e9)::bigint)"
    } else {
        "INSERT INTO fault_log (job_id, attempt, queue, grp, seq, pid, start_ns, end_ns, picked_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, (extract(epoch FROM now()) * 1e9)::bigint)"
    };
    diesel::sql_query(sql)
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt as i32)
        .bind::<Text, _>(&queue)
        .bind::<Integer, _>(grp as i32)
        .bind::<Integer, _>(seq as i32)
        .bind::<Integer, _>(std::process::id() as i32)
        .bind::<BigInt, _>(start_ns)
        .bind::<BigInt, _>(end_ns)
        .execute(ctx.conn())
        .await
        .map(drop)
}

/// Runs of this process so far: each run's number joins its record lines.
static RUN_NO: AtomicU64 = AtomicU64::new(0);

/// A run in progress: its job and attempt, and its number in this process.
#[derive(Clone, Copy)]
struct Run {
    key: RunKey,
    n: u64,
}

fn started(ctx: &JobContext<'_>, grp: u32, seq: u32) -> (Run, i64) {
    let run = Run {
        key: RunKey {
            job: ctx.id(),
            attempt: ctx.attempt(),
        },
        n: RUN_NO.fetch_add(1, Ordering::Relaxed),
    };
    let ns = now_ns();
    record(&Line::Start {
        run: run.key,
        n: run.n,
        grp,
        seq,
        pid: std::process::id(),
        ns,
    });
    (run, ns)
}

fn ended(run: Run, outcome: &str) {
    record(&Line::End {
        run: run.key,
        pid: std::process::id(),
        n: run.n,
        ns: now_ns(),
        outcome: outcome.to_owned(),
    });
}

/// `dberr:` and the error on one line (the write through the job's
/// transaction failed: the transaction or its connection is gone).
fn db_error(e: &diesel::result::Error) -> String {
    let text: String = e
        .to_string()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    format!("dberr:{text}")
}

/// Whether an earlier attempt of this job failed with an error containing
/// `what`, as `pgfifo.job_attempt` records it.
async fn earlier_failure(
    ctx: &mut JobContext<'_>,
    what: &str,
) -> Result<bool, diesel::result::Error> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let id = ctx.id();
    let row = diesel::sql_query(
        "SELECT count(*) AS n FROM pgfifo.job_attempt \
         WHERE job_id = $1 AND strpos(coalesce(error, ''), $2) > 0",
    )
    .bind::<BigInt, _>(id)
    .bind::<Text, _>(what)
    .get_result::<Count>(ctx.conn())
    .await?;
    Ok(row.n > 0)
}

/// Sleeps far past any job timeout: the runner cancels the handler.
async fn hang() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

#[async_trait]
impl Handler for FaultJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        fault_run(ctx, self.grp, self.seq, self.mode, self.work_ms, false).await
    }
}

#[async_trait]
impl Handler for LongFaultJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        fault_run(ctx, self.grp, self.seq, self.mode, self.work_ms, true).await
    }
}

/// A run of `faults.job` (or, with `long`, `faults.long`): does what its
/// mode says.
async fn fault_run(
    ctx: &mut JobContext<'_>,
    grp: u32,
    seq: u32,
    mode: Mode,
    work_ms: u32,
    long: bool,
) -> Result<(), JobError> {
    let (run, start_ns) = started(ctx, grp, seq);
    let hangs = match mode {
        Mode::Poison => {
            record(&Line::Abort {
                run: run.key,
                pid: std::process::id(),
                n: run.n,
                ns: now_ns(),
            });
            std::process::abort();
        }
        Mode::HangAlways => Ok(true),
        Mode::HangOnce => earlier_failure(ctx, "timed out").await.map(|seen| !seen),
        _ => Ok(false),
    };
    if hangs.as_ref().is_ok_and(|h| *h) {
        hang().await;
    }
    let written = match hangs {
        Err(e) => Err(e),
        Ok(_) => {
            if work_ms > 0 {
                tokio::time::sleep(Duration::from_millis(u64::from(work_ms))).await;
            }
            match log_run(ctx, grp, seq, start_ns, now_ns(), long).await {
                Err(e) => Err(e),
                Ok(()) => match mode {
                    Mode::PanicAlways => Ok(true),
                    Mode::PanicOnce => earlier_failure(ctx, "panicked").await.map(|seen| !seen),
                    _ => Ok(false),
                },
            }
        }
    };
    let panics = match written {
        Err(e) => {
            ended(run, &db_error(&e));
            return Err(e.into());
        }
        Ok(panics) => panics,
    };
    ended(run, if panics { "panic" } else { "ok" });
    if panics {
        panic!(
            "fault-worker: planned panic in job {} attempt {}",
            run.key.job, run.key.attempt
        );
    }
    Ok(())
}

#[async_trait]
impl Handler for HotJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (run, start_ns) = started(ctx, self.grp, self.seq);
        if self.work_us > 0 {
            tokio::time::sleep(Duration::from_micros(u64::from(self.work_us))).await;
        }
        let panics = self.mode == Mode::PanicOnce && ctx.attempt() == 1;
        if !panics {
            ctx.set_result(&HotRun {
                attempt: ctx.attempt(),
                pid: std::process::id(),
                start_ns,
                end_ns: now_ns(),
            })?;
        }
        ended(run, if panics { "panic" } else { "ok" });
        if panics {
            panic!("fault-worker: planned panic in hot job {}", run.key.job);
        }
        Ok(())
    }
}

#[async_trait]
impl Handler for FreezeJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        freeze_run(ctx, self.grp, self.seq, self.freeze, self.work_ms, false).await
    }
}

#[async_trait]
impl Handler for LongFreezeJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        freeze_run(ctx, self.grp, self.seq, self.freeze, self.work_ms, true).await
    }
}

/// A run of a freeze job: with `freeze`, attempt 1 stops at its freeze
/// point (see `FreezeJob`).
async fn freeze_run(
    ctx: &mut JobContext<'_>,
    grp: u32,
    seq: u32,
    freeze: bool,
    work_ms: u32,
    long: bool,
) -> Result<(), JobError> {
    let (run, start_ns) = started(ctx, grp, seq);
    if freeze && ctx.attempt() == 1 {
        let pre_ns = now_ns();
        let logged = log_run(ctx, grp, seq, start_ns, pre_ns, long).await;
        let done_ns = now_ns();
        if let Err(e) = logged {
            ended(run, &db_error(&e));
            return Err(e.into());
        }
        // Nothing runs on the job's connection from here on: its
        // transaction is idle, as a frozen process would leave it.
        worker::say(&format!(
            "freeze-point job={} pid={} pre_ns={pre_ns} done_ns={done_ns}",
            run.key.job,
            std::process::id()
        ));
        let hold = *FREEZE_HOLD.get().expect("set in main");
        // A monotonic-clock wait: after SIGCONT it ends at once if its
        // time passed while the process was stopped.
        tokio::time::sleep(hold).await;
        ended(run, "ok");
        return Ok(());
    }
    if work_ms > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(work_ms))).await;
    }
    let logged = log_run(ctx, grp, seq, start_ns, now_ns(), long).await;
    ended(
        run,
        &logged.as_ref().map_or_else(db_error, |()| "ok".to_owned()),
    );
    logged?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    worker::exit_code("fault-worker", run().await)
}

async fn run() -> Result<(), String> {
    worker::init_logging(false);
    let url = worker::var("DATABASE_URL")?;
    let app = worker::var("APP_NAME")?;
    let path = worker::var("RECORDS_FILE")?;
    let queues: Vec<String> = std::env::var("QUEUES")
        .unwrap_or_else(|_| "faults".to_owned())
        .split(',')
        .map(str::to_owned)
        .collect();
    let concurrency: usize = worker::number("CONCURRENCY", 4)?;
    let idle_grace = Duration::from_millis(worker::number("IDLE_GRACE_MS", 2000)?);
    let long_lease = Duration::from_millis(worker::number("LONG_LEASE_MS", 30_000)?);
    let max_batch: usize = worker::number("MAX_BATCH", pgfifo::RunnerConfig::default().max_batch)?;
    FREEZE_HOLD
        .set(Duration::from_millis(worker::number(
            "FREEZE_HOLD_MS",
            2000,
        )?))
        .expect("set once");
    worker::exit_with_stdin_if_asked("fault-worker");
    RECORDS
        .set(Mutex::new(worker::open_records(&path)?))
        .expect("set once");

    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}application_name={app}");
    // Room for every lane of the runner (`concurrency` plus up to as many
    // prefetch lanes), its LISTEN and bookkeeping connections, and a spare:
    // the suite tests faults, not a starved pool (tests/faults/ has a test
    // of its own for that).
    let default_pool_size = u32::try_from(2 * concurrency + 3).map_err(|e| e.to_string())?;
    let pool_size: u32 = worker::number("POOL_SIZE", default_pool_size)?;
    let pool = worker::connect(&url, pool_size).await?;
    let config = worker::base_config(queues, concurrency)
        .idle_grace(idle_grace)
        .long_lease(long_lease)
        .max_batch(max_batch)
        .max_backoff(Duration::from_secs(1))
        .shutdown_timeout(Duration::from_secs(10))
        .name(format!("{app}:{}", std::process::id()));
    worker::run_until_signal(pool, config).await?;
    worker::say(&format!("done pid={}", std::process::id()));
    Ok(())
}

//! `cron-worker`: one runner process of the recurring-jobs tests
//! (`tests/it/schedules_multi.rs`), declaring one schedule.
//!
//! Environment:
//! * `DATABASE_URL`: the (migrated) database;
//! * `WORKER_NAME`: the runner's name (recorded as `fired_by`);
//! * `SCHEDULE_NAME`, `SCHEDULE_EXPR` (default every second) and
//!   `SCHEDULE_MISSED`: `skip`, `once` (default) or `each:N`;
//! * `BLOCK_FIRST_FIRE=1`: the first time the schedule's job closure runs
//!   (inside the firing transaction, with the schedule's row locked) it
//!   prints `firing tick=<ms> pid=<pid>` and blocks for good, so that the
//!   test can kill the process mid-firing;
//! * `EXIT_WITH_STDIN=1`: exit as soon as stdin closes.
//!
//! It serves queue `cron`, prints `ready pid=<pid>` once the runner runs,
//! and drains and exits 0 on SIGTERM or SIGINT.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use pgfifo::schedule::{Missed, Schedule, Tick};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::worker;
use serde::{Deserialize, Serialize};

/// The schedule's job: its tick (ms since the epoch) and how many due ticks
/// before it got no job of their own.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "cron.tick", queue = "cron")]
struct CronTick {
    tick_ms: i64,
    missed: u64,
}

#[async_trait]
impl Handler for CronTick {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// Whether the closure has run once (for `BLOCK_FIRST_FIRE`).
static FIRED_ONCE: AtomicBool = AtomicBool::new(false);

fn job_for(tick: &Tick, block_first: bool) -> CronTick {
    let tick_ms = tick
        .at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    if block_first && !FIRED_ONCE.swap(true, Ordering::SeqCst) {
        worker::say(&format!("firing tick={tick_ms} pid={}", std::process::id()));
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    CronTick {
        tick_ms,
        missed: tick.missed,
    }
}

fn missed_policy(text: &str) -> Result<Missed, String> {
    match text {
        "skip" => Ok(Missed::Skip),
        "once" => Ok(Missed::RunOnce),
        _ => text
            .strip_prefix("each:")
            .and_then(|n| n.parse().ok())
            .map(|max| Missed::RunEach { max })
            .ok_or_else(|| format!("SCHEDULE_MISSED={text:?}: skip, once or each:N")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    worker::exit_code("cron-worker", run().await)
}

async fn run() -> Result<(), String> {
    worker::init_logging(false);
    let url = worker::var("DATABASE_URL")?;
    let name = worker::var("WORKER_NAME")?;
    let schedule_name = worker::var("SCHEDULE_NAME")?;
    let expression = std::env::var("SCHEDULE_EXPR").unwrap_or_else(|_| "* * * * * *".to_owned());
    let missed =
        missed_policy(&std::env::var("SCHEDULE_MISSED").unwrap_or_else(|_| "once".into()))?;
    let block_first = std::env::var("BLOCK_FIRST_FIRE").is_ok_and(|v| v == "1");
    worker::exit_with_stdin_if_asked("cron-worker");

    let schedule = Schedule::for_tick(schedule_name, expression, move |tick: &Tick| {
        job_for(tick, block_first)
    })
    .on_missed(missed);
    let config = worker::base_config(["cron"], 2)
        .name(name)
        .schedule(schedule);
    let pool = worker::connect(&url, 8).await?;
    worker::run_until_signal(pool, config).await
}

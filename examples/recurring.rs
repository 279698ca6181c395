//! Recurring jobs: a schedule that fires every two seconds, in a tenant's
//! group, run by two runners at once — each tick still enqueues one job.
//!
//! ```sh
//! cargo run -p pgfifo-examples --example recurring
//! ```
//!
//! It uses `DATABASE_URL`'s server (or a throwaway one, as the demo does),
//! creates a fresh database `pgfifo_recurring`, runs for about seven
//! seconds, prints each run with its tick, then what `pgfifo schedules`
//! would show. See `docs/recurring-jobs.md`.

use std::time::{Duration, UNIX_EPOCH};

use pgfifo::admin;
use pgfifo::schedule::{Missed, Schedule, Tick};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, RunnerConfig};
use serde::{Deserialize, Serialize};

/// Sums up a tenant's usage for the period that ends at `tick_s`.
#[derive(Job, Serialize, Deserialize)]
#[job(queue = "reports", timeout = "30s")]
struct UsageReport {
    tenant: String,
    /// The tick this report is for, in s since the epoch.
    tick_s: u64,
    /// Ticks before this one that passed without a report of their own.
    missed: u64,
}

#[async_trait]
impl Handler for UsageReport {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        println!(
            "report for {} at tick {} (job {}, group {:?}, {} missed before it)",
            self.tenant,
            admin::rfc3339(UNIX_EPOCH + Duration::from_secs(self.tick_s)),
            ctx.id(),
            ctx.group().unwrap_or("-"),
            self.missed
        );
        Ok(())
    }
}

/// The report for one tick.
fn report(tick: &Tick) -> UsageReport {
    UsageReport {
        tenant: "tenant-7".to_owned(),
        tick_s: tick
            .at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        missed: tick.missed,
    }
}

/// The schedule both runners declare: the same definition, so they share it.
fn usage_schedule() -> Schedule {
    // Six fields: the first is seconds. Every two seconds, in UTC.
    Schedule::for_tick("usage-report", "*/2 * * * * *", report)
        .group("tenant-7")
        .on_missed(Missed::RunOnce)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pgfifo_examples::init_logging();
    let (_server, pool) =
        pgfifo_examples::example_database("recurring example", "pgfifo_recurring", 20).await?;

    // Two runners, as two processes of a deployment would be.
    let config = |name: &str| {
        RunnerConfig::default()
            .name(name)
            .concurrency(2)
            .schedule(usage_schedule())
    };
    let first = pgfifo::runner::start(pool.clone(), config("runner-a")).await?;
    let second = pgfifo::runner::start(pool.clone(), config("runner-b")).await?;
    println!("two runners declare schedule usage-report (*/2 * * * * *); running for 7 s\n");
    tokio::time::sleep(Duration::from_secs(7)).await;

    // Pause it (as `pgfifo schedule pause usage-report` would), and let the
    // last tick's job finish.
    let mut conn = pool.get().await?;
    admin::pause_schedule(&mut conn, "usage-report").await?;
    for _ in 0..100 {
        let s = admin::schedule(&mut conn, "usage-report").await?;
        if s.last_job_state.as_deref() == Some("succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in admin::schedules(&mut conn).await? {
        println!(
            "\nschedule {}{}: {} ({}), group {}, missed-tick policy: {}\n  declared by {}\n  last tick {}, job {} ({})\n  next tick {}",
            s.name,
            if s.paused { " (paused)" } else { "" },
            s.expression,
            s.time_zone,
            s.group.as_deref().unwrap_or("-"),
            s.on_missed,
            s.declared_by.join(", "),
            s.last_tick.map_or("-".into(), admin::rfc3339),
            s.last_job.map_or("-".into(), |id| id.to_string()),
            s.last_job_state.as_deref().unwrap_or("-"),
            s.next_tick.map_or("-".into(), admin::rfc3339),
        );
    }
    println!("\nfired ticks (each once, by whichever runner got there first):");
    for t in admin::schedule_ticks(&mut conn, "usage-report", 10)
        .await?
        .iter()
        .rev()
    {
        println!(
            "  {}  job {}  by {}",
            admin::rfc3339(t.tick),
            t.job,
            t.fired_by
        );
    }
    drop(conn);
    first.shutdown().await?;
    second.shutdown().await?;
    Ok(())
}

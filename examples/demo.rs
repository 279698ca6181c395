//! The pgfifo demo: per-tenant jobs that never overlap or reorder within a
//! tenant, while different tenants run in parallel.
//!
//! Run it with:
//!
//! ```sh
//! cargo run -p pgfifo-examples --example demo
//! ```
//!
//! It uses the PostgreSQL server of `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), creates a fresh database
//! `pgfifo_demo` there, migrates it, enqueues invoices for four
//! tenants, runs them with four workers, prints a timeline and exits.
//!
//! When no server answers there, it starts a throwaway one if the PostgreSQL
//! server binaries are installed (and says so in one line), or else exits
//! with one line saying what to do. `PGFIFO_DEMO_THROWAWAY=off` turns the
//! throwaway server off.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use pgfifo::runner::JobOutcome;
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob, RunnerConfig,
};
use serde::{Deserialize, Serialize};

/// One invoice to charge for a tenant. The handler pretends to call a payment
/// provider for `work_ms` milliseconds.
#[derive(Job, Serialize, Deserialize)]
#[job(queue = "billing", max_attempts = 3, timeout = "10s", backoff = "50ms")]
struct ChargeInvoice {
    tenant: String,
    invoice: u32,
    work_ms: u64,
}

/// When the demo started, and every run as (tenant, invoice, start, end).
static CLOCK: OnceLock<Instant> = OnceLock::new();
static RUNS: Mutex<Vec<(String, u32, Duration, Duration)>> = Mutex::new(Vec::new());

fn elapsed() -> Duration {
    CLOCK.get_or_init(Instant::now).elapsed()
}

#[async_trait]
impl Handler for ChargeInvoice {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = elapsed();
        println!(
            "{:>7.3}s  {:<9} invoice {} starts (job {}, attempt {})",
            start.as_secs_f64(),
            self.tenant,
            self.invoice,
            ctx.id(),
            ctx.attempt()
        );
        tokio::time::sleep(Duration::from_millis(self.work_ms)).await;
        let end = elapsed();
        println!(
            "{:>7.3}s  {:<9} invoice {} done",
            end.as_secs_f64(),
            self.tenant,
            self.invoice
        );
        RUNS.lock()
            .expect("runs")
            .push((self.tenant.clone(), self.invoice, start, end));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pgfifo_examples::init_logging();
    // DATABASE_URL's server, or a throwaway one when none answers there.
    let (_server, pool) = pgfifo_examples::example_database("demo", "pgfifo_demo", 10).await?;

    // Enqueue five invoices for each of four tenants, in one round trip. Each
    // tenant's invoices must be charged one at a time, in order.
    let tenants = ["acme", "globex", "initech", "umbrella"];
    let mut jobs = Vec::new();
    for invoice in 1..=5 {
        for (i, tenant) in tenants.iter().enumerate() {
            let work_ms = 40 + 30 * ((invoice as u64 + i as u64) % 3);
            let job = ChargeInvoice {
                tenant: tenant.to_string(),
                invoice,
                work_ms,
            };
            jobs.push(NewJob::new(&job, EnqueueOptions::group(*tenant))?);
        }
    }
    {
        let mut conn = pool.get().await?;
        let ids = pgfifo::enqueue_batch(&mut conn, jobs).await?;
        println!(
            "enqueued {} jobs for {} tenants (ids {}..={})\n",
            ids.len(),
            tenants.len(),
            ids[0],
            ids[ids.len() - 1]
        );
    }

    elapsed();
    let runner = pgfifo::runner::start(pool, RunnerConfig::default().concurrency(4)).await?;
    let mut events = runner.subscribe();
    let mut done = 0;
    while done < tenants.len() * 5 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        if event.outcome == JobOutcome::Succeeded {
            done += 1;
        }
    }
    runner.shutdown().await?;
    print_timeline(&tenants);
    Ok(())
}

/// Prints one row per tenant: each column is 20 ms, the digit is the invoice
/// running then. Rows never show two invoices at once and count up; rows
/// overlap each other in time.
fn print_timeline(tenants: &[&str]) {
    let runs = RUNS.lock().expect("runs");
    let step = Duration::from_millis(20);
    let end = runs.iter().map(|r| r.3).max().unwrap_or_default();
    let columns = (end.as_millis() / step.as_millis()) as usize + 1;
    let mut rows: BTreeMap<&str, Vec<char>> =
        tenants.iter().map(|t| (*t, vec!['.'; columns])).collect();
    for (tenant, invoice, start, end) in runs.iter() {
        let row = rows.get_mut(tenant.as_str()).expect("known tenant");
        let first = (start.as_millis() / step.as_millis()) as usize;
        let last = (end.as_millis().saturating_sub(1) / step.as_millis()) as usize;
        for cell in row.iter_mut().take(last + 1).skip(first) {
            *cell = char::from_digit(*invoice, 10).unwrap_or('#');
        }
    }
    println!("\ntimeline (one column = 20 ms; the digit is the invoice running):");
    for (tenant, row) in rows {
        println!("  {tenant:<9} |{}|", row.into_iter().collect::<String>());
    }
    let in_order = tenants.iter().all(|t| {
        let mut mine: Vec<_> = runs.iter().filter(|r| r.0 == *t).collect();
        mine.sort_by_key(|r| r.2);
        mine.windows(2).all(|w| w[0].1 < w[1].1 && w[0].3 <= w[1].2)
    });
    println!(
        "\n{} runs; each tenant's invoices ran one at a time and in order: {}",
        runs.len(),
        if in_order { "yes" } else { "NO" }
    );
}

//! pgfifo's metrics, exported for Prometheus.
//!
//! Run it with:
//!
//! ```sh
//! cargo run -p pgfifo-examples --example metrics
//! ```
//!
//! It installs `metrics-exporter-prometheus` as the recorder of the `metrics`
//! facade, with its scrape endpoint on `METRICS_ADDR` (default
//! `127.0.0.1:9898`), creates a fresh database `pgfifo_metrics_example` on the
//! server of `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), enqueues reports for a few
//! tenants (some fail once and are retried, one fails for good), runs them,
//! scrapes the endpoint once, prints what pgfifo exported and exits.
//!
//! In an application, install the recorder the same way, before
//! `pgfifo::runner::start`, and let Prometheus scrape the endpoint.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use pgfifo::runner::{metrics as names, JobOutcome};
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob, RunnerConfig,
};
use serde::{Deserialize, Serialize};

/// Builds a tenant's report. `flaky` reports fail their first attempt;
/// `broken` ones fail every time, until their attempts are used up.
#[derive(Job, Serialize, Deserialize)]
#[job(queue = "reports", max_attempts = 2, timeout = "10s", backoff = "20ms")]
struct BuildReport {
    tenant: String,
    report: u32,
    flaky: bool,
    broken: bool,
}

#[async_trait]
impl Handler for BuildReport {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(5 + 7 * u64::from(self.report % 4))).await;
        if self.broken || (self.flaky && ctx.attempt() == 1) {
            return Err(JobError::retry(format!(
                "the data source of {} did not answer",
                self.tenant
            )));
        }
        Ok(())
    }
}

/// The handler-time buckets, in seconds (without them the exporter renders
/// histograms as summaries).
const DURATION_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pgfifo_examples::init_logging();

    // The recorder goes first: the runner registers its metrics at start.
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9898".to_owned())
        .parse()?;
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(names::JOB_DURATION.into()), DURATION_BUCKETS)?
        .build()?;
    metrics::set_global_recorder(recorder)?;
    tokio::spawn(exporter);

    let url =
        pgfifo_examples::fresh_database(&pgfifo_examples::server_url(), "pgfifo_metrics_example")
            .await?;
    let pool = pgfifo::connect(&url, 16).await?;
    pgfifo::migrate(&pool).await?;

    let tenants = ["acme", "globex", "initech"];
    let mut jobs = Vec::new();
    for report in 1..=6 {
        for tenant in tenants {
            let job = BuildReport {
                tenant: tenant.to_owned(),
                report,
                flaky: report % 3 == 0,
                broken: tenant == "initech" && report == 6,
            };
            jobs.push(NewJob::new(&job, EnqueueOptions::group(tenant))?);
        }
    }
    let total = jobs.len();
    pgfifo::enqueue_batch(&mut *pool.get().await?, jobs).await?;
    println!("enqueued {total} reports for {} tenants", tenants.len());

    let sample_every = Duration::from_millis(200);
    let runner = pgfifo::runner::start(
        pool,
        RunnerConfig::default()
            .concurrency(4)
            .metrics_interval(sample_every),
    )
    .await?;
    let mut events = runner.subscribe();
    let mut finished = 0;
    while finished < total {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        if matches!(
            event.outcome,
            JobOutcome::Succeeded | JobOutcome::Failed { .. }
        ) {
            finished += 1;
        }
    }
    // Let the gauges be sampled once more, now that the queue is drained.
    tokio::time::sleep(sample_every * 2).await;

    let body = tokio::task::spawn_blocking(move || scrape(addr)).await??;
    println!("\nGET http://{addr}/metrics (pgfifo's lines, histogram buckets left out):\n");
    for line in body
        .lines()
        .filter(|l| l.contains("pgfifo_") && !l.contains("_bucket{"))
    {
        println!("  {line}");
    }
    runner.shutdown().await?;
    Ok(())
}

/// Fetches the scrape endpoint, as Prometheus would, with a plain HTTP/1.0
/// GET; returns the body.
fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(std::io::Error::other(format!("scrape failed: {status}")));
    }
    Ok(body.to_owned())
}

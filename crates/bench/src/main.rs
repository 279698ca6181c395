//! pgfifo's benchmarks: `cargo run --release -p pgfifo-bench -- <scenario> [--name value]…`
//!
//! Scenarios: `fifo-groups`, `backlog`, `latency`, `long-job`, and `status`
//! (the operator's `pgfifo status` on a large table), `dashboard` (each page
//! of the web dashboard on a large queue) (see `docs/performance.md`),
//! `group-rate` and `group-concurrency` (a group's rate limit across several
//! runners, and what a group's concurrency buys; see the `group_controls`
//! module), and `queue-rate` (a queue's rate limit across three runner
//! processes, which are this binary run as `queue-rate-worker`; see the
//! `queue_rate` module). Each prints progress on stderr and exactly one JSON line on
//! stdout. Inputs are environment variables (`DATABASE_URL`, `JOBS`,
//! `NGROUPS`, `WORKERS`, …); a flag `--jobs 5000` overrides `JOBS`. Each
//! scenario recreates its own database on the server; `BENCH_DB_SUFFIX`
//! appends to its name, so that runs side by side do not share one.

mod backlog;
mod batch_mode;
mod citus;
mod common;
mod dashboard;
mod fifo_groups;
mod group_controls;
mod latency;
mod long_job;
mod pg_cpu;
mod queue_rate;
mod status;

use common::Inputs;

const USAGE: &str = "usage: pgfifo-bench \
    <fifo-groups|backlog|latency|long-job|status|dashboard|group-rate|group-concurrency|queue-rate> \
    [--name value]...";

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(scenario) = args.first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let result = match Inputs::from_args(&args[1..]) {
        Err(err) => Err(err),
        Ok(inputs) => match scenario.as_str() {
            "fifo-groups" => fifo_groups::run(&inputs).await,
            "backlog" => backlog::run(&inputs).await,
            "latency" => latency::run(&inputs).await,
            "long-job" => long_job::run(&inputs).await,
            "status" => status::run(&inputs).await,
            "dashboard" => dashboard::run(&inputs).await,
            "group-rate" => group_controls::run_rate(&inputs).await,
            "group-concurrency" => group_controls::run_concurrency(&inputs).await,
            "queue-rate" => queue_rate::run(&inputs).await,
            "queue-rate-worker" => queue_rate::worker(&inputs).await,
            other => Err(format!("unknown scenario {other:?}\n{USAGE}")),
        },
    };
    match result {
        Ok(json) => println!("{json}"),
        Err(err) => {
            eprintln!("pgfifo-bench {scenario}: {err}");
            std::process::exit(1);
        }
    }
}

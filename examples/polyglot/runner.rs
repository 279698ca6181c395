//! The Rust side of the polyglot example (docs/enqueue-from-sql.md): Python
//! and Node.js producers enqueue jobs through pgfifo's SQL API, and this
//! runner runs them.
//!
//! ```sh
//! url=$(cargo run -q -p pgfifo-examples --example polyglot -- prepare)
//! DATABASE_URL=$url python3 examples/polyglot/python/enqueue.py
//! DATABASE_URL=$url node examples/polyglot/node/enqueue.js
//! cargo run -q -p pgfifo-examples --example polyglot -- run "$url" --expect 40
//! ```
//!
//! `prepare` creates a fresh database `pgfifo_polyglot` on the server of
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! migrates it, creates the example's own table and prints the database's
//! URL. The producers only connect and call `pgfifo.add_job` /
//! `pgfifo.add_jobs`: they run no runner. `run` starts a runner on the
//! `polyglot` queue, waits until the `--expect` jobs have finished, and
//! checks that each job ran once and that each group's jobs ran in the
//! order they were enqueued (the `seq` each producer put in its payloads).
//! It exits with status 1 when a check fails.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgfifo::diesel;
use pgfifo::diesel::sql_types::{BigInt, Text};

use pgfifo::diesel::QueryableByName;
use pgfifo::diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::RunnerConfig;
use pgfifo_examples::polyglot::RUN_TABLE;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct RunRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Text)]
    group_id: String,
    #[diesel(sql_type = Text)]
    producer: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> Result<i64, diesel::result::Error> {
    let row: Count = diesel::sql_query(sql).get_result(conn).await?;
    Ok(row.n)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pgfifo_examples::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["prepare"] => prepare().await,
        ["run", url, "--expect", n] => run(url, n.parse()?).await,
        _ => {
            eprintln!("usage: polyglot prepare | polyglot run URL --expect N");
            std::process::exit(2);
        }
    }
}

async fn prepare() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        pgfifo_examples::fresh_database(&pgfifo_examples::server_url(), "pgfifo_polyglot").await?;
    let pool = pgfifo::connect(&url, 2).await?;
    pgfifo::migrate(&pool).await?;
    pool.get().await?.batch_execute(RUN_TABLE).await?;
    println!("{url}");
    Ok(())
}

async fn run(url: &str, expect: i64) -> Result<(), Box<dyn std::error::Error>> {
    let pool = pgfifo::connect(url, 8).await?;
    let mut conn = pool.get_owned().await?;
    let enqueued = count(
        &mut conn,
        "SELECT count(*) AS n FROM pgfifo.job WHERE queue = 'polyglot'",
    )
    .await?;
    if enqueued != expect {
        return fail(format!(
            "expected {expect} jobs in queue polyglot, found {enqueued}"
        ));
    }
    let started = Instant::now();
    let runner = pgfifo::runner::start(
        pool.clone(),
        RunnerConfig::default().queues(["polyglot"]).concurrency(4),
    )
    .await?;
    let deadline = started + Duration::from_secs(60);
    loop {
        let left = count(
            &mut conn,
            "SELECT count(*) AS n FROM pgfifo.job WHERE queue = 'polyglot' AND state = 'queued'",
        )
        .await?;
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            runner.shutdown().await?;
            return fail(format!("{left} jobs still queued after 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runner.shutdown().await?;
    let elapsed = started.elapsed();

    let not_succeeded = count(
        &mut conn,
        "SELECT count(*) AS n FROM pgfifo.job WHERE queue = 'polyglot' AND state <> 'succeeded'",
    )
    .await?;
    let runs: Vec<RunRow> =
        diesel::sql_query("SELECT job_id, group_id, producer, seq FROM polyglot_run ORDER BY n")
            .load(&mut conn)
            .await?;
    let mut ran_ids: Vec<i64> = runs.iter().map(|r| r.job_id).collect();
    ran_ids.sort_unstable();
    ran_ids.dedup();
    let mut groups: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut producers: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &runs {
        groups.entry(&r.group_id).or_default().push(r.seq);
        *producers.entry(&r.producer).or_default() += 1;
    }
    let out_of_order: Vec<&str> = groups
        .iter()
        .filter(|(_, seqs)| **seqs != (0..seqs.len() as i64).collect::<Vec<_>>())
        .map(|(g, _)| *g)
        .collect();
    println!(
        "polyglot: {} jobs from {} ran in {:.2}s; groups {}; each once: {}; in order: {}",
        runs.len(),
        producers
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        elapsed.as_secs_f64(),
        groups.len(),
        if runs.len() as i64 == expect && ran_ids.len() == runs.len() {
            "yes"
        } else {
            "no"
        },
        if out_of_order.is_empty() { "yes" } else { "no" },
    );
    if not_succeeded != 0 {
        return fail(format!("{not_succeeded} jobs did not succeed"));
    }
    if runs.len() as i64 != expect || ran_ids.len() != runs.len() {
        return fail(format!(
            "{} runs of {} distinct jobs for {expect} enqueued",
            runs.len(),
            ran_ids.len()
        ));
    }
    if !out_of_order.is_empty() {
        return fail(format!("groups out of enqueue order: {out_of_order:?}"));
    }
    Ok(())
}

fn fail(message: String) -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("polyglot: {message}");
    std::process::exit(1);
}

//! The fault-injection suite (issue 3): several `fault-worker` processes (see
//! `tests/src/bin/fault-worker.rs`) drain thousands of jobs in more than a
//! hundred groups (one in five of them runs up to 2 or 3 jobs at once: group
//! concurrency N, set with `pgfifo::admin::set_group_limits` before the
//! workers start; see `wide.rs`) while the suite
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
//! One group in four of N = 1 runs its jobs in long mode (`#[job(long)]`,
//! `faults.long`): held without an open transaction, through every fault
//! above; the suite also reports how soon a long job killed mid-handler
//! started again (`long_runs.rs`), and freezes a worker mid-long-job
//! (`freeze_long.rs`: its group is taken over once its lease passes).
//!
//! Two hot groups of N = 1, in a queue of their own (`hot`) served by a
//! worker process of their own, get a burst of quick jobs before every
//! fault step (`faults.hot`: 0–2 ms, and the handler never takes the job's
//! connection; `hot.rs`). `pgfifo.pick` then also takes the next jobs of a
//! group behind its head (followers), and the worker runs a batch of them
//! per transaction while the faults go on. Some steps SIGKILL the hot
//! worker mid-burst, and a few hot jobs panic on their first attempt (the
//! rest of their batch is handed back). A hot run reaches `fault_log`
//! through its job's result, which is written with the success; its
//! recorded runs are checked in order by `hot_checks.rs` (a batch that did
//! not commit sends its group back to its head).
//!
//! It then checks every job: succeeded exactly once, or failed with its
//! reason; none lost; never more runs of a group at once than its N (no
//! overlap at all for the others); every group in order (N = 1: each run
//! after the previous one; a hot group: each run of a job after a run of
//! the job before it that succeeded and committed, or ran in the same
//! process (its batch); N > 1: FIFO starts, within a jitter, and nothing
//! starts behind a job that failed an attempt until it is done); and prints
//! one summary line, with the peak runs at once of the groups of N > 1 and
//! the number of followers (hot jobs that committed in the same transaction
//! as the previous job of their group: `fault_log.xact`). Any non-zero
//! violation count fails the run, and so does a run whose groups of N > 1
//! never ran two jobs at once, or in which no job committed as a follower.
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

// The suite's parts.
mod checks;
mod freeze;
mod freeze_long;
mod hot;
mod hot_checks;
mod jobs;
mod long_runs;
mod monitor;
mod plan;
mod prefetch_cut;
mod processes;
mod release;
mod report;
mod run;
mod run_checks;
mod start_checks;
mod suite;
mod wide;

// Helpers of the smaller checks.
mod small_checks;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::AsyncPgConnection;
use pgfifo::{EnqueueOptions, NewJob};
use pgfifo_tests::TestDb;
use tracing_subscriber::util::SubscriberInitExt;

use crate::monitor::log_line_ns;
use crate::small_checks::{chain, Captured, PoolJob};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts its own PostgreSQL for minutes: run by .ci/run (cargo test -p pgfifo-tests --test faults -- --ignored)"]
async fn faults_suite() {
    run::faults_suite().await;
}

// --- Smaller checks (not ignored; the shared server, a database of their own) ---

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

/// Nothing listens on the port: `pgfifo::connect` fails at once, saying it
/// could not connect, and why (the OS error, such as "connection refused",
/// which pgfifo keeps from tokio-postgres's error chain).
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
    assert!(message.contains("could not connect"), "{message}");
    assert!(
        message.contains("error connecting to server: "),
        "{message}"
    );

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

//! A runner whose only server hangs still stops by its deadline.

use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use pgfifo::runner::{JobOutcome, ABORT_PATIENCE};
use pgfifo::{EnqueueOptions, NewJob, RunnerConfig};
use pgfifo_tests::failover::{wait_until, Node};

use crate::switch::{connect, FoJob, FO_LOG};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_by_its_deadline_when_the_server_hangs() {
    let mut node = Node::primary().expect("start a private server");
    connect(&node.url("postgres"))
        .await
        .batch_execute("CREATE DATABASE app")
        .await
        .unwrap();
    let pool = pgfifo::connect(&node.url("app"), 12)
        .await
        .expect("connect");
    pgfifo::migrate(&pool).await.expect("migrate");
    {
        let mut conn = pool.get().await.unwrap();
        conn.batch_execute(FO_LOG).await.unwrap();
        let jobs = (0..2_000u32).map(|i| {
            let (group, seq) = (i % 20, i / 20);
            NewJob::new(
                &FoJob { group, seq },
                EnqueueOptions::group(format!("g{group}")),
            )
            .unwrap()
        });
        pgfifo::enqueue_batch(&mut conn, jobs.collect::<Vec<_>>())
            .await
            .expect("enqueue");
    }
    let runner = pgfifo::runner::start(
        pool.clone(),
        RunnerConfig::default().queues(["fo"]).concurrency(4),
    )
    .await
    .expect("start the runner");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut events = runner.subscribe();
    let seen = done.clone();
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            if event.outcome == JobOutcome::Succeeded {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    assert!(
        wait_until(Duration::from_secs(60), || done
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 50)
        .await,
        "the runner did not get going"
    );

    // The server hangs mid-drain: lanes wait on picks, commits and
    // handlers' statements, none of which will ever be answered.
    node.freeze().expect("SIGSTOP");
    let deadline = Duration::from_secs(1);
    let began = Instant::now();
    let stopped =
        tokio::time::timeout(Duration::from_secs(60), runner.shutdown_within(deadline)).await;
    let took = began.elapsed();
    println!("shutdown_within({deadline:?}) on a hung server returned after {took:.2?}");
    stopped
        .expect("shutdown hung with the server")
        .expect("shutdown");
    let bound = deadline + ABORT_PATIENCE + Duration::from_millis(1_500);
    assert!(took < bound, "shutdown took {took:?}, past {bound:?}");
    node.thaw().expect("SIGCONT");
}

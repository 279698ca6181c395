//! A runner whose only server hangs: it still stops by its deadline, and
//! handlers waiting on the server do not hold their permits until their
//! timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use pgfifo::runner::{JobOutcome, ABORT_PATIENCE};
use pgfifo::{EnqueueOptions, NewJob, RunnerConfig};
use pgfifo_tests::failover::{wait_until, Node};

use crate::jobs::{connect, FoJob, FO_LOG};

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

/// Handlers of this type wait in a statement of their own until the server
/// answers; each notes when it starts and when its future ends.
#[derive(pgfifo::Job, serde::Serialize, serde::Deserialize, Debug)]
#[job(
    kind = "fo.sleep",
    queue = "fo_sleep",
    max_attempts = 5,
    timeout = "120s"
)]
struct SleepJob {
    n: u32,
}

static SLEEPING: AtomicUsize = AtomicUsize::new(0);
static CUT_OFF: AtomicUsize = AtomicUsize::new(0);

/// Counts the handler's end, however it ends (returned or dropped).
struct Ends;

impl Drop for Ends {
    fn drop(&mut self) {
        CUT_OFF.fetch_add(1, Ordering::SeqCst);
    }
}

#[pgfifo::async_trait]
impl pgfifo::Handler for SleepJob {
    async fn handle(&self, ctx: &mut pgfifo::JobContext<'_>) -> Result<(), pgfifo::JobError> {
        let _ends = Ends;
        SLEEPING.fetch_add(1, Ordering::SeqCst);
        ctx.conn().batch_execute("SELECT pg_sleep(60)").await?;
        Ok(())
    }
}

/// Every lane is inside a handler's own statement when the server hangs:
/// no round trip of a lane notices, but the listener's poll does, and the
/// handlers on that server are cut off instead of holding their permits
/// until their 120 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_waiting_on_a_hung_server_are_cut_off() {
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
        let jobs = (0..2u32)
            .map(|n| NewJob::new(&SleepJob { n }, EnqueueOptions::group(format!("s{n}"))).unwrap());
        pgfifo::enqueue_batch(&mut conn, jobs.collect::<Vec<_>>())
            .await
            .expect("enqueue");
    }
    let round_trip = Duration::from_secs(2);
    let config = RunnerConfig::default()
        .queues(["fo_sleep"])
        .concurrency(2)
        // No lane beyond the two handlers': none picks while they wait.
        .prefetch(0)
        .poll_interval(Duration::from_millis(200))
        .round_trip_timeout(round_trip);
    let runner = pgfifo::runner::start(pool.clone(), config)
        .await
        .expect("start the runner");
    assert!(
        wait_until(Duration::from_secs(30), || SLEEPING.load(Ordering::SeqCst)
            >= 2)
        .await,
        "the handlers did not start"
    );
    // Let both reach their statement.
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.freeze().expect("SIGSTOP");
    let frozen = Instant::now();
    let bound = Duration::from_millis(200) + round_trip + Duration::from_secs(3);
    let cut = wait_until(Duration::from_secs(30), || {
        CUT_OFF.load(Ordering::SeqCst) >= 2
    })
    .await;
    let took = frozen.elapsed();
    println!("handlers on a hung server cut off after {took:.2?} (poll 200 ms, round trip {round_trip:?})");
    assert!(
        cut,
        "the handlers still wait on the hung server after {took:?}"
    );
    assert!(
        took < bound,
        "the handlers were cut off after {took:?}, past {bound:?}"
    );
    runner
        .shutdown_within(Duration::from_secs(1))
        .await
        .unwrap();
    node.thaw().expect("SIGCONT");
}

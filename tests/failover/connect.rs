//! A multi-host URL whose first host hangs in its start-up exchange.

use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use pgfifo::ConnectOptions;
use pgfifo_tests::failover::Node;
use pgfifo_tests::TestDb;

/// The slack allowed past the deadline of the hung host: the healthy host
/// answers in milliseconds, but the machine is shared with other tests.
const MARGIN: Duration = Duration::from_millis(2_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_first_host_costs_its_deadline_then_the_next_host_answers() {
    let db = TestDb::new().await;
    let mut hung = Node::primary().expect("start a private server");
    hung.freeze_postmaster().expect("SIGSTOP the postmaster");
    // The hung server first, the shared test server second.
    let url = db.url.replacen('@', &format!("@{},", hung.host()), 1);
    let per_host = Duration::from_secs(2);
    let options = ConnectOptions::new(4).connect_timeout_per_host(per_host);

    let began = Instant::now();
    let pool = pgfifo::connect_with(&url, options)
        .await
        .unwrap_or_else(|err| panic!("no connection through the second host: {err}"));
    let took = began.elapsed();
    println!("connect with a hung first host: {took:.2?} (deadline per host {per_host:?})");
    assert!(
        took >= per_host - Duration::from_millis(100),
        "connected in {took:?}: the hung host was not tried first"
    );
    assert!(
        took < per_host + MARGIN,
        "connect took {took:?}, past the hung host's deadline ({per_host:?}) plus {MARGIN:?}"
    );

    // The pool's own connections are opened the same way.
    let began = Instant::now();
    let mut conn = pool
        .dedicated_connection()
        .await
        .expect("a new pooled connection");
    let took = began.elapsed();
    // The hung host failed a moment ago: it is tried last now.
    assert!(
        took < Duration::from_secs(1),
        "a pool connection took {took:?}: the host that just hung was tried first again"
    );
    conn.batch_execute("SELECT 1").await.expect("a round trip");
    pgfifo::migrate(&pool)
        .await
        .expect("migrate through the pool");

    // Only the hung host: a timeout error after its deadline, not a hang.
    let began = Instant::now();
    let alone = hung.url("postgres");
    let err = pgfifo::connect_with(&alone, options)
        .await
        .expect_err("connected to a hung server");
    let took = began.elapsed();
    assert!(
        matches!(err, pgfifo::Error::ConnectTimeout(d) if d == per_host),
        "unexpected error: {err}"
    );
    assert!(
        took < per_host + MARGIN,
        "the hung host alone took {took:?}"
    );
    hung.thaw().expect("SIGCONT");
}

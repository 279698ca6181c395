//! pgfifo through PgBouncer (see `pgfifo_tests::pgbouncer`): a private
//! instance with a transaction-mode and a session-mode pool in front of the
//! test's database.
//!
//! Against each: enqueue (one job, a batch, inside the application's own
//! transaction), the admin API, and worker processes draining 2,000 jobs in
//! 50 groups with nothing lost, duplicated or reordered and nothing logged
//! at warning level or above, apart from the one notice a transaction-pooled
//! runner without a direct URL gives at start.

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::{ConnectOptions, EnqueueOptions, Job, NewJob, Pool};
use pgfifo_tests::pgbouncer::PgBouncer;
use pgfifo_tests::TestDb;

use crate::jobs::LogJob;
use crate::multiprocess::harness::{drain_and_check, Drain, Output};

/// The notice of a runner that must poll.
const POLLING_NOTICE: &str = "cannot LISTEN";

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Has the pooler open `n` server connections (transactions that overlap
/// in time, until `n` ran at once). In transaction mode its round robin then
/// has servers to go round: a statement split across two transactions lands
/// on two servers. In session mode, runners then find their servers ready:
/// PgBouncer opens new ones one at a time, which on a loaded machine makes
/// a runner's lanes wait seconds for their first connections.
async fn warm(url: &str, n: usize) {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(pgfifo::db::pooler::establish(url).await.expect("connect"));
    }
    for _ in 0..50 {
        let sleeps = conns.iter_mut().map(|conn| {
            conn.transaction::<_, diesel::result::Error, _>(async |conn| {
                let pid: Count =
                    diesel::sql_query("SELECT pg_backend_pid()::bigint AS n, pg_sleep(0.2)")
                        .get_result(conn)
                        .await?;
                Ok(pid.n)
            })
        });
        let pids: std::collections::BTreeSet<i64> = futures_util::future::join_all(sleeps)
            .await
            .into_iter()
            .map(|pid| pid.expect("a sleeping transaction"))
            .collect();
        if pids.len() == n {
            return;
        }
    }
    panic!("pgbouncer never ran {n} transactions at once");
}

async fn pool(url: &str, transaction_pooler: bool) -> Pool {
    let options = ConnectOptions::new(8).transaction_pooler(transaction_pooler);
    pgfifo::connect_with(url, options)
        .await
        .expect("connect through pgbouncer")
}

fn log_job(group: &str, seq: i64) -> LogJob {
    LogJob {
        group: group.into(),
        seq,
        sleep_ms: 0,
    }
}

/// Enqueue in its three forms, then admin calls, on `pool`; checks each.
async fn enqueue_and_admin(db: &TestDb, pool: &Pool) {
    // Many rounds on several connections at once: with the pooler handing
    // out servers in turn, a statement split across two of them would fail.
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.get_owned().await.unwrap();
            let group = format!("g{worker}");
            for round in 0..10 {
                log_job(&group, round * 3)
                    .enqueue(&mut conn, &group)
                    .await
                    .expect("enqueue one job");
                let batch = (1..3).map(|k| {
                    NewJob::new(
                        &log_job(&group, round * 3 + k),
                        EnqueueOptions::group(&group),
                    )
                    .unwrap()
                });
                let ids = pgfifo::enqueue_batch(&mut conn, batch)
                    .await
                    .expect("enqueue a batch");
                assert_eq!(ids.len(), 2);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 120);

    // Inside the application's transaction: it commits with it, or vanishes
    // with its rollback.
    let mut conn = pool.get().await.unwrap();
    conn.transaction::<_, diesel::result::Error, _>(async |conn| {
        log_job("tx", 0)
            .enqueue(conn, "tx")
            .await
            .expect("enqueue in a transaction");
        let seen: Count =
            diesel::sql_query("SELECT count(*) AS n FROM pgfifo.job WHERE group_id = 'tx'")
                .get_result(conn)
                .await?;
        assert_eq!(seen.n, 1, "the job is visible inside the transaction");
        Ok(())
    })
    .await
    .unwrap();
    let rolled_back = conn
        .transaction::<(), diesel::result::Error, _>(async |conn| {
            log_job("tx", 1)
                .enqueue(conn, "tx")
                .await
                .expect("enqueue in a transaction");
            Err(diesel::result::Error::RollbackTransaction)
        })
        .await;
    assert!(rolled_back.is_err());
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE group_id = 'tx'")
            .await,
        1,
        "the rolled-back job is gone, the committed one stays"
    );

    // The admin API, read and write.
    assert!(pgfifo::admin::pause_group(&mut conn, "log", "g0")
        .await
        .unwrap());
    let status = pgfifo::admin::queue_status(&mut conn, "log", 5)
        .await
        .unwrap();
    assert_eq!(status.queue, "log");
    let groups = pgfifo::admin::groups(&mut conn, "log", &Default::default())
        .await
        .unwrap();
    assert!(groups
        .iter()
        .any(|g| g.group == "g0" && g.state == pgfifo::admin::GroupState::Paused));
    assert!(pgfifo::admin::resume_group(&mut conn, "log", "g0")
        .await
        .unwrap());
    let schema = pgfifo::migrate::status(&mut conn).await.unwrap();
    assert!(schema.migrations.iter().all(|m| m.applied));
}

/// Warning and error lines in the workers' logs, without the polling notice.
fn complaints(outputs: &[Output]) -> Vec<&String> {
    outputs
        .iter()
        .flat_map(|o| o.stderr.iter())
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .filter(|line| !line.contains(POLLING_NOTICE))
        .collect()
}

fn notices(outputs: &[Output]) -> Vec<usize> {
    outputs
        .iter()
        .map(|o| {
            o.stderr
                .iter()
                .filter(|l| l.contains(POLLING_NOTICE))
                .count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_enqueue_and_admin() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    warm(&bouncer.transaction_url, 4).await;
    let pool = pool(&bouncer.transaction_url, true).await;
    enqueue_and_admin(&db, &pool).await;
    assert!(
        !bouncer.log().contains("does not exist"),
        "{}",
        bouncer.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_enqueue_and_admin() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    let pool = pool(&bouncer.session_url, false).await;
    enqueue_and_admin(&db, &pool).await;
}

/// Two worker processes drain through `mode`'s pool, with `direct` as their
/// `direct_url` when given; checks the drain, that nothing was logged at
/// warning level or above but the polling notice, and returns how many
/// notices each worker gave.
async fn drain_through(mode: Mode, direct: bool) -> Vec<usize> {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return Vec::new();
    };
    let flagged = format!("{}?pgbouncer=true", bouncer.transaction_url);
    let (url, mut enqueuer, mut env) = match mode {
        Mode::Flag => {
            // The URL alone says that it leads to a transaction pooler.
            warm(&bouncer.transaction_url, 28).await;
            let conn = pgfifo::db::pooler::establish(&flagged).await.unwrap();
            (&flagged, conn, Vec::new())
        }
        Mode::Transaction => {
            // Up to both workers' lanes and bookkeepers at once.
            warm(&bouncer.transaction_url, 28).await;
            let conn = pgfifo::db::pooler::establish(&bouncer.transaction_url)
                .await
                .unwrap();
            (
                &bouncer.transaction_url,
                conn,
                vec![("TRANSACTION_POOLER", "1")],
            )
        }
        Mode::Session => {
            // Two workers' pools and LISTEN connections, and the enqueuer.
            warm(&bouncer.session_url, 36).await;
            let conn = AsyncPgConnection::establish(&bouncer.session_url)
                .await
                .unwrap();
            (&bouncer.session_url, conn, Vec::new())
        }
    };
    if direct {
        env.push(("DIRECT_URL", db.url.as_str()));
    }
    let drain = Drain {
        processes: 2,
        url,
        env: &env,
    };
    let outputs = drain_and_check(&db, drain, &mut enqueuer).await;
    assert_eq!(complaints(&outputs), Vec::<&String>::new());
    notices(&outputs)
}

/// PgBouncer's two pools (the transaction-mode one also through a URL
/// that carries `pgbouncer=true`, without the option).
enum Mode {
    Flag,
    Transaction,
    Session,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_runners_with_a_direct_url_drain_in_order() {
    let notices = drain_through(Mode::Transaction, true).await;
    assert!(
        notices.iter().all(|&n| n == 0),
        "runners with a direct URL listen: {notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_runners_without_a_direct_url_poll_and_say_so_once() {
    let notices = drain_through(Mode::Transaction, false).await;
    assert!(
        notices.iter().all(|&n| n == 1),
        "each runner says once that it polls: {notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pgbouncer_flag_in_the_url_is_enough() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    warm(&bouncer.transaction_url, 4).await;
    let url = format!("{}?pgbouncer=true", bouncer.transaction_url);
    // Plain `connect`, no option: the flag turns transaction-pooler mode on.
    let pool = pgfifo::connect(&url, 8)
        .await
        .expect("connect with the flag");
    {
        let mut conn = pool.get().await.unwrap();
        assert!(pgfifo::db::pooler::is_transaction_pooled(&mut conn));
    }
    enqueue_and_admin(&db, &pool).await;
    assert!(
        !bouncer.log().contains("does not exist"),
        "{}",
        bouncer.log()
    );
    // `pgbouncer=false` is the default, and a misspelt value is refused.
    let off = format!("{}?pgbouncer=false", bouncer.session_url);
    let pool = pgfifo::connect(&off, 2).await.expect("connect without it");
    assert!(!pgfifo::db::pooler::is_transaction_pooled(
        &mut pool.get().await.unwrap()
    ));
    let bad = format!("{}?pgbouncer=on", bouncer.session_url);
    let err = pgfifo::connect(&bad, 2)
        .await
        .expect_err("a bad flag value");
    assert!(err.to_string().contains("pgbouncer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_given_only_a_flagged_url_drain_in_order_and_poll() {
    let notices = drain_through(Mode::Flag, false).await;
    assert!(
        notices.iter().all(|&n| n == 1),
        "each runner says once that it polls: {notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_runners_drain_in_order() {
    let notices = drain_through(Mode::Session, false).await;
    assert!(
        notices.iter().all(|&n| n == 0),
        "runners in session mode listen: {notices:?}"
    );
}

/// The control: the same enqueues on connections that were not prepared for
/// the pooler fail, as the report that led to the option said. This is what
/// makes the tests above strict: with servers handed out in turn, a
/// statement prepared in one round trip and run in the next lands on two
/// servers. (If this stops failing, the pooler or the driver changed, and
/// `docs/deploying.md` should say so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_without_the_option_fails_on_prepared_statements() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    warm(&bouncer.transaction_url, 4).await;
    let mut failures = Vec::new();
    // Even opening the pool may fail: diesel-async's own setup statements
    // meet the same fate.
    match pgfifo::connect(&bouncer.transaction_url, 2).await {
        Err(err) => failures.push(err.to_string()),
        Ok(pool) => match pool.get().await {
            Err(err) => failures.push(err.to_string()),
            Ok(mut conn) => {
                for seq in 0..10 {
                    if let Err(err) = log_job("g", seq).enqueue(&mut conn, "g").await {
                        failures.push(err.to_string());
                    }
                }
            }
        },
    }
    assert!(
        failures.iter().any(|e| e.contains("prepared statement")),
        "enqueues through a transaction pooler without the option: {failures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_url_that_leads_nowhere_is_refused_at_start() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    let pool = pool(&bouncer.transaction_url, true).await;
    let config = pgfifo_tests::test_config().direct_url("postgres://postgres@127.0.0.1:1/nowhere");
    let err = pgfifo::runner::start(pool, config)
        .await
        .expect_err("the runner refuses a direct_url it cannot reach");
    assert!(err.to_string().contains("direct_url"), "{err}");
}

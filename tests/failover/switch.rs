//! A runner follows its database through a failover: the primary dies or
//! hangs, the standby is promoted, and the runner (never restarted) drains
//! the rest on the new primary.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::SimpleAsyncConnection;
use pgfifo::runner::JobOutcome;
use pgfifo::schedule::{Missed, Schedule};
use pgfifo::{EnqueueOptions, GroupLimits, JobId, NewJob, RunnerConfig, RunnerHandle};
use pgfifo_tests::failover::{wait_until, Node};
use pgfifo_tests::query::scalar;

use crate::hot::{check_hot, enqueue_hot, start_hot_runner, FO_HOT_LOG, HOT_GROUPS, HOT_PER_GROUP};
use crate::jobs::{
    committed_runs, connect, long_checks, now_ns, peak_overlap, FoJob, FoLong, FoTick, FoWide,
    FO_LOG, FO_LONG_LOG, FO_TICKS, FO_WIDE_LOG,
};

const GROUPS: u32 = 30;
const PER_GROUP: u32 = 40;
const DB: &str = "app";
/// Groups of concurrency 2 and their jobs.
const WIDE_GROUPS: u32 = 3;
const WIDE_PER_GROUP: u32 = 40;
/// Groups of long-mode jobs (`#[job(long)]`) and their jobs.
const LONG_GROUPS: u32 = 2;
const LONG_PER_GROUP: u32 = 40;
/// Jobs that succeed before the fault.
const BEFORE: usize = 300;

/// What happens to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `kill -9` of its postmaster.
    Killed,
    /// SIGSTOP of every one of its processes (continued when the test ends).
    Hung,
    /// `pg_ctl stop -m fast`.
    Stopped,
    /// It stays up but takes no writes any more (`default_transaction_read_only`,
    /// as a demoted primary that came back as a standby): the runner's
    /// connections to it get SQLSTATE 25006 and must move.
    Demoted,
}

/// How the standby confirms the primary's commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replication {
    /// `synchronous_standby_names = '*'`: a commit returns once the standby
    /// has it.
    Synchronous,
    /// The default: a commit returns once it is on the primary's disk.
    Asynchronous,
}

/// Makes the primary wait for the standby on every commit, and waits until
/// the standby is its synchronous one.
pub(crate) async fn make_synchronous(primary: &Node) {
    let mut admin = connect(&primary.url("postgres")).await;
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let began = Instant::now();
    loop {
        let sync = scalar(
            &mut admin,
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        )
        .await;
        if sync == 1 {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the standby never became synchronous"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The id of every success `runner` reports (acknowledged by a primary),
/// schedule ticks left out.
fn record_successes(runner: &RunnerHandle) -> Arc<Mutex<Vec<JobId>>> {
    let successes: Arc<Mutex<Vec<JobId>>> = Arc::default();
    let mut events = runner.subscribe();
    let seen = successes.clone();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(event) if event.outcome == JobOutcome::Succeeded && event.queue != "fo_tick" => {
                    seen.lock().unwrap().push(event.id);
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    panic!("missed {n} job events")
                }
                Err(_) => return,
            }
        }
    });
    successes
}

/// The whole scenario; prints one summary line.
async fn failover(fault: Fault, replication: Replication) {
    // `PGFIFO_TEST_LOG=pgfifo=debug` shows what the runner did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PGFIFO_TEST_LOG")
                .unwrap_or_else(|_| "off".into()),
        )
        .with_test_writer()
        .try_init();
    let mut primary = Node::primary().expect("start the primary");
    let standby = Node::standby_of(&primary).expect("start the standby");
    if replication == Replication::Synchronous {
        make_synchronous(&primary).await;
    }
    {
        let mut admin = connect(&primary.url("postgres")).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {DB}"))
            .await
            .unwrap();
    }
    let url = format!(
        "postgres://postgres@{},{}/{DB}?target_session_attrs=read-write",
        primary.host(),
        standby.host()
    );
    // Default deadlines: what a user gets.
    let pool = pgfifo::connect(&url, 32).await.expect("connect");
    pgfifo::migrate(&pool).await.expect("migrate");
    {
        let mut conn = pool.get().await.unwrap();
        conn.batch_execute(FO_LOG).await.unwrap();
        conn.batch_execute(FO_TICKS).await.unwrap();
        conn.batch_execute(FO_WIDE_LOG).await.unwrap();
        conn.batch_execute(FO_LONG_LOG).await.unwrap();
        conn.batch_execute(FO_HOT_LOG).await.unwrap();
        let long = (0..LONG_GROUPS * LONG_PER_GROUP).map(|i| {
            let (group, seq) = (i % LONG_GROUPS, i / LONG_GROUPS);
            NewJob::new(
                &FoLong { group, seq },
                EnqueueOptions::group(format!("l{group}")),
            )
            .unwrap()
        });
        pgfifo::enqueue_batch(&mut conn, long.collect::<Vec<_>>())
            .await
            .expect("enqueue");
        let wide = (0..WIDE_GROUPS * WIDE_PER_GROUP).map(|i| {
            let (group, seq) = (i % WIDE_GROUPS, i / WIDE_GROUPS);
            NewJob::new(
                &FoWide { group, seq },
                EnqueueOptions::group(format!("w{group}")),
            )
            .unwrap()
        });
        pgfifo::enqueue_batch(&mut conn, wide.collect::<Vec<_>>())
            .await
            .expect("enqueue");
        for seq in 0..PER_GROUP {
            let jobs = (0..GROUPS).map(|group| {
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
    }

    let tick = Schedule::new("fo-tick", "* * * * * *", || FoTick {}).on_missed(Missed::Skip);
    let config = RunnerConfig::default()
        .queues(["fo", "fo_tick", "fo_wide", "fo_long"])
        .group_limits("fo_wide", GroupLimits::new().concurrency(2))
        .concurrency(8)
        .poll_interval(Duration::from_millis(200))
        .schedule(tick);
    let runner = pgfifo::runner::start(pool.clone(), config)
        .await
        .expect("start the runner");
    // Every success the runners report: acknowledged by a primary.
    let successes = record_successes(&runner);
    let hot_runner = start_hot_runner(pool.clone()).await;
    let hot_successes = record_successes(&hot_runner);
    assert!(
        wait_until(Duration::from_secs(60), || successes.lock().unwrap().len()
            >= BEFORE)
        .await,
        "the runner did not drain {BEFORE} jobs before the fault"
    );
    // A burst in the hot groups, begun when the fault comes: it cuts
    // batches of followers off.
    enqueue_hot(&mut pool.get().await.unwrap(), 0)
        .await
        .expect("enqueue hot jobs");
    assert!(
        wait_until(Duration::from_secs(60), || hot_successes
            .lock()
            .unwrap()
            .len()
            >= 20)
        .await,
        "the hot runner did not start its burst"
    );

    match fault {
        Fault::Killed => primary.kill_postmaster().expect("kill -9"),
        Fault::Hung => primary.freeze().expect("SIGSTOP"),
        Fault::Stopped => primary.stop_fast().expect("pg_ctl stop -m fast"),
        Fault::Demoted => {
            let mut admin = connect(&primary.url("postgres")).await;
            admin
                .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
                .await
                .unwrap();
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
        }
    }
    let before_fault = successes.lock().unwrap().len();
    let asked = Instant::now();
    let asked_ns = now_ns();
    let promoted = standby.promote().expect("promote the standby");
    let promoted_ns = now_ns();
    let promote_took = promoted - asked;

    // A new job per group, enqueued on the new primary through the same
    // pool: its first connections may still be the old primary's.
    let began = Instant::now();
    loop {
        let enqueued = async {
            let mut conn = pool.get().await?;
            let jobs = (0..GROUPS).map(|group| {
                NewJob::new(
                    &FoJob {
                        group,
                        seq: PER_GROUP,
                    },
                    EnqueueOptions::group(format!("g{group}")),
                )
                .unwrap()
            });
            pgfifo::enqueue_batch(&mut conn, jobs.collect::<Vec<_>>()).await?;
            // And a second burst in the hot groups: followers on the new primary.
            enqueue_hot(&mut conn, HOT_PER_GROUP).await
        };
        match enqueued.await {
            Ok(_) => break,
            Err(err) => {
                assert!(
                    began.elapsed() < Duration::from_secs(60),
                    "no enqueue on the new primary: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    let total = (GROUPS * (PER_GROUP + 1)) as i64;
    let wide_total = (WIDE_GROUPS * WIDE_PER_GROUP) as i64;
    let long_total = (LONG_GROUPS * LONG_PER_GROUP) as i64;
    let hot_total = (2 * HOT_GROUPS * HOT_PER_GROUP) as i64;
    let mut checker = connect(&standby.url(DB)).await;
    let began = Instant::now();
    loop {
        let done = scalar(
            &mut checker,
            "SELECT count(*) FROM pgfifo.job WHERE queue IN ('fo', 'fo_wide', 'fo_long', 'fo_hot') \
             AND state = 'succeeded'",
        )
        .await;
        if done == total + wide_total + long_total + hot_total {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "{done} of {} jobs succeeded 90 s after the promotion",
            total + wide_total + long_total + hot_total
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every success the runners reported was acknowledged by a primary:
    // with synchronous replication, the new one has it.
    let mut reported = successes.lock().unwrap().clone();
    reported.extend(hot_successes.lock().unwrap().iter());
    let acknowledged: HashSet<JobId> = reported.iter().copied().collect();
    // Successes reported twice: the first one's commit did not survive.
    let reruns = reported.len() - acknowledged.len();
    // The first job that committed on the new primary, by its commit
    // timestamp, in ns since the epoch.
    let first_new_ns = scalar(
        &mut checker,
        &format!(
            "SELECT (extract(epoch FROM min(pg_xact_commit_timestamp(xmin))) * 1e9)::bigint \
             FROM fo_log WHERE port = {}",
            standby.port()
        ),
    )
    .await;
    // The schedule fires on the new primary too.
    let tick_query = format!(
        "SELECT coalesce((extract(epoch FROM min(pg_xact_commit_timestamp(xmin))) * 1e9)::bigint, 0) \
         FROM fo_ticks WHERE port = {}",
        standby.port()
    );
    let began = Instant::now();
    let first_tick_ns = loop {
        let ns = scalar(&mut checker, &tick_query).await;
        if ns > 0 {
            break ns;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the schedule never fired on the new primary"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ms = |ns: i64| ns as f64 / 1e6;
    let recovery_ms = ms(first_new_ns - asked_ns);

    let rows = committed_runs(&mut checker, "fo_log").await;
    let wide_rows = committed_runs(&mut checker, "fo_wide_log").await;
    let long_rows = committed_runs(&mut checker, "fo_long_log").await;
    let mut committed: HashSet<i64> = rows.iter().map(|r| r.job_id).collect();
    committed.extend(wide_rows.iter().map(|r| r.job_id));
    let duplicates = rows.len() + wide_rows.len() - committed.len();
    // Long mode: a run's row commits as it goes, so a run cut off by the
    // failover may have written its row and run again (a rerun, next to it).
    let long_jobs: HashSet<i64> = long_rows.iter().map(|r| r.job_id).collect();
    let (long_order, long_overlaps, long_reruns) = long_checks(&long_rows);
    let long_on_new = long_rows
        .iter()
        .filter(|r| r.port == i32::from(standby.port()))
        .count();
    committed.extend(long_jobs.iter().copied());
    let hot = check_hot(&mut checker, standby.port()).await;
    committed.extend(hot.committed.iter().copied());
    let wide_peak = peak_overlap(&wide_rows);
    let lost = acknowledged
        .iter()
        .filter(|id| !committed.contains(*id))
        .count();
    let mut order_violations = 0;
    let mut overlaps = 0;
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.grp != b.grp {
            continue;
        }
        if b.seq != a.seq + 1 {
            order_violations += 1;
        }
        if b.started_ns < a.ended_ns {
            overlaps += 1;
        }
    }
    let firsts = rows.iter().filter(|r| r.seq == 0).count();

    let stopping = Instant::now();
    let (main_stop, hot_stop) = tokio::join!(
        runner.shutdown_within(Duration::from_secs(5)),
        hot_runner.shutdown_within(Duration::from_secs(5))
    );
    main_stop.expect("shutdown");
    hot_stop.expect("shutdown of the hot runner");
    let shutdown_took = stopping.elapsed();
    println!(
        "failover: fault={fault:?} replication={replication:?} jobs={total} groups={GROUPS} \
         before_fault={} acknowledged={} lost={lost} reruns={reruns} duplicates={duplicates} \
         order_violations={order_violations} overlaps={overlaps} promote={promote_took:.2?} \
         first_commit_on_new_primary={recovery_ms:.0}ms_after_promote_asked \
         ({:.0}ms_after_pg_ctl_returned) first_tick_on_new_primary={:.0}ms_after_promote_asked \
         wide_jobs={wide_total} wide_peak={wide_peak} long_jobs={long_total} \
         long_ran={} long_order_violations={long_order} long_overlaps={long_overlaps} \
         long_reruns={long_reruns} long_on_new_primary={long_on_new} hot_jobs={hot_total} \
         hot_ran={} hot_duplicates={} hot_order_violations={} hot_overlaps={} \
         hot_followers={} hot_followers_on_new_primary={} shutdown={shutdown_took:.2?}",
        before_fault,
        acknowledged.len(),
        ms(first_new_ns - promoted_ns),
        ms(first_tick_ns - asked_ns),
        long_jobs.len(),
        hot.runs,
        hot.duplicates,
        hot.order_violations,
        hot.overlaps,
        hot.followers,
        hot.followers_on_new,
    );
    assert_eq!(hot.runs as i64, hot_total, "every hot job committed once");
    assert_eq!(hot.duplicates, 0, "hot jobs committed twice");
    assert_eq!(hot.order_violations, 0, "hot groups out of order");
    assert_eq!(hot.overlaps, 0, "runs of a hot group overlapped");
    assert!(hot.followers > 0, "no hot job ran as a follower");
    assert_eq!(long_jobs.len() as i64, long_total, "every long job ran");
    assert_eq!(long_order, 0, "long-mode groups out of order");
    assert_eq!(long_overlaps, 0, "long-mode runs of a group overlapped");
    assert_eq!(rows.len() as i64, total, "every job committed once");
    assert_eq!(
        wide_rows.len() as i64,
        wide_total,
        "every wide job committed once"
    );
    assert!(
        wide_peak <= 2,
        "{wide_peak} runs of a group of concurrency 2 at once"
    );
    assert_eq!(firsts, GROUPS as usize);
    if replication == Replication::Synchronous {
        assert_eq!(lost, 0, "acknowledged successes lost");
        assert_eq!(reruns, 0, "acknowledged successes ran again");
    }
    assert_eq!(duplicates, 0, "jobs committed twice");
    assert_eq!(order_violations, 0, "groups out of order");
    assert_eq!(overlaps, 0, "runs of a group overlapped");
    assert!(
        shutdown_took < Duration::from_secs(5) + pgfifo::runner::ABORT_PATIENCE,
        "shutdown took {shutdown_took:?}"
    );
    // The bound the issue sets with default settings: 30 s after the
    // standby left recovery (5 s when the primary was killed or stopped),
    // counted from when `pg_ctl promote -w` returned: on a loaded machine
    // the promotion itself has taken 5 s. A demotion is bounded like a
    // hang: in one run of several it took 10 s, the round-trip deadline,
    // most likely a COMMIT begun before `default_transaction_read_only`
    // that waited for the synchronous standby promoted away
    // (docs/failover.md; the `.ci/run` summary line shows the figure).
    let bound = match fault {
        Fault::Killed | Fault::Stopped => Duration::from_secs(5),
        Fault::Hung | Fault::Demoted => Duration::from_secs(30),
    };
    let after_promoted_ms = ms(first_new_ns - promoted_ns);
    assert!(
        after_promoted_ms < bound.as_secs_f64() * 1e3,
        "the first job committed on the new primary {after_promoted_ms:.0} ms after the \
         promotion ({recovery_ms:.0} ms after it was asked for)"
    );
    drop(checker);
    drop(primary);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby and a failover; .ci/run runs it with --ignored"]
async fn a_killed_primary_and_a_promoted_synchronous_standby() {
    failover(Fault::Killed, Replication::Synchronous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby and a failover; .ci/run runs it with --ignored"]
async fn a_hung_primary_and_a_promoted_synchronous_standby() {
    failover(Fault::Hung, Replication::Synchronous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby and a failover; .ci/run runs it with --ignored"]
async fn a_stopped_primary_and_a_promoted_synchronous_standby() {
    failover(Fault::Stopped, Replication::Synchronous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby and a failover; .ci/run runs it with --ignored"]
async fn a_demoted_primary_that_takes_no_writes_and_a_promoted_standby() {
    failover(Fault::Demoted, Replication::Synchronous).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "heavy: a primary, a standby and a failover; .ci/run runs it with --ignored"]
async fn a_killed_primary_and_a_promoted_asynchronous_standby() {
    failover(Fault::Killed, Replication::Asynchronous).await;
}

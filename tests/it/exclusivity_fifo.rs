//! Semantics 1 and 2: at most one running job per (queue, group), across
//! workers and across runners; jobs of a group start in enqueue order.
//!
//! Every job logs `(start, end)` of its handler run in its own transaction
//! (`LogJob` → `test_log`). Exclusivity is checked twice, on two clocks: the
//! handler's own interval (process clock) and the interval from the attempt's
//! start row (`pgfifo.job_attempt.started_at`, written after the locks are
//! taken) to the job's completion (`pgfifo.job.finished_at`, written before the
//! commit that frees the group), both on the database clock.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::{test_config, TestDb};

use crate::jobs::{LogJob, LOG_TABLE};

/// How long a test may wait for its jobs before it fails.
const LIMIT: Duration = Duration::from_secs(60);

/// A handler sleep of 1 to 3 ms, varied by position.
fn sleep_ms(group: usize, seq: i64) -> u64 {
    1 + ((group as u64 * 7 + seq as u64) % 3)
}

fn group_name(g: usize) -> String {
    format!("excl-g{g:02}")
}

/// `groups` × `per_group` `LogJob`s, interleaved across groups.
fn interleaved(groups: usize, per_group: i64) -> Vec<NewJob> {
    let mut jobs = Vec::new();
    for seq in 0..per_group {
        for g in 0..groups {
            let job = LogJob {
                group: group_name(g),
                seq,
                sleep_ms: sleep_ms(g, seq),
            };
            jobs.push(NewJob::new(&job, EnqueueOptions::group(group_name(g))).unwrap());
        }
    }
    jobs
}

/// Pairs of runs of one group whose handler intervals overlap (process clock).
async fn handler_overlaps_within_groups(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT count(*) FROM test_log a JOIN test_log b \
           ON a.grp = b.grp AND (a.job_id, a.attempt) < (b.job_id, b.attempt) \
         WHERE a.started_ns < b.ended_ns AND b.started_ns < a.ended_ns",
    )
    .await
}

/// Pairs of jobs of one group whose lock-held intervals overlap (database
/// clock): from the attempt's start record to the job's completion.
async fn locked_overlaps_within_groups(db: &TestDb) -> i64 {
    db.scalar(
        "WITH r AS ( \
           SELECT j.queue, j.group_id, j.id, a.started_at AS s, j.finished_at AS f \
           FROM pgfifo.job j JOIN pgfifo.job_attempt a ON a.job_id = j.id) \
         SELECT count(*) FROM r x JOIN r y \
           ON x.queue = y.queue AND x.group_id = y.group_id AND x.id < y.id \
         WHERE x.s < y.f AND y.s < x.f",
    )
    .await
}

/// Rows of `test_log` whose group's start order disagrees with seq order or
/// with id (enqueue) order.
async fn fifo_violations(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT count(*) FROM ( \
           SELECT seq, job_id, \
                  lag(seq) OVER w AS prev_seq, lag(job_id) OVER w AS prev_id \
           FROM test_log WINDOW w AS (PARTITION BY grp ORDER BY started_ns)) s \
         WHERE prev_seq >= seq OR prev_id >= job_id",
    )
    .await
}

/// Checks that every one of `total` jobs ran exactly once and succeeded.
async fn assert_each_ran_once(db: &TestDb, total: i64) {
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, total);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded' AND attempts = 1")
            .await,
        total,
        "every job succeeded on its first attempt"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM test_log").await,
        total,
        "one committed run per job"
    );
    assert_eq!(
        db.scalar("SELECT count(DISTINCT job_id) FROM test_log")
            .await,
        total,
        "no job ran twice"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await,
        total,
        "one attempt started per job (a duplicate run would start a second one)"
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM test_log l JOIN pgfifo.job j ON j.id = l.job_id \
                   WHERE j.group_id = l.grp AND (j.payload->>'seq')::bigint = l.seq"
        )
        .await,
        total,
        "each log row belongs to its job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_exclusivity_20_groups_25_jobs_concurrency_8() {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, interleaved(20, 25))
        .await
        .unwrap();
    drop(conn);
    assert_eq!(ids.len(), 500);

    let runner = db.start_runner(test_config().concurrency(8)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        500,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_each_ran_once(&db, 500).await;
    assert_eq!(
        handler_overlaps_within_groups(&db).await,
        0,
        "two runs of one group overlapped"
    );
    assert_eq!(
        locked_overlaps_within_groups(&db).await,
        0,
        "two jobs of one group held the group at once"
    );
    assert_eq!(
        fifo_violations(&db).await,
        0,
        "a group's jobs started out of order"
    );
    let across = db
        .scalar(
            "SELECT count(*) FROM test_log a JOIN test_log b ON a.grp < b.grp \
             WHERE a.started_ns < b.ended_ns AND b.started_ns < a.ended_ns",
        )
        .await;
    assert!(
        across > 0,
        "no two groups ever ran at the same time: there is no parallelism across groups"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_exclusivity_holds_across_two_runners() {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    // Two runners with pools of their own, as two processes would have; more
    // workers than groups, so every free group is contended for.
    let pool_a = pgfifo::connect(&db.url, 10).await.unwrap();
    let pool_b = pgfifo::connect(&db.url, 10).await.unwrap();
    let runner_a =
        pgfifo::runner::start(pool_a, test_config().concurrency(6).name("excl-runner-a"))
            .await
            .unwrap();
    let runner_b =
        pgfifo::runner::start(pool_b, test_config().concurrency(6).name("excl-runner-b"))
            .await
            .unwrap();

    let mut conn = db.conn().await;
    // Several batches while both runners are draining. Each batch holds one
    // group: see `enqueue_multi_group_batches_while_running_never_deadlocks`
    // for batches that span groups.
    let mut total = 0;
    for round in 0..4 {
        for g in 0..5 {
            let jobs = (round * 20..(round + 1) * 20).map(|seq| {
                let job = LogJob {
                    group: group_name(g),
                    seq,
                    sleep_ms: u64::from(seq % 2 == 0),
                };
                NewJob::new(&job, EnqueueOptions::group(group_name(g))).unwrap()
            });
            total += pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap().len() as i64;
        }
    }
    drop(conn);
    assert_eq!(total, 400);

    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        total,
        LIMIT,
    )
    .await;
    runner_a.shutdown().await.unwrap();
    runner_b.shutdown().await.unwrap();

    assert_each_ran_once(&db, total).await;
    assert_eq!(
        handler_overlaps_within_groups(&db).await,
        0,
        "two runs of one group overlapped"
    );
    assert_eq!(
        locked_overlaps_within_groups(&db).await,
        0,
        "two jobs of one group held the group at once"
    );
    assert_eq!(
        fifo_violations(&db).await,
        0,
        "a group's jobs started out of order"
    );
    assert_eq!(
        db.scalar("SELECT count(DISTINCT runner) FROM pgfifo.job_attempt")
            .await,
        2,
        "both runners ran jobs"
    );
}

async fn enqueue_one(
    conn: &mut AsyncPgConnection,
    g: usize,
    seq: i64,
    options: EnqueueOptions,
) -> i64 {
    let job = LogJob {
        group: group_name(g),
        seq,
        sleep_ms: sleep_ms(g, seq),
    };
    job.enqueue_with(conn, options).await.unwrap()
}

/// `LogJob`s of group `g` with the given seqs.
fn group_jobs(g: usize, seqs: std::ops::Range<i64>, priority: Option<i16>) -> Vec<NewJob> {
    seqs.map(|seq| {
        let job = LogJob {
            group: group_name(g),
            seq,
            sleep_ms: sleep_ms(g, seq),
        };
        let mut options = EnqueueOptions::group(group_name(g));
        if let Some(priority) = priority {
            options = options.priority(priority);
        }
        NewJob::new(&job, options).unwrap()
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_within_group_for_single_and_batched_enqueues() {
    const GROUPS: usize = 6;
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    let mut conn = db.conn().await;
    let mut ids = Vec::new();

    // 1. Before any runner: one batch spanning every group, interleaved.
    let mut jobs = Vec::new();
    for seq in 0..3 {
        for g in 0..GROUPS {
            jobs.extend(group_jobs(g, seq..seq + 1, None));
        }
    }
    ids.extend(pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap());

    // The rest is enqueued while a runner drains, so groups go idle and busy
    // again between enqueues (both ways a new job becomes a group's head).
    let runner = db.start_runner(test_config().concurrency(4)).await;
    // 2. One by one, alternating groups.
    for seq in 3..8 {
        for g in 0..GROUPS {
            ids.push(enqueue_one(&mut conn, g, seq, EnqueueOptions::group(group_name(g))).await);
        }
    }
    // 3. A batch per group.
    for g in 0..GROUPS {
        ids.extend(
            pgfifo::enqueue_batch(&mut conn, group_jobs(g, 8..14, None))
                .await
                .unwrap(),
        );
    }
    // 4. A single and a batch in one application transaction, per group.
    for g in 0..GROUPS {
        let in_tx = conn
            .transaction::<_, pgfifo::Error, _>(async |c| {
                let mut ids =
                    vec![enqueue_one(c, g, 14, EnqueueOptions::group(group_name(g))).await];
                ids.extend(pgfifo::enqueue_batch(c, group_jobs(g, 15..19, None)).await?);
                Ok(ids)
            })
            .await
            .unwrap();
        ids.extend(in_tx);
    }
    // 5. Singles whose priority rises with seq: priority chooses among
    // groups; it must never let a later job of a group overtake an earlier one.
    for seq in 19..25 {
        for g in (0..GROUPS).rev() {
            let options = EnqueueOptions::group(group_name(g)).priority(seq as i16 * 10);
            ids.push(enqueue_one(&mut conn, g, seq, options).await);
        }
    }
    // 6. Batches per group with a lower priority than the jobs before them.
    for g in (0..GROUPS).rev() {
        ids.extend(
            pgfifo::enqueue_batch(&mut conn, group_jobs(g, 25..30, Some(-5)))
                .await
                .unwrap(),
        );
    }
    drop(conn);
    let total = (GROUPS * 30) as i64;
    assert_eq!(ids.len() as i64, total);

    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        total,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_each_ran_once(&db, total).await;
    assert_eq!(
        fifo_violations(&db).await,
        0,
        "a group's jobs started out of order"
    );
    // Each group started exactly seq 0, 1, 2, … 29 in that order.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM ( \
               SELECT seq, row_number() OVER (PARTITION BY grp ORDER BY started_ns) - 1 AS pos \
               FROM test_log) s WHERE seq <> pos",
        )
        .await,
        0,
        "start order within a group is enqueue order"
    );
    assert_eq!(handler_overlaps_within_groups(&db).await, 0);
    assert_eq!(locked_overlaps_within_groups(&db).await, 0);
}

/// Batches that span several groups, enqueued while a runner drains those
/// groups (so they keep going idle and active again), never fail and keep
/// every guarantee. An earlier revision failed here now and then with
/// `deadlock detected`: a pick statement that met a group's row just after
/// that group went idle kept the row lock (PostgreSQL keeps the lock of a row
/// that fails the WHERE re-check under `FOR UPDATE`), and an enqueuer that
/// updated the idle group's row while holding the advisory lock of the
/// picker's own group waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_multi_group_batches_while_running_never_deadlocks() {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    let runner = db.start_runner(test_config().concurrency(6)).await;
    let mut conn = db.conn().await;
    let started = std::time::Instant::now();
    let mut total = 0;
    let mut seq = 0;
    // The race is narrow: keep groups draining and refilling for a while.
    while seq < 100 && started.elapsed() < Duration::from_secs(4) {
        let mut jobs = Vec::new();
        for g in 0..8 {
            let job = LogJob {
                group: group_name(g),
                seq,
                sleep_ms: (seq as u64 + g as u64) % 3,
            };
            jobs.push(NewJob::new(&job, EnqueueOptions::group(group_name(g))).unwrap());
        }
        match pgfifo::enqueue_batch(&mut conn, jobs).await {
            Ok(ids) => total += ids.len() as i64,
            Err(err) => panic!(
                "enqueue of batch {seq} failed after {:?} ({total} jobs enqueued): {err}",
                started.elapsed()
            ),
        }
        seq += 1;
        // Roughly the time the runner needs for a batch, so groups go idle.
        tokio::time::sleep(Duration::from_millis(4 * (1 + seq as u64 % 3) / 2)).await;
    }
    drop(conn);
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        total,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();
    assert_each_ran_once(&db, total).await;
    assert_eq!(fifo_violations(&db).await, 0);
}

//! Upgrades from release 0.1.0: its frozen schema, filled through its own
//! SQL protocol with jobs in every state, then `migrate` and this release's
//! runner. Nothing is lost or run twice, every group keeps its order, and
//! what was paused, held or failed behaves as it did. And the rolling deploy
//! `docs/upgrading.md` promises: a 0.1.0 runner keeps working, without a job
//! run twice or out of order, while `migrate` runs under it and while a new
//! runner shares its queues.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{admin, async_trait, migrate, EnqueueOptions, Handler, Job, JobContext, JobError};
use pgfifo_tests::release_0_1_0::{self as old, OldJob, OldRunner};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// The job of both releases: logs its run in the job's transaction.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "upgrade", max_attempts = 3, backoff = "10ms")]
struct UpgradeJob {
    seq: i64,
}

/// Its kind, as 0.1.0 stored it: the type's name.
const KIND: &str = "UpgradeJob";

const LOG: &str = "CREATE TABLE upgrade_log (
    log_id bigserial PRIMARY KEY, job_id bigint NOT NULL, queue text NOT NULL,
    group_id text, seq bigint NOT NULL, attempt int NOT NULL, release text NOT NULL)";

#[async_trait]
impl Handler for UpgradeJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
        let (queue, group) = (ctx.queue().to_owned(), ctx.group().map(str::to_owned));
        diesel::sql_query(
            "INSERT INTO upgrade_log (job_id, queue, group_id, seq, attempt, release) \
             VALUES ($1, $2, $3, $4, $5, 'new')",
        )
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(queue)
        .bind::<diesel::sql_types::Nullable<Text>, _>(group)
        .bind::<BigInt, _>(self.seq)
        .bind::<Integer, _>(attempt)
        .execute(ctx.conn())
        .await?;
        Ok(())
    }
}

/// What an old runner's handler writes in the job's transaction.
fn old_log(job: &old::Taken) -> String {
    format!(
        "INSERT INTO upgrade_log (job_id, queue, group_id, seq, attempt, release) \
         VALUES ({}, '{}', {}, {}, {}, '0.1.0')",
        job.id,
        job.queue,
        job.group
            .as_deref()
            .map_or("NULL".to_owned(), |g| format!("'{g}'")),
        job.payload["seq"],
        job.attempt
    )
}

fn job<'a>(queue: &'a str, group: &'a str, seq: i64) -> OldJob<'a> {
    OldJob {
        queue,
        group: Some(group),
        kind: KIND,
        payload: serde_json::json!({ "seq": seq }),
        max_attempts: 3,
        unique_key: None,
        delay: None,
    }
}

#[derive(QueryableByName, Debug)]
struct Run {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Text)]
    group_id: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

/// Every logged run, in the order the runs committed.
async fn runs(conn: &mut AsyncPgConnection) -> Vec<Run> {
    diesel::sql_query(
        "SELECT job_id, queue || '/' || group_id AS group_id, seq, attempt \
         FROM upgrade_log ORDER BY log_id",
    )
    .load(conn)
    .await
    .expect("read the log")
}

/// Each job's runs in one list per group, in commit order.
fn by_group(runs: &[Run]) -> BTreeMap<&str, Vec<i64>> {
    let mut groups: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for run in runs {
        groups.entry(&run.group_id).or_default().push(run.seq);
    }
    groups
}

/// No job logged twice.
fn assert_once(runs: &[Run]) {
    let mut seen = HashSet::new();
    for run in runs {
        assert!(
            seen.insert(run.job_id),
            "job {} ran twice: {runs:?}",
            run.job_id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_0_1_0_database_with_jobs_in_every_state_upgrades_and_drains() {
    let db = TestDb::unmigrated().await;
    old::install(&db.url).await;
    db.exec(LOG).await;
    let mut conn = db.direct().await;
    let (q, held, paused, crash) = ("upgrade", "upgrade_hold", "upgrade_paused", "upgrade_crash");
    let mut ids: BTreeMap<&str, i64> = BTreeMap::new();
    // First what a 0.1.0 runner works on before the upgrade: b1 fails once
    // and is due again after the upgrade (b2 waits behind it); e1 fails for
    // good under the `continue` policy and e2 succeeds; h1 fails for good
    // under `hold` and holds h2 and h3.
    ids.insert("b1", old::enqueue(&mut conn, &job(q, "b", 1)).await);
    ids.insert("b2", old::enqueue(&mut conn, &job(q, "b", 2)).await);
    ids.insert("e1", old::enqueue(&mut conn, &job(q, "e", 1)).await);
    ids.insert("e2", old::enqueue(&mut conn, &job(q, "e", 2)).await);
    ids.insert("h1", old::enqueue(&mut conn, &job(held, "h", 1)).await);
    ids.insert("h2", old::enqueue(&mut conn, &job(held, "h", 2)).await);
    ids.insert("h3", old::enqueue(&mut conn, &job(held, "h", 3)).await);
    ids.insert("d1", old::enqueue(&mut conn, &job(crash, "d", 1)).await);
    ids.insert("d2", old::enqueue(&mut conn, &job(crash, "d", 2)).await);
    old::admin::set_failure_policy(&mut conn, held, "hold").await;
    let mut runner = OldRunner::connect(&db.url, "old-runner").await;
    let mut wanted: BTreeMap<i64, &str> = ["b1", "e1", "e2", "h1"]
        .into_iter()
        .map(|name| (ids[name], name))
        .collect();
    while !wanted.is_empty() {
        let taken = runner
            .take(&[q, held])
            .await
            .unwrap_or_else(|| panic!("the 0.1.0 runner found none of {wanted:?}"));
        match wanted.remove(&taken.id) {
            Some("b1") => {
                let later = Some(Duration::from_secs(3));
                runner.finish(&taken, "retry", Some("boom"), later).await
            }
            Some("e2") => {
                runner.in_job(&old_log(&taken)).await;
                runner.finish(&taken, "succeeded", None, None).await
            }
            Some(_) => {
                runner
                    .finish(&taken, "failed", Some("for good"), None)
                    .await
            }
            None => panic!("the 0.1.0 runner took {taken:?}, not one of {wanted:?}"),
        }
    }
    // d1 is running on a connection that then dies, its work uncommitted.
    let mut dying = OldRunner::connect(&db.url, "old-dying").await;
    let taken = dying.take(&[crash]).await.expect("d1 is its queue's head");
    assert_eq!(taken.id, ids["d1"]);
    dying.in_job(&old_log(&taken)).await;
    let pid = dying.job_backend_pid().await;
    db.exec(&format!("SELECT pg_terminate_backend({pid})"))
        .await;
    db.wait_for(
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
        0,
        LIMIT,
    )
    .await;

    // Then the rest: queued (a), delayed (c1, c2 behind it), a group with
    // the failed e1 and more work (e3), cancelled (f1), a paused group (g),
    // a unique key still held by its unfinished job (u1), a paused queue.
    for (name, seq) in [("a1", 1), ("a2", 2), ("a3", 3)] {
        ids.insert(name, old::enqueue(&mut conn, &job(q, "a", seq)).await);
    }
    let delayed = OldJob {
        delay: Some(Duration::from_secs(3)),
        ..job(q, "c", 1)
    };
    ids.insert("c1", old::enqueue(&mut conn, &delayed).await);
    ids.insert("c2", old::enqueue(&mut conn, &job(q, "c", 2)).await);
    ids.insert("e3", old::enqueue(&mut conn, &job(q, "e", 3)).await);
    ids.insert("f1", old::enqueue(&mut conn, &job(q, "f", 1)).await);
    ids.insert("f2", old::enqueue(&mut conn, &job(q, "f", 2)).await);
    ids.insert("g1", old::enqueue(&mut conn, &job(q, "g", 1)).await);
    ids.insert("g2", old::enqueue(&mut conn, &job(q, "g", 2)).await);
    let keyed = OldJob {
        unique_key: Some("invoice-7"),
        ..job(q, "u", 1)
    };
    ids.insert("u1", old::enqueue(&mut conn, &keyed).await);
    ids.insert("p1", old::enqueue(&mut conn, &job(paused, "p", 1)).await);
    ids.insert("p2", old::enqueue(&mut conn, &job(paused, "p", 2)).await);
    old::admin::pause_group(&mut conn, q, "g").await;
    old::admin::pause_queue(&mut conn, paused).await;
    old::admin::cancel_job(&mut conn, ids["f1"]).await;
    let id = |name: &str| ids[name];

    let state = |name: &str| state_of(&db, id(name));
    assert_eq!(
        waiting(&db, id("b1"), 1).await,
        1,
        "b1 is not waiting for its retry"
    );
    assert_eq!(waiting(&db, id("c1"), 0).await, 1, "c1 is not delayed");
    assert_eq!(state("e1").await, "failed");
    assert_eq!(state("f1").await, "cancelled");
    assert_eq!(state("h1").await, "failed");
    assert_eq!(state("d1").await, "queued");

    // This release's runner will not run on the 0.1.0 schema.
    let refused = pgfifo::runner::start(db.pool.clone(), test_config())
        .await
        .map(|_| "a runner")
        .expect_err("a runner started on the 0.1.0 schema");
    let message = refused.to_string();
    assert!(
        matches!(
            refused,
            pgfifo::Error::SchemaOutdated { found: Some(2), .. }
        ) && message.contains("at version 2 (pgfifo 0.1.0)")
            && message.contains(&format!("needs version {}", migrate::latest_version()))
            && message.contains("pgfifo migrate up"),
        "{message}"
    );

    // The upgrade.
    let migrated = migrate::migrate(&db.pool).await.expect("migrate");
    assert!(
        migrated.applied.contains(&migrate::latest_version()),
        "{migrated:?}"
    );
    let after = migrate::status(&mut db.direct().await).await.unwrap();
    assert!(after.is_current(), "{after:?}");

    // The unique key still holds across the upgrade.
    let again = UpgradeJob { seq: 99 }
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group("u").unique_key("invoice-7"),
        )
        .await
        .unwrap();
    assert_eq!(again, id("u1"), "the unique key was forgotten");

    // Drain with this release's runner.
    let handle = db
        .start_runner(test_config().queues([q, held, paused, crash]))
        .await;
    let runnable = [
        "a1", "a2", "a3", "b1", "b2", "c1", "c2", "d1", "d2", "e3", "f2", "u1",
    ];
    let runnable_ids: Vec<i64> = runnable.iter().map(|n| id(n)).collect();
    db.wait_jobs_in(&runnable_ids, "succeeded", LIMIT).await;
    // Paused and held work stayed put.
    for name in ["g1", "g2", "p1", "p2", "h2", "h3"] {
        assert_eq!(
            state(name).await,
            "queued",
            "{name} ran while paused or held"
        );
    }
    // Failed jobs are retried in their order: e1 alone (its group went on),
    // h1 then the group it held.
    admin::retry_failed(&mut conn, q, None).await.unwrap();
    admin::retry_failed(&mut conn, held, None).await.unwrap();
    admin::resume_group(&mut conn, q, "g").await.unwrap();
    admin::resume_queue(&mut conn, paused).await.unwrap();
    let rest: Vec<i64> = ["e1", "g1", "g2", "h1", "h2", "h3", "p1", "p2"]
        .iter()
        .map(|n| id(n))
        .collect();
    db.wait_jobs_in(&rest, "succeeded", LIMIT).await;
    handle.shutdown().await.unwrap();

    let log = runs(&mut conn).await;
    assert_once(&log);
    let groups = by_group(&log);
    let expect: BTreeMap<&str, Vec<i64>> = [
        ("upgrade/a", vec![1, 2, 3]),
        ("upgrade/b", vec![1, 2]),
        ("upgrade/c", vec![1, 2]),
        // d1's first run died with its connection: its log row with it.
        ("upgrade_crash/d", vec![1, 2]),
        ("upgrade/e", vec![2, 3, 1]),
        ("upgrade/f", vec![2]),
        ("upgrade/g", vec![1, 2]),
        ("upgrade/u", vec![1]),
        ("upgrade_hold/h", vec![1, 2, 3]),
        ("upgrade_paused/p", vec![1, 2]),
    ]
    .into();
    assert_eq!(groups, expect);
    // Attempts carried over: b1 and d1 ran their second attempt.
    let attempt = |job_id: i64| log.iter().find(|r| r.job_id == job_id).unwrap().attempt;
    assert_eq!(attempt(id("b1")), 2);
    assert_eq!(attempt(id("d1")), 2);
    assert_eq!(state("f1").await, "cancelled");
}

/// Job `id`'s state.
async fn state_of(db: &TestDb, id: i64) -> String {
    let state = db.job_state(id).await;
    state.split(' ').next().unwrap().to_owned()
}

/// 1 if job `id` waits for a later time after `attempts` attempts.
async fn waiting(db: &TestDb, id: i64, attempts: i32) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'queued' \
         AND run_after > now() AND attempts = {attempts}"
    ))
    .await
}

/// The rolling deploy: a 0.1.0 runner works through `migrate` and then
/// alongside this release's runner; every job runs once, in group order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_0_1_0_runner_keeps_working_through_migrate_and_beside_a_new_runner() {
    const GROUPS: i64 = 8;
    const PER_GROUP: i64 = 40;
    let db = TestDb::unmigrated().await;
    old::install(&db.url).await;
    db.exec(LOG).await;
    let mut conn = db.direct().await;
    let q = "upgrade";
    for seq in 1..=PER_GROUP {
        for g in 0..GROUPS {
            let group = format!("r{g}");
            old::enqueue(&mut conn, &job(q, &group, seq)).await;
        }
    }

    // The old runner: two lanes of 0.1.0, each a job at a time.
    let stop = Arc::new(AtomicBool::new(false));
    let mut lanes = Vec::new();
    for lane in 0..2 {
        let (url, stop) = (db.url.clone(), stop.clone());
        lanes.push(tokio::spawn(async move {
            let mut runner = OldRunner::connect(&url, &format!("old-{lane}")).await;
            while !AtomicBool::load(&stop, Ordering::Relaxed) {
                match runner.take(&[q]).await {
                    Some(taken) => {
                        runner.in_job(&old_log(&taken)).await;
                        runner.finish(&taken, "succeeded", None, None).await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }));
    }
    let total = GROUPS * PER_GROUP;
    db.wait_for("SELECT least(count(*), 20) FROM upgrade_log", 20, LIMIT)
        .await;

    // migrate runs while the old lanes hold job transactions.
    migrate::migrate(&db.pool)
        .await
        .expect("migrate under a 0.1.0 runner");
    let at_migrate = db.scalar("SELECT count(*) FROM upgrade_log").await;
    assert!(at_migrate < total, "the old runner finished before migrate");
    // The old runner goes on after the upgrade...
    let mark = at_migrate;
    db.wait_for(
        &format!("SELECT least(count(*), {}) FROM upgrade_log", mark + 10),
        mark + 10,
        LIMIT,
    )
    .await;
    // ...and beside a runner of this release until the queue is empty.
    let handle = db.start_runner(test_config().queues([q])).await;
    db.wait_for("SELECT count(*) FROM upgrade_log", total, LIMIT)
        .await;
    stop.store(true, Ordering::Relaxed);
    for lane in lanes {
        lane.await.expect("an old lane panicked");
    }
    handle.shutdown().await.unwrap();

    let log = runs(&mut conn).await;
    assert_eq!(log.len() as i64, total);
    assert_once(&log);
    let sorted: Vec<i64> = (1..=PER_GROUP).collect();
    for (group, seqs) in by_group(&log) {
        assert_eq!(seqs, sorted, "group {group} ran out of order");
    }
    let by =
        |release: &str| format!("SELECT count(*) FROM upgrade_log WHERE release = '{release}'");
    assert!(
        db.scalar(&by("0.1.0")).await > at_migrate,
        "the old runner stopped at migrate"
    );
    assert!(
        db.scalar(&by("new")).await > 0,
        "the new runner ran nothing"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state <> 'succeeded'")
            .await,
        0
    );
}

/// Going back: `migrate down` to 0.1.0's schema keeps this release's
/// functions, and a 0.1.0 runner goes on with them. Group controls' tables
/// go with their migration; the functions that look for them do without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_migrate_down_a_0_1_0_runner_works_with_this_releases_functions() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let slow = pgfifo::GroupLimits::new().rate(pgfifo::Rate::per_minute(1).unwrap());
    admin::set_group_limits(&mut conn, "upgrade", "r", slow)
        .await
        .unwrap();
    let since_0_1_0 = (migrate::latest_version() - 2) as usize;
    migrate::rollback(&mut conn, since_0_1_0).await.unwrap();
    let gone = db
        .scalar("SELECT (to_regclass('pgfifo.group_control') IS NULL)::int")
        .await;
    assert_eq!(gone, 1);

    let first = old::enqueue(&mut conn, &job("upgrade", "r", 1)).await;
    let second = old::enqueue(&mut conn, &job("upgrade", "r", 2)).await;
    let mut runner = OldRunner::connect(&db.url, "old-after-down").await;
    let taken = runner.take(&["upgrade"]).await.expect("the first job");
    assert_eq!(taken.id, first);
    runner.finish(&taken, "succeeded", None, None).await;
    // No rate limit any more: the next job is there at once, and a retry
    // goes through the same functions.
    let taken = runner.take(&["upgrade"]).await.expect("the second job");
    assert_eq!(taken.id, second);
    runner
        .finish(&taken, "retry", Some("once"), Some(Duration::ZERO))
        .await;
    let taken = runner.take(&["upgrade"]).await.expect("its retry");
    assert_eq!((taken.id, taken.attempt), (second, 2));
    runner.finish(&taken, "succeeded", None, None).await;
    assert_eq!(state_of(&db, first).await, "succeeded");
    assert_eq!(state_of(&db, second).await, "succeeded");
}

//! De-duplication windows per key (docs/dedup-windows.md): each mode, a
//! batch with one key twice, bad input, retention, and `migrate down`. The
//! job type and helpers also serve `dedup_windows_races` (concurrent
//! producers, application transactions, a debounced head and FIFO).

use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{
    async_trait, enqueue_batch, enqueue_batch_outcomes, migrate, EnqueueOptions, EnqueueOutcome,
    Enqueued, Error, Handler, Job, JobContext, JobError, JobId, NewJob, Retention,
};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::enqueue_api::gate;

pub(crate) const QUEUE: &str = "dedup";

/// A job of this module: optionally waits for its gate, then logs
/// `(job_id, tag)` to `dedup_log` (in its own transaction: a row means the
/// job ran to its end).
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "dedup", max_attempts = 1, timeout = "30s")]
pub struct DedupJob {
    tag: String,
    gate: Option<String>,
}

#[async_trait]
impl Handler for DedupJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if let Some(name) = &self.gate {
            gate(name).acquire_owned().await?.forget();
        }
        diesel::sql_query("INSERT INTO dedup_log (job_id, tag) VALUES ($1, $2)")
            .bind::<BigInt, _>(ctx.id())
            .bind::<Text, _>(&self.tag)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

/// A fresh database with the log table.
pub(crate) async fn setup() -> TestDb {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE dedup_log (n bigserial PRIMARY KEY, job_id bigint NOT NULL, tag text NOT NULL)")
        .await;
    db
}

/// A job of group `group` tagged `tag`, with `options` applied.
pub(crate) fn new_job(
    tag: &str,
    group: &str,
    options: impl FnOnce(EnqueueOptions) -> EnqueueOptions,
) -> NewJob {
    new_gated(tag, None, group, options)
}

/// As [`new_job`], waiting for gate `gate` when it runs.
pub(crate) fn new_gated(
    tag: &str,
    gate: Option<&str>,
    group: &str,
    options: impl FnOnce(EnqueueOptions) -> EnqueueOptions,
) -> NewJob {
    let job = DedupJob {
        tag: tag.into(),
        gate: gate.map(Into::into),
    };
    NewJob::new(&job, options(EnqueueOptions::group(group))).expect("valid options")
}

/// Enqueues one job and returns what happened.
pub(crate) async fn one(conn: &mut AsyncPgConnection, job: NewJob) -> Enqueued {
    let out = enqueue_batch_outcomes(conn, [job]).await.expect("enqueue");
    assert_eq!(out.len(), 1);
    out[0]
}

const HOUR: Duration = Duration::from_secs(3600);

fn created(id: JobId) -> Enqueued {
    Enqueued {
        id,
        outcome: EnqueueOutcome::Created,
    }
}

fn folded(id: JobId, outcome: EnqueueOutcome) -> Enqueued {
    Enqueued { id, outcome }
}

async fn jobs(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pgfifo.job").await
}

async fn windows(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pgfifo.job_window").await
}

async fn payload_tag(db: &TestDb, id: JobId) -> String {
    db.text(&format!(
        "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {id}"
    ))
    .await
    .expect("the job exists")
}

/// Ends the window of `key` (as if its period had passed).
async fn expire(db: &TestDb, key: &str) {
    db.exec(&format!(
        "UPDATE pgfifo.job_window SET until = now() - interval '1 second' WHERE key = '{key}'"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_for_a_period_returns_the_job_whatever_its_state() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let unique = |o: EnqueueOptions| o.unique_for("order-7", HOUR);

    let first = one(&mut conn, new_job("first", "g", unique)).await;
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let again = one(&mut conn, new_job("again", "other-group", unique)).await;
    assert_eq!(again, folded(first.id, EnqueueOutcome::Deduplicated));
    // Through the plain batch API: the same id, nothing written.
    let ids = enqueue_batch(&mut conn, [new_job("plain", "g", unique)])
        .await
        .unwrap();
    assert_eq!(ids, vec![first.id]);
    assert_eq!(jobs(&db).await, 1);
    assert_eq!(
        payload_tag(&db, first.id).await,
        "first",
        "the first payload is kept"
    );

    // Finished: the window still holds (unlike unique_key).
    let runner = db.start_runner(test_config()).await;
    db.wait_job_succeeded(first.id, Duration::from_secs(20))
        .await;
    let after_run = one(&mut conn, new_job("after-run", "g", unique)).await;
    assert_eq!(after_run, folded(first.id, EnqueueOutcome::Deduplicated));
    assert_eq!(jobs(&db).await, 1);

    // The same key in another queue is another window.
    let other_queue = one(
        &mut conn,
        new_job("q2", "g", |o| unique(o.queue("dedup_other"))),
    )
    .await;
    assert_eq!(other_queue.outcome, EnqueueOutcome::Created);

    // Once the period is over, the key takes a new job and a new window.
    expire(&db, "order-7").await;
    let next = one(&mut conn, new_job("next", "g", unique)).await;
    assert_eq!(next.outcome, EnqueueOutcome::Created);
    assert!(next.id > first.id);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_window WHERE queue = '{QUEUE}' AND key = 'order-7' \
             AND mode = 'unique' AND job_id = {} AND until > now() + interval '59 minutes'",
            next.id
        ))
        .await,
        1
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_allows_one_job_per_aligned_slot() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let day = Duration::from_secs(86_400);
    let throttle = |o: EnqueueOptions| o.throttle("sync-42", day);

    let first = one(&mut conn, new_job("first", "g", throttle)).await;
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    for tag in ["2", "3"] {
        let out = one(&mut conn, new_job(tag, "g", throttle)).await;
        assert_eq!(out, folded(first.id, EnqueueOutcome::Throttled));
    }
    assert_eq!(jobs(&db).await, 1);
    // The slot ends at the next multiple of the period since the epoch (for a
    // day: the next midnight UTC), not a day after the first enqueue.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM pgfifo.job_window WHERE key = 'sync-42' AND mode = 'throttle' \
             AND until = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day'"
        )
        .await,
        1
    );
    expire(&db, "sync-42").await;
    let next = one(&mut conn, new_job("next", "g", throttle)).await;
    assert_eq!(next.outcome, EnqueueOutcome::Created);
    assert_ne!(next.id, first.id);
    assert_eq!(jobs(&db).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_replaces_a_queued_job_and_moves_its_start() {
    let db = setup().await;
    let mut conn = db.conn().await;

    let first = one(&mut conn, new_job("v1", "g", |o| o.debounce("doc-9", HOUR))).await;
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let start_of = |id: JobId| {
        format!("SELECT (extract(epoch FROM run_after) * 1000000)::bigint FROM pgfifo.job WHERE id = {id}")
    };
    let before = db.scalar(&start_of(first.id)).await;
    let second = one(
        &mut conn,
        new_job("v2", "g", |o| o.debounce("doc-9", 2 * HOUR)),
    )
    .await;
    assert_eq!(second, folded(first.id, EnqueueOutcome::Debounced));
    assert_eq!(jobs(&db).await, 1);
    assert_eq!(
        payload_tag(&db, first.id).await,
        "v2",
        "the latest payload wins"
    );
    let after = db.scalar(&start_of(first.id)).await;
    assert!(
        after >= before + 3_000_000_000,
        "start moved to now + the quiet period: {before} -> {after}"
    );
    // The window follows the job's start.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_window AS w JOIN pgfifo.job AS j ON j.id = w.job_id \
             WHERE w.key = 'doc-9' AND w.mode = 'debounce' AND w.until = j.run_after AND j.id = {}",
            first.id
        ))
        .await,
        1
    );
    // A key held by an open debounce window refuses another mode, writing nothing.
    let other = enqueue_batch_outcomes(
        &mut conn,
        [new_job("u", "g", |o| o.unique_for("doc-9", HOUR))],
    )
    .await;
    let err = other.expect_err("another mode on an open window");
    assert!(
        err.to_string().contains("held by a debounce window"),
        "{err}"
    );
    assert_eq!(jobs(&db).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_one_key_twice_folds_the_second_into_the_first() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let out = enqueue_batch_outcomes(
        &mut conn,
        [
            new_job("u1", "a", |o| o.unique_for("u", HOUR)),
            new_job("u2", "a", |o| o.unique_for("u", HOUR)),
            new_job("t1", "b", |o| o.throttle("t", HOUR)),
            new_job("t2", "b", |o| o.throttle("t", HOUR)),
            new_job("d1", "c", |o| o.debounce("d", HOUR)),
            new_job("d2", "c", |o| o.debounce("d", HOUR)),
            new_job("k1", "c", |o| o.unique_key("k")),
            new_job("k2", "c", |o| o.unique_key("k")),
            new_job("plain", "c", |o| o),
        ],
    )
    .await
    .unwrap();
    let id = |i: usize| out[i].id;
    assert_eq!(
        out,
        vec![
            created(id(0)),
            folded(id(0), EnqueueOutcome::Deduplicated),
            created(id(2)),
            folded(id(2), EnqueueOutcome::Throttled),
            created(id(4)),
            folded(id(4), EnqueueOutcome::Debounced),
            created(id(6)),
            folded(id(6), EnqueueOutcome::Deduplicated),
            created(id(8)),
        ]
    );
    // Ids of created jobs ascend in input order (FIFO within a group).
    assert!(id(0) < id(2) && id(2) < id(4) && id(4) < id(6) && id(6) < id(8));
    assert_eq!(jobs(&db).await, 5);
    assert_eq!(payload_tag(&db, id(4)).await, "d2");
    assert_eq!(windows(&db).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_windows_are_refused_before_anything_is_written() {
    let db = setup().await;
    let job = DedupJob {
        tag: "bad".into(),
        gate: None,
    };
    let bad: Vec<(&str, EnqueueOptions)> = vec![
        (
            "period",
            EnqueueOptions::group("g").unique_for("k", Duration::ZERO),
        ),
        (
            "period",
            EnqueueOptions::group("g").throttle("k", Duration::from_nanos(10)),
        ),
        ("key", EnqueueOptions::group("g").debounce("", HOUR)),
        (
            "key",
            EnqueueOptions::group("g").throttle("x".repeat(300), HOUR),
        ),
        (
            "one window",
            EnqueueOptions::group("g")
                .unique_for("k", HOUR)
                .debounce("k", HOUR),
        ),
        (
            "not both",
            EnqueueOptions::group("g")
                .unique_key("k")
                .throttle("k", HOUR),
        ),
        (
            "run_at",
            EnqueueOptions::group("g").run_in(HOUR).debounce("k", HOUR),
        ),
    ];
    for (what, options) in bad {
        match NewJob::new(&job, options) {
            Err(Error::InvalidOption(message)) => {
                assert!(message.contains(what), "{what}: {message}")
            }
            other => panic!("{what}: expected InvalidOption, got {other:?}"),
        }
    }
    // The SQL function checks every row before writing any.
    let rows = [
        ("'unique'", "NULL::text", "1000000"),
        ("'sometimes'", "'k'", "1000000"),
        ("'throttle'", "'k'", "0"),
        ("'debounce'", "'k'", "-5"),
        ("NULL::text", "'k'", "1000000"),
    ];
    for (mode, key, us) in rows {
        let sql = format!(
            "SELECT cardinality(ids) FROM pgfifo.enqueue_outcomes(\
             ARRAY['{QUEUE}', '{QUEUE}'], ARRAY['g', 'g'], ARRAY['DedupJob', 'DedupJob'], \
             ARRAY['{{}}'::jsonb, '{{}}'::jsonb], ARRAY[0, 0]::smallint[], ARRAY[1, 1], \
             ARRAY[NULL, NULL]::text[], ARRAY[NULL, NULL]::bigint[], ARRAY[NULL, NULL]::bigint[], \
             ARRAY['fine', {key}], ARRAY['unique', {mode}], ARRAY[1000000, {us}]::bigint[])"
        );
        let err = diesel::sql_query(&sql)
            .execute(&mut *db.conn().await)
            .await
            .expect_err(&sql);
        assert!(err.to_string().contains("window"), "{sql}: {err}");
    }
    assert_eq!(jobs(&db).await, 0);
    assert_eq!(windows(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_windows_that_hold_nothing() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let open_unique = one(&mut conn, new_job("a", "g", |o| o.unique_for("open", HOUR))).await;
    one(
        &mut conn,
        new_job("b", "g", |o| o.unique_for("ended", HOUR)),
    )
    .await;
    one(
        &mut conn,
        new_job("c", "g", |o| o.throttle("ended-t", HOUR)),
    )
    .await;
    let debounced = one(&mut conn, new_job("d", "h", |o| o.debounce("queued", HOUR))).await;
    let finished = one(
        &mut conn,
        new_job("e", "i", |o| o.debounce("finished", HOUR)),
    )
    .await;
    expire(&db, "ended").await;
    expire(&db, "ended-t").await;
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {}",
        finished.id
    ))
    .await;
    // A runner's retention pass, in batches of 2.
    let retention = Retention::default()
        .finished_after(HOUR)
        .failed_after(None)
        .idle_groups_after(None)
        .interval(Duration::from_millis(100))
        .batch_size(2);
    let runner = db.start_runner(test_config().retention(retention)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job_window",
        2,
        Duration::from_secs(20),
    )
    .await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.text("SELECT string_agg(key, ',' ORDER BY key) FROM pgfifo.job_window")
            .await
            .as_deref(),
        Some("open,queued")
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_window WHERE job_id IN ({}, {})",
            open_unique.id, debounced.id
        ))
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_down_refuses_windows_clearly_and_up_brings_them_back() {
    let db = setup().await;
    let mut conn = db.direct().await;
    // Down to just before the migration dedup_windows (and whatever came
    // after it).
    let windows = migrate::MIGRATIONS
        .iter()
        .find(|m| m.name == "dedup_windows")
        .expect("the migration dedup_windows")
        .version;
    let newer: Vec<i64> = migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| *v >= windows)
        .rev()
        .collect();
    let reverted = migrate::rollback(&mut conn, newer.len()).await.unwrap();
    assert_eq!(reverted, newer);
    let err = enqueue_batch_outcomes(&mut conn, [new_job("w", "g", |o| o.unique_for("k", HOUR))])
        .await
        .expect_err("no window table");
    assert!(err.to_string().contains("migration dedup_windows"), "{err}");
    // Enqueues without windows work on the older schema, with outcomes too.
    let plain = one(&mut conn, new_job("p", "g", |o| o)).await;
    assert_eq!(plain.outcome, EnqueueOutcome::Created);
    let ids = enqueue_batch(&mut conn, [new_job("p2", "g", |o| o)])
        .await
        .unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(jobs(&db).await, 2);

    migrate::migrate_conn(&mut conn).await.unwrap();
    let w = one(&mut conn, new_job("w", "g", |o| o.unique_for("k", HOUR))).await;
    assert_eq!(w.outcome, EnqueueOutcome::Created);
    let again = one(&mut conn, new_job("w2", "g", |o| o.unique_for("k", HOUR))).await;
    assert_eq!(again, folded(w.id, EnqueueOutcome::Deduplicated));
}

//! The SQL API for producers in other languages (`pgfifo.add_job`,
//! `pgfifo.add_jobs`, docs/enqueue-from-sql.md), called as another language
//! would: plain SQL with named parameters and bound values. Every option,
//! the defaults, the caller's transaction (commit and rollback), unique keys,
//! and bad input (each bad field: a clear error naming it, nothing written).
//! Bad input is in `sql_api_bad_input.rs`, the runner side in
//! `sql_api_runs.rs`.

use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

/// A registered type, to enqueue from Rust beside SQL. It never runs here.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "sql_api", kind = "sql_api.job")]
struct SqlApiJob {
    n: i64,
}

#[async_trait]
impl Handler for SqlApiJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[derive(QueryableByName, Debug)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[derive(QueryableByName, Debug)]
struct Ids {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

/// A stored job as the tests compare it.
#[derive(QueryableByName, Debug, PartialEq)]
struct Stored {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    group_id: Option<String>,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Jsonb)]
    payload: serde_json::Value,
    #[diesel(sql_type = SmallInt)]
    priority: i16,
    #[diesel(sql_type = Integer)]
    max_attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    unique_key: Option<String>,
    /// `run_after - created_at` in whole microseconds (both taken from the
    /// enqueuing transaction's clock, so a delay shows exactly).
    #[diesel(sql_type = BigInt)]
    delay_us: i64,
    /// `run_after` as microseconds since the epoch.
    #[diesel(sql_type = BigInt)]
    run_after_us: i64,
}

/// The test's own query of the stored jobs, in id order.
async fn stored(conn: &mut AsyncPgConnection) -> Vec<Stored> {
    diesel::sql_query(
        "SELECT id, queue, group_id, kind, payload, priority, max_attempts, unique_key, \
                (extract(epoch FROM run_after - created_at) * 1000000)::bigint AS delay_us, \
                (extract(epoch FROM run_after) * 1000000)::bigint AS run_after_us \
         FROM pgfifo.job ORDER BY id",
    )
    .load(conn)
    .await
    .expect("read the jobs")
}

async fn add_jobs(conn: &mut AsyncPgConnection, jobs: serde_json::Value) -> Vec<i64> {
    let row: Ids = diesel::sql_query("SELECT pgfifo.add_jobs(jobs => $1) AS ids")
        .bind::<Jsonb, _>(jobs)
        .get_result(conn)
        .await
        .expect("add_jobs");
    row.ids
}

/// 2030-01-02T03:04:05.678901Z in microseconds since the epoch.
const RUN_AT_US: i64 = 1_893_553_445_678_901;
const RUN_AT: &str = "2030-01-02T03:04:05.678901Z";

#[tokio::test]
async fn add_job_takes_every_option_by_name() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    // Every parameter named, in an order of their own.
    let delayed: Id = diesel::sql_query(
        "SELECT pgfifo.add_job(max_attempts => $1, unique_key => $2, priority => $3, \
                delay => $4::interval, group_id => $5, payload => $6, queue => $7, kind => $8) AS id",
    )
    .bind::<Integer, _>(2)
    .bind::<Text, _>("invoice-7")
    .bind::<Integer, _>(-7)
    .bind::<Text, _>("90 seconds")
    .bind::<Text, _>("tenant-42")
    .bind::<Jsonb, _>(serde_json::json!({"n": 1, "nested": ["a", {"b": true}]}))
    .bind::<Text, _>("billing")
    .bind::<Text, _>("ChargeInvoice")
    .get_result(&mut conn)
    .await
    .expect("add_job with every option");
    let at: Id = diesel::sql_query(
        "SELECT pgfifo.add_job(kind => $1, queue => $2, payload => $3, run_at => $4::timestamptz) AS id",
    )
    .bind::<Text, _>("Report")
    .bind::<Text, _>("reports")
    .bind::<Jsonb, _>(serde_json::json!(null))
    .bind::<Text, _>(RUN_AT)
    .get_result(&mut conn)
    .await
    .expect("add_job with run_at");
    // Positional, only the three required ones: the defaults.
    let plain: Id = diesel::sql_query("SELECT pgfifo.add_job($1, $2, $3) AS id")
        .bind::<Text, _>("Ping")
        .bind::<Text, _>("default")
        .bind::<Jsonb, _>(serde_json::json!({}))
        .get_result(&mut conn)
        .await
        .expect("add_job with defaults");
    // NULL in an optional parameter is its default.
    let nulls: Id = diesel::sql_query(
        "SELECT pgfifo.add_job(kind => 'Ping', queue => 'default', payload => '{}', \
                group_id => NULL, run_at => NULL, delay => NULL, priority => NULL, \
                unique_key => NULL, max_attempts => NULL) AS id",
    )
    .get_result(&mut conn)
    .await
    .expect("add_job with NULLs");

    let jobs = stored(&mut conn).await;
    assert_eq!(jobs.len(), 4, "{jobs:?}");
    assert_eq!(
        jobs[0],
        Stored {
            id: delayed.id,
            queue: "billing".into(),
            group_id: Some("tenant-42".into()),
            kind: "ChargeInvoice".into(),
            payload: serde_json::json!({"n": 1, "nested": ["a", {"b": true}]}),
            priority: -7,
            max_attempts: 2,
            unique_key: Some("invoice-7".into()),
            delay_us: 90_000_000,
            run_after_us: jobs[0].run_after_us,
        }
    );
    assert_eq!(jobs[1].id, at.id);
    assert_eq!(jobs[1].run_after_us, RUN_AT_US, "run_at is kept to the µs");
    assert_eq!(jobs[1].payload, serde_json::json!(null));
    assert_eq!(
        (jobs[1].queue.as_str(), jobs[1].group_id.as_deref()),
        ("reports", None)
    );
    for (job, id) in [(&jobs[2], plain.id), (&jobs[3], nulls.id)] {
        assert_eq!(
            *job,
            Stored {
                id,
                queue: "default".into(),
                group_id: None,
                kind: "Ping".into(),
                payload: serde_json::json!({}),
                priority: 0,
                max_attempts: 5,
                unique_key: None,
                delay_us: 0,
                run_after_us: job.run_after_us,
            }
        );
    }
    // A grouped job leaves the group to be woken by a runner; an ungrouped
    // one needs no group.
    assert_eq!(
        db.text("SELECT string_agg(queue || '/' || group_id, ',') FROM pgfifo.group_wake")
            .await
            .as_deref(),
        Some("billing/tenant-42")
    );
}

#[tokio::test]
async fn add_jobs_takes_every_option_and_keeps_input_order() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let ids = add_jobs(
        &mut conn,
        serde_json::json!([
            {"kind": "Step", "queue": "q", "payload": {"seq": 0}, "group_id": "g"},
            {"kind": "Step", "queue": "q", "payload": {"seq": 1}, "group_id": "g",
             "priority": 3, "max_attempts": 9, "unique_key": "k1", "delay": "2 minutes"},
            {"kind": "Other", "queue": "r", "payload": [1, 2], "run_at": RUN_AT},
            {"kind": "Step", "queue": "q", "payload": {"seq": 2}, "group_id": "g", "delay": 1.5},
            {"kind": "Step", "queue": "q", "payload": null, "group_id": null, "priority": null,
             "max_attempts": null, "unique_key": null, "run_at": null, "delay": null}
        ]),
    )
    .await;
    assert_eq!(ids.len(), 5);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids in input order: {ids:?}"
    );
    let jobs = stored(&mut conn).await;
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), ids);
    let seen: Vec<_> = jobs
        .iter()
        .map(|j| {
            (
                j.kind.as_str(),
                j.queue.as_str(),
                j.group_id.as_deref(),
                j.payload.clone(),
                j.priority,
                j.max_attempts,
                j.unique_key.as_deref(),
                j.delay_us,
            )
        })
        .collect();
    let jobs2_delay = jobs[2].delay_us;
    assert_eq!(
        seen,
        vec![
            (
                "Step",
                "q",
                Some("g"),
                serde_json::json!({"seq": 0}),
                0,
                5,
                None,
                0
            ),
            (
                "Step",
                "q",
                Some("g"),
                serde_json::json!({"seq": 1}),
                3,
                9,
                Some("k1"),
                120_000_000
            ),
            (
                "Other",
                "r",
                None,
                serde_json::json!([1, 2]),
                0,
                5,
                None,
                jobs2_delay
            ),
            (
                "Step",
                "q",
                Some("g"),
                serde_json::json!({"seq": 2}),
                0,
                5,
                None,
                1_500_000
            ),
            ("Step", "q", None, serde_json::json!(null), 0, 5, None, 0),
        ]
    );
    assert_eq!(jobs[2].run_after_us, RUN_AT_US);
    assert_eq!(
        add_jobs(&mut conn, serde_json::json!([])).await,
        Vec::<i64>::new()
    );
}

#[tokio::test]
async fn jobs_appear_with_the_callers_commit_and_vanish_with_its_rollback() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let err = conn
        .transaction::<(), DieselError, _>(async |tx| {
            diesel::sql_query("SELECT pgfifo.add_job('Step', 'q', '{}', group_id => 'g') AS id")
                .execute(tx)
                .await?;
            diesel::sql_query("SELECT pgfifo.add_jobs('[{\"kind\": \"Step\", \"queue\": \"q\", \"payload\": 1}]') AS ids")
                .execute(tx)
                .await?;
            // Seen inside the transaction…
            let inside = pgfifo_tests::query::scalar(tx, "SELECT count(*) FROM pgfifo.job").await;
            assert_eq!(inside, 2);
            Err(DieselError::RollbackTransaction)
        })
        .await
        .expect_err("rolled back");
    assert!(matches!(err, DieselError::RollbackTransaction));
    // …and gone with the rollback, wake row included.
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.group_wake").await, 0);

    let ids = conn
        .transaction::<_, DieselError, _>(async |tx| {
            let one: Id =
                diesel::sql_query("SELECT pgfifo.add_job('Step', 'q', '{}', group_id => 'g') AS id")
                    .get_result(tx)
                    .await?;
            let more: Ids = diesel::sql_query(
                "SELECT pgfifo.add_jobs('[{\"kind\": \"Step\", \"queue\": \"q\", \"payload\": 1, \"group_id\": \"g\"}]') AS ids",
            )
            .get_result(tx)
            .await?;
            // Not visible to others before the commit.
            assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 0);
            Ok(vec![one.id, more.ids[0]])
        })
        .await
        .expect("committed");
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id IN ({}, {}) AND state = 'queued'",
            ids[0], ids[1]
        ))
        .await,
        2
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.group_wake").await, 2);
}

#[tokio::test]
async fn a_taken_unique_key_returns_the_existing_job_from_sql_and_rust() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let add = "SELECT pgfifo.add_job(kind => 'sql_api.job', queue => 'sql_api', payload => $1, \
                      group_id => 'g', unique_key => $2) AS id";
    let first: Id = diesel::sql_query(add)
        .bind::<Jsonb, _>(serde_json::json!({"n": 1}))
        .bind::<Text, _>("key-1")
        .get_result(&mut conn)
        .await
        .unwrap();
    let again: Id = diesel::sql_query(add)
        .bind::<Jsonb, _>(serde_json::json!({"n": 2}))
        .bind::<Text, _>("key-1")
        .get_result(&mut conn)
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    // In a batch: the first holder wins, the later ones get its id.
    let batch = add_jobs(
        &mut conn,
        serde_json::json!([
            {"kind": "sql_api.job", "queue": "sql_api", "payload": {"n": 3}, "unique_key": "key-1"},
            {"kind": "sql_api.job", "queue": "sql_api", "payload": {"n": 4}, "unique_key": "key-2"},
            {"kind": "sql_api.job", "queue": "sql_api", "payload": {"n": 5}, "unique_key": "key-2"},
            {"kind": "sql_api.job", "queue": "other", "payload": {"n": 6}, "unique_key": "key-1"}
        ]),
    )
    .await;
    assert_eq!(batch[0], first.id);
    assert_eq!(batch[2], batch[1]);
    assert_ne!(batch[3], first.id, "unique keys are per queue");
    // The Rust client sees the same key.
    let mut pooled = db.conn().await;
    let from_rust = SqlApiJob { n: 7 }
        .enqueue_with(&mut pooled, EnqueueOptions::group("g").unique_key("key-2"))
        .await
        .unwrap();
    assert_eq!(from_rust, batch[1]);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 3);
    assert_eq!(
        db.text(&format!(
            "SELECT payload::text FROM pgfifo.job WHERE id = {}",
            first.id
        ))
        .await
        .as_deref(),
        Some(r#"{"n": 1}"#),
        "the holder's payload is kept"
    );
}

/// What a producer in another language looks up: a registered type's kind,
/// queue and defaults. A type that does not derive `schemars::JsonSchema`
/// has no schema, and needs nothing to compile.
#[test]
fn job_types_describe_the_registered_types() {
    let types = pgfifo::job_types().expect("valid registrations");
    assert!(
        types.windows(2).all(|w| w[0].kind < w[1].kind),
        "sorted by kind"
    );
    let ours = types
        .iter()
        .find(|t| t.kind == "sql_api.job")
        .expect("sql_api.job is registered");
    assert_eq!(
        *ours,
        pgfifo::JobType {
            kind: "sql_api.job".into(),
            queue: "sql_api".into(),
            rust_type: std::any::type_name::<SqlApiJob>().into(),
            max_attempts: SqlApiJob::MAX_ATTEMPTS,
            priority: 0,
            timeout_ms: None,
            backoff_ms: 1000,
            long: false,
            payload_schema: None,
        }
    );
}

/// The signatures docs/enqueue-from-sql.md documents as stable: a change
/// here is a change of the public interface (docs/upgrading.md).
#[tokio::test]
async fn the_documented_signatures_are_installed() {
    let db = TestDb::new().await;
    let signature = |name: &str| {
        format!(
            "SELECT pg_get_function_arguments(p.oid) || ' -> ' || pg_get_function_result(p.oid) \
             FROM pg_proc AS p WHERE p.pronamespace = 'pgfifo'::regnamespace AND p.proname = '{name}'"
        )
    };
    assert_eq!(
        db.text(&signature("add_job")).await.as_deref(),
        Some(
            "kind text, queue text, payload jsonb, group_id text DEFAULT NULL::text, \
             run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, \
             delay interval DEFAULT NULL::interval, priority integer DEFAULT NULL::integer, \
             unique_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, \
             traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, \
             window_key text DEFAULT NULL::text, window_mode text DEFAULT NULL::text, \
             window_period interval DEFAULT NULL::interval \
             -> bigint"
        )
    );
    assert_eq!(
        db.text(&signature("add_jobs")).await.as_deref(),
        Some("jobs jsonb -> bigint[]")
    );
    assert_eq!(
        db.text(&signature("add_job_after")).await.as_deref(),
        Some(
            "kind text, queue text, payload jsonb, depends_on bigint[] DEFAULT NULL::bigint[], \
             after_batches bigint[] DEFAULT NULL::bigint[], \
             on_dependency_failure text DEFAULT 'cancel'::text, group_id text DEFAULT NULL::text, \
             run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, \
             delay interval DEFAULT NULL::interval, priority integer DEFAULT NULL::integer, \
             max_attempts integer DEFAULT NULL::integer \
             -> bigint"
        )
    );
    assert_eq!(
        db.text(&signature("add_job_outcome")).await.as_deref(),
        Some(
            "kind text, queue text, payload jsonb, group_id text DEFAULT NULL::text, \
             run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, \
             delay interval DEFAULT NULL::interval, priority integer DEFAULT NULL::integer, \
             unique_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, \
             traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text, \
             window_key text DEFAULT NULL::text, window_mode text DEFAULT NULL::text, \
             window_period interval DEFAULT NULL::interval, OUT id bigint, OUT outcome text \
             -> record"
        )
    );
}

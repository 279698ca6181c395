//! De-duplication windows through the SQL API (`pgfifo.add_job`,
//! `pgfifo.add_jobs`): the same keys as the Rust client, and bad windows
//! refused with the SQL API's error fields, writing nothing; and
//! `pgfifo.add_job_outcome`, which also says what became of a call.

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{Array, BigInt};
use diesel_async::RunQueryDsl;
use pgfifo::EnqueueOutcome;
use pgfifo_tests::TestDb;

use crate::dedup_windows::{new_job, one};

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[derive(diesel::QueryableByName)]
struct Ids {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

const ADD: &str = "SELECT pgfifo.add_job(kind => 'DedupJob', queue => 'dedup', \
     payload => '{\"tag\": \"sql\", \"gate\": null}', group_id => 'g', \
     window_key => 'k', window_mode => 'unique', window_period => '1 hour') AS id";

#[tokio::test]
async fn add_job_and_add_jobs_share_the_rust_clients_windows() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let first: Id = diesel::sql_query(ADD).get_result(&mut conn).await.unwrap();
    let again: Id = diesel::sql_query(ADD).get_result(&mut conn).await.unwrap();
    assert_eq!(again.id, first.id);
    // The Rust client sees the same window.
    let rust = one(
        &mut conn,
        new_job("rust", "g", |o| {
            o.unique_for("k", std::time::Duration::from_secs(60))
        }),
    )
    .await;
    assert_eq!(rust.id, first.id);
    assert_eq!(rust.outcome, EnqueueOutcome::Deduplicated);
    // add_jobs: the same throttle key twice, a plain job, a period in seconds.
    let ids: Ids = diesel::sql_query(
        "SELECT pgfifo.add_jobs(jobs => '[\
           {\"kind\": \"DedupJob\", \"queue\": \"dedup\", \"payload\": {\"tag\": \"a\"}, \"group_id\": \"h\", \
            \"window_key\": \"t\", \"window_mode\": \"throttle\", \"window_period\": 3600},\
           {\"kind\": \"DedupJob\", \"queue\": \"dedup\", \"payload\": {\"tag\": \"b\"}, \"group_id\": \"h\", \
            \"window_key\": \"t\", \"window_mode\": \"throttle\", \"window_period\": \"1 hour\"},\
           {\"kind\": \"DedupJob\", \"queue\": \"dedup\", \"payload\": {\"tag\": \"c\"}, \"group_id\": \"h\"}\
         ]') AS ids",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    assert_eq!(ids.ids.len(), 3);
    assert_eq!(ids.ids[0], ids.ids[1], "throttled into the first");
    assert_ne!(ids.ids[2], ids.ids[0]);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 3);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_window WHERE key = 't' AND mode = 'throttle'")
            .await,
        1
    );
}

#[tokio::test]
async fn bad_windows_from_sql_name_their_field_and_write_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let base = "SELECT pgfifo.add_job(kind => 'DedupJob', queue => 'dedup', payload => '{}', ";
    let cases = [
        ("window_key => 'k', window_mode => 'unique', window_period => '0 seconds'", "window_period"),
        ("window_key => 'k', window_mode => 'throttle', window_period => '-1 minute'", "window_period"),
        ("window_key => 'k', window_mode => 'unique'", "window_period"),
        ("window_mode => 'debounce', window_period => '1 minute'", "window_key"),
        ("window_key => 'k', window_period => '1 minute'", "window_mode"),
        ("window_key => 'k', window_mode => 'sometimes', window_period => '1 minute'", "window_mode"),
        ("unique_key => 'u', window_key => 'k', window_mode => 'unique', window_period => '1 minute'", "unique_key"),
        ("delay => '1 minute', window_key => 'k', window_mode => 'debounce', window_period => '1 minute'", "run_at"),
    ];
    for (args, field) in cases {
        let sql = format!("{base}{args}) AS id");
        let err = diesel::sql_query(&sql)
            .get_result::<Id>(&mut conn)
            .await
            .err()
            .unwrap_or_else(|| panic!("{sql} succeeded"));
        let DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) = &err else {
            panic!("{sql}: {err:?}");
        };
        assert_eq!(info.column_name(), Some(field), "{sql}: {}", info.message());
        assert_eq!(info.constraint_name(), Some("pgfifo_bad_job"), "{sql}");
    }
    // In add_jobs, a bad window anywhere writes no job of the batch.
    let err = diesel::sql_query(
        "SELECT pgfifo.add_jobs(jobs => '[\
           {\"kind\": \"DedupJob\", \"queue\": \"dedup\", \"payload\": {}},\
           {\"kind\": \"DedupJob\", \"queue\": \"dedup\", \"payload\": {}, \
            \"window_key\": \"k\", \"window_mode\": \"unique\", \"window_period\": \"soon\"}\
         ]') AS ids",
    )
    .get_result::<Ids>(&mut conn)
    .await
    .err()
    .expect("a bad window_period");
    assert!(err.to_string().contains("jobs[1].window_period"), "{err}");
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_window").await, 0);
}

#[derive(diesel::QueryableByName, Debug, PartialEq)]
struct Outcome {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    outcome: String,
}

/// `pgfifo.add_job_outcome` with `args` after the job's kind, queue and
/// payload (tagged `tag`), in group `g`.
async fn add_outcome(
    conn: &mut diesel_async::AsyncPgConnection,
    tag: &str,
    args: &str,
) -> Result<Outcome, DieselError> {
    diesel::sql_query(format!(
        "SELECT id, outcome FROM pgfifo.add_job_outcome(kind => 'DedupJob', queue => 'dedup', \
         payload => jsonb_build_object('tag', $1::text), group_id => 'g'{args})"
    ))
    .bind::<diesel::sql_types::Text, _>(tag)
    .get_result(conn)
    .await
}

#[tokio::test]
async fn add_job_outcome_says_what_became_of_each_call() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let throttle = ", window_key => 't', window_mode => 'throttle', window_period => '1 hour'";
    let first = add_outcome(&mut conn, "t1", throttle).await.unwrap();
    assert_eq!(first.outcome, "created");
    let second = add_outcome(&mut conn, "t2", throttle).await.unwrap();
    assert_eq!(
        second,
        Outcome {
            id: first.id,
            outcome: "throttled".into()
        }
    );
    let unique = ", unique_key => 'u'";
    let held = add_outcome(&mut conn, "u1", unique).await.unwrap();
    assert_eq!(held.outcome, "created");
    let folded = add_outcome(&mut conn, "u2", unique).await.unwrap();
    assert_eq!(
        (folded.id, folded.outcome.as_str()),
        (held.id, "deduplicated")
    );
    let debounce = ", window_key => 'd', window_mode => 'debounce', window_period => '1 hour'";
    let waiting = add_outcome(&mut conn, "d1", debounce).await.unwrap();
    let moved = add_outcome(&mut conn, "d2", debounce).await.unwrap();
    assert_eq!(
        (moved.id, moved.outcome.as_str()),
        (waiting.id, "debounced")
    );
    assert_eq!(
        db.text(&format!(
            "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {}",
            waiting.id
        ))
        .await
        .as_deref(),
        Some("d2")
    );
    let plain = add_outcome(&mut conn, "p", "").await.unwrap();
    assert_eq!(plain.outcome, "created");
    // The same jobs as add_job would have made, no more.
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 4);
    // The same errors as add_job, and nothing written.
    let err = add_outcome(
        &mut conn,
        "bad",
        ", window_key => 'k', window_mode => 'unique', window_period => '0 seconds'",
    )
    .await
    .expect_err("a zero period");
    let DieselError::DatabaseError(_, info) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(info.column_name(), Some("window_period"));
    assert_eq!(info.constraint_name(), Some("pgfifo_bad_job"));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 4);
}

//! Hot groups at the level of the SQL functions: `pgfifo.pick` with a batch
//! takes a group's next jobs behind its head (followers) only when it left
//! no other work ready, in order, stopping at the first that may not start
//! now; `pgfifo.complete` with several jobs of one group lets its last job
//! decide the group's head. The runner-level behaviour is in
//! `hot_groups.rs`.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, JobId, NewJob};
use pgfifo_tests::TestDb;

use super::hot_groups::{enqueue_group, Act, HotJob, QUEUE};

#[derive(QueryableByName, Debug)]
struct Picked {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Bool)]
    more: bool,
}

/// Makes the woken groups active, as a runner's promote does.
async fn promote(db: &TestDb) {
    db.scalar(&format!(
        "SELECT promoted FROM pgfifo.promote(ARRAY['{QUEUE}'], 100)"
    ))
    .await;
}

/// Opens a job transaction on `conn` and picks up to `limit` jobs of
/// different groups, `batch` in all (the setting in the same statement, as
/// the runner does); the transaction stays open.
async fn pick(conn: &mut AsyncPgConnection, limit: i32, batch: i32) -> Vec<Picked> {
    conn.batch_execute("BEGIN; SET LOCAL pgfifo.job_transaction = on")
        .await
        .expect("begin");
    diesel::sql_query(format!(
        "SELECT id, more FROM (SELECT set_config('pgfifo.pick_batch', $1::text, true) AS b) AS s \
         CROSS JOIN LATERAL pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, $2, \
                                        CASE WHEN s.b IS NOT NULL THEN '{{}}'::bigint[] END)"
    ))
    .bind::<diesel::sql_types::Integer, _>(batch)
    .bind::<diesel::sql_types::Integer, _>(limit)
    .load(conn)
    .await
    .expect("pick")
}

fn ids_of(picked: &[Picked]) -> Vec<JobId> {
    picked.iter().map(|p| p.id).collect()
}

/// Completes `ids` (all of group `tenant`) with `outcomes`, a retry or a
/// snooze due in 10 s, in the open transaction.
async fn complete(
    conn: &mut AsyncPgConnection,
    ids: &[JobId],
    outcomes: &[&str],
) -> diesel::QueryResult<usize> {
    let n = ids.len();
    diesel::sql_query("SELECT 1 FROM pgfifo.complete($1, $2, $3, $4, $5, $6, $7, $8)")
        .bind::<Array<BigInt>, _>(ids)
        .bind::<Array<diesel::sql_types::Integer>, _>(vec![1; n])
        .bind::<Array<Text>, _>(outcomes)
        .bind::<Array<Nullable<Text>>, _>(vec![None::<String>; n])
        .bind::<Array<Nullable<diesel::sql_types::Jsonb>>, _>(vec![None::<serde_json::Value>; n])
        .bind::<Array<Nullable<BigInt>>, _>(vec![Some(10_000_000i64); n])
        .bind::<Array<Text>, _>(vec![QUEUE; n])
        .bind::<Array<Nullable<Text>>, _>(vec![Some("tenant"); n])
        .execute(conn)
        .await
}

/// The group's head and whether it is ready now.
async fn head(db: &TestDb) -> (Option<i64>, bool) {
    let head = db
        .text(&format!(
            "SELECT head_id::text FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = 'tenant'"
        ))
        .await
        .map(|h| h.parse().expect("an id"));
    let ready = db
        .scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = 'tenant' \
             AND ready_at <= now()"
        ))
        .await;
    (head, ready == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_takes_the_next_jobs_of_its_group_up_to_its_batch() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "sql", &[Act::Ok; 10]).await;
    promote(&db).await;
    let mut conn = db.direct().await;
    let picked = pick(&mut conn, 1, 4).await;
    assert_eq!(
        ids_of(&picked),
        ids[..4].to_vec(),
        "the head, then 3 in order"
    );
    assert!(picked.iter().all(|p| !p.more));
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    // Without the setting (as 0.1.0's runners call it), one job.
    conn.batch_execute("BEGIN; SET LOCAL pgfifo.job_transaction = on")
        .await
        .expect("begin");
    let old: Vec<Picked> = diesel::sql_query(format!(
        "SELECT id, more FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 4)"
    ))
    .load(&mut conn)
    .await
    .expect("pick");
    assert_eq!(ids_of(&old), ids[..1].to_vec());
    conn.batch_execute("ROLLBACK").await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_stop_at_a_delayed_job_and_at_a_locked_one() {
    let db = TestDb::new().await;
    let mut ids = enqueue_group(&db, "sql", &[Act::Ok; 3]).await;
    {
        // A job that may not start yet, then two more.
        let mut conn = db.conn().await;
        let job = HotJob {
            tag: "sql".into(),
            act: Act::Ok,
        };
        let delayed = NewJob::new(
            &job,
            EnqueueOptions::group("tenant").run_in(Duration::from_secs(60)),
        )
        .expect("new job");
        let now = NewJob::new(&job, EnqueueOptions::group("tenant")).expect("new job");
        let more = pgfifo::enqueue_batch(&mut conn, vec![delayed, now])
            .await
            .expect("enqueue");
        ids.extend(more);
    }
    promote(&db).await;
    let mut conn = db.direct().await;
    let picked = pick(&mut conn, 1, 16).await;
    assert_eq!(ids_of(&picked), ids[..3].to_vec(), "up to the delayed job");
    conn.batch_execute("ROLLBACK").await.expect("rollback");

    // Job 2 locked by another transaction (an operator's, say): the pick
    // stops before it rather than pass it by.
    let mut other = db.direct().await;
    other
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgfifo.job WHERE id = {} FOR UPDATE",
            ids[1]
        ))
        .await
        .expect("lock");
    let picked = pick(&mut conn, 1, 16).await;
    assert_eq!(ids_of(&picked), ids[..1].to_vec(), "the head alone");
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    other.batch_execute("ROLLBACK").await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_followers_while_other_groups_are_ready() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "sql", &[Act::Ok; 5]).await;
    let other = db
        .enqueue(
            HotJob {
                tag: "sql".into(),
                act: Act::Ok,
            },
            "another",
        )
        .await;
    promote(&db).await;
    let mut conn = db.direct().await;
    // One group's head, the other group left for another lane: no
    // followers, and `more` says so.
    let picked = pick(&mut conn, 1, 8).await;
    assert_eq!(picked.len(), 1);
    assert!(picked[0].more);
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    // Both groups taken: the followers of the group that has them.
    let picked = pick(&mut conn, 2, 8).await;
    let got = ids_of(&picked);
    assert_eq!(got.len(), 6, "{got:?}");
    assert!(got[..2].contains(&ids[0]) && got[..2].contains(&other));
    assert_eq!(got[2..], ids[1..]);
    conn.batch_execute("ROLLBACK").await.expect("rollback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_job_of_a_group_decides_its_head() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "sql", &[Act::Ok; 6]).await;
    promote(&db).await;
    let mut conn = db.direct().await;

    // Two succeeded, the third retries: it is the head, due later.
    let picked = ids_of(&pick(&mut conn, 1, 4).await);
    complete(
        &mut conn,
        &picked[..3],
        &["succeeded", "succeeded", "retry"],
    )
    .await
    .expect("complete");
    conn.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(head(&db).await, (Some(ids[2]), false));
    assert_eq!(db.job_state(ids[0]).await, "succeeded 1");
    assert_eq!(db.job_state(ids[1]).await, "succeeded 1");
    assert_eq!(db.job_state(ids[2]).await, "queued 1");

    // The retry is due: it and the next one succeed, the rest was handed
    // back: the head is the first of those.
    db.exec(&format!(
        "UPDATE pgfifo.job SET run_after = now() WHERE id = {0}; \
         UPDATE pgfifo.queue_group SET ready_at = now() WHERE head_id = {0}",
        ids[2]
    ))
    .await;
    let picked = ids_of(&pick(&mut conn, 1, 3).await);
    assert_eq!(picked, ids[2..5].to_vec());
    complete(&mut conn, &picked[..2], &["succeeded", "succeeded"])
        .await
        .expect("complete");
    conn.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(head(&db).await, (Some(ids[4]), true));

    // A snooze after a success: the snoozed job is the head.
    let picked = ids_of(&pick(&mut conn, 1, 2).await);
    assert_eq!(picked, ids[4..6].to_vec());
    complete(&mut conn, &picked, &["succeeded", "snoozed"])
        .await
        .expect("complete");
    conn.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(head(&db).await, (Some(ids[5]), false));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.group_snooze WHERE job_id = {}",
            ids[5]
        ))
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_after_one_of_its_group_that_did_not_succeed_is_refused() {
    let db = TestDb::new().await;
    let ids = enqueue_group(&db, "sql", &[Act::Ok; 3]).await;
    promote(&db).await;
    let mut conn = db.direct().await;
    let picked = ids_of(&pick(&mut conn, 1, 3).await);
    let err = complete(&mut conn, &picked[..2], &["retry", "succeeded"])
        .await
        .expect_err("a job ran after its group's retry");
    assert!(err.to_string().contains("did not succeed"), "{err}");
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    assert_eq!(head(&db).await, (Some(ids[0]), true));
}

//! A single job into an idle group makes the group active in `enqueue`
//! itself, when it can lock the group's row without waiting: no wake row,
//! no promote. Its head is then the group's oldest queued job; the row
//! stays locked until the enqueuer's transaction ends, and nobody waits for
//! it. Everything else still goes through a wake row and promote.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo_tests::{query, TestDb};

const QUEUE: &str = "activation";

/// The enqueue call of one job of `group` (delayed by `delay_ms`), as an
/// expression yielding its id.
fn enqueue_sql(group: &str, delay_ms: Option<i64>) -> String {
    let delay = delay_ms.map_or("NULL".to_string(), |ms| {
        format!("ARRAY[{}::bigint]", ms * 1000)
    });
    format!(
        "(pgfifo.enqueue(ARRAY['{QUEUE}'], ARRAY['{group}'], ARRAY['k'], ARRAY['{{}}'::jsonb], \
                         ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::text], NULL, {delay}))[1]"
    )
}

async fn enqueue(conn: &mut AsyncPgConnection, group: &str) -> i64 {
    let call = enqueue_sql(group, None);
    tokio::time::timeout(Duration::from_secs(5), query::scalar(conn, &call))
        .await
        .expect("enqueue waited")
}

/// A group that has run a job and gone idle (its row exists, no head).
async fn idle_group(db: &TestDb, group: &str) {
    let first = db.scalar(&enqueue_sql(group, None)).await;
    db.scalar(&format!(
        "(SELECT promoted FROM pgfifo.promote(ARRAY['{QUEUE}'], 100))"
    ))
    .await;
    // What complete and advance_head leave behind when nothing follows.
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {first}; \
         UPDATE pgfifo.queue_group SET head_id = NULL, ready_at = NULL, idle_since = now() \
         WHERE queue = '{QUEUE}' AND group_id = '{group}'"
    ))
    .await;
}

async fn head(db: &TestDb, group: &str) -> Option<String> {
    db.text(&format!(
        "SELECT coalesce(head_id::text, '-') || CASE WHEN ready_at IS NULL THEN ' idle' ELSE ' active' END \
         FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = '{group}'"
    ))
    .await
}

async fn wake_rows(db: &TestDb, group: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.group_wake WHERE queue = '{QUEUE}' AND group_id = '{group}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_group_becomes_active_in_the_enqueue() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut conn = db.direct().await;
    let id = enqueue(&mut conn, "g").await;
    assert_eq!(head(&db, "g").await, Some(format!("{id} active")));
    assert_eq!(wake_rows(&db, "g").await, 0, "no promote needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_job_waiting_for_promote_becomes_the_head() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    // Someone (a promote, an operator) holds the idle group's row: the
    // enqueue does not wait for it, and leaves a wake row.
    let mut holder = db.direct().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgfifo.queue_group \
             WHERE queue = '{QUEUE}' AND group_id = 'g' FOR UPDATE"
        ))
        .await
        .unwrap();
    let mut conn = db.direct().await;
    let older = enqueue(&mut conn, "g").await;
    assert_eq!(wake_rows(&db, "g").await, 1);
    assert_eq!(head(&db, "g").await.as_deref(), Some("- idle"));
    holder.batch_execute("COMMIT").await.unwrap();
    // The next enqueue makes the group active with the older job first.
    let newer = enqueue(&mut conn, "g").await;
    assert!(newer > older);
    assert_eq!(head(&db, "g").await, Some(format!("{older} active")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_holds_the_group_but_nobody_waits_for_it() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut open = db.direct().await;
    open.batch_execute("BEGIN").await.unwrap();
    let first = enqueue(&mut open, "g").await;

    // Another enqueue of the group does not wait: it leaves a wake row.
    let mut conn = db.direct().await;
    let second = enqueue(&mut conn, "g").await;
    assert_eq!(wake_rows(&db, "g").await, 1);

    // A pick passes the locked group by.
    let mut picker = db.direct().await;
    let pick = format!(
        "SELECT count(*) FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 4) \
         WHERE id IS NOT NULL"
    );
    picker
        .batch_execute("BEGIN; SET LOCAL pgfifo.job_transaction = on")
        .await
        .unwrap();
    assert_eq!(query::scalar(&mut picker, &format!("({pick})")).await, 0);
    picker.batch_execute("ROLLBACK").await.unwrap();

    open.batch_execute("COMMIT").await.unwrap();
    assert_eq!(head(&db, "g").await, Some(format!("{first} active")));
    // Promote leaves the head alone (the woken job is younger).
    db.scalar(&format!(
        "(SELECT promoted FROM pgfifo.promote(ARRAY['{QUEUE}'], 100))"
    ))
    .await;
    assert_eq!(head(&db, "g").await, Some(format!("{first} active")));
    picker
        .batch_execute("BEGIN; SET LOCAL pgfifo.job_transaction = on")
        .await
        .unwrap();
    let picked = query::scalar(
        &mut picker,
        &format!(
            "(SELECT min(id) FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 4))"
        ),
    )
    .await;
    assert_eq!(picked, first);
    assert!(second > first);
    picker.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_paused_groups_and_new_groups_go_through_promote() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;

    // A new group: its row is made by promote.
    enqueue(&mut conn, "new").await;
    assert_eq!(head(&db, "new").await, None, "no group row yet");
    assert_eq!(wake_rows(&db, "new").await, 1);

    // A delayed job: promote tells the runner when it is due.
    idle_group(&db, "delayed").await;
    query::scalar(&mut conn, &enqueue_sql("delayed", Some(60_000))).await;
    assert_eq!(head(&db, "delayed").await.as_deref(), Some("- idle"));
    assert_eq!(wake_rows(&db, "delayed").await, 1);

    // A paused group stays idle.
    idle_group(&db, "paused").await;
    db.exec(&format!("SELECT pgfifo.pause_group('{QUEUE}', 'paused')"))
        .await;
    enqueue(&mut conn, "paused").await;
    assert_eq!(head(&db, "paused").await.as_deref(), Some("- idle"));
    assert_eq!(wake_rows(&db, "paused").await, 1);
}

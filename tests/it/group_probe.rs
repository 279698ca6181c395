//! Helpers of the tests that drive pgfifo's SQL functions by hand, a
//! statement at a time (`enqueue_activation.rs`, `enqueue_interleavings.rs`):
//! a group's state and wake rows, promote, and picks in job transactions.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo_tests::{query, TestDb};

/// How a lane opens its job transaction.
pub const JOB_TX: &str = "BEGIN; SET LOCAL pgfifo.job_transaction = on";

/// A group's head and state: `"<head id> active"`, `"<head id> idle"`
/// (held), `"- idle"`; `None` without a group row.
pub async fn head(db: &TestDb, queue: &str, group: &str) -> Option<String> {
    db.text(&format!(
        "SELECT coalesce(head_id::text, '-') || CASE WHEN ready_at IS NULL THEN ' idle' ELSE ' active' END \
         FROM pgfifo.queue_group WHERE queue = '{queue}' AND group_id = '{group}'"
    ))
    .await
}

/// The group's wake rows (committed).
pub async fn wake_rows(db: &TestDb, queue: &str, group: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.group_wake WHERE queue = '{queue}' AND group_id = '{group}'"
    ))
    .await
}

/// One promote of `queue`, as the runner's listener runs it: the wake rows
/// it handled.
pub async fn promote(db: &TestDb, queue: &str) -> i64 {
    db.scalar(&format!(
        "(SELECT promoted FROM pgfifo.promote(ARRAY['{queue}'], 100))"
    ))
    .await
}

/// Finishes the group's job `job` and declares the group idle, as complete
/// and advance_head leave them when nothing follows.
pub async fn finish_and_idle(db: &TestDb, queue: &str, group: &str, job: i64) {
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {job}; \
         UPDATE pgfifo.queue_group SET head_id = NULL, ready_at = NULL, idle_since = now() \
         WHERE queue = '{queue}' AND group_id = '{group}'"
    ))
    .await;
}

/// A connection whose open transaction holds the group's row (as a promote
/// or an operator's command does for a moment); commit it to let go.
pub async fn hold_row(db: &TestDb, queue: &str, group: &str) -> AsyncPgConnection {
    let mut holder = db.direct().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgfifo.queue_group \
             WHERE queue = '{queue}' AND group_id = '{group}' FOR UPDATE"
        ))
        .await
        .unwrap();
    holder
}

/// Whether another transaction could lock the group's row right now.
pub async fn row_free(db: &TestDb, queue: &str, group: &str) -> bool {
    let mut conn = db.direct().await;
    conn.batch_execute("BEGIN").await.unwrap();
    let n = query::scalar(
        &mut conn,
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM pgfifo.queue_group \
             WHERE queue = '{queue}' AND group_id = '{group}' FOR UPDATE SKIP LOCKED) AS s"
        ),
    )
    .await;
    conn.batch_execute("ROLLBACK").await.unwrap();
    n == 1
}

/// A pick of `queue` on `conn`, in a job transaction that stays open: the
/// lowest id picked (0: none).
pub async fn pick_open(conn: &mut AsyncPgConnection, queue: &str) -> i64 {
    conn.batch_execute(JOB_TX).await.unwrap();
    query::scalar(
        conn,
        &format!(
            "(SELECT coalesce(min(id), 0) FROM pgfifo.pick(ARRAY['{queue}'], 0, 0, '{{}}', '{{}}', 60000, 4))"
        ),
    )
    .await
}

/// A pick in a job transaction that is rolled back: the lowest id picked.
pub async fn pick_once(db: &TestDb, queue: &str) -> i64 {
    let mut conn = db.direct().await;
    let id = pick_open(&mut conn, queue).await;
    conn.batch_execute("ROLLBACK").await.unwrap();
    id
}

/// What the lanes pick from a group whose head a pick has to repair (a
/// finished head left for a later look, ready 50 ms on): once it is ready,
/// a committed pick moves the head (and may stop there), and the next one
/// picks the new head. The lowest id picked.
pub async fn pick_after_repair(db: &TestDb, queue: &str, group: &str) -> i64 {
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{queue}' AND group_id = '{group}' \
             AND ready_at <= now()"
        ),
        1,
        Duration::from_secs(2),
    )
    .await;
    let mut repair = db.direct().await;
    let first = pick_open(&mut repair, queue).await;
    repair.batch_execute("COMMIT").await.unwrap();
    if first == 0 {
        pick_once(db, queue).await
    } else {
        first
    }
}

//! A single job enqueued alone in its transaction into an idle group makes
//! the group active in `enqueue` itself, when it can lock the group's row
//! without waiting: no wake row, no promote. Its head is then the group's
//! oldest queued job; the row stays locked until the commit that follows,
//! and nobody waits for it. pgfifo's enqueue says "alone" (the setting
//! `pgfifo.enqueue_alone`) when diesel sees no transaction open; an enqueue
//! inside a transaction, and everything else, still goes through a wake
//! row and promote (see also `enqueue_interleavings.rs`).

use std::time::Duration;

use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, SimpleAsyncConnection, TransactionManager,
};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{query, TestDb};
use serde::{Deserialize, Serialize};

use crate::group_probe::{
    finish_and_idle, head, hold_row, pick_once, promote, row_free, wake_rows,
};

const QUEUE: &str = "activation";

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "activation")]
pub struct ActivationJob {
    n: i64,
}

#[async_trait]
impl Handler for ActivationJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// The enqueue call of one job of `group` (delayed by `delay_ms`), as an
/// expression yielding its id, as pgfifo's enqueue sends it outside a
/// transaction (the function may make the group active). Sent inside an
/// explicit transaction, it stands for the moment between that statement
/// and its commit.
fn enqueue_sql(group: &str, delay_ms: Option<i64>) -> String {
    let delay = delay_ms.map_or("NULL".to_string(), |ms| {
        format!("ARRAY[{}::bigint]", ms * 1000)
    });
    format!(
        "(SELECT (pgfifo.enqueue(ARRAY['{QUEUE}'], ARRAY['{group}'], ARRAY['k'], \
                                 ARRAY['{{}}'::jsonb], ARRAY[0::smallint], ARRAY[3], \
                                 ARRAY[NULL::text], NULL, {delay}))[1] \
          FROM (SELECT set_config('pgfifo.enqueue_alone', 'on', true) AS alone) AS s \
          WHERE s.alone = 'on')"
    )
}

async fn enqueue(conn: &mut AsyncPgConnection, group: &str) -> i64 {
    let call = enqueue_sql(group, None);
    tokio::time::timeout(Duration::from_secs(5), query::scalar(conn, &call))
        .await
        .expect("enqueue waited")
}

/// An enqueue of one job of `group` in a transaction that stays open: the
/// connection (to commit or roll back) and the job's id.
async fn open_enqueue(db: &TestDb, group: &str) -> (AsyncPgConnection, i64) {
    let mut open = db.direct().await;
    open.batch_execute("BEGIN").await.unwrap();
    let id = enqueue(&mut open, group).await;
    (open, id)
}

/// A group that has run a job and gone idle (its row exists, no head).
async fn idle_group(db: &TestDb, group: &str) {
    let first = db.scalar(&enqueue_sql(group, None)).await;
    promote(db, QUEUE).await;
    finish_and_idle(db, QUEUE, group, first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgfifo_s_enqueue_outside_a_transaction_makes_an_idle_group_active() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut conn = db.direct().await;
    let id = ActivationJob { n: 1 }
        .enqueue(&mut conn, "g")
        .await
        .unwrap();
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{id} active")));
    assert_eq!(wake_rows(&db, QUEUE, "g").await, 0, "no promote needed");
    // The setting went with the statement's transaction.
    assert_eq!(
        db.text("SELECT coalesce(current_setting('pgfifo.enqueue_alone', true), '')")
            .await
            .as_deref(),
        Some("")
    );
}

/// pgfifo's enqueue inside a transaction (opened through diesel) that goes
/// on leaves a wake row and holds nothing: another producer's job of the
/// group, committed meanwhile, runs while the transaction is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgfifo_s_enqueue_in_a_transaction_holds_nothing() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut open = db.direct().await;
    AnsiTransactionManager::begin_transaction(&mut open)
        .await
        .unwrap();
    let first = ActivationJob { n: 1 }
        .enqueue(&mut open, "g")
        .await
        .unwrap();
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));
    assert_eq!(
        wake_rows(&db, QUEUE, "g").await,
        0,
        "not visible before the commit"
    );

    let mut other = db.direct().await;
    let committed = ActivationJob { n: 2 }
        .enqueue(&mut other, "g")
        .await
        .unwrap();
    assert!(committed > first);
    assert_eq!(
        head(&db, QUEUE, "g").await,
        Some(format!("{committed} active"))
    );
    let picked = pick_once(&db, QUEUE).await;
    AnsiTransactionManager::commit_transaction(&mut open)
        .await
        .unwrap();
    assert_eq!(
        picked, committed,
        "a committed job waits for an open enqueue"
    );
    // The open transaction's job is woken by its wake row, and runs after.
    assert_eq!(wake_rows(&db, QUEUE, "g").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_group_becomes_active_in_the_enqueue() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut conn = db.direct().await;
    let id = enqueue(&mut conn, "g").await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{id} active")));
    assert_eq!(wake_rows(&db, QUEUE, "g").await, 0, "no promote needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_job_waiting_for_promote_becomes_the_head() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    // Someone (a promote, an operator) holds the idle group's row: the
    // enqueue does not wait for it, and leaves a wake row.
    let mut holder = hold_row(&db, QUEUE, "g").await;
    let mut conn = db.direct().await;
    let older = enqueue(&mut conn, "g").await;
    assert_eq!(wake_rows(&db, QUEUE, "g").await, 1);
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));
    holder.batch_execute("COMMIT").await.unwrap();
    // The next enqueue makes the group active with the older job first.
    let newer = enqueue(&mut conn, "g").await;
    assert!(newer > older);
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{older} active")));
}

/// Between an activating enqueue and its commit the group's row is held:
/// nobody waits for it (held open here to widen that moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activating_enqueue_holds_the_group_until_its_commit_and_nobody_waits() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let (mut open, first) = open_enqueue(&db, "g").await;

    // Another enqueue of the group does not wait: it leaves a wake row.
    let mut conn = db.direct().await;
    let second = enqueue(&mut conn, "g").await;
    assert_eq!(wake_rows(&db, QUEUE, "g").await, 1);

    // A pick passes the locked group by.
    assert_eq!(pick_once(&db, QUEUE).await, 0);

    open.batch_execute("COMMIT").await.unwrap();
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{first} active")));
    // Promote leaves the head alone (the woken job is younger).
    promote(&db, QUEUE).await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{first} active")));
    assert_eq!(pick_once(&db, QUEUE).await, first);
    assert!(second > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_paused_groups_and_new_groups_go_through_promote() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;

    // A new group: its row is made by promote.
    enqueue(&mut conn, "new").await;
    assert_eq!(head(&db, QUEUE, "new").await, None, "no group row yet");
    assert_eq!(wake_rows(&db, QUEUE, "new").await, 1);

    // A delayed job: promote tells the runner when it is due.
    idle_group(&db, "delayed").await;
    query::scalar(&mut conn, &enqueue_sql("delayed", Some(60_000))).await;
    assert_eq!(head(&db, QUEUE, "delayed").await.as_deref(), Some("- idle"));
    assert_eq!(wake_rows(&db, QUEUE, "delayed").await, 1);

    // A paused group stays idle.
    idle_group(&db, "paused").await;
    db.exec(&format!("SELECT pgfifo.pause_group('{QUEUE}', 'paused')"))
        .await;
    enqueue(&mut conn, "paused").await;
    assert_eq!(head(&db, QUEUE, "paused").await.as_deref(), Some("- idle"));
    assert_eq!(wake_rows(&db, QUEUE, "paused").await, 1);
}

/// An activating enqueue whose transaction rolls back leaves the group idle,
/// and another producer's job, committed meanwhile, is still promoted (its
/// wake row was put back, not lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_activation_loses_no_wake_row() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let (mut open, _) = open_enqueue(&db, "g").await;
    let mut other = db.direct().await;
    let committed = enqueue(&mut other, "g").await;
    assert_eq!(promote(&db, QUEUE).await, 0, "the row is locked: put back");
    open.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));
    // Nothing notifies now (the rollback sends nothing, promote's put-back
    // sends nothing): the next poll's promote finds the wake row.
    promote(&db, QUEUE).await;
    assert_eq!(
        head(&db, QUEUE, "g").await,
        Some(format!("{committed} active"))
    );
}

/// "Alone" is said for one call: in a transaction opened with a `BEGIN`
/// that diesel did not see (so pgfifo's enqueue took it for none), a later
/// enqueue of the transaction does not make its group active and holds
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alone_is_said_for_one_enqueue_only() {
    let db = TestDb::new().await;
    idle_group(&db, "a").await;
    idle_group(&db, "b").await;
    let mut open = db.direct().await;
    open.batch_execute("BEGIN").await.unwrap();
    let first = ActivationJob { n: 1 }
        .enqueue(&mut open, "a")
        .await
        .unwrap();
    let second = query::scalar(
        &mut open,
        &format!(
            "(pgfifo.enqueue(ARRAY['{QUEUE}'], ARRAY['b'], ARRAY['k'], ARRAY['{{}}'::jsonb], \
                             ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::text], NULL, NULL))[1]"
        ),
    )
    .await;
    assert!(second > first);
    let b_free = row_free(&db, QUEUE, "b").await;
    open.batch_execute("COMMIT").await.unwrap();
    assert!(b_free, "the second enqueue holds its group's row");
    assert_eq!(head(&db, QUEUE, "b").await.as_deref(), Some("- idle"));
    assert_eq!(wake_rows(&db, QUEUE, "b").await, 1);
}

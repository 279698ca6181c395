//! Interleavings of an enqueue whose transaction stays open with promote,
//! pick, complete and operators' commands, forced with explicit
//! transactions on separate connections: the enqueue of an application's
//! transaction, or of a handler, that goes on after it.
//!
//! Such an enqueue never makes its group active itself (only one that is
//! its transaction's only statement does, see `enqueue_activation.rs`), so
//! it never holds a group's row: other producers' committed jobs of the
//! group run while it is open, whatever raced with it. Several of these
//! failed while every single-job enqueue could make its group active
//! (933277c): the open transaction then held the group's row, and with it
//! the group's committed jobs, for as long as it lasted. The last two
//! tests pin what the group's advisory lock asks of `advance_head`'s
//! callers: no job runs in a transaction that holds it.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo_tests::{query, TestDb};

use crate::group_probe::{
    finish_and_idle, head, hold_row, pick_after_repair, pick_once, pick_open, promote, row_free,
    JOB_TX,
};

const QUEUE: &str = "review";

/// The enqueue call of one job of `group`, as an expression yielding its id.
fn enqueue_sql(group: &str) -> String {
    format!(
        "(pgfifo.enqueue(ARRAY['{QUEUE}'], ARRAY['{group}'], ARRAY['k'], ARRAY['{{}}'::jsonb], \
                         ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::text], NULL, NULL))[1]"
    )
}

/// Enqueues one job of `group` on `conn`; never waits (bounded by 5 s).
async fn enqueue(conn: &mut AsyncPgConnection, group: &str) -> i64 {
    let call = enqueue_sql(group);
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
    let first = db.scalar(&enqueue_sql(group)).await;
    promote(db, QUEUE).await;
    finish_and_idle(db, QUEUE, group, first).await;
}

fn complete_sql(id: i64, group: &str, outcome: &str, delay_us: i64) -> String {
    format!(
        "SELECT 1 FROM pgfifo.complete(ARRAY[{id}]::bigint[], ARRAY[1], ARRAY['{outcome}'], \
         ARRAY[NULL::text], ARRAY[NULL::jsonb], ARRAY[{delay_us}::bigint], \
         ARRAY['{QUEUE}'], ARRAY['{group}'])"
    )
}

/// Group `g`'s head j1 runs and ends with `outcome` (committed) while an
/// enqueuer's transaction, which found the group active and added j2, is
/// open: `(j1, j2, that enqueuer's connection)`.
async fn head_ends_while_an_enqueue_is_open(
    db: &TestDb,
    outcome: &str,
) -> (i64, i64, AsyncPgConnection) {
    let mut conn = db.direct().await;
    let j1 = enqueue(&mut conn, "g").await;
    promote(db, QUEUE).await;
    let mut runner = db.direct().await;
    assert_eq!(pick_open(&mut runner, QUEUE).await, j1);

    let (open, j2) = open_enqueue(db, "g").await;

    runner
        .batch_execute(&complete_sql(j1, "g", outcome, 0))
        .await
        .unwrap();
    runner.batch_execute("COMMIT").await.unwrap();
    (j1, j2, open)
}

/// An application's transaction that enqueued into an idle group and
/// stays open holds nothing: a job that another producer enqueued *and
/// committed* meanwhile is promoted and runs at once (its later id is no
/// obstacle: the open transaction's job is invisible, and "a job whose
/// transaction commits late may find a later id already started").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_enqueue_does_not_hold_back_committed_jobs_of_its_group() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let (mut open, first) = open_enqueue(&db, "g").await;

    let mut other = db.direct().await;
    let committed = enqueue(&mut other, "g").await;
    assert!(committed > first);
    // The runner's reaction to that commit's notification.
    promote(&db, QUEUE).await;
    let picked = pick_once(&db, QUEUE).await;

    open.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        picked, committed,
        "a committed job of the group waits for another enqueuer's open transaction"
    );
}

/// The same in a queue with group controls: the enqueue leaves a wake row,
/// locks nothing, and committed jobs of other producers are promoted while
/// the enqueuer's transaction is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_that_does_not_activate_locks_nothing() {
    let db = TestDb::new().await;
    // Group controls in the queue (for another group).
    db.exec(&format!(
        "SELECT pgfifo.set_group_control('{QUEUE}', 'other', NULL, NULL, NULL, 2)"
    ))
    .await;
    idle_group(&db, "g").await;
    let (mut open, _) = open_enqueue(&db, "g").await;
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));
    let free = row_free(&db, QUEUE, "g").await;

    let mut other = db.direct().await;
    let committed = enqueue(&mut other, "g").await;
    promote(&db, QUEUE).await;
    let after_promote = head(&db, QUEUE, "g").await;
    open.batch_execute("ROLLBACK").await.unwrap();

    assert!(
        free,
        "an enqueue that left a wake row holds the idle group's row"
    );
    assert_eq!(
        after_promote,
        Some(format!("{committed} active")),
        "promote could not make the committed job the head"
    );
}

/// When the group's oldest queued job is a delayed one still waiting for
/// promote, an open enqueue of a job due now leaves the group's row alone:
/// promote sets the delayed head (and tells the runner its time) while the
/// enqueuer's transaction is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_behind_a_delayed_job_locks_nothing() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut conn = db.direct().await;
    let delayed = query::scalar(
        &mut conn,
        &format!(
            "(pgfifo.enqueue(ARRAY['{QUEUE}'], ARRAY['g'], ARRAY['k'], ARRAY['{{}}'::jsonb], \
                             ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::text], NULL, \
                             ARRAY[1000000::bigint]))[1]"
        ),
    )
    .await;
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));

    let (mut open, _) = open_enqueue(&db, "g").await;
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));
    let free = row_free(&db, QUEUE, "g").await;
    promote(&db, QUEUE).await;
    let after_promote = head(&db, QUEUE, "g").await;
    open.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        free,
        "an enqueue that did not activate holds the idle group's row (head after promote: {after_promote:?})"
    );
    assert_eq!(after_promote, Some(format!("{delayed} active")));
}

/// The same in a paused group: an enqueue that found it paused holds
/// nothing, and resuming it starts its committed jobs while that
/// enqueuer's transaction is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_into_a_paused_group_does_not_hold_back_its_resume() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    db.exec(&format!("SELECT pgfifo.pause_group('{QUEUE}', 'g')"))
        .await;
    let mut conn = db.direct().await;
    let waiting = enqueue(&mut conn, "g").await;
    promote(&db, QUEUE).await; // paused: stays idle
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));

    let (mut open, _) = open_enqueue(&db, "g").await;

    db.exec(&format!("SELECT pgfifo.resume_group('{QUEUE}', 'g')"))
        .await;
    promote(&db, QUEUE).await;
    let after_resume = head(&db, QUEUE, "g").await;
    open.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        after_resume,
        Some(format!("{waiting} active")),
        "the resumed group's committed job waits for an open enqueue"
    );
}

/// The one place where a runner waits for a group row (complete of a slot
/// job that retries, snoozes or holds, FOR UPDATE) is never made to wait
/// by an enqueuer: the only idle slot group with a job running is a paused
/// one (parked beside its running slot job), and an enqueue into it locks
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_never_waits_for_an_enqueue() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "SELECT pgfifo.set_group_control('{QUEUE}', 'g', NULL, NULL, NULL, 2)"
    ))
    .await;
    let mut conn = db.direct().await;
    let j1 = enqueue(&mut conn, "g").await;
    enqueue(&mut conn, "g").await;
    promote(&db, QUEUE).await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j1} active")));

    // The slot job runs.
    let mut runner = db.direct().await;
    assert_eq!(pick_open(&mut runner, QUEUE).await, j1);

    // Paused; the next pick parks the group (idle) while j1 runs.
    db.exec(&format!("SELECT pgfifo.pause_group('{QUEUE}', 'g')"))
        .await;
    let mut parker = db.direct().await;
    assert_eq!(pick_open(&mut parker, QUEUE).await, 0);
    parker.batch_execute("COMMIT").await.unwrap();
    assert_eq!(head(&db, QUEUE, "g").await.as_deref(), Some("- idle"));

    // An application transaction enqueues into the group and stays open.
    let (mut open, _) = open_enqueue(&db, "g").await;

    // j1 fails and will be retried.
    runner
        .batch_execute("SET LOCAL lock_timeout = '3s'")
        .await
        .unwrap();
    let completed = runner
        .batch_execute(&complete_sql(j1, "g", "retry", 1_000_000))
        .await;
    let _ = runner.batch_execute("ROLLBACK").await;
    open.batch_execute("ROLLBACK").await.unwrap();
    if let Err(err) = completed {
        panic!("the job's completion waited for the enqueuer's transaction: {err}");
    }
}

/// FIFO between committed jobs of two open enqueuers: p's job (older id)
/// finds the group's row held for a moment (a promote, here a stand-in)
/// and leaves a wake row; a second enqueuer, whose transaction is open,
/// enqueues a younger job. p commits first and its job runs first: the
/// second, open, did not make the group active with its own job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_committed_first_with_the_older_id_runs_first() {
    let db = TestDb::new().await;
    idle_group(&db, "g").await;
    let mut holder = hold_row(&db, QUEUE, "g").await;
    let (mut p, older) = open_enqueue(&db, "g").await;
    holder.batch_execute("COMMIT").await.unwrap();

    let (mut q, younger) = open_enqueue(&db, "g").await;
    assert!(younger > older);

    p.batch_execute("COMMIT").await.unwrap();
    promote(&db, QUEUE).await; // on p's notification: the row is locked
    q.batch_execute("COMMIT").await.unwrap();
    // q notified on pgfifo: a lane picks, nobody promotes.
    assert_eq!(
        pick_once(&db, QUEUE).await,
        older,
        "the younger job runs before an older one that committed first"
    );
}

/// A group held by a failed head (policy 'hold') that is released (the
/// policy goes back to 'continue') with nothing visible behind its head is
/// declared idle only through advance_head, under the group's advisory
/// lock. An enqueuer that found the group active before it was held left
/// no wake row; while it is in flight, the group stays active on its
/// finished head, and its job runs once it commits. (0.1.0's promote set
/// the head to NULL directly and stranded that job: the group stayed idle
/// with a queued job and nothing woke it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_held_group_does_not_strand_an_enqueue_in_flight() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "SELECT pgfifo.set_failure_policy('{QUEUE}', 'hold')"
    ))
    .await;
    // The head runs; an enqueuer finds the group active (nothing to wake);
    // the head fails for good and holds the group.
    let (j1, j2, mut open) = head_ends_while_an_enqueue_is_open(&db, "failed").await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j1} idle")));

    // The operator lets the queue go on; promote releases the group.
    db.exec(&format!(
        "SELECT pgfifo.set_failure_policy('{QUEUE}', 'continue')"
    ))
    .await;
    promote(&db, QUEUE).await;
    // The enqueuer is in flight: the group stays active on its finished
    // head, for a pick to look at again in a moment.
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j1} active")));
    open.batch_execute("COMMIT").await.unwrap();
    promote(&db, QUEUE).await;
    // The pick that finds the finished head moves it to j2.
    let picked = pick_after_repair(&db, QUEUE, "g").await;
    assert_eq!(
        picked,
        j2,
        "the enqueued job is stranded (group: {:?})",
        head(&db, QUEUE, "g").await
    );
}

/// The idle race with the advisory lock. A runner completing the
/// group's last job while an enqueuer of the group is in flight cannot
/// declare the group idle; once the enqueuer commits, the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_flight_keeps_a_finishing_group_active() {
    let db = TestDb::new().await;
    let (j1, j2, mut open) = head_ends_while_an_enqueue_is_open(&db, "succeeded").await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j1} active")));
    open.batch_execute("COMMIT").await.unwrap();
    // The repair pick: the finished head moves to j2 (ready 50 ms later).
    assert_eq!(pick_after_repair(&db, QUEUE, "g").await, j2);
}

/// What `advance_head` tells its caller about the group's advisory lock:
/// taken (no enqueuer in flight, the group declared idle), the setting
/// `pgfifo.holds_group_lock` says so, for the rest of the transaction;
/// not taken (an enqueuer is in flight), it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advance_head_says_when_it_holds_the_group_lock() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let j1 = enqueue(&mut conn, "g").await;
    promote(&db, QUEUE).await;
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {j1}"
    ))
    .await;
    let advance = format!(
        "SELECT coalesce(pgfifo.advance_head('{QUEUE}', 'g', {j1}), -1) \
         * CASE WHEN current_setting('pgfifo.holds_group_lock', true) = 'on' THEN -1 ELSE 1 END"
    );

    // An enqueuer in flight: not taken; the finished head stays, 50 ms on.
    let (mut open, j2) = open_enqueue(&db, "g").await;
    let mut runner = db.direct().await;
    runner.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        query::scalar(&mut runner, &format!("({advance})")).await,
        50_000
    );
    runner.batch_execute("ROLLBACK").await.unwrap();
    open.batch_execute("ROLLBACK").await.unwrap();

    // Nobody in flight: taken, the group idle (NULL, here -1), and said.
    runner.batch_execute("BEGIN").await.unwrap();
    assert_eq!(query::scalar(&mut runner, &format!("({advance})")).await, 1);
    runner.batch_execute("ROLLBACK").await.unwrap();
    assert!(j2 > j1);
}

/// A pick that repaired a finished head while its transaction holds the
/// group's advisory lock runs nothing in that transaction: enqueuers of the
/// group would wait for the job's whole run. (advance_head takes the lock
/// and then finds a job only when one commits between its two looks, a
/// window no test hits on purpose: the setting it leaves is set by hand
/// here.) The next pick runs the new head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_holding_the_group_lock_runs_nothing_in_its_transaction() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;
    let j1 = enqueue(&mut conn, "g").await;
    let j2 = enqueue(&mut conn, "g").await;
    promote(&db, QUEUE).await;
    // The head finished out of band; j2 waits behind it.
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {j1}"
    ))
    .await;
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j1} active")));

    let mut runner = db.direct().await;
    runner
        .batch_execute(&format!("{JOB_TX}; SET LOCAL pgfifo.holds_group_lock = on"))
        .await
        .unwrap();
    let picked = query::scalar(
        &mut runner,
        &format!(
            "(SELECT coalesce(min(id), 0) FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 4))"
        ),
    )
    .await;
    runner.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        picked, 0,
        "a job picked in a transaction holding the group lock"
    );
    assert_eq!(head(&db, QUEUE, "g").await, Some(format!("{j2} active")));
    assert_eq!(pick_once(&db, QUEUE).await, j2);
}

//! Interleavings found in review, replayed step by step with a second
//! session holding the locks a runner or an enqueuer would: no runner runs,
//! each step is one SQL call, so every test is deterministic.

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::admin::{self, FailurePolicy};
use pgfifo::JobId;

use crate::admin_support::{Fx, Mode, QUEUE};

/// Promotes every woken group of the test queue; returns what promote says.
async fn promote(fx: &Fx) -> i64 {
    fx.scalar(&format!(
        "SELECT promoted FROM pgfifo.promote(ARRAY['{QUEUE}'], 100)"
    ))
    .await
}

/// The group's `head_id` and whether it is active (`ready_at` set).
async fn head(fx: &Fx, group: &str) -> (Option<JobId>, bool) {
    let text = fx
        .text(&format!(
            "SELECT coalesce(head_id::text, '-') || ',' || (ready_at IS NOT NULL)::text
             FROM pgfifo.queue_group WHERE queue = '{QUEUE}' AND group_id = '{group}'"
        ))
        .await
        .expect("the group row");
    let (id, active) = text.split_once(',').unwrap();
    (id.parse().ok(), active == "true")
}

/// One pick in a job transaction, committed at once, as a lane's empty or
/// parking pick would be.
async fn pick(conn: &mut AsyncPgConnection) {
    conn.batch_execute(&format!(
        "BEGIN; SELECT set_config('pgfifo.job_transaction', 'on', true);
         SELECT * FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 1);
         COMMIT;"
    ))
    .await
    .unwrap();
}

/// A session that holds the group's row, as a runner running its job does.
async fn hold_group_row(fx: &Fx, group: &str) -> AsyncPgConnection {
    let mut conn = fx.direct().await;
    conn.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM pgfifo.queue_group
         WHERE queue = '{QUEUE}' AND group_id = '{group}' FOR UPDATE"
    ))
    .await
    .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_does_not_count_wake_rows_it_puts_back_for_a_busy_group() {
    let fx = Fx::new().await;
    fx.push("busy", 0, Mode::Ok).await;
    assert_eq!(promote(&fx).await, 1);
    let mut runner = hold_group_row(&fx, "busy").await;
    fx.exec(&format!(
        "INSERT INTO pgfifo.group_wake (queue, group_id) VALUES ('{QUEUE}', 'busy')"
    ))
    .await;
    // Counting the put-back row made idle lanes pick and promote in a loop
    // for as long as the job ran.
    assert_eq!(promote(&fx).await, 0, "nothing handled: the group is busy");
    assert_eq!(
        fx.scalar("SELECT count(*) FROM pgfifo.group_wake").await,
        1,
        "the wake row is kept for later"
    );
    runner.batch_execute("COMMIT").await.unwrap();
    assert_eq!(promote(&fx).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_a_held_head_while_its_row_is_locked_still_releases_the_group() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    admin::set_failure_policy(&mut conn, QUEUE, FailurePolicy::Hold)
        .await
        .unwrap();
    let failed = fx.push("held", 0, Mode::Ok).await;
    let behind = fx.push("held", 1, Mode::Ok).await;
    promote(&fx).await;
    // The head failed for good under 'hold': head = failed job, inactive.
    fx.exec(&format!(
        "UPDATE pgfifo.job SET state = 'failed', finished_at = now() WHERE id = {failed};
         UPDATE pgfifo.queue_group SET ready_at = NULL WHERE group_id = 'held'"
    ))
    .await;
    assert_eq!(head(&fx, "held").await, (Some(failed), false));

    // A promote (woken by an enqueue) holds the row while the retry runs.
    let mut other = hold_group_row(&fx, "held").await;
    let report = admin::retry_jobs(&mut conn, &[failed]).await.unwrap();
    assert_eq!(report[0].result, admin::RetryResult::Retried);
    other.batch_execute("COMMIT").await.unwrap();
    promote(&fx).await;
    assert_eq!(
        head(&fx, "held").await,
        (Some(failed), true),
        "the retried head is active again, ahead of job {behind}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_not_parked_while_an_enqueuer_of_it_is_in_flight() {
    let fx = Fx::new().await;
    let first = fx.push("p", 0, Mode::Ok).await;
    promote(&fx).await;
    let mut conn = fx.conn().await;
    admin::pause_group(&mut conn, QUEUE, "p").await.unwrap();
    // An enqueuer is inside its transaction: it holds the group's advisory
    // lock shared and saw the group active, so it wrote no wake row.
    let mut enqueuer = fx.direct().await;
    enqueuer
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock_shared(1885824614, pgfifo.group_lock_key('{QUEUE}', 'p'))"
        ))
        .await
        .unwrap();
    // A pick finds the group paused but may not declare it idle now.
    let mut picker = fx.direct().await;
    pick(&mut picker).await;
    assert_eq!(
        head(&fx, "p").await,
        (Some(first), true),
        "not parked while an enqueuer is in flight"
    );
    enqueuer.batch_execute("COMMIT").await.unwrap();
    // Later, with no enqueuer in flight, the pick parks it.
    fx.exec("UPDATE pgfifo.queue_group SET ready_at = now() - interval '1 second'")
        .await;
    pick(&mut picker).await;
    assert_eq!(head(&fx, "p").await, (None, false), "parked");
    admin::resume_group(&mut conn, QUEUE, "p").await.unwrap();
    promote(&fx).await;
    assert_eq!(head(&fx, "p").await, (Some(first), true), "resumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_operations_refuse_a_repeatable_read_transaction() {
    let fx = Fx::new().await;
    fx.push("rr", 0, Mode::Ok).await;
    promote(&fx).await;
    let mut conn = fx.direct().await;
    conn.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    let err = admin::skip_head(&mut conn, QUEUE, "rr", None)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("READ COMMITTED"),
        "a clear error: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_head_waits_out_a_moment_of_lock_but_not_a_running_job() {
    let fx = Fx::new().await;
    let first = fx.push("g", 0, Mode::Ok).await;
    fx.push("g", 1, Mode::Ok).await;
    promote(&fx).await;
    assert_eq!(head(&fx, "g").await, (Some(first), true));

    // A pick that holds the group for a moment (a changed group, a batch
    // about to commit): skip-head waits for it instead of calling the head
    // running.
    let mut picker = hold_group_row(&fx, "g").await;
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        picker.batch_execute("COMMIT").await.unwrap();
    });
    let mut conn = fx.conn().await;
    let started = std::time::Instant::now();
    let skipped = admin::skip_head(&mut conn, QUEUE, "g", None).await.unwrap();
    assert_eq!(skipped, Some(first));
    assert!(started.elapsed() >= std::time::Duration::from_millis(90));
    release.await.unwrap();

    // A running job holds it for longer: busy after the moment, at once.
    let mut runner = hold_group_row(&fx, "g").await;
    let started = std::time::Instant::now();
    let err = admin::skip_head(&mut conn, QUEUE, "g", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, pgfifo::Error::GroupBusy { .. }),
        "expected GroupBusy, got {err:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(2),
        "waited {waited:?} for a running job"
    );
    runner.batch_execute("COMMIT").await.unwrap();
}

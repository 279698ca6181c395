//! Debounce in a group that runs several jobs at once (group concurrency
//! 2): a debounced job keeps its place in its group's start order, so a job
//! enqueued after it does not start first even with a free slot, and its
//! start moves with each debounce (docs/dedup-windows.md, "Against FIFO").

use std::time::Duration;

use pgfifo::{admin, EnqueueOutcome, GroupLimits};
use pgfifo_tests::test_config;

use crate::dedup_windows::{new_gated, new_job, one, setup, QUEUE};
use crate::enqueue_api::gate;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_debounced_job_keeps_its_place_in_a_wide_group() {
    let db = setup().await;
    let mut conn = db.conn().await;
    admin::set_group_limits(&mut conn, QUEUE, "w", GroupLimits::new().concurrency(2))
        .await
        .unwrap();
    let gate_name = "dedup_wide";
    let running = one(&mut conn, new_gated("running", Some(gate_name), "w", |o| o)).await;
    let runner = db.start_runner(test_config()).await;
    db.wait_attempt_rows(running.id, 1, Duration::from_secs(20))
        .await;
    // The group's second slot is free while the debounced job waits.
    let debounced = one(
        &mut conn,
        new_job("d1", "w", |o| o.debounce("wide", Duration::from_secs(2))),
    )
    .await;
    let behind = one(&mut conn, new_job("behind", "w", |o| o)).await;
    let moved = one(&mut conn, new_job("d2", "w", |o| o.debounce("wide", HOUR))).await;
    assert_eq!(moved.id, debounced.id);
    assert_eq!(moved.outcome, EnqueueOutcome::Debounced);
    // A job of another group due after the first quiet period: once it has
    // run, the runner has looked at the queue after that time.
    let probe = one(
        &mut conn,
        new_job("probe", "other", |o| o.run_in(Duration::from_secs(4))),
    )
    .await;
    db.wait_job_succeeded(probe.id, Duration::from_secs(30))
        .await;
    for id in [debounced.id, behind.id] {
        assert_eq!(
            db.job_state(id).await,
            "queued 0",
            "job {id} waits for the debounced job's new time, though a slot is free"
        );
    }
    // Debounced to a start that is near: it starts before the job behind it,
    // with its last payload.
    let last = one(
        &mut conn,
        new_job("d3", "w", |o| o.debounce("wide", Duration::from_micros(1))),
    )
    .await;
    assert_eq!(last.id, debounced.id);
    db.wait_job_succeeded(behind.id, Duration::from_secs(30))
        .await;
    db.wait_job_succeeded(debounced.id, Duration::from_secs(30))
        .await;
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(tag, ',' ORDER BY n) FROM dedup_log WHERE job_id = {}",
            debounced.id
        ))
        .await
        .as_deref(),
        Some("d3"),
        "the debounced job ran once, with its last payload"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT ((SELECT min(started_at) FROM pgfifo.job_attempt WHERE job_id = {}) \
                     <= (SELECT min(started_at) FROM pgfifo.job_attempt WHERE job_id = {}))::int",
            debounced.id, behind.id
        ))
        .await,
        1,
        "the debounced job started first"
    );
    gate(gate_name).add_permits(1);
    db.wait_job_succeeded(running.id, Duration::from_secs(20))
        .await;
    runner.shutdown().await.unwrap();
}

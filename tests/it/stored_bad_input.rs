//! Semantic 9 on the runner side: bad jobs that are already stored (written
//! by another program, an older binary, or by hand through
//! `pgfifo.enqueue(...)`) are marked `failed` with a clear reason, and the
//! runner keeps running: the jobs behind them in their group run.

use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use pgfifo::runner::JobOutcome;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(20);

const SBI_LOG: &str =
    "CREATE TABLE sbi_log (job_id bigint NOT NULL, n bigint NOT NULL, label text NOT NULL)";

/// A valid job type, to store good and broken payloads of.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(
    queue = "stored_bad_input",
    kind = "stored_bad_input.valid",
    max_attempts = 3,
    backoff = "10ms"
)]
struct StoredBadInputJob {
    n: i64,
    label: String,
}

#[async_trait]
impl Handler for StoredBadInputJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let id = ctx.id();
        diesel::sql_query("INSERT INTO sbi_log (job_id, n, label) VALUES ($1, $2, $3)")
            .bind::<BigInt, _>(id)
            .bind::<BigInt, _>(self.n)
            .bind::<Text, _>(&self.label)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

/// Stores one job through the schema's own enqueue function, bypassing the
/// library's checks; returns its id. `payload` is a JSON literal.
async fn store_raw(db: &TestDb, queue: &str, group: &str, kind: &str, payload: &str) -> i64 {
    db.scalar(&format!(
        "SELECT (pgfifo.enqueue( \
           ARRAY['{queue}'], ARRAY['{group}'], ARRAY['{kind}'], ARRAY['{payload}'::jsonb], \
           ARRAY[0::smallint], ARRAY[3], NULL, ARRAY[NULL::bigint], ARRAY[NULL::bigint]))[1]"
    ))
    .await
}

fn valid(n: i64) -> StoredBadInputJob {
    StoredBadInputJob {
        n,
        label: format!("job {n}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_unknown_job_type_fails_and_runner_keeps_running() {
    let db = TestDb::new().await;
    db.exec(SBI_LOG).await;
    let runner = db.start_runner(test_config().concurrency(1)).await;
    let mut events = runner.subscribe();
    let queue = StoredBadInputJob::QUEUE;
    let unknown = store_raw(
        &db,
        queue,
        "g",
        "stored_bad_input.NoSuchType",
        r#"{"n": 1}"#,
    )
    .await;
    let after = db.enqueue(valid(2), "g").await;

    // One worker: the one that met the bad job must go on to the next.
    db.wait_job_succeeded(after, LIMIT).await;
    // And a job enqueued afterwards runs too.
    let later = db.enqueue(valid(3), "g").await;
    db.wait_job_succeeded(later, LIMIT).await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.job_state(unknown).await,
        "failed 1",
        "an unknown type fails at once, without retries"
    );
    let reason = db.last_error(unknown).await.unwrap();
    assert!(
        reason.contains("unknown job type") && reason.contains("stored_bad_input.NoSuchType"),
        "the reason should name the unknown type: {reason}"
    );
    let mut failed = Vec::new();
    while let Ok(event) = events.try_recv() {
        if event.id == unknown {
            failed.push(event);
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        matches!(&failed[0].outcome, JobOutcome::Failed { error } if error.contains("unknown job type"))
    );
    assert_eq!(
        db.text("SELECT string_agg(n::text, ',' ORDER BY job_id) FROM sbi_log")
            .await
            .as_deref(),
        Some("2,3")
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt a, pgfifo.job h \
             WHERE a.job_id = {after} AND h.id = {unknown} AND a.started_at < h.finished_at"
        ))
        .await,
        0,
        "the next job of the group waited for the bad head"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_payload_that_does_not_deserialize_fails_and_runner_keeps_running() {
    let db = TestDb::new().await;
    db.exec(SBI_LOG).await;
    let queue = StoredBadInputJob::QUEUE;
    let kind = StoredBadInputJob::KIND;
    let missing_field = store_raw(&db, queue, "g", kind, r#"{"n": 1}"#).await;
    let wrong_type = store_raw(&db, queue, "g", kind, r#"{"n": "one", "label": "x"}"#).await;
    let not_an_object = store_raw(&db, queue, "h", kind, "[1, 2, 3]").await;
    let null = store_raw(&db, queue, "h", kind, "null").await;
    // Valid jobs behind the broken ones, in the same groups.
    let after_g = db.enqueue(valid(10), "g").await;
    let after_h = db.enqueue(valid(20), "h").await;
    // A stored job with a valid payload (extra fields ignored) runs.
    let extra = store_raw(
        &db,
        queue,
        "h",
        kind,
        r#"{"n": 21, "label": "raw", "extra": true}"#,
    )
    .await;

    let runner = db.start_runner(test_config().concurrency(1)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        7,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    for (id, detail) in [
        (missing_field, "missing field `label`"),
        (wrong_type, "invalid type"),
        (not_an_object, "invalid type"),
        (null, "invalid type"),
    ] {
        assert_eq!(
            db.job_state(id).await,
            "failed 1",
            "job {id}: a payload that does not deserialize fails at once"
        );
        let reason = db.last_error(id).await.unwrap();
        assert!(
            reason.contains("payload") && reason.contains("deserialize") && reason.contains(detail),
            "job {id}: the reason should say the payload does not deserialize ({detail}): {reason}"
        );
    }
    assert_eq!(
        db.text(&format!("SELECT string_agg(state, ',' ORDER BY id) FROM pgfifo.job WHERE id IN ({after_g}, {after_h}, {extra})"))
            .await
            .as_deref(),
        Some("succeeded,succeeded,succeeded")
    );
    assert_eq!(
        db.text("SELECT string_agg(n || ':' || label, ',' ORDER BY job_id) FROM sbi_log")
            .await
            .as_deref(),
        Some("10:job 10,20:job 20,21:raw")
    );
}

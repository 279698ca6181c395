//! Semantic 3, strict head-of-line: a failed job that will be retried stays
//! at the head of its group, which waits for the retry (backoff via
//! `run_after`); when it runs out of attempts it is kept as `failed` and the
//! group goes on. Also the other outcomes a handler can ask for: permanent
//! failure, cancellation, retry after a given delay.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::RunQueryDsl;
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(20);

/// Where handlers of this module record their successful runs (in the job's
/// transaction, so only committed runs appear).
const RETRY_LOG: &str = "CREATE TABLE retry_log (
    grp text NOT NULL, seq bigint NOT NULL, job_id bigint NOT NULL, attempt int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())";

async fn log_run(ctx: &mut JobContext<'_>, seq: i64) -> Result<(), JobError> {
    let group = ctx.group().unwrap_or("").to_owned();
    let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
    diesel::sql_query("INSERT INTO retry_log (grp, seq, job_id, attempt) VALUES ($1, $2, $3, $4)")
        .bind::<Text, _>(group)
        .bind::<BigInt, _>(seq)
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt)
        .execute(ctx.conn())
        .await?;
    Ok(())
}

/// Fails (retryably) on its first `fail_times` attempts, then succeeds.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "retries", max_attempts = 5, backoff = "300ms")]
struct RetryFlakyJob {
    seq: i64,
    fail_times: u32,
}

#[async_trait]
impl Handler for RetryFlakyJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        // Written and then rolled back by the failure: must never show up.
        log_run(ctx, self.seq).await?;
        if ctx.attempt() <= self.fail_times {
            return Err(JobError::retry(format!(
                "flaky failure on attempt {}",
                ctx.attempt()
            )));
        }
        Ok(())
    }
}

/// Does what `behavior` says: `ok`, `always_retry`, `permanent`, `cancel`,
/// or `retry_after_ms` (on the first attempt only).
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "retries", max_attempts = 3, backoff = "10ms")]
struct RetryOutcomeJob {
    seq: i64,
    behavior: String,
    #[serde(default)]
    retry_after_ms: u64,
}

#[async_trait]
impl Handler for RetryOutcomeJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(ctx, self.seq).await?;
        match self.behavior.as_str() {
            "ok" => Ok(()),
            "always_retry" => Err(JobError::retry(format!(
                "always fails (attempt {})",
                ctx.attempt()
            ))),
            "permanent" => Err(JobError::permanent("a permanent problem")),
            "cancel" => Err(JobError::cancel("no longer wanted")),
            "retry_after" if ctx.attempt() == 1 => Err(JobError::retry_after(
                Duration::from_millis(self.retry_after_ms),
                "come back later",
            )),
            "retry_after" => Ok(()),
            other => Err(JobError::permanent(format!("unknown behavior {other}"))),
        }
    }
}

fn outcome(seq: i64, behavior: &str) -> RetryOutcomeJob {
    RetryOutcomeJob {
        seq,
        behavior: behavior.into(),
        retry_after_ms: 0,
    }
}

/// Waits for the event of job `id` that satisfies `pred` (events of other
/// jobs are passed over).
async fn wait_event(
    rx: &mut broadcast::Receiver<JobEvent>,
    id: i64,
    pred: impl Fn(&JobOutcome) -> bool,
) -> JobEvent {
    tokio::time::timeout(LIMIT, async {
        loop {
            match rx.recv().await {
                Ok(event) if event.id == id && pred(&event.outcome) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("runner events closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching event for job {id} within {LIMIT:?}"))
}

/// Milliseconds from the end of `attempt` of job `id` to the start of the next.
async fn gap_ms(db: &TestDb, id: i64, attempt: i32) -> i64 {
    db.scalar(&format!(
        "SELECT (extract(epoch FROM b.started_at - a.finished_at) * 1000)::bigint \
         FROM pgfifo.job_attempt a JOIN pgfifo.job_attempt b ON b.job_id = a.job_id AND b.attempt = a.attempt + 1 \
         WHERE a.job_id = {id} AND a.attempt = {attempt}"
    ))
    .await
}

/// Attempts of other jobs of `id`'s group that started before `id` finished.
async fn group_starts_before_finish(db: &TestDb, id: i64) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pgfifo.job h JOIN pgfifo.job o \
           ON o.queue = h.queue AND o.group_id = h.group_id AND o.id <> h.id \
         JOIN pgfifo.job_attempt a ON a.job_id = o.id \
         WHERE h.id = {id} AND a.started_at < h.finished_at"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_head_of_line_retried_head_blocks_its_group_until_success() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let runner = db.start_runner(test_config().concurrency(4)).await;
    let mut events = runner.subscribe();
    // The head fails twice, then succeeds; three jobs wait behind it. One
    // batch, so they are all queued before the head first runs.
    let jobs = (0..4).map(|seq| {
        let job = RetryFlakyJob {
            seq,
            fail_times: if seq == 0 { 2 } else { 0 },
        };
        NewJob::new(&job, EnqueueOptions::group("hol")).unwrap()
    });
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    drop(conn);
    let (head, later) = (ids[0], &ids[1..]);

    let first = wait_event(&mut events, head, |o| {
        matches!(o, JobOutcome::Retrying { .. })
    })
    .await;
    match &first.outcome {
        JobOutcome::Retrying { error, delay } => {
            assert!(error.contains("flaky failure on attempt 1"), "{error}");
            // Base backoff 300 ms, jitter on the upper half only.
            assert!(
                *delay >= Duration::from_millis(150) && *delay <= Duration::from_millis(300),
                "first retry delay {delay:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(first.attempt, 1);
    // While the head waits for its retry, nothing else of the group starts.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({})",
            later
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await,
        0,
        "a later job of the group started while its head waited for a retry"
    );
    db.wait_succeeded(4, LIMIT).await;
    runner.shutdown().await.unwrap();

    // The head: three attempts, the first two failed, kept succeeded.
    assert_eq!(db.job_state(head).await, "succeeded 3");
    assert_eq!(
        db.last_error(head).await.as_deref(),
        Some("flaky failure on attempt 2")
    );
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt || ':' || coalesce(error, '-'), ' | ' ORDER BY attempt) \
             FROM pgfifo.job_attempt WHERE job_id = {head}"
        ))
        .await
        .as_deref(),
        Some("1:flaky failure on attempt 1 | 2:flaky failure on attempt 2 | 3:-")
    );
    // Failed attempts' writes were rolled back: only the third run is logged.
    assert_eq!(
        db.text(&format!(
            "SELECT string_agg(attempt::text, ',') FROM retry_log WHERE job_id = {head}"
        ))
        .await
        .as_deref(),
        Some("3")
    );
    // Backoff: run_after moved at least half the base delay (the fixed half of
    // the jitter) into the future, then twice that for the second retry.
    let first_gap = gap_ms(&db, head, 1).await;
    let second_gap = gap_ms(&db, head, 2).await;
    assert!(
        first_gap >= 148,
        "second attempt started {first_gap} ms after the first failed"
    );
    assert!(
        second_gap >= 298,
        "third attempt started {second_gap} ms after the second failed"
    );
    // The later jobs started only after the head's success, in order.
    assert_eq!(group_starts_before_finish(&db, head).await, 0);
    assert_eq!(
        db.text("SELECT string_agg(seq::text, ',' ORDER BY at) FROM retry_log")
            .await
            .as_deref(),
        Some("0,1,2,3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_head_of_line_exhausted_attempts_fail_then_group_proceeds() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let runner = db.start_runner(test_config().concurrency(3)).await;
    let mut events = runner.subscribe();
    let head = db.enqueue(outcome(0, "always_retry"), "dead").await;
    let next = db.enqueue(outcome(1, "ok"), "dead").await;

    let failed = wait_event(&mut events, head, |o| {
        matches!(o, JobOutcome::Failed { .. })
    })
    .await;
    assert_eq!(failed.attempt, 3);
    db.wait_job_succeeded(next, LIMIT).await;
    runner.shutdown().await.unwrap();

    assert_eq!(db.job_state(head).await, "failed 3");
    let last_error = db.last_error(head).await.unwrap();
    assert!(
        last_error.contains("always fails (attempt 3)"),
        "{last_error}"
    );
    assert!(last_error.contains("no attempts left"), "{last_error}");
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {head} AND error LIKE 'always fails%'"
        ))
        .await,
        3
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {head} AND finished_at IS NOT NULL"
        ))
        .await,
        1
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM retry_log WHERE job_id = {head}"
        ))
        .await,
        0
    );
    // The next job waited for the dead one, then ran.
    assert_eq!(group_starts_before_finish(&db, head).await, 0);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM retry_log WHERE job_id = {next}"
        ))
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_fails_at_once_and_cancel_cancels() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let permanent = db.enqueue(outcome(0, "permanent"), "perm").await;
    let after_permanent = db.enqueue(outcome(1, "ok"), "perm").await;
    let cancel = db.enqueue(outcome(0, "cancel"), "cancel").await;
    let after_cancel = db.enqueue(outcome(1, "ok"), "cancel").await;

    let runner = db.start_runner(test_config().concurrency(2)).await;
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id IN ({after_permanent}, {after_cancel}) AND state = 'succeeded'"),
        2,
        LIMIT,
    )
    .await;
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.text(&format!("SELECT state || ' ' || attempts || ' ' || last_error FROM pgfifo.job WHERE id = {permanent}"))
            .await
            .as_deref(),
        Some("failed 1 a permanent problem")
    );
    assert_eq!(
        db.attempt_rows(permanent).await,
        1,
        "a permanent error is not retried"
    );
    assert_eq!(
        db.text(&format!("SELECT state || ' ' || attempts || ' ' || last_error FROM pgfifo.job WHERE id = {cancel}"))
            .await
            .as_deref(),
        Some("cancelled 1 no longer wanted")
    );
    assert_eq!(db.attempt_rows(cancel).await, 1);
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM retry_log WHERE job_id IN ({permanent}, {cancel})"
        ))
        .await,
        0,
        "writes of failed and cancelled runs are rolled back"
    );
    assert_eq!(group_starts_before_finish(&db, permanent).await, 0);
    assert_eq!(group_starts_before_finish(&db, cancel).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_and_cancel_events_report_the_outcome() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    let permanent = db.enqueue(outcome(0, "permanent"), "ev").await;
    let cancel = db.enqueue(outcome(1, "cancel"), "ev").await;
    let event = wait_event(&mut events, permanent, |_| true).await;
    assert_eq!(
        event.outcome,
        JobOutcome::Failed {
            error: "a permanent problem".into()
        }
    );
    assert_eq!((event.attempt, event.group.as_deref()), (1, Some("ev")));
    let event = wait_event(&mut events, cancel, |_| true).await;
    assert_eq!(
        event.outcome,
        JobOutcome::Cancelled {
            reason: "no longer wanted".into()
        }
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_delay_is_honoured() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut events = runner.subscribe();
    // The type's backoff is 10 ms; the handler asks for 700 ms.
    let job = RetryOutcomeJob {
        seq: 0,
        behavior: "retry_after".into(),
        retry_after_ms: 700,
    };
    let id = db.enqueue(job, "later").await;

    let retry = wait_event(&mut events, id, |o| {
        matches!(o, JobOutcome::Retrying { .. })
    })
    .await;
    assert!(
        matches!(retry.outcome, JobOutcome::Retrying { delay, .. } if delay == Duration::from_millis(700)),
        "{retry:?}"
    );
    wait_event(&mut events, id, |o| *o == JobOutcome::Succeeded).await;
    runner.shutdown().await.unwrap();

    let gap = gap_ms(&db, id, 1).await;
    assert!(
        gap >= 695,
        "the retry started {gap} ms after the failure, before the 700 ms asked for"
    );
    assert_eq!(db.job_state(id).await, "succeeded 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_head_of_line_waiting_retry_blocks_only_its_group() {
    let db = TestDb::new().await;
    db.exec(RETRY_LOG).await;
    let runner = db.start_runner(test_config().concurrency(3)).await;
    let mut events = runner.subscribe();
    let mut conn = db.conn().await;
    // The head of "slow" asks to be retried in a minute.
    let head = RetryOutcomeJob {
        seq: 0,
        behavior: "retry_after".into(),
        retry_after_ms: 60_000,
    }
    .enqueue(&mut conn, "slow")
    .await
    .unwrap();
    let blocked = outcome(1, "ok").enqueue(&mut conn, "slow").await.unwrap();
    let retry = wait_event(&mut events, head, |o| {
        matches!(o, JobOutcome::Retrying { .. })
    })
    .await;
    assert_eq!(retry.attempt, 1);

    // Work enqueued while the head waits runs: other groups, ungrouped jobs.
    let mut others = Vec::new();
    for seq in 0..5 {
        others.push(outcome(seq, "ok").enqueue(&mut conn, "fast").await.unwrap());
    }
    others.push(
        outcome(0, "ok")
            .enqueue_with(&mut conn, EnqueueOptions::ungrouped())
            .await
            .unwrap(),
    );
    drop(conn);
    let others = others
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    db.wait_for(
        &format!("SELECT count(*) FROM pgfifo.job WHERE id IN ({others}) AND state = 'succeeded'"),
        6,
        LIMIT,
    )
    .await;
    // The runner has drained everything it may run; the held group is untouched.
    runner.shutdown().await.unwrap();

    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job j JOIN pgfifo.job_attempt a ON a.job_id = j.id \
             WHERE j.id = {head} AND j.state = 'queued' AND j.attempts = 1 \
             AND j.run_after BETWEEN a.finished_at + interval '59.9 seconds' AND a.finished_at + interval '60.1 seconds'"
        ))
        .await,
        1,
        "run_after is the delay the handler asked for"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.queue_group g JOIN pgfifo.job j ON j.id = g.head_id \
             WHERE g.group_id = 'slow' AND g.head_id = {head} AND g.ready_at = j.run_after"
        ))
        .await,
        1,
        "the retried job stays the head of its group until its time"
    );
    assert_eq!(
        db.attempt_rows(blocked).await,
        0,
        "the job behind a waiting retry must not start"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id = {blocked} AND state = 'queued'"
        ))
        .await,
        1
    );
}

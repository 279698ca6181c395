//! Ungrouped jobs are serialized with nothing: they run in parallel with each
//! other and are not held up by a running grouped job of their queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::{Barrier, Semaphore};

/// Waits at a rendezvous of `parties` jobs (failing for good if they do not
/// all arrive within 10 s), or at a gate, then logs its tag.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "ungrouped", max_attempts = 1, timeout = "30s")]
pub struct UngroupedJob {
    tag: String,
    rendezvous: Option<(String, usize)>,
    gate: Option<String>,
}

const LOG_TABLE: &str =
    "CREATE TABLE ungrouped_log (n bigserial PRIMARY KEY, job_id bigint NOT NULL, tag text NOT NULL)";

#[async_trait]
impl Handler for UngroupedJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if let Some((name, parties)) = &self.rendezvous {
            let barrier = barrier(name, *parties);
            if tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                .await
                .is_err()
            {
                return Err(JobError::permanent(format!(
                    "{}: the other {} jobs of rendezvous {name} did not run at the same time",
                    self.tag,
                    parties - 1
                )));
            }
        }
        if let Some(name) = &self.gate {
            gate(name).acquire_owned().await?.forget();
        }
        diesel::sql_query("INSERT INTO ungrouped_log (job_id, tag) VALUES ($1, $2)")
            .bind::<BigInt, _>(ctx.id())
            .bind::<Text, _>(&self.tag)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

fn barrier(name: &str, parties: usize) -> Arc<Barrier> {
    static BARRIERS: OnceLock<Mutex<HashMap<String, Arc<Barrier>>>> = OnceLock::new();
    BARRIERS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(Barrier::new(parties)))
        .clone()
}

fn gate(name: &str) -> Arc<Semaphore> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<Semaphore>>>> = OnceLock::new();
    GATES
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(Semaphore::new(0)))
        .clone()
}

fn plain(tag: &str) -> UngroupedJob {
    UngroupedJob {
        tag: tag.to_owned(),
        rendezvous: None,
        gate: None,
    }
}

async fn setup() -> TestDb {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungrouped_jobs_run_in_parallel() {
    let db = setup().await;
    let jobs: Vec<NewJob> = (0..4)
        .map(|i| {
            let job = UngroupedJob {
                rendezvous: Some(("ungrouped_parallel".into(), 4)),
                ..plain(&format!("u{i}"))
            };
            NewJob::new(&job, EnqueueOptions::ungrouped()).unwrap()
        })
        .collect();
    assert!(jobs.iter().all(|j| j.group_name().is_none()));
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    drop(conn);
    assert_eq!(ids.len(), 4);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE group_id IS NULL")
            .await,
        4
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group").await,
        0,
        "ungrouped jobs have no group row"
    );

    // Each job waits until all four are inside their handlers: only possible
    // if they run at the same time.
    let runner = db.start_runner(test_config().concurrency(4)).await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE state <> 'queued'",
        4,
        Duration::from_secs(30),
    )
    .await;
    runner.shutdown().await.unwrap();

    let errors = db
        .text("SELECT string_agg(last_error, '; ') FROM pgfifo.job WHERE state <> 'succeeded'")
        .await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'")
            .await,
        4,
        "{errors:?}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM ungrouped_log").await, 4);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await,
        4,
        "one attempt each"
    );
    // Every job started before any finished.
    assert_eq!(
        db.scalar(
            "SELECT ((SELECT max(started_at) FROM pgfifo.job_attempt)
                   < (SELECT min(finished_at) FROM pgfifo.job))::int"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungrouped_job_is_not_blocked_by_a_running_grouped_job() {
    let db = setup().await;
    let gate_name = "ungrouped_vs_grouped";
    let runner = db.start_runner(test_config().concurrency(2)).await;
    let mut conn = db.conn().await;
    let grouped = UngroupedJob {
        gate: Some(gate_name.into()),
        ..plain("grouped-1")
    }
    .enqueue(&mut conn, "g")
    .await
    .unwrap();
    let grouped_next = plain("grouped-2").enqueue(&mut conn, "g").await.unwrap();
    db.wait_attempt_rows(grouped, 1, Duration::from_secs(10))
        .await;

    // Enqueued after both grouped jobs, in the same queue: it runs while the
    // group is busy.
    let ungrouped = plain("ungrouped")
        .enqueue_with(&mut conn, EnqueueOptions::ungrouped())
        .await
        .unwrap();
    drop(conn);
    db.wait_job_succeeded(ungrouped, Duration::from_secs(10))
        .await;
    assert_eq!(
        db.text(&format!(
            "SELECT state FROM pgfifo.job WHERE id = {grouped}"
        ))
        .await
        .as_deref(),
        Some("queued"),
        "the grouped job is still running"
    );
    assert_eq!(db.attempt_rows(grouped).await, 1);
    assert_eq!(
        db.attempt_rows(grouped_next).await,
        0,
        "its group is still held"
    );

    gate(gate_name).add_permits(1);
    db.wait_succeeded(3, Duration::from_secs(10)).await;
    runner.shutdown().await.unwrap();
    let order = db
        .text("SELECT string_agg(tag, ',' ORDER BY n) FROM ungrouped_log")
        .await;
    assert_eq!(order.as_deref(), Some("ungrouped,grouped-1,grouped-2"));
}

//! The enqueue API: single and batch enqueue, the caller's transaction. This
//! module's job type and helpers also serve `enqueue_options` (unique keys,
//! delays, priorities, per-job max attempts) and `enqueue_no_wait`
//! (enqueueing into a busy group without waiting for it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, Semaphore};

/// A job of this module. It optionally waits for its gate to open, optionally
/// fails, and otherwise logs `(job_id, tag)` to `enq_api_log` in its own
/// transaction (so a log row means the job succeeded).
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[job(queue = "enq_api", max_attempts = 4, timeout = "30s", backoff = "10ms")]
pub struct EnqApiJob {
    tag: String,
    gate: Option<String>,
    fail: bool,
}

const LOG_TABLE: &str =
    "CREATE TABLE enq_api_log (n bigserial PRIMARY KEY, job_id bigint NOT NULL, tag text NOT NULL)";

#[async_trait]
impl Handler for EnqApiJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if let Some(name) = &self.gate {
            gate(name).acquire_owned().await?.forget();
        }
        if self.fail {
            return Err(JobError::retry(format!("{} fails on purpose", self.tag)));
        }
        diesel::sql_query("INSERT INTO enq_api_log (job_id, tag) VALUES ($1, $2)")
            .bind::<BigInt, _>(ctx.id())
            .bind::<Text, _>(&self.tag)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

/// A named gate (closed until permits are added), shared by the test and the
/// handlers of this binary. Names are unique per test.
pub(crate) fn gate(name: &str) -> Arc<Semaphore> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<Semaphore>>>> = OnceLock::new();
    GATES
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(Semaphore::new(0)))
        .clone()
}

pub(crate) fn job(tag: &str) -> EnqApiJob {
    EnqApiJob {
        tag: tag.to_owned(),
        gate: None,
        fail: false,
    }
}

pub(crate) fn gated(tag: &str, gate: &str) -> EnqApiJob {
    EnqApiJob {
        gate: Some(gate.to_owned()),
        ..job(tag)
    }
}

pub(crate) fn failing(tag: &str) -> EnqApiJob {
    EnqApiJob {
        fail: true,
        ..job(tag)
    }
}

pub(crate) async fn setup() -> TestDb {
    let db = TestDb::new().await;
    db.exec(LOG_TABLE).await;
    db
}

/// Waits for the event of `id` that ends its run (any outcome), skipping the
/// events of other jobs.
pub(crate) async fn next_event_of(
    rx: &mut broadcast::Receiver<JobEvent>,
    id: JobId,
    limit: Duration,
) -> JobEvent {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(event)) if event.id == id => return event,
            Ok(Ok(_)) => {}
            Ok(Err(broadcast::error::RecvError::Lagged(n))) => panic!("missed {n} runner events"),
            Ok(Err(broadcast::error::RecvError::Closed)) => {
                panic!("the runner's event channel closed")
            }
            Err(_) => panic!("no event for job {id} within {limit:?}"),
        }
    }
}

async fn rows_of(db: &TestDb, id: JobId) -> i64 {
    db.scalar(&format!("SELECT count(*) FROM pgfifo.job WHERE id = {id}"))
        .await
}

/// `count(*)` of `pgfifo.job` rows with id `id`, seen from `conn` (which may be
/// inside a transaction).
async fn rows_seen_by(conn: &mut AsyncPgConnection, id: JobId) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let row: Row = diesel::sql_query("SELECT count(*) AS n FROM pgfifo.job WHERE id = $1")
        .bind::<BigInt, _>(id)
        .get_result(conn)
        .await
        .expect("count the job's rows");
    row.n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_enqueue_stores_the_job() {
    let db = setup().await;
    let payload = job("single");
    let mut conn = db.conn().await;
    let id = payload.enqueue(&mut conn, "tenant-1").await.unwrap();
    drop(conn);

    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
    let where_id = format!("FROM pgfifo.job WHERE id = {id}");
    assert_eq!(
        db.text(&format!("SELECT queue {where_id}"))
            .await
            .as_deref(),
        Some("enq_api")
    );
    assert_eq!(
        db.text(&format!("SELECT group_id {where_id}"))
            .await
            .as_deref(),
        Some("tenant-1")
    );
    assert_eq!(
        db.text(&format!("SELECT kind {where_id}")).await.as_deref(),
        Some("EnqApiJob")
    );
    assert_eq!(EnqApiJob::KIND, "EnqApiJob");
    let stored: serde_json::Value = serde_json::from_str(
        &db.text(&format!("SELECT payload {where_id}"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(stored, serde_json::to_value(&payload).unwrap());
    assert_eq!(
        serde_json::from_value::<EnqApiJob>(stored).unwrap(),
        payload
    );
    assert_eq!(
        db.scalar(&format!("SELECT max_attempts {where_id}")).await,
        4
    );
    assert_eq!(db.scalar(&format!("SELECT priority {where_id}")).await, 0);
    assert_eq!(db.scalar(&format!("SELECT attempts {where_id}")).await, 0);
    assert_eq!(
        db.text(&format!("SELECT state {where_id}"))
            .await
            .as_deref(),
        Some("queued")
    );
    assert_eq!(
        db.text(&format!("SELECT unique_key {where_id}")).await,
        None
    );
    // Once a runner promotes the woken group, the job is its head.
    db.exec("SELECT pgfifo.promote(ARRAY['enq_api'], 1000)")
        .await;
    assert_eq!(
        db.scalar("SELECT head_id FROM pgfifo.queue_group WHERE queue = 'enq_api' AND group_id = 'tenant-1'")
            .await,
        id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_batch_returns_ids_in_input_order() {
    let db = setup().await;
    let groups = ["b", "a", "c", "a", "b", "a", "c", "c", "b", "a"];
    let jobs: Vec<NewJob> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| NewJob::new(&job(&format!("batch-{i}")), EnqueueOptions::group(*g)).unwrap())
        .collect();
    assert_eq!(jobs[3].queue_name(), "enq_api");
    assert_eq!(jobs[3].group_name(), Some("a"));
    let mut conn = db.conn().await;
    assert_eq!(
        pgfifo::enqueue_batch(&mut conn, Vec::new()).await.unwrap(),
        Vec::<JobId>::new()
    );
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    drop(conn);

    assert_eq!(ids.len(), groups.len());
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids increase in input order: {ids:?}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job").await,
        groups.len() as i64
    );
    for (i, (id, group)) in ids.iter().zip(groups).enumerate() {
        let tag = db
            .text(&format!(
                "SELECT payload->>'tag' FROM pgfifo.job WHERE id = {id}"
            ))
            .await;
        assert_eq!(tag, Some(format!("batch-{i}")), "id {id} is input {i}");
        let stored_group = db
            .text(&format!("SELECT group_id FROM pgfifo.job WHERE id = {id}"))
            .await;
        assert_eq!(stored_group.as_deref(), Some(group));
    }
    // Each group's head, once promoted, is its first job in input order.
    db.exec("SELECT pgfifo.promote(ARRAY['enq_api'], 1000)")
        .await;
    for group in ["a", "b", "c"] {
        let first = groups.iter().position(|g| *g == group).unwrap();
        let head = db
            .scalar(&format!(
                "SELECT head_id FROM pgfifo.queue_group WHERE queue = 'enq_api' AND group_id = '{group}'"
            ))
            .await;
        assert_eq!(head, ids[first], "head of group {group}");
    }

    // And they run in that order within each group.
    let runner = db.start_runner(test_config().concurrency(3)).await;
    db.wait_for(
        "SELECT count(*) FROM enq_api_log",
        groups.len() as i64,
        Duration::from_secs(30),
    )
    .await;
    runner.shutdown().await.unwrap();
    let disorder = db
        .scalar(
            "SELECT count(*) FROM (
                SELECT j.group_id, l.job_id, lag(l.job_id) OVER (PARTITION BY j.group_id ORDER BY l.n) AS prev
                FROM enq_api_log l JOIN pgfifo.job j ON j.id = l.job_id) s
             WHERE prev > job_id",
        )
        .await;
    assert_eq!(disorder, 0, "jobs of a group ran in id (input) order");
}

/// `pgfifo.enqueue` has a path of its own for one job without a unique key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_alone_is_stored_as_in_a_batch() {
    let db = setup().await;
    let options = |group: &str| {
        EnqueueOptions::group(group)
            .priority(7)
            .max_attempts(9)
            .run_in(Duration::from_secs(3600))
    };
    let payload = job("alike");
    let mut conn = db.conn().await;
    let alone = payload
        .enqueue_with(&mut conn, options("alone"))
        .await
        .unwrap();
    let batch = vec![
        NewJob::new(&payload, options("batched")).unwrap(),
        NewJob::new(&payload, EnqueueOptions::ungrouped().priority(7)).unwrap(),
    ];
    let batched = pgfifo::enqueue_batch(&mut conn, batch).await.unwrap();
    let ungrouped = payload
        .enqueue_with(&mut conn, EnqueueOptions::ungrouped().priority(7))
        .await
        .unwrap();
    assert!(alone < batched[0] && batched[1] < ungrouped);
    // The same columns, the delay from the server's clock included.
    let alike = |a: JobId, b: JobId| {
        format!(
            "SELECT count(DISTINCT (queue, kind, payload, priority, max_attempts, state, attempts, \
                                    attempt_base, unique_key, result, last_error, finished_at, \
                                    round(extract(epoch FROM run_after - created_at)))) \
             FROM pgfifo.job WHERE id IN ({a}, {b})"
        )
    };
    assert_eq!(db.scalar(&alike(alone, batched[0])).await, 1);
    assert_eq!(db.scalar(&alike(batched[1], ungrouped)).await, 1);
    assert_eq!(
        db.scalar(&format!(
            "SELECT round(extract(epoch FROM run_after - created_at)) FROM pgfifo.job WHERE id = {alone}"
        ))
        .await,
        3600
    );
    // Each idle group is woken once, ungrouped jobs wake no group.
    let wakes = "SELECT count(*) FROM pgfifo.group_wake";
    assert_eq!(db.scalar(wakes).await, 2);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT group_id) FROM pgfifo.group_wake WHERE group_id IN ('alone', 'batched')")
            .await,
        2
    );
    // Into an active group, neither path writes a wake row.
    db.exec("SELECT pgfifo.promote(ARRAY['enq_api'], 1000)")
        .await;
    assert_eq!(db.scalar(wakes).await, 0);
    payload
        .enqueue_with(&mut conn, options("alone"))
        .await
        .unwrap();
    pgfifo::enqueue_batch(
        &mut conn,
        vec![NewJob::new(&payload, options("batched")).unwrap()],
    )
    .await
    .unwrap();
    assert_eq!(db.scalar(wakes).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_a_transaction_runs_only_after_commit() {
    let db = setup().await;
    // One worker: if the uncommitted job were visible, it would be picked
    // before the probe enqueued after it (same priority, older ready time).
    let runner = db.start_runner(test_config().concurrency(1)).await;
    let mut events = runner.subscribe();
    let mut other = db.conn().await;
    let mut conn = db.conn().await;

    let id = conn
        .transaction::<_, pgfifo::Error, _>(async |c| {
            let id = job("in-tx").enqueue(c, "tx-group").await?;
            assert_eq!(
                rows_seen_by(c, id).await,
                1,
                "the enqueuing transaction sees its job"
            );
            assert_eq!(
                rows_of(&db, id).await,
                0,
                "another connection does not see it"
            );

            let probe = job("probe").enqueue(&mut other, "probe-group").await?;
            let event = next_event_of(&mut events, probe, Duration::from_secs(10)).await;
            assert_eq!(event.outcome, JobOutcome::Succeeded);
            assert_eq!(
                db.attempt_rows(id).await,
                0,
                "the runner did not start the uncommitted job"
            );
            assert_eq!(rows_of(&db, id).await, 0);
            Ok(id)
        })
        .await
        .unwrap();

    assert_eq!(rows_of(&db, id).await, 1, "visible once committed");
    let event = next_event_of(&mut events, id, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    assert_eq!(event.group.as_deref(), Some("tx-group"));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM enq_api_log WHERE job_id = {id}"
        ))
        .await,
        1
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_a_rolled_back_transaction_vanishes() {
    let db = setup().await;
    let runner = db.start_runner(test_config().concurrency(1)).await;
    let mut events = runner.subscribe();
    let mut other = db.conn().await;
    let mut conn = db.conn().await;

    let mut rolled_back = Vec::new();
    let result = conn
        .transaction::<(), pgfifo::Error, _>(async |c| {
            let first = job("rolled-back-1").enqueue(c, "rb-group").await?;
            let second = job("rolled-back-2").enqueue(c, "rb-group").await?;
            rolled_back = vec![first, second];
            assert_eq!(rows_seen_by(c, first).await, 1);
            assert_eq!(
                rows_of(&db, first).await,
                0,
                "another connection does not see it"
            );

            let probe = job("probe-1").enqueue(&mut other, "probe-group").await?;
            let event = next_event_of(&mut events, probe, Duration::from_secs(10)).await;
            assert_eq!(event.outcome, JobOutcome::Succeeded);
            assert_eq!(
                db.attempt_rows(first).await,
                0,
                "the runner did not start the uncommitted job"
            );
            Err(pgfifo::Error::Database(
                diesel::result::Error::RollbackTransaction,
            ))
        })
        .await;
    assert!(
        matches!(
            result,
            Err(pgfifo::Error::Database(
                diesel::result::Error::RollbackTransaction
            ))
        ),
        "{result:?}"
    );
    assert_eq!(rolled_back.len(), 2);

    for id in &rolled_back {
        assert_eq!(
            rows_of(&db, *id).await,
            0,
            "job {id} vanished with the rollback"
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group WHERE group_id = 'rb-group' AND head_id IS NOT NULL")
            .await,
        0,
        "no group head left pointing at a rolled-back job"
    );

    // The group is usable: a committed job in it runs, and the rolled-back
    // jobs never do.
    let after = job("after-rollback")
        .enqueue(&mut other, "rb-group")
        .await
        .unwrap();
    let event = next_event_of(&mut events, after, Duration::from_secs(10)).await;
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    runner.shutdown().await.unwrap();
    for id in &rolled_back {
        assert_eq!(db.attempt_rows(*id).await, 0, "job {id} never started");
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM enq_api_log WHERE tag LIKE 'rolled-back%'")
            .await,
        0
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM enq_api_log").await,
        2,
        "the probe and the later job ran"
    );
}

//! `pgfifo::testing` against pgfifo itself: a drain runs groups in the
//! order a real runner does, follows the failure policy and pauses, and
//! the order check from the attempt records passes after a real runner and
//! catches a job that overtook another. Databases come from
//! `pgfifo::testing::TestDatabase`, the public form of this crate's `TestDb`.

use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::admin::{
    pause_group, pause_queue, set_failure_policy, set_group_limits, FailurePolicy,
};
use pgfifo::testing::{
    assert_group_ran_in_order, check_group_ran_in_order, enqueued_jobs, Drain, Jobs, TestDatabase,
};
use pgfifo::{
    async_trait, EnqueueOptions, GroupLimits, Handler, Job, JobContext, JobError, JobId, Rate,
};
use pgfifo_tests::{eventually, test_config};
use serde::{Deserialize, Serialize};

const QUEUE: &str = "testing_helpers";

/// Succeeds, or fails for good when `fail` is set; when `spawn` is set,
/// first enqueues a plain job into group `b` and an ungrouped one.
#[derive(Job, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[job(queue = "testing_helpers", max_attempts = 2)]
struct TestingHelpersJob {
    fail: bool,
    spawn: bool,
}

#[async_trait]
impl Handler for TestingHelpersJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.fail {
            return Err(JobError::permanent("asked to fail"));
        }
        if self.spawn {
            let plain = TestingHelpersJob::default();
            plain.enqueue(ctx.conn(), "b").await?;
            plain
                .enqueue_with(ctx.conn(), EnqueueOptions::ungrouped())
                .await?;
        }
        Ok(())
    }
}

async fn enqueue(db: &TestDatabase, fail: bool, group: &str) -> JobId {
    let mut conn = db.pool().get().await.unwrap();
    TestingHelpersJob { fail, spawn: false }
        .enqueue(&mut conn, group)
        .await
        .unwrap()
}

/// Six jobs in each of three groups, enqueued in turn.
async fn enqueue_groups(db: &TestDatabase) -> Vec<(String, JobId)> {
    let mut ids = Vec::new();
    for _ in 0..6 {
        for group in ["a", "b", "c"] {
            ids.push((group.to_owned(), enqueue(db, false, group).await));
        }
    }
    ids
}

#[tokio::test]
async fn a_drain_runs_each_group_in_the_order_a_runner_does() {
    let drained = TestDatabase::new().await.unwrap();
    let ids = enqueue_groups(&drained).await;
    let summary = Drain::queue(QUEUE).run(drained.pool()).await.unwrap();
    summary.assert_fifo();
    assert_eq!((summary.succeeded, summary.left_queued), (18, 0));
    for group in ["a", "b", "c"] {
        let expected: Vec<JobId> = ids
            .iter()
            .filter(|(g, _)| g == group)
            .map(|p| p.1)
            .collect();
        assert_eq!(summary.order(group), expected, "group {group}");
    }

    let ran = TestDatabase::on(&pgfifo_tests::server_url(), 20)
        .await
        .unwrap();
    assert_eq!(
        enqueue_groups(&ran).await,
        ids,
        "fresh databases number jobs alike"
    );
    let runner = pgfifo::runner::start(ran.pool().clone(), test_config().concurrency(4))
        .await
        .unwrap();
    let mut conn = ran.connect().await.unwrap();
    eventually("18 jobs succeeded", Duration::from_secs(30), || async {
        let jobs = enqueued_jobs(
            &mut ran.connect().await.unwrap(),
            &Jobs::in_queue(QUEUE).state("succeeded"),
        )
        .await
        .map_err(|e| e.to_string())?;
        if jobs.len() == 18 {
            Ok(())
        } else {
            Err(format!("{} succeeded", jobs.len()))
        }
    })
    .await;
    runner.shutdown().await.unwrap();
    let mut drained_conn = drained.connect().await.unwrap();
    for group in ["a", "b", "c"] {
        assert_group_ran_in_order(&mut conn, QUEUE, group).await;
        assert_group_ran_in_order(&mut drained_conn, QUEUE, group).await;
    }
}

#[tokio::test]
async fn a_drain_follows_the_hold_policy_and_leaves_paused_groups() {
    let db = TestDatabase::new().await.unwrap();
    let mut conn = db.connect().await.unwrap();
    set_failure_policy(&mut conn, QUEUE, FailurePolicy::Hold)
        .await
        .unwrap();
    let failing = enqueue(&db, true, "held").await;
    enqueue(&db, false, "held").await;
    enqueue(&db, false, "held").await;
    let free = enqueue(&db, false, "free").await;
    enqueue(&db, false, "paused").await;
    pause_group(&mut conn, QUEUE, "paused").await.unwrap();

    let summary = Drain::queue(QUEUE)
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    assert_eq!(
        (summary.failed, summary.succeeded),
        (1, 1),
        "{}",
        summary.describe()
    );
    assert_eq!(summary.order("held"), vec![failing]);
    assert_eq!(summary.order("free"), vec![free]);
    assert!(summary.order("paused").is_empty());
    assert_eq!(summary.left_queued, 3);
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[tokio::test]
async fn the_order_check_catches_a_job_that_overtook_its_group() {
    let db = TestDatabase::new().await.unwrap();
    let first = enqueue(&db, false, "g").await;
    let second = enqueue(&db, false, "g").await;
    let mut conn = db.connect().await.unwrap();
    // Records as a broken runner would leave them: the second job started
    // (and finished) before the first.
    conn.batch_execute(
        "INSERT INTO pgfifo.job_attempt (job_id, attempt, runner, started_at) \
         SELECT id, 1, 'broken', now() - (id * interval '1 second') FROM pgfifo.job; \
         UPDATE pgfifo.job SET state = 'succeeded', attempts = 1, finished_at = now()",
    )
    .await
    .unwrap();
    let ids: Vec<Id> = diesel::sql_query("SELECT id FROM pgfifo.job ORDER BY id")
        .load(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        ids.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![first, second]
    );
    let problem = check_group_ran_in_order(&mut conn, QUEUE, "g")
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        problem.contains(&format!("job {second} started before job {first}")),
        "{problem}"
    );
    let err = check_group_ran_in_order(&mut conn, QUEUE, "")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("group"), "{err}");
}

#[tokio::test]
async fn a_drain_honours_a_groups_rate_limit() {
    let db = TestDatabase::new().await.unwrap();
    let mut conn = db.connect().await.unwrap();
    let hourly = Rate::new(1, Duration::from_secs(3600)).unwrap();
    set_group_limits(
        &mut conn,
        QUEUE,
        "limited",
        GroupLimits::new().rate(hourly).burst(1),
    )
    .await
    .unwrap();
    let first = enqueue(&db, false, "limited").await;
    enqueue(&db, false, "limited").await;

    // The second job waits for the group's next token, in an hour.
    let summary = Drain::queue(QUEUE).run(db.pool()).await.unwrap();
    assert_eq!(summary.order("limited"), vec![first]);
    assert_eq!((summary.left_queued, summary.throttled), (1, false));

    // with_scheduled does not mint tokens: the group still waits for its
    // next one, and nothing is recorded.
    let summary = Drain::queue(QUEUE)
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    assert!(summary.runs.is_empty(), "{}", summary.describe());
    assert_eq!(summary.left_queued, 1);
    let attempts = enqueued_jobs(&mut conn, &Jobs::in_queue(QUEUE).state("queued"))
        .await
        .unwrap();
    assert_eq!(attempts[0].attempts, 0);
}

#[tokio::test]
async fn without_recursion_jobs_enqueued_by_handlers_wait_in_any_group() {
    let db = TestDatabase::new().await.unwrap();
    let parent = {
        let mut conn = db.pool().get().await.unwrap();
        TestingHelpersJob {
            fail: false,
            spawn: true,
        }
        .enqueue(&mut conn, "a")
        .await
        .unwrap()
    };
    let summary = Drain::queue(QUEUE).run(db.pool()).await.unwrap();
    assert_eq!(summary.runs.len(), 1, "{}", summary.describe());
    assert_eq!(summary.order("a"), vec![parent]);
    assert_eq!(summary.left_queued, 2);
    let mut conn = db.connect().await.unwrap();
    let plain = TestingHelpersJob::default();
    pgfifo::testing::assert_enqueued(
        &mut conn,
        &Jobs::all().group("b"),
        std::slice::from_ref(&plain),
    )
    .await;
    pgfifo::testing::assert_enqueued(
        &mut conn,
        &Jobs::all().ungrouped().state("queued"),
        &[plain],
    )
    .await;

    let summary = Drain::queue(QUEUE)
        .with_recursion(true)
        .run(db.pool())
        .await
        .unwrap();
    assert_eq!((summary.succeeded, summary.left_queued), (2, 0));
    assert_eq!(summary.by_group().len(), 2, "group b and the ungrouped job");
}

#[tokio::test]
async fn a_drain_runs_a_wide_group_in_order_and_nothing_of_a_paused_queue() {
    let db = TestDatabase::new().await.unwrap();
    let mut conn = db.connect().await.unwrap();
    set_group_limits(&mut conn, QUEUE, "wide", GroupLimits::new().concurrency(2))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(enqueue(&db, false, "wide").await);
    }
    let summary = Drain::queue(QUEUE).run(db.pool()).await.unwrap();
    assert_eq!(summary.order("wide"), ids, "{}", summary.describe());

    enqueue(&db, false, "later").await;
    pause_queue(&mut conn, QUEUE).await.unwrap();
    let summary = Drain::queue(QUEUE)
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    assert!(summary.runs.is_empty(), "{}", summary.describe());
    assert_eq!(summary.left_queued, 1);
}

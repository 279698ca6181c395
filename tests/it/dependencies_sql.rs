//! Dependencies at the enqueue, without a runner: a missing dependency is
//! an error that writes nothing, an enqueue that rolls back leaves nothing,
//! bad combinations are refused, and the SQL function's own checks.

use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, RunQueryDsl};
use pgfifo::{
    async_trait, Dependency, EnqueueOptions, Error, Handler, Job, JobContext, JobError, NewJob,
};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "dependencies_sql")]
struct DependenciesSqlJob {
    n: u32,
}

#[async_trait]
impl Handler for DependenciesSqlJob {
    async fn handle(&self, _: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn job(n: u32, options: EnqueueOptions) -> NewJob {
    NewJob::new(&DependenciesSqlJob { n }, options).unwrap()
}

/// Rows in every table an enqueue with dependencies writes.
const ROWS: &str =
    "SELECT (SELECT count(*) FROM pgfifo.job) + (SELECT count(*) FROM pgfifo.job_wait)
    + (SELECT count(*) FROM pgfifo.job_dependency) + (SELECT count(*) FROM pgfifo.group_wake)";

#[tokio::test]
async fn a_missing_dependency_is_an_error_that_writes_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let err = pgfifo::enqueue_batch(
        &mut conn,
        [
            job(1, EnqueueOptions::group("g")),
            job(2, EnqueueOptions::group("g").depends_on([987_654])),
        ],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::DependencyNotFound(Dependency::Job(987_654))),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "the dependency job 987654 does not exist");
    let err = pgfifo::enqueue_batch(
        &mut conn,
        [job(3, EnqueueOptions::ungrouped().after_batch(4321))],
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::DependencyNotFound(Dependency::Batch(4321))),
        "{err:?}"
    );
    assert_eq!(db.scalar(ROWS).await, 0);
}

#[tokio::test]
async fn an_enqueue_with_dependencies_that_rolls_back_leaves_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let result = conn
        .transaction::<(), Error, _>(async |c| {
            let x = pgfifo::enqueue_batch(&mut *c, [job(1, EnqueueOptions::group("gx"))]).await?[0];
            pgfifo::enqueue_batch(
                &mut *c,
                [
                    job(2, EnqueueOptions::group("gd").depends_on([x])),
                    job(3, EnqueueOptions::ungrouped().depends_on([x])),
                ],
            )
            .await?;
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        })
        .await;
    assert!(result.is_err());
    assert_eq!(db.scalar(ROWS).await, 0);
}

#[tokio::test]
async fn dependencies_do_not_mix_with_unique_keys_windows_or_batches() {
    let db = TestDb::new().await;
    let keyed = NewJob::new(
        &DependenciesSqlJob { n: 1 },
        EnqueueOptions::group("g").depends_on([1]).unique_key("k"),
    );
    assert!(matches!(keyed, Err(Error::InvalidOption(_))), "{keyed:?}");
    let mut conn = db.conn().await;
    let x = pgfifo::enqueue_batch(&mut conn, [job(1, EnqueueOptions::group("g"))])
        .await
        .unwrap()[0];
    let mixed = pgfifo::enqueue_batch(
        &mut conn,
        [
            job(2, EnqueueOptions::group("g").depends_on([x])),
            job(3, EnqueueOptions::group("g").unique_key("k")),
        ],
    )
    .await;
    assert!(matches!(mixed, Err(Error::InvalidOption(_))), "{mixed:?}");
    let in_batch = pgfifo::Batch::new()
        .enqueue(
            &mut conn,
            [job(4, EnqueueOptions::group("g").depends_on([x]))],
        )
        .await;
    assert!(
        matches!(in_batch, Err(Error::InvalidOption(_))),
        "{in_batch:?}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
}

#[derive(diesel::QueryableByName)]
struct Ids {
    #[diesel(sql_type = diesel::sql_types::Array<BigInt>)]
    ids: Vec<i64>,
}

#[tokio::test]
async fn the_sql_function_checks_its_input_and_a_done_dependency_counts_at_once() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let x = pgfifo::enqueue_batch(&mut conn, [job(1, EnqueueOptions::group("g"))])
        .await
        .unwrap()[0];
    let call = |policy: &'static str, row: i32| {
        format!(
            "SELECT pgfifo.enqueue_after(ARRAY['dependencies_sql'], ARRAY['g2'], ARRAY['DependenciesSqlJob'],
                 ARRAY['{{}}'::jsonb], ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::bigint], ARRAY[NULL::bigint],
                 ARRAY['{policy}'], ARRAY[{row}], ARRAY[{x}::bigint], ARRAY[NULL::bigint]) AS ids"
        )
    };
    for (policy, row) in [("later", 1), ("hold", 2), ("hold", 0)] {
        let err = diesel::sql_query(call(policy, row))
            .get_result::<Ids>(&mut conn)
            .await
            .err();
        assert!(err.is_some(), "{policy} {row}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
    // x succeeds: a later dependent is an ordinary job at once.
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {x}"
    ))
    .await;
    let ids = diesel::sql_query(call("hold", 1))
        .get_result::<Ids>(&mut conn)
        .await
        .unwrap()
        .ids;
    let at = db
        .text(&format!(
            "SELECT (run_after <= now())::text FROM pgfifo.job WHERE id = {}",
            ids[0]
        ))
        .await;
    assert_eq!(at.as_deref(), Some("true"));
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_wait").await, 0);
}

#[tokio::test]
async fn add_job_after_enqueues_a_dependent_from_sql() {
    let db = TestDb::new().await;
    let x = db
        .scalar(
            "SELECT pgfifo.add_job(kind => 'DependenciesSqlJob', queue => 'dependencies_sql',
                 payload => '{\"n\": 1}', group_id => 'g')",
        )
        .await;
    let d = db
        .scalar(&format!(
            "SELECT pgfifo.add_job_after(kind => 'DependenciesSqlJob', queue => 'dependencies_sql',
                 payload => '{{\"n\": 2}}', depends_on => ARRAY[{x}]::bigint[],
                 on_dependency_failure => 'hold', group_id => 'g2')"
        ))
        .await;
    assert_eq!(
        db.text(&format!(
            "SELECT on_failure FROM pgfifo.job_wait WHERE job_id = {d}"
        ))
        .await
        .as_deref(),
        Some("hold")
    );
    let mut conn = db.conn().await;
    let missing = diesel::sql_query(
        "SELECT pgfifo.add_job_after(kind => 'DependenciesSqlJob', queue => 'dependencies_sql',
             payload => '{}', after_batches => ARRAY[77]::bigint[]) AS ids",
    )
    .execute(&mut conn)
    .await
    .map_err(Error::from)
    .unwrap_err();
    assert!(
        matches!(missing, Error::DependencyNotFound(Dependency::Batch(77))),
        "{missing:?}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_drain_runs_a_chain_and_leaves_a_dependent_of_another_queue_waiting() {
    use pgfifo::testing::Drain;
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let a = pgfifo::enqueue_batch(&mut conn, [job(1, EnqueueOptions::group("a"))])
        .await
        .unwrap()[0];
    let b = pgfifo::enqueue_batch(
        &mut conn,
        [job(2, EnqueueOptions::group("b").depends_on([a]))],
    )
    .await
    .unwrap()[0];
    // A dependency in a queue the drain does not run.
    let other = pgfifo::enqueue_batch(
        &mut conn,
        [job(3, EnqueueOptions::group("x").queue("elsewhere"))],
    )
    .await
    .unwrap()[0];
    let c = pgfifo::enqueue_batch(
        &mut conn,
        [job(4, EnqueueOptions::group("c").depends_on([other]))],
    )
    .await
    .unwrap()[0];
    drop(conn);
    let summary = Drain::queue("dependencies_sql")
        .with_scheduled(true)
        .run(&db.pool)
        .await
        .unwrap();
    assert_eq!(summary.order("a"), vec![a], "{}", summary.describe());
    assert_eq!(summary.order("b"), vec![b], "{}", summary.describe());
    assert!(summary.order("c").is_empty(), "{}", summary.describe());
    assert_eq!(db.job_state(c).await, "queued 0");
}

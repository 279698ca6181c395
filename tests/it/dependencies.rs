//! Dependencies between jobs, run by a runner: a chain across groups whose
//! first job fails twice, a waiting dependent holding its group (FIFO), each
//! failure policy, a dependency on a batch, and the sweep that releases a
//! dependent whose enqueue committed after its dependency ended.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{
    async_trait, Batch, DependencyFailure, EnqueueOptions, Handler, Job, JobContext, JobError,
    JobId, NewJob,
};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);

/// The runs that succeeded (written in the job's transaction), and the
/// names whose failing jobs may succeed now.
const TABLES: &str = "CREATE TABLE dep_log (
        name text NOT NULL, attempt int NOT NULL, job_id bigint NOT NULL,
        started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL);
    CREATE TABLE dep_ok (name text PRIMARY KEY);";

/// Fails (retryably) on its first `fail_times` attempts; fails for good
/// while `fail_for_good` and no `dep_ok` row names it; takes `sleep_ms`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "dependencies", max_attempts = 5, backoff = "200ms")]
struct DependenciesJob {
    name: String,
    fail_times: u32,
    fail_for_good: bool,
    sleep_ms: u64,
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[async_trait]
impl Handler for DependenciesJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = std::time::SystemTime::now();
        tokio::time::sleep(Duration::from_millis(self.sleep_ms)).await;
        if ctx.attempt() <= self.fail_times {
            return Err(JobError::retry(format!("attempt {}", ctx.attempt())));
        }
        if self.fail_for_good {
            let ok: Count = diesel::sql_query("SELECT count(*) AS n FROM dep_ok WHERE name = $1")
                .bind::<Text, _>(&self.name)
                .get_result(ctx.conn())
                .await?;
            if ok.n == 0 {
                return Err(JobError::permanent(format!("{} fails", self.name)));
            }
        }
        let start_us = start
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
        diesel::sql_query(
            "INSERT INTO dep_log (name, attempt, job_id, started_at, finished_at)
             VALUES ($1, $2, $3, to_timestamp($4 / 1e6), clock_timestamp())",
        )
        .bind::<Text, _>(&self.name)
        .bind::<Integer, _>(attempt)
        .bind::<BigInt, _>(id)
        .bind::<BigInt, _>(start_us)
        .execute(ctx.conn())
        .await?;
        Ok(())
    }
}

fn job(name: &str, options: EnqueueOptions) -> NewJob {
    spec(name, 0, false, 0, options)
}

fn spec(
    name: &str,
    fail_times: u32,
    fail_for_good: bool,
    sleep_ms: u64,
    o: EnqueueOptions,
) -> NewJob {
    let job = DependenciesJob {
        name: name.to_owned(),
        fail_times,
        fail_for_good,
        sleep_ms,
    };
    NewJob::new(&job, o).unwrap()
}

async fn enqueue(db: &TestDb, job: NewJob) -> JobId {
    let mut conn = db.conn().await;
    pgfifo::enqueue_batch(&mut conn, [job]).await.unwrap()[0]
}

async fn setup() -> TestDb {
    let db = TestDb::new().await;
    db.exec(TABLES).await;
    db
}

fn config() -> pgfifo::RunnerConfig {
    test_config()
        .queues(["dependencies"])
        .max_backoff(Duration::from_millis(200))
}

/// Whether `first` finished before `second` started (both ran once).
async fn ran_before(db: &TestDb, first: &str, second: &str) -> bool {
    db.scalar(&format!(
        "SELECT count(*) FROM dep_log AS a, dep_log AS b
         WHERE a.name = '{first}' AND b.name = '{second}' AND a.finished_at <= b.started_at"
    ))
    .await
        == 1
}

async fn runs(db: &TestDb, name: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM dep_log WHERE name = '{name}'"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chain_across_groups_waits_for_a_job_that_fails_twice() {
    let db = setup().await;
    let a = enqueue(&db, spec("a", 2, false, 0, EnqueueOptions::group("ga"))).await;
    let b = enqueue(&db, job("b", EnqueueOptions::group("gb").depends_on([a]))).await;
    let c = enqueue(&db, job("c", EnqueueOptions::group("gc").depends_on([b]))).await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_wait").await,
        2,
        "b and c wait"
    );
    let runner = db.start_runner(config()).await;
    db.wait_jobs_in(&[a, b, c], "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        db.text("SELECT string_agg(name || attempt, ',' ORDER BY started_at) FROM dep_log")
            .await
            .as_deref(),
        Some("a3,b1,c1"),
        "a succeeded on its third attempt, then b and c once each"
    );
    assert!(ran_before(&db, "a", "b").await && ran_before(&db, "b", "c").await);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job_wait").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_dependency")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_dependent_holds_its_group() {
    let db = setup().await;
    // x runs late (its own group): d waits for it, e waits behind d.
    let x = enqueue(
        &db,
        job(
            "x",
            EnqueueOptions::group("gx").run_in(Duration::from_millis(1500)),
        ),
    )
    .await;
    let d = enqueue(&db, job("d", EnqueueOptions::group("gd").depends_on([x]))).await;
    let e = enqueue(&db, job("e", EnqueueOptions::group("gd"))).await;
    let u = enqueue(&db, job("u", EnqueueOptions::ungrouped().depends_on([x]))).await;
    let runner = db.start_runner(config()).await;
    db.wait_jobs_in(&[x, d, e, u], "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert!(ran_before(&db, "x", "d").await, "d waited for x");
    assert!(ran_before(&db, "d", "e").await, "e waited behind d (FIFO)");
    assert!(
        ran_before(&db, "x", "u").await,
        "an ungrouped dependent waited too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_failure_policy_does_what_it_says() {
    let db = setup().await;
    let f = enqueue(&db, spec("f", 0, true, 300, EnqueueOptions::group("gf"))).await;
    // Cancel (the default): d1 and its own dependent d2 are cancelled; their
    // groups go on.
    let d1 = enqueue(&db, job("d1", EnqueueOptions::group("g1").depends_on([f]))).await;
    let e1 = enqueue(&db, job("e1", EnqueueOptions::group("g1"))).await;
    let d2 = enqueue(&db, job("d2", EnqueueOptions::group("g2").depends_on([d1]))).await;
    let e2 = enqueue(&db, job("e2", EnqueueOptions::group("g2"))).await;
    // Hold: h waits, and e3 behind it.
    let hold = EnqueueOptions::group("gh")
        .depends_on([f])
        .on_dependency_failure(DependencyFailure::Hold);
    let h = enqueue(&db, job("h", hold)).await;
    let e3 = enqueue(&db, job("e3", EnqueueOptions::group("gh"))).await;
    // Run: r runs anyway.
    let run = EnqueueOptions::group("gr")
        .depends_on([f])
        .on_dependency_failure(DependencyFailure::Run);
    let r = enqueue(&db, job("r", run)).await;

    let runner = db.start_runner(config()).await;
    db.wait_jobs_in(&[f], "failed", LIMIT).await;
    db.wait_jobs_in(&[e1, e2, r], "succeeded", LIMIT).await;
    db.wait_jobs_in(&[d1, d2], "cancelled", LIMIT).await;
    assert_eq!(
        db.last_error(d1).await,
        Some(format!("dependency job {f} failed"))
    );
    assert_eq!(
        db.last_error(d2).await,
        Some(format!("dependency job {d1} cancelled"))
    );
    // (f's failure wrote no log: its transaction rolled back.)
    let r_after_f = format!(
        "SELECT count(*) FROM dep_log AS l, pgfifo.job AS j
         WHERE l.name = 'r' AND j.id = {f} AND j.finished_at <= l.started_at"
    );
    assert_eq!(db.scalar(&r_after_f).await, 1, "r ran after f failed");
    // h is held by f, and holds its group.
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.job_wait WHERE job_id = {h} AND blocked_by_job = {f}"
        ),
        1,
        LIMIT,
    )
    .await;
    assert_eq!(db.job_state(h).await, "queued 0");
    assert_eq!(db.job_state(e3).await, "queued 0");
    assert_eq!(runs(&db, "e3").await, 0);
    // An enqueue after the failure: created cancelled under 'cancel'.
    let late = enqueue(
        &db,
        job("late", EnqueueOptions::group("g1").depends_on([f])),
    )
    .await;
    assert_eq!(db.job_state(late).await, "cancelled 0");
    // The operator retries f, which succeeds: h runs, then e3.
    db.exec("INSERT INTO dep_ok VALUES ('f')").await;
    let mut conn = db.conn().await;
    pgfifo::admin::retry_jobs(&mut conn, &[f]).await.unwrap();
    drop(conn);
    db.wait_jobs_in(&[f, h, e3], "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert!(ran_before(&db, "f", "h").await && ran_before(&db, "h", "e3").await);
    assert_eq!(
        runs(&db, "r").await,
        1,
        "r ran once, not again after f's retry"
    );
    assert_eq!(runs(&db, "d1").await + runs(&db, "d2").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dependent_of_a_batch_waits_until_the_batch_succeeded() {
    let db = setup().await;
    let mut conn = db.conn().await;
    let batch = Batch::new()
        .enqueue(
            &mut conn,
            [
                spec("b1", 1, false, 200, EnqueueOptions::group("gb1")),
                spec("b2", 0, false, 400, EnqueueOptions::group("gb2")),
            ],
        )
        .await
        .unwrap();
    let failing = Batch::new()
        .enqueue(
            &mut conn,
            [spec("bf", 0, true, 0, EnqueueOptions::group("gbf"))],
        )
        .await
        .unwrap();
    drop(conn);
    let d = enqueue(
        &db,
        job("d", EnqueueOptions::group("gd").after_batch(batch.id)),
    )
    .await;
    let both = EnqueueOptions::group("gd2")
        .after_batch(batch.id)
        .after_batch(failing.id);
    let d2 = enqueue(&db, job("d2", both)).await;
    let runner = db.start_runner(config()).await;
    db.wait_jobs_in(&[d], "succeeded", LIMIT).await;
    db.wait_jobs_in(&[d2], "cancelled", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert!(ran_before(&db, "b1", "d").await && ran_before(&db, "b2", "d").await);
    assert_eq!(
        db.last_error(d2).await,
        Some(format!(
            "dependency batch {} completed without success",
            failing.id
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_releases_a_dependent_whose_enqueue_committed_after_its_dependency_ended() {
    let db = setup().await;
    let x = enqueue(&db, job("x", EnqueueOptions::group("gx"))).await;
    // The dependent's enqueue, in a transaction left open.
    let mut producer = db.direct().await;
    producer.batch_execute("BEGIN").await.unwrap();
    let d = pgfifo::enqueue_batch(
        &mut producer,
        [job("d", EnqueueOptions::group("gd").depends_on([x]))],
    )
    .await
    .unwrap()[0];
    // x runs and commits meanwhile: its completion cannot see d.
    let runner = db.start_runner(config()).await;
    db.wait_jobs_in(&[x], "succeeded", LIMIT).await;
    producer.batch_execute("COMMIT").await.unwrap();
    db.wait_jobs_in(&[d], "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();
    assert!(ran_before(&db, "x", "d").await);
}

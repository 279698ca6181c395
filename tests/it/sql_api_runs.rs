//! Jobs enqueued through the SQL API (`pgfifo.add_job`, `pgfifo.add_jobs`)
//! run under a Rust runner: in enqueue order per group, each once, whether
//! the runner was up when they were enqueued or came up later (an
//! application that only enqueues, docs/enqueue-from-sql.md); a payload that
//! does not decode fails its job with a clear reason and the group goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use diesel::sql_types::{BigInt, Jsonb, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(30);
const GROUPS: usize = 4;
const PER_GROUP: usize = 6;

/// What a producer in another language enqueues: a group's step.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "sql_api_runs", kind = "sql_api_runs.step", backoff = "10ms")]
struct SqlApiRunsStep {
    tenant: String,
    seq: i64,
}

#[async_trait]
impl Handler for SqlApiRunsStep {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let id = ctx.id();
        diesel::sql_query("INSERT INTO sql_api_runs_log (job_id, tenant, seq) VALUES ($1, $2, $3)")
            .bind::<BigInt, _>(id)
            .bind::<Text, _>(&self.tenant)
            .bind::<BigInt, _>(self.seq)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

const LOG: &str =
    "CREATE TABLE sql_api_runs_log (n bigserial PRIMARY KEY, job_id bigint NOT NULL, \
                   tenant text NOT NULL, seq bigint NOT NULL)";

#[derive(QueryableByName, Debug)]
struct LogRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Text)]
    tenant: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
}

/// Enqueues `PER_GROUP` steps for each of `GROUPS` tenants through the SQL
/// API, interleaving tenants, in several transactions: single calls and
/// batches. Returns the ids in enqueue order.
async fn enqueue_from_sql(db: &TestDb) -> Vec<i64> {
    let mut conn = db.direct().await;
    let mut ids = Vec::new();
    for seq in 0..PER_GROUP {
        if seq % 2 == 0 {
            for g in 0..GROUPS {
                #[derive(QueryableByName)]
                struct Id {
                    #[diesel(sql_type = BigInt)]
                    id: i64,
                }
                let row: Id = diesel::sql_query(
                    "SELECT pgfifo.add_job(kind => 'sql_api_runs.step', queue => 'sql_api_runs', \
                            payload => $1, group_id => $2) AS id",
                )
                .bind::<Jsonb, _>(serde_json::json!({"tenant": format!("t{g}"), "seq": seq}))
                .bind::<Text, _>(format!("t{g}"))
                .get_result(&mut conn)
                .await
                .expect("add_job");
                ids.push(row.id);
            }
        } else {
            let jobs: Vec<_> = (0..GROUPS)
                .map(|g| {
                    serde_json::json!({
                        "kind": "sql_api_runs.step", "queue": "sql_api_runs",
                        "group_id": format!("t{g}"),
                        "payload": {"tenant": format!("t{g}"), "seq": seq}
                    })
                })
                .collect();
            #[derive(QueryableByName)]
            struct Ids {
                #[diesel(sql_type = diesel::sql_types::Array<BigInt>)]
                ids: Vec<i64>,
            }
            let row: Ids = diesel::sql_query("SELECT pgfifo.add_jobs(jobs => $1) AS ids")
                .bind::<Jsonb, _>(serde_json::Value::Array(jobs))
                .get_result(&mut conn)
                .await
                .expect("add_jobs");
            ids.extend(row.ids);
        }
    }
    ids
}

/// Every job ran once, and each tenant's steps ran in enqueue order.
async fn assert_ran_once_in_order(db: &TestDb, ids: &[i64]) {
    let mut conn = db.conn().await;
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, tenant, seq FROM sql_api_runs_log ORDER BY n")
            .load(&mut *conn)
            .await
            .expect("read the log");
    let mut ran: Vec<i64> = log.iter().map(|r| r.job_id).collect();
    ran.sort_unstable();
    let mut expected = ids.to_vec();
    expected.sort_unstable();
    assert_eq!(ran, expected, "every job ran exactly once");
    let mut per_tenant: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in &log {
        per_tenant.entry(&row.tenant).or_default().push(row.seq);
    }
    assert_eq!(per_tenant.len(), GROUPS);
    let in_order: Vec<i64> = (0..PER_GROUP as i64).collect();
    for (tenant, seqs) in per_tenant {
        assert_eq!(seqs, in_order, "tenant {tenant} ran in enqueue order");
    }
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_attempt WHERE job_id IN ({})",
            pgfifo_tests::id_list(ids)
        ))
        .await,
        ids.len() as i64,
        "one attempt each"
    );
}

#[tokio::test]
async fn jobs_enqueued_from_sql_run_in_order_under_a_running_runner() {
    let db = TestDb::new().await;
    db.exec(LOG).await;
    let runner = db
        .start_runner(test_config().queues(["sql_api_runs"]))
        .await;
    let ids = enqueue_from_sql(&db).await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");
    assert_ran_once_in_order(&db, &ids).await;
}

/// An application that only enqueues: no runner of its own. Its jobs wait,
/// untouched, and run in order when a runner elsewhere comes up.
#[tokio::test]
async fn jobs_enqueued_with_no_runner_run_when_one_comes_up() {
    let db = TestDb::new().await;
    db.exec(LOG).await;
    // The producer: SQL from "another language", and a Rust process that
    // only connects and enqueues (its own pool, no runner).
    let mut ids = enqueue_from_sql(&db).await;
    let producer = pgfifo::connect(&db.url, 2).await.expect("connect");
    let mut conn = producer.get().await.expect("conn");
    for g in 0..GROUPS {
        let tenant = format!("t{g}");
        let step = SqlApiRunsStep {
            tenant: tenant.clone(),
            seq: PER_GROUP as i64,
        };
        ids.push(step.enqueue(&mut conn, &tenant).await.expect("enqueue"));
    }
    drop(conn);
    drop(producer);
    // Nothing ran or was claimed: every job is queued without an attempt.
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued' AND attempts = 0")
            .await,
        ids.len() as i64
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await,
        0
    );
    assert_eq!(db.scalar("SELECT count(*) FROM sql_api_runs_log").await, 0);
    // The wake-ups wait in pgfifo.group_wake for the runner's first promote.
    assert!(db.scalar("SELECT count(*) FROM pgfifo.group_wake").await >= GROUPS as i64);

    let runner = db
        .start_runner(test_config().queues(["sql_api_runs"]))
        .await;
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");
    let mut conn = db.conn().await;
    let log: Vec<LogRow> =
        diesel::sql_query("SELECT job_id, tenant, seq FROM sql_api_runs_log ORDER BY n")
            .load(&mut *conn)
            .await
            .expect("read the log");
    let mut per_tenant: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in &log {
        per_tenant.entry(&row.tenant).or_default().push(row.seq);
    }
    let in_order: Vec<i64> = (0..=PER_GROUP as i64).collect();
    assert_eq!(per_tenant.len(), GROUPS);
    for (tenant, seqs) in per_tenant {
        assert_eq!(
            seqs, in_order,
            "tenant {tenant}: SQL jobs, then the Rust one"
        );
    }
    assert_eq!(log.len(), ids.len(), "each job ran once");
}

#[tokio::test]
async fn a_payload_from_sql_that_does_not_decode_fails_its_job_and_the_group_goes_on() {
    let db = TestDb::new().await;
    db.exec(LOG).await;
    let mut conn = db.direct().await;
    #[derive(QueryableByName)]
    struct Ids {
        #[diesel(sql_type = diesel::sql_types::Array<BigInt>)]
        ids: Vec<i64>,
    }
    let row: Ids = diesel::sql_query("SELECT pgfifo.add_jobs(jobs => $1) AS ids")
        .bind::<Jsonb, _>(serde_json::json!([
            {"kind": "sql_api_runs.step", "queue": "sql_api_runs", "group_id": "t0",
             "payload": {"tenant": "t0", "seq": "one"}},
            {"kind": "sql_api_runs.step", "queue": "sql_api_runs", "group_id": "t0",
             "payload": {"tenant": "t0", "seq": 2}}
        ]))
        .get_result(&mut conn)
        .await
        .expect("add_jobs");
    let (bad, good) = (row.ids[0], row.ids[1]);
    let runner = db
        .start_runner(test_config().queues(["sql_api_runs"]))
        .await;
    db.wait_jobs_in(&[good], "succeeded", LIMIT).await;
    runner.shutdown().await.expect("shutdown");
    assert_eq!(
        db.job_state(bad).await,
        "failed 1",
        "failed at once, not retried"
    );
    let reason = db.last_error(bad).await.expect("a reason");
    assert!(
        reason.contains("does not deserialize into") && reason.contains("SqlApiRunsStep"),
        "{reason}"
    );
    assert!(
        reason.ends_with(r#"SqlApiRunsStep: seq: invalid type: string "one", expected i64"#),
        "the reason names the field and what is wrong: {reason}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM sql_api_runs_log").await, 1);
}

//! The batch protocol at the level of the SQL functions lanes call:
//! `pgfifo.pick` with several jobs (each once, the other lanes' held jobs
//! not counted as work left) and `pgfifo.complete` with several retries
//! (one due time each). The runner-level behaviour is in `batching.rs`.

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::JobId;
use pgfifo_tests::TestDb;

use super::batching::{enqueue_one_per_group, BatchFreeJob, QUEUE};

/// Enqueues `n` no-op jobs, one per group, and makes the groups active.
async fn ready_groups(db: &TestDb, n: usize) -> Vec<JobId> {
    let jobs = (0..n)
        .map(|_| BatchFreeJob { fail: false, ms: 0 })
        .collect();
    let ids = enqueue_one_per_group(db, jobs).await;
    db.scalar(&format!(
        "SELECT promoted FROM pgfifo.promote(ARRAY['{QUEUE}'], 100)"
    ))
    .await;
    ids
}

/// Opens a transaction `pgfifo.pick` accepts, as the runner does.
async fn begin_job_transaction(conn: &mut diesel_async::AsyncPgConnection) {
    diesel_async::SimpleAsyncConnection::batch_execute(
        conn,
        "BEGIN; SET LOCAL pgfifo.job_transaction = on",
    )
    .await
    .expect("begin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_never_returns_a_job_twice() {
    let db = TestDb::new().await;
    let ids = ready_groups(&db, 3).await;
    // The queue named twice: its second visit meets the groups and jobs this
    // transaction already locked, which PostgreSQL grants it again.
    let mut conn = db.direct().await;
    begin_job_transaction(&mut conn).await;
    #[derive(QueryableByName)]
    struct Picked {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let picked: Vec<Picked> = diesel::sql_query(format!(
        "SELECT id FROM pgfifo.pick(ARRAY['{QUEUE}', '{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 8)"
    ))
    .load(&mut conn)
    .await
    .expect("pick");
    let mut got: Vec<i64> = picked.iter().map(|p| p.id).collect();
    got.sort_unstable();
    let mut want = ids.clone();
    want.sort_unstable();
    assert_eq!(got, want, "each job once");
}

/// What one-job `pgfifo.pick` calls return.
#[derive(QueryableByName)]
struct PickedOne {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    more: bool,
}

/// Picks one job from the start of the sweep, as a lane whose runner's other
/// lanes hold `held`, and rolls back.
async fn pick_one(conn: &mut diesel_async::AsyncPgConnection, held: &[i64]) -> PickedOne {
    begin_job_transaction(conn).await;
    let picked: PickedOne = diesel::sql_query(format!(
        "SELECT id, more FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 1, $1)"
    ))
    .bind::<diesel::sql_types::Array<BigInt>, _>(held)
    .get_result(conn)
    .await
    .expect("pick");
    diesel_async::SimpleAsyncConnection::batch_execute(conn, "ROLLBACK")
        .await
        .expect("rollback");
    picked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_the_other_lanes_hold_are_not_work_left() {
    let db = TestDb::new().await;
    let ids = ready_groups(&db, 2).await;
    let mut conn = db.direct().await;
    let first = pick_one(&mut conn, &[]).await;
    assert!(first.more, "the other group is ready and nobody holds it");
    let other = *ids.iter().find(|id| **id != first.id).expect("other job");
    let again = pick_one(&mut conn, &[other]).await;
    assert_eq!(again.id, first.id);
    assert!(
        !again.more,
        "the only other ready group is held by another lane of the runner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reports_when_each_of_its_retries_is_due() {
    #[derive(QueryableByName)]
    struct PickedRow {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Text)]
        group_id: String,
    }
    #[derive(QueryableByName)]
    struct Left {
        #[diesel(sql_type = diesel::sql_types::Array<BigInt>)]
        later: Vec<i64>,
    }
    let db = TestDb::new().await;
    ready_groups(&db, 2).await;
    let mut conn = db.direct().await;
    begin_job_transaction(&mut conn).await;
    let picked: Vec<PickedRow> = diesel::sql_query(format!(
        "SELECT id, group_id FROM pgfifo.pick(ARRAY['{QUEUE}'], 0, 0, '{{}}', '{{}}', 60000, 2)"
    ))
    .load(&mut conn)
    .await
    .expect("pick");
    assert_eq!(picked.len(), 2, "both groups are ready");
    // Both retried, 300 ms and 900 ms from now, in one call.
    let left: Left = diesel::sql_query(format!(
        "SELECT ready_later_us AS later FROM pgfifo.complete($1, '{{1,1}}', \
         '{{retry,retry}}', '{{first,second}}', ARRAY[NULL, NULL]::jsonb[], \
         '{{300000,900000}}', ARRAY['{QUEUE}', '{QUEUE}'], $2)"
    ))
    .bind::<diesel::sql_types::Array<BigInt>, _>(picked.iter().map(|p| p.id).collect::<Vec<_>>())
    .bind::<diesel::sql_types::Array<Text>, _>(
        picked
            .iter()
            .map(|p| p.group_id.clone())
            .collect::<Vec<_>>(),
    )
    .get_result(&mut conn)
    .await
    .expect("complete");
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "ROLLBACK")
        .await
        .expect("rollback");
    let mut later = left.later;
    later.sort_unstable();
    assert_eq!(later.len(), 2, "one due time per retry: {later:?}");
    assert!(later[0] > 0 && later[0] <= 300_000, "{later:?}");
    assert!(later[1] > 300_000 && later[1] <= 900_000, "{later:?}");
}

//! Queue limits at the level of the SQL functions the lanes call: a pick in
//! a queue with a concurrency holds one of its slot rows for its job
//! transaction, whatever the number of jobs it took; a session that dies
//! frees it; a lane that cannot start a job at once takes none of the
//! queue's; a limited queue that gave nothing does not keep its slot while
//! other queues' jobs run; a pick under a slot takes its lane's whole batch
//! of heads; after a lowered concurrency nothing starts while a slot above
//! it is held; bad values written through SQL are refused.

use diesel::sql_types::{Array, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{admin, async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, QueueLimits};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

/// Never run: the tests call the SQL functions themselves.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "qsql")]
struct QsqlJob;

#[async_trait]
impl Handler for QsqlJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[derive(QueryableByName, Debug)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    id: Option<i64>,
}

/// Opens a job transaction as a lane does and picks up to `limit` jobs of
/// `queues`, leaving the transaction open: the ids returned (`None` for
/// the row that says "commit and pick again").
async fn pick(
    conn: &mut AsyncPgConnection,
    queues: &[&str],
    limit: i32,
    start_at_once: bool,
) -> Vec<Option<i64>> {
    let opener = if start_at_once {
        "BEGIN; SET LOCAL pgfifo.job_transaction = on"
    } else {
        "BEGIN; SET LOCAL pgfifo.job_transaction = on; SET LOCAL pgfifo.pick_slots = off"
    };
    conn.batch_execute(opener).await.expect("begin");
    let rows: Vec<Row> =
        diesel::sql_query("SELECT id FROM pgfifo.pick($1, 0, 0, '{}', '{}', 60000, $2)")
            .bind::<Array<Text>, _>(queues)
            .bind::<Integer, _>(limit)
            .load(conn)
            .await
            .expect("pick");
    rows.into_iter().map(|r| r.id).collect()
}

/// Enqueues one job into each of `groups` of `queue`, promoted.
async fn enqueue(db: &TestDb, queue: &str, groups: &[&str]) {
    let mut conn = db.conn().await;
    for group in groups {
        QsqlJob
            .enqueue_with(&mut conn, EnqueueOptions::group(*group).queue(queue))
            .await
            .unwrap();
    }
    db.scalar(&format!(
        "SELECT promoted FROM pgfifo.promote(ARRAY['{queue}'], 100)"
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_holds_one_queue_slot_and_a_dead_session_frees_it() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qsql", QueueLimits::new().concurrency(2))
        .await
        .unwrap();
    enqueue(&db, "qsql", &["a", "b", "c", "d", "e", "f"]).await;
    let mut first = db.direct().await;
    let mut second = db.direct().await;
    let mut third = db.direct().await;
    let pid = diesel::sql_query("SELECT pg_backend_pid()::bigint AS id")
        .get_result::<Row>(&mut first)
        .await
        .unwrap()
        .id
        .unwrap();

    // One pick of several jobs (run one after another) holds one slot.
    let took = pick(&mut first, &["qsql"], 3, true).await;
    assert_eq!(took.len(), 3, "{took:?}");
    assert!(took.iter().all(Option::is_some));
    let took = pick(&mut second, &["qsql"], 1, true).await;
    assert_eq!(took.len(), 1, "the second slot: {took:?}");
    let took = pick(&mut third, &["qsql"], 1, true).await;
    assert!(took.is_empty(), "the queue is at its limit: {took:?}");
    third.batch_execute("COMMIT").await.unwrap();

    // The first picker's session dies (as with kill -9 of its runner):
    // its slot is free at once.
    assert!(pid > 0);
    db.scalar(&format!("SELECT pg_terminate_backend({pid})::int"))
        .await;
    pgfifo_tests::eventually(
        "the session to end",
        std::time::Duration::from_secs(30),
        || {
            let db = &db;
            async move {
                let left = db
                    .scalar(&format!(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
                    ))
                    .await;
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left}"))
                }
            }
        },
    )
    .await;
    let took = pick(&mut third, &["qsql"], 1, true).await;
    assert_eq!(took.len(), 1, "the freed slot: {took:?}");
    third.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        first.batch_execute("ROLLBACK").await.is_err(),
        "the first session is gone"
    );
    second.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_cannot_start_at_once_takes_nothing_of_a_limited_queue() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qsql", QueueLimits::new().concurrency(5))
        .await
        .unwrap();
    enqueue(&db, "qsql", &["a", "b"]).await;
    enqueue(&db, "free", &["x"]).await;
    let mut direct = db.direct().await;
    let took = pick(&mut direct, &["qsql", "free"], 4, false).await;
    assert_eq!(took.len(), 1, "only the free queue's job: {took:?}");
    let held = db
        .scalar("SELECT count(*) FROM pgfifo.queue_slot WHERE queue = 'qsql' AND slot IN (SELECT slot FROM pgfifo.queue_slot FOR UPDATE SKIP LOCKED)")
        .await;
    assert_eq!(held, 5, "no slot held by the prefetching lane");
    direct.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_queue_that_gives_nothing_lets_its_slot_go_before_other_queues() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qsql", QueueLimits::new().concurrency(1))
        .await
        .unwrap();
    enqueue(&db, "qsql", &["a"]).await;
    enqueue(&db, "free", &["x"]).await;
    // Another session holds group a's row: the limited queue's walk finds
    // nothing to take though its slot is free.
    let mut holder = db.direct().await;
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM pgfifo.queue_group WHERE queue = 'qsql' AND group_id = 'a' FOR UPDATE",
        )
        .await
        .unwrap();
    let mut direct = db.direct().await;
    // The limited queue first (turn 0), the other one after it.
    let took = pick(&mut direct, &["qsql", "free"], 4, true).await;
    assert_eq!(took, vec![None], "commit and pick again");
    direct.batch_execute("COMMIT").await.unwrap();
    holder.batch_execute("ROLLBACK").await.unwrap();
}

/// The lane's batch (`pgfifo.pick_batch`, the jobs that fit in its batch
/// window) with a limit of one head, as a lane asks when other lanes seek
/// work: the heads of `queue`'s groups it took, and whether the
/// transaction says it holds a queue slot (the column the runner reads).
async fn pick_batch(
    conn: &mut AsyncPgConnection,
    queue: &str,
    batch: i32,
    slot_batch: Option<i32>,
) -> (usize, bool) {
    #[derive(QueryableByName)]
    struct Marked {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        marked: bool,
    }
    conn.batch_execute("BEGIN; SET LOCAL pgfifo.job_transaction = on")
        .await
        .expect("begin");
    // (Without a slot batch, as a runner before 0.3.0 calls it.)
    let row: Marked = diesel::sql_query(
        "SELECT count(p.id) AS n, bool_and(coalesce(current_setting('pgfifo.queue_slot', true), '') <> '') AS marked \
         FROM (SELECT set_config('pgfifo.pick_batch', $2::text, true) AS b, \
                      CASE WHEN $3::integer IS NOT NULL \
                           THEN set_config('pgfifo.pick_slot_batch', $3::text, true) END AS sb) AS s \
         CROSS JOIN LATERAL pgfifo.pick(ARRAY[$1], 0, 0, '{}', '{}', 60000, 1) AS p",
    )
    .bind::<Text, _>(queue)
    .bind::<Integer, _>(batch)
    .bind::<diesel::sql_types::Nullable<Integer>, _>(slot_batch)
    .get_result(conn)
    .await
    .expect("pick");
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    (usize::try_from(row.n).unwrap(), row.marked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_under_a_queue_slot_takes_its_whole_batch_of_heads() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qsql", QueueLimits::new().concurrency(2))
        .await
        .unwrap();
    let groups = ["a", "b", "c", "d", "e", "f"];
    enqueue(&db, "qsql", &groups).await;
    enqueue(&db, "free", &groups).await;
    let mut direct = db.direct().await;
    // The slot is what a limited queue is short of: the heads that fit in
    // the batch run under it one after another.
    assert_eq!(pick_batch(&mut direct, "qsql", 4, None).await, (4, true));
    // Under a slot, the lane's slot batch when it gives one (longer than
    // its batch: see "Under a queue's slot" in the runner's batching).
    assert_eq!(pick_batch(&mut direct, "qsql", 2, Some(5)).await, (5, true));
    // Without a queue limit, a limit of one stays one head (the other
    // lanes take the rest side by side), and no slot is held; the slot
    // batch changes nothing there.
    assert_eq!(pick_batch(&mut direct, "free", 4, None).await, (1, false));
    assert_eq!(
        pick_batch(&mut direct, "free", 2, Some(5)).await,
        (1, false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lowered_concurrency_nothing_starts_while_a_slot_above_it_is_held() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::set_queue_limits(&mut conn, "qsql", QueueLimits::new().concurrency(3))
        .await
        .unwrap();
    enqueue(&db, "qsql", &["a", "b", "c", "d", "e"]).await;
    // Three lanes hold slots 0, 1 and 2, one job each.
    let mut lanes = Vec::new();
    for _ in 0..3 {
        let mut lane = db.direct().await;
        assert_eq!(pick(&mut lane, &["qsql"], 1, true).await.len(), 1);
        lanes.push(lane);
    }
    admin::change_queue_limits(
        &mut conn,
        "qsql",
        &["concurrency"],
        QueueLimits::new().concurrency(1),
    )
    .await
    .unwrap();
    let mut next = db.direct().await;
    // The job in slot 0 ends: slot 0 is free, but two jobs still run above
    // the new limit of 1; then the one in slot 1 ends.
    for lane in lanes.iter_mut().take(2) {
        lane.batch_execute("COMMIT").await.unwrap();
        let took = pick(&mut next, &["qsql"], 1, true).await;
        assert!(
            took.is_empty(),
            "a start while a slot above 1 is held: {took:?}"
        );
        next.batch_execute("COMMIT").await.unwrap();
    }
    // The last job above the limit ends: the queue starts one again, and the
    // slots above its limit are gone.
    lanes[2].batch_execute("COMMIT").await.unwrap();
    let took = pick(&mut next, &["qsql"], 1, true).await;
    assert_eq!(took.len(), 1, "{took:?}");
    next.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_slot WHERE queue = 'qsql' AND slot >= 1")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_through_sql_are_refused_and_write_nothing() {
    let db = TestDb::new().await;
    let mut direct = db.direct().await;
    let bad = [
        "ARRAY['concurrency'], 0, NULL, NULL, NULL",
        "ARRAY['concurrency'], 10001, NULL, NULL, NULL",
        "ARRAY['rate'], NULL, 5, NULL, NULL",
        "ARRAY['rate'], NULL, 0, 1000, NULL",
        "ARRAY['rate'], NULL, 5, 0, NULL",
        "ARRAY['burst'], NULL, NULL, NULL, 3",
        "ARRAY['rate', 'burst'], NULL, 5, 1000, 0",
        "ARRAY['weight'], NULL, NULL, NULL, NULL",
    ];
    for args in bad {
        let err = diesel::sql_query(format!(
            "SELECT * FROM pgfifo.change_queue_control('qsql', {args})"
        ))
        .execute(&mut direct)
        .await
        .expect_err(args);
        assert!(
            err.to_string().contains("change_queue_control"),
            "{args}: {err}"
        );
    }
    let err = diesel::sql_query(
        "SELECT * FROM pgfifo.change_queue_control('', ARRAY['concurrency'], 2, NULL, NULL, NULL)",
    )
    .execute(&mut direct)
    .await
    .expect_err("empty queue name");
    assert!(err.to_string().contains("queue name is empty"), "{err}");
    assert_eq!(
        db.scalar(
            "SELECT (SELECT count(*) FROM pgfifo.queue_control)
                  + (SELECT count(*) FROM pgfifo.queue_slot)
                  + (SELECT count(*) FROM pgfifo.queue_bucket)"
        )
        .await,
        0,
        "nothing written"
    );
}

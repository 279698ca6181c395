//! Start order with a group concurrency above 1, at the level of the SQL
//! functions the lanes call. A job of such a group ("slot job") that is
//! picked but does not begin at once lets younger jobs of its group begin,
//! and end, in other slots before it. So:
//!
//! * `pgfifo.pick` takes a slot job only when the lane can start it at once
//!   (the runner turns `pgfifo.pick_slots` off when no permit is free), at
//!   most one per pick, and returns it first (never behind another handler
//!   of its batch);
//! * `pgfifo.start_attempts` gives a rate-limited slot job a token only when
//!   no older queued job of its group is without an attempt under way: the
//!   younger one is refused (attempt 0) and picked again after it.
//!
//! The runner-level checks are in `group_concurrency.rs` and
//! `multiprocess/concurrency.rs`.

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{admin, async_trait, GroupLimits, Handler, Job, JobContext, JobError, Rate};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

/// Never run: the tests call the SQL functions themselves.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "slots", max_attempts = 5)]
struct SlotJob;

#[async_trait]
impl Handler for SlotJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[derive(QueryableByName, Debug)]
struct Row {
    #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
    id: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    group_id: Option<String>,
}

/// Picks up to `limit` jobs of the queue in a job transaction opened as the
/// runner opens it (`start_at_once` false: as a lane without a free permit),
/// and rolls it back: (job id, group) in the order returned.
async fn pick(conn: &mut AsyncPgConnection, limit: i32, start_at_once: bool) -> Vec<(i64, String)> {
    let opener = if start_at_once {
        "BEGIN; SET LOCAL pgfifo.job_transaction = on"
    } else {
        "BEGIN; SET LOCAL pgfifo.job_transaction = on; SET LOCAL pgfifo.pick_slots = off"
    };
    conn.batch_execute(opener).await.expect("begin");
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT id, group_id FROM pgfifo.pick(ARRAY['slots'], 0, 0, '{}', '{}', 60000, $1)",
    )
    .bind::<Integer, _>(limit)
    .load(conn)
    .await
    .expect("pick");
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    rows.into_iter()
        .filter_map(|r| Some((r.id?, r.group_id.unwrap_or_default())))
        .collect()
}

/// Enqueues one job into each of `groups`, in that order.
async fn enqueue(db: &TestDb, groups: &[&str]) -> Vec<i64> {
    let mut ids = Vec::new();
    for group in groups {
        ids.push(db.enqueue(SlotJob, group).await);
    }
    db.scalar("SELECT promoted FROM pgfifo.promote(ARRAY['slots'], 100)")
        .await;
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_job_is_picked_only_to_start_at_once_and_first() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    for wide in ["wide-a", "wide-b"] {
        admin::set_group_limits(&mut conn, "slots", wide, GroupLimits::new().concurrency(3))
            .await
            .unwrap();
    }
    // Narrow groups before and after the wide ones, so that a walk meets a
    // wide group after it took jobs, whatever its starting point.
    let ids = enqueue(
        &db,
        &[
            "narrow-1", "wide-a", "wide-a", "narrow-2", "wide-b", "narrow-3", "wide-b",
        ],
    )
    .await;
    let narrow = [ids[0], ids[3], ids[5]];
    let mut direct = db.direct().await;

    // A lane without a free permit: the narrow groups' heads only.
    let picked = pick(&mut direct, 8, false).await;
    let mut got: Vec<i64> = picked.iter().map(|p| p.0).collect();
    got.sort_unstable();
    assert_eq!(
        got, narrow,
        "no slot job for a lane that cannot start it at once"
    );

    // A lane that can start at once: one slot job, first, and the oldest of
    // its group; every narrow head after it.
    let picked = pick(&mut direct, 8, true).await;
    assert!(
        picked[0].1.starts_with("wide-"),
        "the slot job comes first: {picked:?}"
    );
    let oldest = if picked[0].1 == "wide-a" {
        ids[1]
    } else {
        ids[4]
    };
    assert_eq!(
        picked[0].0, oldest,
        "the oldest job of its group: {picked:?}"
    );
    assert_eq!(
        picked.iter().filter(|p| p.1.starts_with("wide-")).count(),
        1,
        "one slot job per pick: {picked:?}"
    );
    let mut rest: Vec<i64> = picked[1..].iter().map(|p| p.0).collect();
    rest.sort_unstable();
    assert_eq!(rest, narrow, "the narrow heads after it: {picked:?}");
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Started {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

async fn start_attempts(conn: &mut AsyncPgConnection, ids: &[i64]) -> Vec<(i64, i32)> {
    let max: Vec<i32> = ids.iter().map(|_| 5).collect();
    let mut rows: Vec<Started> = diesel::sql_query(
        "SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, 'test-runner')",
    )
    .bind::<diesel::sql_types::Array<BigInt>, _>(ids)
    .bind::<diesel::sql_types::Array<Integer>, _>(max)
    .load(conn)
    .await
    .expect("start_attempts");
    rows.sort_by_key(|r| r.job_id);
    rows.into_iter().map(|r| (r.job_id, r.attempt)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_slot_job_takes_no_token_before_an_older_one() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let limits = GroupLimits::new()
        .concurrency(3)
        .rate(Rate::per_second(100).unwrap());
    admin::set_group_limits(&mut conn, "slots", "wide", limits)
        .await
        .unwrap();
    let ids = enqueue(&db, &["wide", "wide", "wide", "wide"]).await;
    let mut direct = db.direct().await;

    // The second job's take comes before the first's: refused, no record.
    assert_eq!(start_attempts(&mut direct, &[ids[1]]).await, [(ids[1], 0)]);
    assert_eq!(db.attempt_rows(ids[1]).await, 0);
    // The first one's, then the second's again: both start.
    assert_eq!(start_attempts(&mut direct, &[ids[0]]).await, [(ids[0], 1)]);
    assert_eq!(start_attempts(&mut direct, &[ids[1]]).await, [(ids[1], 1)]);
    // Older and younger in one call: the older one's token counts for the
    // younger one's turn.
    let id2 = ids[2];
    let id3 = ids[3];
    assert_eq!(
        start_attempts(&mut direct, &[id3, id2]).await,
        [(id2, 1), (id3, 1)]
    );
    // An older job whose attempt ended and that waits in the queue again
    // (its retry is due) holds back a younger one's token.
    db.exec(&format!(
        "UPDATE pgfifo.job_attempt SET finished_at = now() WHERE job_id = {}",
        ids[0]
    ))
    .await;
    assert_eq!(start_attempts(&mut direct, &[ids[2]]).await, [(ids[2], 0)]);
}

//! Hot groups in the failover switch (`switch.rs`): a few groups with a
//! backlog of quick jobs whose handler never takes the job's connection, in
//! a queue of their own (`fo_hot`) served by a second runner in the test
//! process with a lane per group. With such a backlog `pgfifo.pick` takes
//! the jobs behind a group's head (followers) and the lane runs them one
//! after another in the pick's transaction, committing once. A burst
//! begins just before the fault, so that batches are in progress when it
//! comes; a second burst goes in on the new primary.
//!
//! A run's record reaches `fo_hot_log` through the job's result, which a
//! trigger copies when `pgfifo.complete` writes the success: a row exists if
//! and only if the run committed, and its `xact` tells which jobs committed
//! together. The checks are those of the other groups (every job once, in
//! order, no overlap) plus the followers counted from `xact`.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob, Pool, RunnerHandle,
};
use serde::{Deserialize, Serialize};

use crate::jobs::now_ns;

/// Hot groups, and the hot runner's lanes (one per group, so that the
/// group the other lane holds is no work for a pick, which then takes
/// followers).
pub(crate) const HOT_GROUPS: u32 = 2;
/// Jobs per hot group in each of two bursts: one begun just before the
/// fault, one enqueued on the new primary.
pub(crate) const HOT_PER_GROUP: u32 = 300;

/// The hot groups' job: a 1 ms timer, no connection taken; its run goes in
/// the job's result.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "fo.hot",
    queue = "fo_hot",
    max_attempts = 25,
    backoff = "20ms",
    timeout = "60s"
)]
pub(crate) struct FoHot {
    pub(crate) group: u32,
    pub(crate) seq: u32,
}

/// A hot run, stored as the job's result.
#[derive(Serialize)]
struct HotRun {
    started_ns: i64,
    ended_ns: i64,
}

#[async_trait]
impl Handler for FoHot {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let started_ns = now_ns();
        tokio::time::sleep(Duration::from_millis(1)).await;
        ctx.set_result(&HotRun {
            started_ns,
            ended_ns: now_ns(),
        })?;
        Ok(())
    }
}

/// The table of committed hot runs and the trigger that fills it from a
/// hot job's result when its success is written.
pub(crate) const FO_HOT_LOG: &str = "
CREATE TABLE fo_hot_log (job_id bigint NOT NULL, grp int NOT NULL, seq int NOT NULL,
    started_ns bigint NOT NULL, ended_ns bigint NOT NULL,
    xact bigint NOT NULL DEFAULT txid_current(),
    port int NOT NULL DEFAULT inet_server_port());
CREATE FUNCTION fo_hot_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fo_hot_log (job_id, grp, seq, started_ns, ended_ns)
    VALUES (NEW.id, (NEW.payload->>'group')::integer, (NEW.payload->>'seq')::integer,
            (NEW.result->>'started_ns')::bigint, (NEW.result->>'ended_ns')::bigint);
    RETURN NULL;
END $$;
CREATE TRIGGER fo_hot_done AFTER UPDATE OF state ON pgfifo.job
    FOR EACH ROW WHEN (NEW.kind = 'fo.hot' AND NEW.state = 'succeeded')
    EXECUTE FUNCTION fo_hot_done();";

/// Enqueues `HOT_PER_GROUP` jobs in every hot group, from `seq` on.
pub(crate) async fn enqueue_hot(
    conn: &mut AsyncPgConnection,
    from_seq: u32,
) -> Result<(), pgfifo::Error> {
    let jobs = (0..HOT_GROUPS * HOT_PER_GROUP).map(|i| {
        let (group, seq) = (i % HOT_GROUPS, from_seq + i / HOT_GROUPS);
        NewJob::new(
            &FoHot { group, seq },
            EnqueueOptions::group(format!("h{group}")),
        )
        .unwrap()
    });
    pgfifo::enqueue_batch(conn, jobs.collect::<Vec<_>>())
        .await
        .map(|_| ())
}

/// The runner of the hot queue: a lane per group.
pub(crate) async fn start_hot_runner(pool: Pool) -> RunnerHandle {
    let config = pgfifo::RunnerConfig::default()
        .queues(["fo_hot"])
        .concurrency(HOT_GROUPS as usize)
        .poll_interval(Duration::from_millis(200));
    pgfifo::runner::start(pool, config)
        .await
        .expect("start the hot runner")
}

#[derive(QueryableByName, Debug)]
struct HotRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    grp: i32,
    #[diesel(sql_type = Integer)]
    seq: i32,
    #[diesel(sql_type = BigInt)]
    started_ns: i64,
    #[diesel(sql_type = BigInt)]
    ended_ns: i64,
    #[diesel(sql_type = BigInt)]
    xact: i64,
    #[diesel(sql_type = Integer)]
    port: i32,
}

/// What the hot groups' committed runs show.
#[derive(Debug, Default)]
pub(crate) struct HotFound {
    /// Committed runs.
    pub(crate) runs: usize,
    /// Jobs whose run committed more than once.
    pub(crate) duplicates: usize,
    /// A run of a group followed (in time) by one that is not the next job.
    pub(crate) order_violations: usize,
    /// A run of a group that began before the one before it ended.
    pub(crate) overlaps: usize,
    /// Jobs that committed in the same transaction as the job before them
    /// in their group: they ran as followers.
    pub(crate) followers: usize,
    /// Followers that committed on the new primary (`port`).
    pub(crate) followers_on_new: usize,
    /// Job ids of every committed run.
    pub(crate) committed: Vec<i64>,
}

/// Reads and checks the hot groups' committed runs; `new_port` is the new
/// primary's.
pub(crate) async fn check_hot(conn: &mut AsyncPgConnection, new_port: u16) -> HotFound {
    let rows: Vec<HotRow> = diesel::sql_query(
        "SELECT job_id, grp, seq, started_ns, ended_ns, xact, port FROM fo_hot_log \
         ORDER BY grp, started_ns",
    )
    .load(conn)
    .await
    .expect("read fo_hot_log");
    let distinct: std::collections::HashSet<i64> = rows.iter().map(|r| r.job_id).collect();
    let mut found = HotFound {
        runs: rows.len(),
        duplicates: rows.len() - distinct.len(),
        committed: rows.iter().map(|r| r.job_id).collect(),
        ..HotFound::default()
    };
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.grp != b.grp {
            continue;
        }
        if b.seq != a.seq + 1 {
            found.order_violations += 1;
        }
        if b.started_ns < a.ended_ns {
            found.overlaps += 1;
        }
        if b.xact == a.xact {
            found.followers += 1;
            if b.port == i32::from(new_port) {
                found.followers_on_new += 1;
            }
        }
    }
    found
}

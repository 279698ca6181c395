//! Schedules on the distributed layout: a runner declares a recurring job,
//! fires each tick once into its group with the tick recorded, and the
//! admin API reads the schedule with its last job.

use std::time::UNIX_EPOCH;

use pgfifo::admin;
use pgfifo::migrate::Layout;
use pgfifo::schedule::{Schedule, Tick};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::test_config;
use serde::{Deserialize, Serialize};

use crate::coordinator::{cluster_with, count, wait_for};

/// The job of this module's schedule: its tick, in ms since the epoch.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "citus.tick", queue = "citus-ticks")]
struct TickJob {
    tick_ms: i64,
}

#[async_trait]
impl Handler for TickJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn tick_job(tick: &Tick) -> TickJob {
    TickJob {
        tick_ms: tick.at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_schedule_fires_each_tick_once_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();
    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let every_second = Schedule::for_tick("each-second", "* * * * * *", tick_job).group("tenant-7");
    let runner = pgfifo::runner::start(pool, test_config().schedule(every_second))
        .await
        .expect("a runner with a schedule on the distributed layout");
    wait_for(
        &url,
        "SELECT least(count(*), 3) FROM pgfifo.job WHERE kind = 'citus.tick' AND state = 'succeeded'",
        3,
    )
    .await;
    runner.shutdown().await.expect("shutdown");
    let ticks = count(
        &mut conn,
        "SELECT count(*) FROM pgfifo.job WHERE kind = 'citus.tick'",
    )
    .await;
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(DISTINCT payload->>'tick_ms') FROM pgfifo.job
             WHERE kind = 'citus.tick' AND group_id = 'tenant-7'"
        )
        .await,
        ticks,
        "each tick once, in the schedule's group"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.schedule_tick WHERE schedule = 'each-second'"
        )
        .await,
        ticks,
        "each fired tick is recorded"
    );
    let info = admin::schedule(&mut conn, "each-second")
        .await
        .expect("schedule");
    assert_eq!(info.group.as_deref(), Some("tenant-7"));
    // The last job's state, read from its shard beside the schedule's row
    // on the coordinator (the last tick may have fired as the runner
    // stopped).
    let last = info.last_job.expect("a last job");
    let state = count(
        &mut conn,
        &format!("SELECT count(*) FROM pgfifo.job WHERE id = {last} AND state = 'succeeded'"),
    )
    .await;
    let expected = if state == 1 { "succeeded" } else { "queued" };
    assert_eq!(info.last_job_state.as_deref(), Some(expected), "{info:?}");
    assert!(info.stale, "its only runner stopped: {info:?}");
    assert!(admin::pause_schedule(&mut conn, "each-second")
        .await
        .expect("pause"));
    assert_eq!(
        admin::schedules(&mut conn).await.expect("schedules").len(),
        1
    );
    admin::delete_schedule(&mut conn, "each-second")
        .await
        .expect("delete");
    assert!(admin::schedules(&mut conn)
        .await
        .expect("schedules")
        .is_empty());
}

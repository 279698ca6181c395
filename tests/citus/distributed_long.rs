//! Long mode (`#[job(long)]`) on the distributed layout: a long job holds
//! its group without an open transaction, through a run row on its group's
//! shard and a session lock on the coordinator; an operator cannot cancel
//! it; when its session dies, the job runs again at once on another
//! connection and its outcome is written once; its group goes on in order.

use diesel::sql_types::{BigInt, Integer};
use diesel_async::RunQueryDsl;
use pgfifo::migrate::Layout;
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{admin, async_trait, Handler, Job, JobContext, JobError, JobId};
use pgfifo_tests::query::text;
use pgfifo_tests::test_config;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::coordinator::{cluster_with, count, wait_for};
use crate::gate::gate;

const QUEUE: &str = "citus_long";

/// Writes a row through its connection (autocommit in long mode), notes its
/// backend (on the coordinator), then holds at its test's gate when `hold`.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "citus_long", long, max_attempts = 5, backoff = "10ms")]
struct LongJob {
    tag: String,
    hold: bool,
}

#[derive(diesel::QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[async_trait]
impl Handler for LongJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (id, attempt) = (ctx.id(), ctx.attempt() as i32);
        diesel::sql_query("INSERT INTO long_rows (job_id, attempt) VALUES ($1, $2)")
            .bind::<BigInt, _>(id)
            .bind::<Integer, _>(attempt)
            .execute(ctx.conn())
            .await?;
        let me: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(ctx.conn())
            .await?;
        let gate = gate(&self.tag);
        gate.pids.lock().unwrap().push(me.pid);
        if self.hold {
            gate.hold().await?;
        }
        Ok(())
    }
}

/// A job of the default mode in the same queue.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "citus_long")]
struct ShortJob;

#[async_trait]
impl Handler for ShortJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn long_mode_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "CREATE TABLE long_rows (job_id bigint NOT NULL, attempt int NOT NULL)",
    )
    .await
    .expect("table");
    let tag = "citus_long";
    let pool = pgfifo::connect(&url, 12).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().queues([QUEUE]).concurrency(4))
        .await
        .expect("a runner with a long job type on the distributed layout");
    let mut events = runner.subscribe();
    let long = LongJob {
        tag: tag.to_owned(),
        hold: true,
    };
    let id = long.enqueue(&mut conn, "g").await.expect("enqueue");
    let next = ShortJob.enqueue(&mut conn, "g").await.expect("enqueue");
    gate(tag).wait_started(1).await;

    // Held by a run row on the group's shard and the group's mark; other
    // groups run, the held group's next job waits.
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job_run
             WHERE part = pgfifo.part_of('citus_long', 'g') AND group_id = 'g'"
        )
        .await,
        1
    );
    // The holder's heartbeat renews the lease (an update of every shard:
    // its runs may be on any). (In a transaction: the runner's own renewal
    // waits for it.)
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "BEGIN")
        .await
        .expect("begin");
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(pgfifo.renew_long_runs(ARRAY(SELECT token FROM pgfifo.job_run), 3600000))"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job_run WHERE lease_until > now() + interval '50 minutes'"
        )
        .await,
        1,
        "the lease was renewed"
    );
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "COMMIT")
        .await
        .expect("commit");
    let other = ShortJob.enqueue(&mut conn, "other").await.expect("enqueue");
    wait_for(
        &url,
        &format!("SELECT count(*) FROM pgfifo.job WHERE id = {other} AND state = 'succeeded'"),
        1,
    )
    .await;
    assert_eq!(state(&mut conn, next).await, "queued 0");
    // The handler's write committed by itself.
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) FROM long_rows WHERE job_id = {id}")
        )
        .await,
        1
    );
    // An operator cannot cancel or skip the running head.
    let cancelled = admin::cancel_job(&mut conn, id, None).await;
    assert!(cancelled.is_err(), "{cancelled:?}");
    let skipped = admin::skip_head(&mut conn, QUEUE, "g", None).await;
    assert!(skipped.is_err(), "{skipped:?}");

    // The holder's session dies (its lock, on the coordinator, goes with
    // it): the job runs again at once on another connection, while the
    // first run's handler still waits at the gate.
    let first = gate(tag).pids.lock().unwrap()[0];
    diesel::sql_query(format!("SELECT pg_terminate_backend({first})"))
        .execute(&mut conn)
        .await
        .expect("end the holder's session");
    gate(tag).wait_started(1).await;
    assert_ne!(gate(tag).pids.lock().unwrap()[1], first);
    assert_eq!(state(&mut conn, next).await, "queued 0", "order kept");

    // Both runs finish: only the second one's outcome is written.
    gate(tag).release.add_permits(2);
    for job in [id, next] {
        wait_for(
            &url,
            &format!("SELECT count(*) FROM pgfifo.job WHERE id = {job} AND state = 'succeeded'"),
            1,
        )
        .await;
    }
    assert_eq!(state(&mut conn, id).await, "succeeded 2");
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) FROM pgfifo.job_attempt WHERE job_id = {id}")
        )
        .await,
        2
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.job_run").await,
        0
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.queue_group WHERE ready_at = '-infinity'"
        )
        .await,
        0
    );
    runner.shutdown().await.expect("shutdown");
    assert_eq!(successes(&mut events, id), 1, "completed exactly once");
}

async fn state(conn: &mut diesel_async::AsyncPgConnection, id: JobId) -> String {
    text(
        conn,
        &format!("SELECT state || ' ' || attempts FROM pgfifo.job WHERE id = {id}"),
    )
    .await
    .unwrap_or_else(|| panic!("no job {id}"))
}

/// The success events of job `id` received so far.
fn successes(events: &mut broadcast::Receiver<JobEvent>, id: JobId) -> u32 {
    let mut seen = 0;
    while let Ok(event) = events.try_recv() {
        if event.id == id && event.outcome == JobOutcome::Succeeded {
            seen += 1;
        }
    }
    seen
}

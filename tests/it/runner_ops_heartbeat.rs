//! The runner's heartbeat: its row in `pgfifo.runner`, written at start and
//! every `heartbeat_interval`, with the handlers it runs now per queue (what
//! `admin::queue_status` reports as running), deleted on shutdown.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Jsonb, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::admin::{self, QueueStatus};
use pgfifo::{Error, RunnerConfig};
use pgfifo_tests::eventually;
use serde_json::json;

use crate::runner_ops_support::{Act, Fx, LIMIT, QUEUE, TICK};

/// A row of `pgfifo.runner`, times in µs since the epoch.
#[derive(QueryableByName, Debug, Clone, PartialEq)]
struct RunnerRow {
    #[diesel(sql_type = Array<Text>)]
    queues: Vec<String>,
    #[diesel(sql_type = Jsonb)]
    running: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    started_us: i64,
    #[diesel(sql_type = BigInt)]
    heartbeat_us: i64,
}

impl Fx {
    /// The heartbeat row of runner `name`, if there is one.
    async fn runner_row(&self, name: &str) -> Option<RunnerRow> {
        let mut conn = self.conn().await;
        diesel::sql_query(
            "SELECT queues, running,
                    (extract(epoch FROM started_at) * 1e6)::bigint AS started_us,
                    (extract(epoch FROM heartbeat_at) * 1e6)::bigint AS heartbeat_us
             FROM pgfifo.runner WHERE name = $1",
        )
        .bind::<Text, _>(name)
        .load::<RunnerRow>(&mut conn)
        .await
        .expect("read pgfifo.runner")
        .pop()
    }

    /// Waits up to `limit` for runner `name`'s row.
    async fn wait_row(&self, name: &str, limit: Duration) -> RunnerRow {
        eventually(&format!("runner {name}'s row"), limit, || async {
            self.runner_row(name)
                .await
                .ok_or_else(|| "no row".to_owned())
        })
        .await
    }

    /// Waits until runner `name`'s row reports `running` handlers of the
    /// test queue.
    async fn wait_row_running(&self, name: &str, running: i64) -> RunnerRow {
        let expected = json!({ QUEUE: running });
        eventually(
            &format!("runner {name}'s row to report running = {expected}"),
            LIMIT,
            || async {
                match self.runner_row(name).await {
                    Some(row) if row.running == expected => Ok(row),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
    }

    /// Waits until the test queue's status reports `running` jobs and
    /// `runners` live runners.
    async fn wait_status(&self, running: i64, runners: i64) -> QueueStatus {
        eventually(
            &format!("status to report running = {running}, runners = {runners}"),
            LIMIT,
            || async {
                let mut conn = self.conn().await;
                let status = admin::queue_status(&mut conn, QUEUE, 3)
                    .await
                    .map_err(|e| e.to_string())?;
                if (status.running, status.runners) == (running, runners) {
                    Ok(status)
                } else {
                    Err(format!(
                        "running = {}, runners = {}",
                        status.running, status.runners
                    ))
                }
            },
        )
        .await
    }

    /// A runner configuration named after the test, with `suffix`.
    fn named(&self, suffix: &str, heartbeat: Duration) -> (String, RunnerConfig) {
        let name = format!("{}-{suffix}", self.name);
        let config = self
            .config()
            .name(name.clone())
            .heartbeat_interval(heartbeat);
        (name, config)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_row_is_written_at_start_not_after_the_first_interval() {
    let fx = Fx::new().await;
    let (name, config) = fx.named("a", Duration::from_secs(10));
    let runner = fx.start_runner(config).await;
    // Written at start: well before the first 10 s interval is over.
    let row = fx.wait_row(&name, Duration::from_secs(3)).await;
    assert_eq!(row.queues, vec![QUEUE.to_owned()], "{row:?}");
    assert_eq!(row.running, json!({ QUEUE: 0 }), "{row:?}");
    assert!(row.started_us <= row.heartbeat_us, "{row:?}");
    fx.wait_status(0, 1).await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_advances_every_interval_and_keeps_started_at() {
    let fx = Fx::new().await;
    let (name, config) = fx.named("a", TICK);
    let runner = fx.start_runner(config).await;
    let first = fx.wait_row(&name, LIMIT).await;
    // Three more beats at 200 ms take 600 ms; allow for a loaded machine, but
    // not for a heartbeat that is only written at start.
    let mut last = first.clone();
    for beat in 1..=3 {
        last = eventually(
            &format!("heartbeat {beat} after the first"),
            Duration::from_secs(3),
            || async {
                match fx.runner_row(&name).await {
                    Some(row) if row.heartbeat_us > last.heartbeat_us => Ok(row),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert_eq!(last.started_us, first.started_us, "started_at changed");
    }
    let span = Duration::from_micros((last.heartbeat_us - first.heartbeat_us) as u64);
    assert!(
        span >= TICK * 2,
        "three beats within {span:?}: faster than the {TICK:?} interval"
    );
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_reports_running_handlers_and_status_counts_them() {
    let fx = Fx::new().await;
    let (name, config) = fx.named("a", TICK);
    let runner = fx.start_runner(config.concurrency(4)).await;
    for group in ["g1", "g2", "g3"] {
        fx.push(Some(group), &[Act::Hold]).await;
    }
    fx.gate().wait_started(3).await;
    fx.wait_row_running(&name, 3).await;
    let status = fx.wait_status(3, 1).await;
    assert_eq!(
        status.queued.value, 0,
        "running jobs are not queued: {status:?}"
    );

    fx.release(3);
    fx.wait_succeeded(3, LIMIT).await;
    fx.wait_row_running(&name, 0).await;
    fx.wait_status(0, 1).await;
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_row_is_deleted_on_shutdown_and_on_abort() {
    let fx = Fx::new().await;
    let (a, config_a) = fx.named("a", TICK);
    let (b, config_b) = fx.named("b", TICK);
    let runner_a = fx.start_runner(config_a).await;
    let runner_b = fx.start_runner(config_b).await;
    fx.wait_row_running(&a, 0).await;
    fx.wait_row_running(&b, 0).await;
    fx.wait_status(0, 2).await;

    runner_a.shutdown().await.unwrap();
    assert_eq!(fx.runner_row(&a).await, None, "row left after shutdown()");
    assert!(
        fx.runner_row(&b).await.is_some(),
        "the other runner's row went"
    );
    fx.wait_status(0, 1).await;

    runner_b.abort().await.unwrap();
    assert_eq!(fx.runner_row(&b).await, None, "row left after abort()");
    fx.wait_status(0, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_sums_the_running_jobs_of_two_runners() {
    let fx = Fx::new().await;
    // One handler at a time and nothing taken ahead: each runner takes one
    // of the two held jobs.
    let one = |config: RunnerConfig| config.concurrency(1).prefetch(0);
    let (a, config_a) = fx.named("a", TICK);
    let (b, config_b) = fx.named("b", TICK);
    let runner_a = fx.start_runner(one(config_a)).await;
    let runner_b = fx.start_runner(one(config_b)).await;
    fx.push(Some("g1"), &[Act::Hold]).await;
    fx.push(Some("g2"), &[Act::Hold]).await;
    fx.gate().wait_started(2).await;
    fx.wait_row_running(&a, 1).await;
    fx.wait_row_running(&b, 1).await;
    fx.wait_status(2, 2).await;

    fx.release(2);
    fx.wait_succeeded(2, LIMIT).await;
    fx.wait_status(0, 2).await;
    runner_a.shutdown().await.unwrap();
    runner_b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_rejects_a_heartbeat_interval_of_zero_or_past_half_the_liveness_age() {
    let fx = Fx::new().await;
    for interval in [
        Duration::ZERO,
        admin::RUNNER_ALIVE / 2 + Duration::from_millis(1),
    ] {
        let (name, config) = fx.named("bad", interval);
        let err = pgfifo::runner::start(fx.pool.clone(), config)
            .await
            .expect_err("a runner with an unworkable heartbeat interval");
        match err {
            Error::InvalidConfig(reason) => {
                assert!(
                    reason.contains("heartbeat_interval"),
                    "{interval:?}: {reason}"
                )
            }
            other => panic!("{interval:?}: expected InvalidConfig, got {other:?}"),
        }
        assert_eq!(
            fx.runner_row(&name).await,
            None,
            "a refused runner wrote a row"
        );
    }
    // The longest allowed interval is accepted.
    let (_, config) = fx.named("ok", admin::RUNNER_ALIVE / 2);
    fx.start_runner(config).await.shutdown().await.unwrap();
}

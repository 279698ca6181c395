//! The runners that are alive now, and what they finished lately.

use std::time::{Duration, SystemTime};

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::status::RUNNER_ALIVE;
use crate::db;
use crate::db::pooler::pinned;
use crate::time::{age_from_micros, from_micros, ser_time};
use crate::Result;

/// A runner whose heartbeat is recent (see [`RUNNER_ALIVE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunnerInfo {
    /// Its name (`RunnerConfig::name`; by default `host:pid:tag`).
    pub name: String,
    /// The queues it serves.
    pub queues: Vec<String>,
    /// Jobs it runs now, over all its queues.
    pub running: i64,
    /// The pgfifo release it runs, when it said (0.2.0 and later).
    pub release: Option<String>,
    /// When it started.
    #[serde(serialize_with = "ser_time")]
    pub started_at: SystemTime,
    /// How long ago its last heartbeat was.
    #[serde(serialize_with = "ser_secs", rename = "heartbeat_age_secs")]
    pub heartbeat_age: Duration,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The live runners, by name.
pub async fn runners(conn: &mut AsyncPgConnection) -> Result<Vec<RunnerInfo>> {
    pinned(conn, async |conn| {
        let rows = db::admin::status::runners(conn, RUNNER_ALIVE).await?;
        Ok(rows
            .into_iter()
            .map(|row| RunnerInfo {
                name: row.name,
                queues: row.queues,
                running: row.running,
                release: row.release,
                started_at: from_micros(row.started_at_us),
                heartbeat_age: age_from_micros(row.heartbeat_age_us),
            })
            .collect())
    })
    .await
}

/// Jobs finished in one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MinuteCount {
    /// The queue.
    pub queue: String,
    /// The minute's start.
    #[serde(serialize_with = "ser_time")]
    pub minute: SystemTime,
    /// Jobs that succeeded in it.
    pub succeeded: i64,
    /// Jobs that failed for good in it.
    pub failed: i64,
}

/// Jobs finished per queue and minute over the last hour, as runners
/// recorded them with their heartbeats (runners of 0.1.0 record nothing;
/// a runner that died loses its last few seconds). Minutes without a
/// finished job have no entry.
pub async fn throughput(conn: &mut AsyncPgConnection) -> Result<Vec<MinuteCount>> {
    pinned(conn, async |conn| {
        let rows = db::admin::status::finished_per_minute(conn, 60).await?;
        Ok(rows
            .into_iter()
            .map(|row| MinuteCount {
                queue: row.queue,
                minute: from_micros(row.minute_us),
                succeeded: row.succeeded,
                failed: row.failed,
            })
            .collect())
    })
    .await
}

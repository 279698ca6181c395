//! Job types shared by the test modules.

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// Appends `(group, seq)` to `test_log` in the job's own transaction, with
/// start and end times from the database clock.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "log", max_attempts = 3, backoff = "10ms")]
pub struct LogJob {
    pub group: String,
    pub seq: i64,
    pub sleep_ms: u64,
}

#[async_trait]
impl Handler for LogJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let started = std::time::SystemTime::now();
        if self.sleep_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(self.sleep_ms)).await;
        }
        let ns = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as i64
        };
        diesel::sql_query(
            "INSERT INTO test_log (grp, seq, job_id, attempt, started_ns, ended_ns) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind::<Text, _>(&self.group)
        .bind::<BigInt, _>(self.seq)
        .bind::<BigInt, _>(ctx.id())
        .bind::<BigInt, _>(i64::from(ctx.attempt()))
        .bind::<BigInt, _>(ns(started))
        .bind::<BigInt, _>(ns(std::time::SystemTime::now()))
        .execute(ctx.conn())
        .await?;
        Ok(())
    }
}

/// The log table `LogJob` writes to.
pub const LOG_TABLE: &str = "CREATE TABLE test_log (
    grp text NOT NULL, seq bigint NOT NULL, job_id bigint NOT NULL, attempt bigint NOT NULL,
    started_ns bigint NOT NULL, ended_ns bigint NOT NULL)";

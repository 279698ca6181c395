//! The job type of the Citus suite.

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use std::time::Duration;

use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob};
use serde::{Deserialize, Serialize};

/// Appends `(group, seq, job, attempt)` with the database clock's start and
/// end to `citus_log`, in the job's transaction, after `hold_ms` of work
/// (2 ms when 0); a job with `fail_first` fails its first attempt (its row
/// is rolled back with it).
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "citus", max_attempts = 3, backoff = "20ms")]
pub struct LogJob {
    pub group: String,
    pub seq: i64,
    pub fail_first: bool,
    pub hold_ms: u64,
}

#[async_trait]
impl Handler for LogJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let (id, attempt) = (ctx.id(), ctx.attempt());
        diesel::sql_query(
            "INSERT INTO citus_log (grp, seq, job_id, attempt, started_at) \
             VALUES ($1, $2, $3, $4, clock_timestamp())",
        )
        .bind::<Text, _>(&self.group)
        .bind::<BigInt, _>(self.seq)
        .bind::<BigInt, _>(id)
        .bind::<BigInt, _>(i64::from(attempt))
        .execute(ctx.conn())
        .await?;
        // A few milliseconds of work, so that runs of different groups
        // overlap and a second run of one group would be seen.
        tokio::time::sleep(std::time::Duration::from_millis(self.hold_ms.max(2))).await;
        diesel::sql_query(
            "UPDATE citus_log SET ended_at = clock_timestamp() WHERE job_id = $1 AND attempt = $2",
        )
        .bind::<BigInt, _>(id)
        .bind::<BigInt, _>(i64::from(attempt))
        .execute(ctx.conn())
        .await?;
        if self.fail_first && attempt == 1 {
            return Err(JobError::retry("fails its first attempt"));
        }
        Ok(())
    }
}

/// The table `LogJob` writes to (on the coordinator, beside pgfifo's).
pub const LOG_TABLE: &str = "CREATE TABLE citus_log (
    grp text NOT NULL, seq bigint NOT NULL, job_id bigint NOT NULL, attempt bigint NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz)";

/// A `LogJob` of `group` (ungrouped when `None`) with `max_attempts`,
/// delayed by `delay`; with one attempt it fails it, for good.
pub fn log_job(
    group: Option<&str>,
    seq: i64,
    max_attempts: u32,
    delay: Option<Duration>,
) -> NewJob {
    let job = LogJob {
        group: group.unwrap_or("-").to_owned(),
        seq,
        fail_first: max_attempts == 1,
        hold_ms: 0,
    };
    let mut options = match group {
        Some(g) => EnqueueOptions::group(g),
        None => EnqueueOptions::ungrouped(),
    }
    .max_attempts(max_attempts);
    if let Some(delay) = delay {
        options = options.run_in(delay);
    }
    NewJob::new(&job, options).expect("new job")
}

/// A job of group `group` whose only attempt fails: it fails for good.
pub fn failing(group: &str, seq: i64) -> NewJob {
    log_job(Some(group), seq, 1, None)
}

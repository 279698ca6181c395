//! The job type of the polyglot example (`examples/polyglot/`,
//! docs/enqueue-from-sql.md): what the Python and Node.js producers enqueue
//! through the SQL API, run by the `polyglot` example and described by the
//! `pgfifo-app` binary's `job-types`.

use pgfifo::diesel;
use pgfifo::diesel::sql_types::{BigInt, Text};
use pgfifo::diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// One step of a tenant's work, as the Python and Node.js producers write
/// it: `{"producer": "python", "tenant": "acme", "seq": 3}`.
#[derive(Job, Serialize, Deserialize, schemars::JsonSchema)]
#[job(
    queue = "polyglot",
    kind = "polyglot.step",
    max_attempts = 3,
    backoff = "100ms"
)]
pub struct Step {
    /// Which producer enqueued it ("python", "node").
    pub producer: String,
    /// The tenant, also the job's group.
    pub tenant: String,
    /// The step's place in its tenant's sequence, from 0.
    pub seq: i64,
}

#[async_trait]
impl Handler for Step {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let id = ctx.id();
        let group = ctx.group().unwrap_or("").to_owned();
        // In the job's transaction: the row commits with the job's success.
        diesel::sql_query(
            "INSERT INTO polyglot_run (job_id, group_id, producer, seq) VALUES ($1, $2, $3, $4)",
        )
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(group)
        .bind::<Text, _>(&self.producer)
        .bind::<BigInt, _>(self.seq)
        .execute(ctx.conn())
        .await?;
        Ok(())
    }
}

/// The example's own table: one row per run, written in the job's
/// transaction.
pub const RUN_TABLE: &str =
    "CREATE TABLE polyglot_run (n bigserial PRIMARY KEY, job_id bigint NOT NULL, \
     group_id text NOT NULL, producer text NOT NULL, seq bigint NOT NULL)";

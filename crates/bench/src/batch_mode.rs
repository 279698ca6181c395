//! `fifo-groups` with `BATCH=1`: the same jobs enqueued as one pgfifo batch
//! (`pgfifo::Batch`, kept open while the chunks are added, then closed)
//! with a complete callback, to measure what a batch costs the drain and
//! how soon its callback starts (docs/batches.md).

use std::time::{Duration, Instant};

use diesel::sql_types::{Double, Nullable};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use pgfifo::{
    async_trait, Batch, BatchId, EnqueueOptions, Handler, Job, JobContext, JobError, NewJob,
};
use serde::{Deserialize, Serialize};

/// The batch's complete callback: does nothing (it is timed from the
/// database's records).
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "bench.batch_done", queue = "bench")]
pub struct BatchDone {}

#[async_trait]
impl Handler for BatchDone {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// Enqueues one chunk of the batch: the first creates it (open), the others
/// are added to it.
pub async fn enqueue_chunk(
    conn: &mut AsyncPgConnection,
    batch: &mut Option<BatchId>,
    chunk: Vec<NewJob>,
) -> Result<(), String> {
    match batch {
        None => {
            let done = NewJob::new(&BatchDone {}, EnqueueOptions::ungrouped())
                .map_err(|e| e.to_string())?;
            let created = Batch::new()
                .description("pgfifo-bench fifo-groups")
                .keep_open()
                .on_complete(done)
                .enqueue(conn, chunk)
                .await
                .map_err(|e| e.to_string())?;
            *batch = Some(created.id);
        }
        Some(id) => {
            pgfifo::batch::add(conn, *id, chunk)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Closes the batch.
pub async fn close(conn: &mut AsyncPgConnection, batch: Option<BatchId>) -> Result<(), String> {
    if let Some(id) = batch {
        pgfifo::batch::close(conn, id)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct Latency {
    #[diesel(sql_type = Nullable<Double>)]
    ms: Option<f64>,
}

/// Waits for the callback to start, and returns how long after the last
/// job's outcome was written (its `finished_at`, taken just before its
/// transaction commits) its attempt started, in ms, by the server's clock.
pub async fn callback_latency_ms(
    conn: &mut AsyncPgConnection,
    batch: BatchId,
) -> Result<f64, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row: Latency = diesel::sql_query(
            "SELECT extract(epoch FROM a.started_at - (
                        SELECT max(j.finished_at) FROM pgfifo.batch_job AS m
                        JOIN pgfifo.job AS j ON j.id = m.job_id WHERE m.batch_id = $1)
                    )::float8 * 1e3 AS ms
             FROM pgfifo.batch_callback AS c
             JOIN pgfifo.job_attempt AS a ON a.job_id = c.job_id
             WHERE c.batch_id = $1 AND c.event = 'complete'",
        )
        .bind::<diesel::sql_types::BigInt, _>(batch)
        .get_result(conn)
        .await
        .or_else(|e| match e {
            diesel::result::Error::NotFound => Ok(Latency { ms: None }),
            e => Err(e.to_string()),
        })?;
        if let Some(ms) = row.ms {
            return Ok(ms);
        }
        if Instant::now() > deadline {
            return Err("the batch's callback did not start within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

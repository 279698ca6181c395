//! Helpers of the smaller checks: a log sink, the pool test's job, error
//! chains.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel_async::RunQueryDsl;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// A log sink for one test: everything pgfifo logs on this thread.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "faults.pool", queue = "faults-pool", timeout = "10s")]
pub(crate) struct PoolJob {
    pub(crate) n: u32,
}

#[async_trait]
impl Handler for PoolJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        diesel::sql_query("INSERT INTO pool_log (job_id, n) VALUES ($1, $2)")
            .bind::<BigInt, _>(ctx.id())
            .bind::<Integer, _>(self.n as i32)
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

/// An error with its causes, `: `-separated (what `{:#}` of anyhow prints).
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text = format!("{text}: {next}");
        }
        cause = c.source();
    }
    text
}

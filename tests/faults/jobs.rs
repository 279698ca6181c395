//! The fault jobs' mirrors and the timings and numbering the suite relies on.

use std::time::Duration;

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use pgfifo_tests::faults::runs::Mode;
use serde::{Deserialize, Serialize};

// --- The job types (mirrors of fault-worker's; they never run here) -------

/// Same name, queue, settings and fields as `fault-worker`'s type, declared so
/// that this binary can enqueue it. No runner of this binary serves its queue.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.job",
    queue = "faults",
    max_attempts = 25,
    timeout = "4s",
    backoff = "100ms"
)]
pub(crate) struct FaultJob {
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) mode: Mode,
    pub(crate) work_ms: u32,
}

#[async_trait]
impl Handler for FaultJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent("faults.job runs in fault-worker only"))
    }
}

/// Mirror of `fault-worker`'s freeze job.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.freeze",
    queue = "freeze",
    max_attempts = 10,
    timeout = "3s",
    backoff = "100ms"
)]
pub(crate) struct FreezeJob {
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) freeze: bool,
    pub(crate) work_ms: u32,
}

#[async_trait]
impl Handler for FreezeJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent(
            "faults.freeze runs in fault-worker only",
        ))
    }
}

/// `faults.job`'s timeout.
pub(crate) const FAULT_TIMEOUT: Duration = Duration::from_secs(4);
/// `faults.freeze`'s timeout.
pub(crate) const FREEZE_TIMEOUT: Duration = Duration::from_secs(3);
/// `RunnerConfig::idle_grace` of the normal workers.
pub(crate) const WORKER_GRACE: Duration = Duration::from_secs(2);
/// `RunnerConfig::idle_grace` of the worker the suite freezes (and of its
/// rescuer): the frozen group must be free within FREEZE_TIMEOUT + this.
pub(crate) const FREEZER_GRACE: Duration = Duration::from_secs(1);
/// Allowed on top of that bound when measuring it: the server checks the
/// timeout on its own timer, and the suite polls every 20 ms.
pub(crate) const RELEASE_MARGIN: Duration = Duration::from_millis(1500);
/// Group numbers of the freeze scenario's groups start here.
pub(crate) const FREEZE_GRP: u32 = 1_000_000;
/// Group numbers of the prefetch scenario's groups start here.
pub(crate) const PREFETCH_GRP: u32 = 2_000_000;
/// Connections of worker processes carry application names with this prefix.
pub(crate) const APP_PREFIX: &str = "pgfifo-fw-";

pub(crate) const FAULT_LOG: &str = "CREATE TABLE fault_log (
    job_id bigint NOT NULL, attempt integer NOT NULL, queue text NOT NULL,
    grp integer NOT NULL, seq integer NOT NULL, pid integer NOT NULL,
    start_ns bigint NOT NULL, end_ns bigint NOT NULL,
    logged_at timestamptz NOT NULL DEFAULT clock_timestamp())";

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

/// Mirror of `fault-worker`'s `faults.long`: `faults.job` in long mode.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.long",
    queue = "faults",
    long,
    max_attempts = 25,
    timeout = "4s",
    backoff = "100ms"
)]
pub(crate) struct LongFaultJob {
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) mode: Mode,
    pub(crate) work_ms: u32,
}

#[async_trait]
impl Handler for LongFaultJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent("faults.long runs in fault-worker only"))
    }
}

/// Mirror of `fault-worker`'s `faults.freeze_long`: the freeze job in long
/// mode. Its timeout is shorter than two thirds of [`LONG_LEASE`], the
/// earliest its group can be taken over: the run checks bound a run without
/// an end by its timeout (a frozen run's handler does not run meanwhile),
/// and after SIGCONT the frozen run times out and its outcome, written
/// through another connection, is refused by the claim's token.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.freeze_long",
    queue = "freeze_long",
    long,
    max_attempts = 10,
    timeout = "1s",
    backoff = "100ms"
)]
pub(crate) struct LongFreezeJob {
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) freeze: bool,
    pub(crate) work_ms: u32,
}

#[async_trait]
impl Handler for LongFreezeJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent(
            "faults.freeze_long runs in fault-worker only",
        ))
    }
}

/// `faults.freeze_long`'s timeout.
pub(crate) const LONG_FREEZE_TIMEOUT: Duration = Duration::from_secs(1);
/// `RunnerConfig::long_lease` of the freeze scenarios' processes: a frozen long-mode run's
/// group is taken over within this plus two poll intervals (100 ms each).
pub(crate) const LONG_LEASE: Duration = Duration::from_millis(1500);
/// Group numbers of the long-mode freeze scenario's groups start here.
pub(crate) const FREEZE_LONG_GRP: u32 = 3_000_000;

/// One group in this many of the `faults` queue (those of N = 1) runs its
/// jobs in long mode (`faults.long`).
pub(crate) const LONG_EVERY: u32 = 4;

/// A long-mode run's log row waits in `fault_long_stage` (its handler's
/// writes commit at once) until the transaction that writes the job's
/// success copies it to `fault_log`: so `fault_log` holds exactly the
/// committed runs in both modes, and a second completion of a long job
/// would show as a second row. (The newest row of the attempt: a number
/// can be given twice after a server crash.)
pub(crate) const FAULT_LONG: &str = "
CREATE TABLE fault_long_stage (LIKE fault_log INCLUDING DEFAULTS);
CREATE FUNCTION fault_long_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fault_log (job_id, attempt, queue, grp, seq, pid, start_ns, end_ns, picked_ns)
    SELECT s.job_id, s.attempt, s.queue, s.grp, s.seq, s.pid, s.start_ns, s.end_ns, s.picked_ns
    FROM public.fault_long_stage AS s
    WHERE s.job_id = NEW.id AND s.attempt = NEW.attempts
    ORDER BY s.logged_at DESC LIMIT 1;
    RETURN NULL;
END $$;
CREATE TRIGGER fault_long_done AFTER UPDATE OF state ON pgfifo.job
    FOR EACH ROW WHEN (NEW.kind IN ('faults.long', 'faults.freeze_long')
                       AND NEW.state = 'succeeded')
    EXECUTE FUNCTION fault_long_done();";

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

/// The committed runs, one row each, written in the transaction that
/// commits the run (`xact`: that transaction's id).
pub(crate) const FAULT_LOG: &str = "CREATE TABLE fault_log (
    job_id bigint NOT NULL, attempt integer NOT NULL, queue text NOT NULL,
    grp integer NOT NULL, seq integer NOT NULL, pid integer NOT NULL,
    start_ns bigint NOT NULL, end_ns bigint NOT NULL, picked_ns bigint NOT NULL,
    logged_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    xact bigint NOT NULL DEFAULT txid_current())";

/// What the checks of groups that run several jobs at once need and the
/// library does not keep: every attempt start it recorded (`fault_start`;
/// `pgfifo.job_attempt` loses the starts of jobs handed back unstarted,
/// such as a prefetched job that waited too long for a free permit), and
/// the commit of each job's first failed attempt (`fault_hold`: from then on
/// nothing behind it in its group may start until it is done). Triggers on
/// the library's tables write them in the transactions that make them, so
/// a row exists exactly when its change committed.
pub(crate) const FAULT_TRACE: &str = "
CREATE TABLE fault_start (
    job_id bigint NOT NULL, attempt integer NOT NULL, runner text NOT NULL,
    started_at timestamptz NOT NULL);
CREATE TABLE fault_hold (job_id bigint NOT NULL, attempts integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION fault_note_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fault_start (job_id, attempt, runner, started_at)
    VALUES (NEW.job_id, NEW.attempt, NEW.runner, NEW.started_at);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_note_start AFTER INSERT ON pgfifo.job_attempt
    FOR EACH ROW EXECUTE FUNCTION fault_note_start();
CREATE FUNCTION fault_note_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fault_hold (job_id, attempts) VALUES (NEW.id, NEW.attempts);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_note_hold AFTER UPDATE ON pgfifo.job
    FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.attempts > 0 AND OLD.attempts = 0)
    EXECUTE FUNCTION fault_note_hold();";

/// Mirror of `fault-worker`'s `faults.hot`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "faults.hot",
    queue = "hot",
    max_attempts = 25,
    timeout = "1s",
    backoff = "100ms"
)]
pub(crate) struct HotJob {
    pub(crate) grp: u32,
    pub(crate) seq: u32,
    pub(crate) mode: Mode,
    pub(crate) work_us: u32,
}

#[async_trait]
impl Handler for HotJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Err(JobError::permanent("faults.hot runs in fault-worker only"))
    }
}

/// `faults.hot`'s timeout.
pub(crate) const HOT_TIMEOUT: Duration = Duration::from_secs(1);
/// Group numbers of the hot groups start here.
pub(crate) const HOT_GRP: u32 = 4_000_000;
/// How many hot groups there are, and the hot worker's concurrency: a lane
/// per group, so that the groups its other lanes hold are no work left for
/// a pick.
pub(crate) const HOT_GROUPS: u32 = 2;

/// The run a hot handler stores as its job's result is copied to
/// `fault_log` by the transaction that writes the job's success: so, as for
/// the other jobs, `fault_log` holds exactly the committed runs, and its
/// `xact` says which jobs committed in one transaction.
pub(crate) const FAULT_HOT: &str = "
CREATE FUNCTION fault_hot_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fault_log (job_id, attempt, queue, grp, seq, pid, start_ns, end_ns, picked_ns)
    VALUES (NEW.id, (NEW.result->>'attempt')::integer, NEW.queue,
            (NEW.payload->>'grp')::integer, (NEW.payload->>'seq')::integer,
            (NEW.result->>'pid')::integer, (NEW.result->>'start_ns')::bigint,
            (NEW.result->>'end_ns')::bigint, (extract(epoch FROM now()) * 1e9)::bigint);
    RETURN NULL;
END $$;
CREATE TRIGGER fault_hot_done AFTER UPDATE OF state ON pgfifo.job
    FOR EACH ROW WHEN (NEW.kind = 'faults.hot' AND NEW.state = 'succeeded')
    EXECUTE FUNCTION fault_hot_done();";

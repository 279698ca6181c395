//! The runner's periodic tasks, each on a pooled connection taken for one
//! tick and given back:
//!
//! * the heartbeat: the runner's row in `pgfifo.runner` (who is alive, what
//!   runs where), written at start and every
//!   [`RunnerConfig::heartbeat_interval`](super::RunnerConfig::heartbeat_interval),
//!   deleted on shutdown;
//! * the gauge sampler: the per-queue gauges of [`super::metrics`], read
//!   every [`RunnerConfig::metrics_interval`](super::RunnerConfig::metrics_interval);
//! * retention ([`Retention`]): deleting old finished jobs and idle groups,
//!   in short batches, by one runner at a time.
//!
//! None of them ever stops the runner: a failure is logged (once, until the
//! task works again) and the next tick tries again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::sql_types::{Array, BigInt, Bool, Double, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, TransactionManager};
use tokio_util::sync::CancellationToken;

use super::txn::Tm;
use super::worker::{jittered, random_fraction};
use super::Shared;
use crate::admin::{self, FinishedState, RUNNER_ALIVE};
use crate::db::PooledConnection;
use crate::{Error, Result};

/// Deleting history: finished jobs past an age, and groups idle for long.
///
/// Off unless [`RunnerConfig::retention`](super::RunnerConfig::retention) is
/// set, because deleting history is the operator's decision. When several
/// runners have it, one at a time makes each pass (a session advisory lock),
/// so it costs the same with one runner or a hundred.
///
/// A pass walks the job table in id order, [`batch_size`](Self::batch_size)
/// rows per short transaction, with a pause between batches so it never
/// competes with the jobs for long; it stops early when the runner shuts
/// down. A group's current head is never deleted. The next pass starts at
/// the first job the previous one had to leave that may still qualify
/// (unfinished or too recent), so kept history (failed jobs) is not read
/// over and over; every 6 hours a pass starts from the first job again.
///
/// ```
/// use std::time::Duration;
/// use pgfifo::runner::Retention;
/// use pgfifo::RunnerConfig;
///
/// let config = RunnerConfig::default().retention(
///     Retention::default()
///         .finished_after(Duration::from_secs(3 * 24 * 3600))
///         .failed_after(Duration::from_secs(30 * 24 * 3600)),
/// );
/// assert!(config.retention.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Succeeded and cancelled jobs are deleted this long after they
    /// finished (default 1 day).
    pub finished_after: Duration,
    /// Failed jobs are deleted this long after they failed; `None` (the
    /// default) keeps them for inspection and manual retry.
    pub failed_after: Option<Duration>,
    /// Group rows idle this long are deleted (default 1 day); the next job
    /// of a deleted group brings it back. `None` keeps them. Paused groups
    /// are kept.
    pub idle_groups_after: Option<Duration>,
    /// How often a pass runs (default 60 s, ±25 % jitter). The first pass
    /// runs within 10 s of the runner's start.
    pub interval: Duration,
    /// Rows looked at per transaction (default 1000).
    pub batch_size: i32,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            finished_after: Duration::from_secs(24 * 3600),
            failed_after: None,
            idle_groups_after: Some(Duration::from_secs(24 * 3600)),
            interval: Duration::from_secs(60),
            batch_size: admin::PURGE_BATCH,
        }
    }
}

impl Retention {
    /// Deletes succeeded and cancelled jobs this long after they finished.
    pub fn finished_after(mut self, age: Duration) -> Self {
        self.finished_after = age;
        self
    }

    /// Deletes failed jobs this long after they failed (`None`: keep them).
    pub fn failed_after(mut self, age: impl Into<Option<Duration>>) -> Self {
        self.failed_after = age.into();
        self
    }

    /// Deletes groups idle this long (`None`: keep them).
    pub fn idle_groups_after(mut self, idle: impl Into<Option<Duration>>) -> Self {
        self.idle_groups_after = idle.into();
        self
    }

    /// Runs a pass this often.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Looks at this many rows per transaction.
    pub fn batch_size(mut self, rows: i32) -> Self {
        self.batch_size = rows;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(Error::InvalidConfig(
                "retention interval must be longer than zero".into(),
            ));
        }
        if self.batch_size < 1 {
            return Err(Error::InvalidConfig(format!(
                "retention batch_size must be at least 1 (got {})",
                self.batch_size
            )));
        }
        Ok(())
    }

    /// The purge walks of a pass: (age, states). Failed jobs share the walk
    /// of the others when their age is the same.
    fn walks(&self) -> Vec<(Duration, Vec<FinishedState>)> {
        let finished = vec![FinishedState::Succeeded, FinishedState::Cancelled];
        match self.failed_after {
            None => vec![(self.finished_after, finished)],
            Some(age) if age == self.finished_after => {
                vec![(age, FinishedState::ALL.to_vec())]
            }
            Some(age) => vec![
                (self.finished_after, finished),
                (age, vec![FinishedState::Failed]),
            ],
        }
    }
}

/// Retention's session advisory lock: one pass at a time across runners.
/// (A single bigint key: that key space is apart from the two-integer one
/// where the groups' advisory locks live, so no queue name can collide.)
const RETENTION_LOCK: i64 = crate::migrate::ADVISORY_KEY_BASE + 2;
/// The pause between two batches of a retention pass.
const BATCH_PAUSE: Duration = Duration::from_millis(50);
/// How often a purge walk starts again from the first job (see [`Resume`]).
const FULL_WALK_EVERY: Duration = Duration::from_secs(6 * 3600);
/// The first retention pass runs within this long of the start.
const FIRST_PASS_WITHIN: Duration = Duration::from_secs(10);
/// A runner row without a heartbeat for this long is deleted by the next
/// runner that starts.
const STALE_RUNNER_ROW: Duration = Duration::from_secs(24 * 3600);
/// How long the heartbeat's final delete may take at shutdown.
const FAREWELL_PATIENCE: Duration = Duration::from_secs(5);

/// Logs a periodic task's failures once, not every tick, until it works again.
struct Complaints {
    task: &'static str,
    failing: bool,
}

impl Complaints {
    fn new(task: &'static str) -> Self {
        Self {
            task,
            failing: false,
        }
    }

    fn report<T>(&mut self, result: Result<T>) -> Option<T> {
        match result {
            Ok(value) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(task = self.task, "pgfifo: runner task works again");
                }
                Some(value)
            }
            Err(err) if self.failing => {
                tracing::debug!(task = self.task, error = %err, "pgfifo: runner task still failing");
                None
            }
            Err(err) => {
                self.failing = true;
                tracing::warn!(task = self.task, error = %err, "pgfifo: runner task failed; retrying every tick");
                None
            }
        }
    }
}

/// A pooled connection for one tick, waiting at most `patience` for it (a
/// busy pool must not pile up ticks).
async fn pooled(shared: &Shared, patience: Duration) -> Result<PooledConnection> {
    match tokio::time::timeout(patience, shared.pool.get_owned()).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(Error::Pool(format!(
            "no pooled connection within {patience:?} (size the pool at least \
             concurrency + prefetch + 4)"
        ))),
    }
}

/// Writes the runner's heartbeat row until the runner stops, then deletes it.
pub(super) async fn heartbeat(shared: Arc<Shared>, service: CancellationToken) {
    let interval = shared.config.heartbeat_interval;
    let mut complaints = Complaints::new("heartbeat");
    let mut starting = true;
    loop {
        if complaints.report(beat(&shared, starting).await).is_some() {
            starting = false;
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = service.cancelled() => break,
        }
    }
    let farewell = async {
        let mut conn = pooled(&shared, FAREWELL_PATIENCE).await?;
        diesel::sql_query("DELETE FROM pgfifo.runner WHERE name = $1")
            .bind::<Text, _>(&shared.config.name)
            .execute(&mut conn)
            .await?;
        Ok::<(), Error>(())
    };
    match tokio::time::timeout(FAREWELL_PATIENCE, farewell).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "pgfifo: could not delete the runner's heartbeat row");
        }
        Err(_) => tracing::warn!("pgfifo: deleting the runner's heartbeat row timed out"),
    }
}

#[derive(QueryableByName)]
struct BeatRow {
    /// Seconds since the previous heartbeat of a row of the same name.
    #[diesel(sql_type = Nullable<Double>)]
    previous_age_s: Option<f64>,
}

/// One heartbeat: upserts the runner's row with the running counts. The
/// first (`starting`) also resets `started_at` and warns when another live
/// runner has the same name.
async fn beat(shared: &Shared, starting: bool) -> Result<()> {
    let interval = shared.config.heartbeat_interval;
    let mut conn = pooled(shared, interval).await?;
    // The CTE reads the row as it was before this statement's upsert.
    let row: BeatRow = diesel::sql_query(
        "WITH previous AS (SELECT r.heartbeat_at FROM pgfifo.runner AS r WHERE r.name = $1)
         INSERT INTO pgfifo.runner AS r (name, started_at, heartbeat_at, queues, running)
         VALUES ($1, now(), now(), $2, $3)
         ON CONFLICT (name) DO UPDATE
         SET started_at = CASE WHEN $4 THEN now() ELSE r.started_at END,
             heartbeat_at = now(), queues = EXCLUDED.queues, running = EXCLUDED.running
         RETURNING (SELECT extract(epoch FROM now() - p.heartbeat_at)::float8
                    FROM previous AS p) AS previous_age_s",
    )
    .bind::<Text, _>(&shared.config.name)
    .bind::<Array<Text>, _>(&shared.queues)
    .bind::<Jsonb, _>(shared.metrics.running())
    .bind::<Bool, _>(starting)
    .get_result(&mut conn)
    .await?;
    if starting {
        // Rows of runners that died without shutting down (killed, crashed)
        // stay behind; status ignores them once stale. Clear out old ones.
        diesel::sql_query(
            "DELETE FROM pgfifo.runner WHERE heartbeat_at < now() - make_interval(secs => $1)",
        )
        .bind::<Double, _>(STALE_RUNNER_ROW.as_secs_f64())
        .execute(&mut conn)
        .await?;
    }
    if let (true, Some(age)) = (starting, row.previous_age_s) {
        if age < RUNNER_ALIVE.as_secs_f64() {
            tracing::warn!(
                name = %shared.config.name,
                previous_heartbeat_s = age,
                "pgfifo: another live runner has this name (or a process of this name stopped \
                 without shutting down moments ago); runner names must be unique, or status \
                 reports them as one"
            );
        }
    }
    Ok(())
}

/// Samples the queues' gauges every `interval` until the runner stops.
pub(super) async fn sample_gauges(
    shared: Arc<Shared>,
    service: CancellationToken,
    interval: Duration,
) {
    let mut complaints = Complaints::new("metrics");
    loop {
        let sampled = async {
            let mut conn = pooled(&shared, interval).await?;
            admin::gauges(&mut conn, &shared.queues).await
        };
        if let Some(gauges) = complaints.report(sampled.await) {
            shared.metrics.set_gauges(&gauges);
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = service.cancelled() => return,
        }
    }
}

/// Runs retention passes until the runner starts shutting down.
pub(super) async fn retention(shared: Arc<Shared>, retention: Retention) {
    let mut complaints = Complaints::new("retention");
    let mut resume = Resume::default();
    let mut wait = retention
        .interval
        .min(FIRST_PASS_WITHIN)
        .mul_f64(random_fraction());
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.stop.cancelled() => return,
        }
        let started = Instant::now();
        let mut deleted = Deleted::default();
        let pass = retention_pass(&shared, &retention, &mut resume, &mut deleted).await;
        let completed = complaints.report(pass);
        if deleted.jobs > 0 || deleted.groups > 0 {
            tracing::info!(
                jobs_purged = deleted.jobs,
                groups_cleaned = deleted.groups,
                elapsed_ms = started.elapsed().as_millis() as u64,
                complete = completed == Some(true),
                "pgfifo retention pass"
            );
        }
        wait = jittered(retention.interval);
    }
}

/// Where each purge walk of the next pass starts. A walk looks again only at
/// jobs from the first one it had to leave that a later walk may delete
/// (unfinished, finished too recently, a held head): rows kept for good by
/// that walk (failed jobs when failed ones are kept) are not read again and
/// again. Every [`FULL_WALK_EVERY`] a walk starts from the beginning, for
/// jobs that changed state behind the mark (a failed job retried since).
#[derive(Debug, Default)]
struct Resume {
    after: Vec<i64>,
    last_full: Option<Instant>,
}

impl Resume {
    /// Starts a pass: forgets the marks when a full walk is due.
    fn begin(&mut self, walks: usize) {
        let full_due = self
            .last_full
            .is_none_or(|at| at.elapsed() >= FULL_WALK_EVERY);
        if full_due || self.after.len() != walks {
            self.after = vec![0; walks];
            self.last_full = Some(Instant::now());
        }
    }
}

/// What a retention pass deleted so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Deleted {
    jobs: u64,
    groups: u64,
}

/// A pooled connection holding retention's session lock. Dropped without
/// [`release`](Self::release) (an error, a cancelled task), the connection is
/// marked broken, so the pool closes it and the server releases the lock,
/// instead of handing a locked session to someone else.
struct RetentionLock {
    conn: Option<PooledConnection>,
}

#[derive(QueryableByName)]
struct LockRow {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

impl RetentionLock {
    /// Takes the lock without waiting; `None` when another session has it.
    async fn try_take(mut conn: PooledConnection) -> Result<Option<Self>> {
        let row: LockRow = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(RETENTION_LOCK)
            .get_result(&mut conn)
            .await?;
        Ok(row.locked.then_some(Self { conn: Some(conn) }))
    }

    fn conn(&mut self) -> &mut AsyncPgConnection {
        self.conn.as_mut().expect("held until released")
    }

    async fn release(mut self) -> Result<()> {
        let row: LockRow = diesel::sql_query("SELECT pg_advisory_unlock($1) AS locked")
            .bind::<BigInt, _>(RETENTION_LOCK)
            .get_result(self.conn())
            .await?;
        if row.locked {
            self.conn = None;
        }
        Ok(())
    }
}

impl Drop for RetentionLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            Tm::transaction_manager_status_mut(&mut **conn).set_in_error();
        }
    }
}

/// One pass, unless another runner is making one. `Ok(true)`: it ran to the
/// end; `Ok(false)`: skipped or cut short by shutdown. `deleted` counts as it
/// goes, so a failing pass still reports what it did.
async fn retention_pass(
    shared: &Shared,
    retention: &Retention,
    resume: &mut Resume,
    deleted: &mut Deleted,
) -> Result<bool> {
    let conn = shared.pool.get_owned().await?;
    let Some(mut lock) = RetentionLock::try_take(conn).await? else {
        tracing::debug!("pgfifo retention: another runner is making a pass");
        return Ok(false);
    };
    let mut complete = true;
    let walks = retention.walks();
    resume.begin(walks.len());
    for (i, (age, states)) in walks.into_iter().enumerate() {
        let walk = Walk {
            age,
            states: &states,
            after: resume.after[i],
        };
        match purge_walk(shared, lock.conn(), retention, walk, deleted).await? {
            Some(next) => resume.after[i] = next,
            None => complete = false,
        }
    }
    if let Some(idle) = retention.idle_groups_after.filter(|_| complete) {
        complete &= clean_groups(shared, lock.conn(), retention, idle, deleted).await?;
    }
    lock.release().await?;
    Ok(complete)
}

/// One purge walk: jobs in `states` older than `age`, from after `after`.
struct Walk<'a> {
    age: Duration,
    states: &'a [FinishedState],
    after: i64,
}

/// Deletes the jobs of `walk`, batch by batch in id order. Returns where
/// the next walk may start, or `None` when cut short by shutdown.
async fn purge_walk(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    retention: &Retention,
    walk: Walk<'_>,
    deleted: &mut Deleted,
) -> Result<Option<i64>> {
    let mut after = walk.after;
    let mut first_pending: Option<i64> = None;
    loop {
        let batch =
            admin::purge_batch(conn, walk.age, walk.states, after, retention.batch_size).await?;
        deleted.jobs += batch.deleted;
        shared.metrics.retained(batch.deleted, 0);
        after = batch.last_id;
        first_pending = first_pending.or(batch.first_pending);
        if batch.done {
            // Everything before the first pending job is deleted or kept for
            // good by this walk; with nothing pending, everything looked at.
            return Ok(Some(first_pending.map_or(after, |id| id - 1)));
        }
        if !pause(shared).await {
            return Ok(None);
        }
    }
}

/// Deletes groups idle longer than `idle`, batch by batch.
/// `Ok(false)`: cut short by shutdown.
async fn clean_groups(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    retention: &Retention,
    idle: Duration,
    deleted: &mut Deleted,
) -> Result<bool> {
    loop {
        let n = admin::clean_groups(conn, idle, retention.batch_size).await?;
        deleted.groups += n;
        shared.metrics.retained(0, n);
        if n < retention.batch_size as u64 {
            return Ok(true);
        }
        if !pause(shared).await {
            return Ok(false);
        }
    }
}

/// The pause between batches; `false` when the runner is stopping.
async fn pause(shared: &Shared) -> bool {
    tokio::select! {
        () = tokio::time::sleep(BATCH_PAUSE) => true,
        () = shared.stop.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn retention_defaults_keep_failed_jobs() {
        let r = Retention::default();
        assert_eq!(r.finished_after, DAY);
        assert_eq!(r.failed_after, None);
        assert_eq!(r.idle_groups_after, Some(DAY));
        assert_eq!(r.interval, Duration::from_secs(60));
        assert_eq!(r.batch_size, 1000);
        assert!(r.validate().is_ok());
    }

    #[test]
    fn retention_builders_set_each_field() {
        let r = Retention::default()
            .finished_after(DAY * 2)
            .failed_after(DAY * 30)
            .idle_groups_after(None)
            .interval(Duration::from_secs(5))
            .batch_size(10);
        assert_eq!(r.finished_after, DAY * 2);
        assert_eq!(r.failed_after, Some(DAY * 30));
        assert_eq!(r.idle_groups_after, None);
        assert_eq!(r.interval, Duration::from_secs(5));
        assert_eq!(r.batch_size, 10);
    }

    #[test]
    fn retention_rejects_unworkable_settings() {
        assert!(Retention::default().batch_size(0).validate().is_err());
        assert!(Retention::default()
            .interval(Duration::ZERO)
            .validate()
            .is_err());
    }

    #[test]
    fn failed_jobs_are_walked_only_when_asked() {
        use FinishedState::*;
        let keep = Retention::default();
        assert_eq!(keep.walks(), vec![(DAY, vec![Succeeded, Cancelled])]);

        let same = Retention::default().failed_after(DAY);
        assert_eq!(
            same.walks(),
            vec![(DAY, vec![Succeeded, Failed, Cancelled])]
        );

        let longer = Retention::default().failed_after(DAY * 7);
        assert_eq!(
            longer.walks(),
            vec![(DAY, vec![Succeeded, Cancelled]), (DAY * 7, vec![Failed])]
        );
    }
}

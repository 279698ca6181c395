//! Deleting history ([`Retention`]): finished jobs past an age and groups
//! idle for long, in short batches, by one runner at a time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::AsyncPgConnection;
use tokio_util::sync::CancellationToken;

use super::{pooled, Complaints};
use crate::admin::{self, FinishedState};
use crate::db;
use crate::db::Pool;
use crate::runner::jitter::{jittered, random_fraction};
use crate::runner::metrics::Metrics;
use crate::runner::sessions::Sessions;
use crate::{Error, Result};

/// How long a pass without the session lock waits for a pooled connection.
const LOCKLESS_POOL_PATIENCE: Duration = Duration::from_secs(5);

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

    pub(crate) fn validate(&self) -> Result<()> {
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

/// What retention works with.
pub(crate) struct RetentionTask {
    pub pool: Pool,
    /// Where the pass's locked connection comes from.
    pub sessions: Sessions,
    pub retention: Retention,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the runner stops picking: a pass stops early.
    pub stop: CancellationToken,
    /// How long the server gets to answer each batch (the runner's
    /// round-trip deadline): a pass on a hung server fails, and the next
    /// one takes a new connection.
    pub round_trip: Duration,
}

/// Runs retention passes until the runner starts shutting down.
pub(crate) async fn run(task: RetentionTask) {
    let RetentionTask {
        pool,
        sessions,
        retention,
        metrics,
        stop,
        round_trip,
    } = task;
    let task = Pass {
        pool: &pool,
        sessions: &sessions,
        retention: &retention,
        metrics: &metrics,
        stop: &stop,
        round_trip,
    };
    let mut complaints = Complaints::new("retention");
    let mut resume = Resume::default();
    let mut wait = retention
        .interval
        .min(FIRST_PASS_WITHIN)
        .mul_f64(random_fraction());
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
        let started = Instant::now();
        let mut deleted = Deleted::default();
        let pass = task.run(&mut resume, &mut deleted).await;
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

/// What one retention pass works with.
struct Pass<'a> {
    pool: &'a Pool,
    sessions: &'a Sessions,
    retention: &'a Retention,
    metrics: &'a Metrics,
    stop: &'a CancellationToken,
    round_trip: Duration,
}

impl Pass<'_> {
    /// `work` within the round-trip deadline.
    async fn bounded<T, E: Into<crate::Error>>(
        &self,
        work: impl std::future::Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.round_trip, work).await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => Err(crate::Error::Database(db::error::timed_out(
                self.round_trip,
            ))),
        }
    }

    /// One pass, unless another runner is making one. `Ok(true)`: it ran to
    /// the end; `Ok(false)`: skipped or cut short by shutdown. `deleted`
    /// counts as it goes, so a failing pass still reports what it did.
    ///
    /// The pass holds retention's session lock on a connection of its own,
    /// not a pooled one: the lock ends when the connection closes, at the
    /// end of the pass or if the task is cancelled, and a locked session is
    /// never handed to anyone else. Where no such connection can be had (a
    /// transaction-mode pooler and no direct URL), the pass runs on a pooled
    /// connection without the lock: runners may then make passes at the
    /// same time, each batch in a transaction of its own, which costs work
    /// but deletes nothing that one pass alone would keep.
    async fn run(&self, resume: &mut Resume, deleted: &mut Deleted) -> Result<bool> {
        match self.sessions.open().await? {
            Some(mut conn) => {
                let locked = db::maintenance::try_session_lock(&mut conn, RETENTION_LOCK);
                if !self.bounded(locked).await? {
                    tracing::debug!("pgfifo retention: another runner is making a pass");
                    return Ok(false);
                }
                self.walk(&mut conn, resume, deleted).await
            }
            None => {
                let mut conn = pooled(self.pool, LOCKLESS_POOL_PATIENCE).await?;
                self.walk(&mut conn, resume, deleted).await
            }
        }
    }

    /// The pass's walks and group cleaning, on `conn`.
    async fn walk(
        &self,
        conn: &mut AsyncPgConnection,
        resume: &mut Resume,
        deleted: &mut Deleted,
    ) -> Result<bool> {
        let mut complete = true;
        let walks = self.retention.walks();
        resume.begin(walks.len());
        for (i, (age, states)) in walks.into_iter().enumerate() {
            let walk = Walk {
                age,
                states: &states,
                after: resume.after[i],
            };
            match self.purge_walk(conn, walk, deleted).await? {
                Some(next) => resume.after[i] = next,
                None => complete = false,
            }
        }
        if let Some(idle) = self.retention.idle_groups_after.filter(|_| complete) {
            complete &= self.clean_groups(conn, idle, deleted).await?;
        }
        if complete {
            complete &= self.clean_windows(conn).await?;
        }
        if complete {
            complete &= self.clean_batches(conn).await?;
        }
        Ok(complete)
    }

    /// Deletes the jobs of `walk`, batch by batch in id order. Returns where
    /// the next walk may start, or `None` when cut short by shutdown.
    async fn purge_walk(
        &self,
        conn: &mut AsyncPgConnection,
        walk: Walk<'_>,
        deleted: &mut Deleted,
    ) -> Result<Option<i64>> {
        let mut after = walk.after;
        let mut first_pending: Option<i64> = None;
        loop {
            let batch = self
                .bounded(admin::purge_batch(
                    conn,
                    walk.age,
                    walk.states,
                    after,
                    self.retention.batch_size,
                ))
                .await?;
            deleted.jobs += batch.deleted;
            self.metrics.retained(batch.deleted, 0);
            after = batch.last_id;
            first_pending = first_pending.or(batch.first_pending);
            if batch.done {
                // Everything before the first pending job is deleted or kept
                // for good by this walk; with nothing pending, everything
                // looked at.
                return Ok(Some(first_pending.map_or(after, |id| id - 1)));
            }
            if !self.pause().await {
                return Ok(None);
            }
        }
    }

    /// Deletes groups idle longer than `idle`, batch by batch.
    /// `Ok(false)`: cut short by shutdown.
    async fn clean_groups(
        &self,
        conn: &mut AsyncPgConnection,
        idle: Duration,
        deleted: &mut Deleted,
    ) -> Result<bool> {
        loop {
            let n = self
                .bounded(admin::clean_groups(conn, idle, self.retention.batch_size))
                .await?;
            deleted.groups += n;
            self.metrics.retained(0, n);
            if n < self.retention.batch_size as u64 {
                return Ok(true);
            }
            if !self.pause().await {
                return Ok(false);
            }
        }
    }

    /// Deletes window rows that hold nothing, batch by batch.
    /// `Ok(false)`: cut short by shutdown.
    async fn clean_windows(&self, conn: &mut AsyncPgConnection) -> Result<bool> {
        let limit = self.retention.batch_size;
        while self.bounded(admin::clean_windows(conn, limit)).await? >= limit as u64 {
            if !self.pause().await {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Deletes batches whose jobs were all purged, batch by batch.
    /// `Ok(false)`: cut short by shutdown.
    async fn clean_batches(&self, conn: &mut AsyncPgConnection) -> Result<bool> {
        let limit = self.retention.batch_size;
        while self.bounded(admin::clean_batches(conn, limit)).await? >= limit as u64 {
            if !self.pause().await {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The pause between batches; `false` when the runner is stopping.
    async fn pause(&self) -> bool {
        tokio::select! {
            () = tokio::time::sleep(BATCH_PAUSE) => true,
            () = self.stop.cancelled() => false,
        }
    }
}

/// One purge walk: jobs in `states` older than `age`, from after `after`.
struct Walk<'a> {
    age: Duration,
    states: &'a [FinishedState],
    after: i64,
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

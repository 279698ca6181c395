//! Draining a queue in the test's own task, with the runner's own
//! statements: promote, `pgfifo.pick`, `pgfifo.start_attempts`, the
//! handler in the handlers' savepoint, `pgfifo.complete`, commit. One job
//! at a time, so the order it runs them in is pgfifo's order.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

use super::attempt::{self, Limits};
use super::summary::DrainSummary;
use crate::db::runner::{self as sql, IdleBounds, PickRequest, Picked, PickedJob};
use crate::db::testing as tsql;
use crate::names::{validate_group, validate_queue};
use crate::registry::Registry;
use crate::runner::outcome::Done;
use crate::{Error, Pool, Result, RunnerConfig};

/// The runner name a drain records its attempts under
/// (`pgfifo.job_attempt.runner`).
pub const DRAIN_RUNNER: &str = "pgfifo-testing-drain";

/// How many attempts a drain runs at most unless told otherwise
/// ([`Drain::max_attempts`]).
pub const DEFAULT_MAX_ATTEMPTS: usize = 1000;

/// Runs the jobs of one queue (or one group of it) in the calling task,
/// without a background runner, by pgfifo's own rules, and returns what
/// ran ([`DrainSummary`]).
///
/// Each step is what a runner's lane does with one job: make woken groups
/// active (`pgfifo.promote`), open a job transaction and `pgfifo.pick` one
/// job, record its attempt (`pgfifo.start_attempts`, autocommit), run the
/// registered handler in a savepoint with its timeout (panics caught, a
/// failed handler's writes rolled back), decide the outcome as the runner
/// does (retry with backoff while attempts are left, fail, cancel, snooze;
/// the queue's failure policy applies), write it with `pgfifo.complete`,
/// and commit. So a group's jobs run in enqueue order, one at a time; a
/// retry counts its attempt; a snooze does not.
///
/// It stops when no job is ready. By default, jobs that wait for a later
/// time (delayed, retrying, snoozed) are left waiting and counted in
/// [`DrainSummary::left_scheduled`]; [`with_scheduled`](Self::with_scheduled)
/// makes them due at once instead. Jobs enqueued by the drained handlers are
/// left queued unless [`with_recursion`](Self::with_recursion) is set.
///
/// The drain needs committed jobs (it works on its own connections, as a
/// runner does): enqueue on a connection that commits, not inside a test
/// transaction that the drain cannot see. Do not run a runner on the same
/// queue meanwhile.
///
/// ```no_run
/// # async fn demo(pool: pgfifo::Pool) -> pgfifo::Result<()> {
/// use pgfifo::testing::Drain;
///
/// let summary = Drain::queue("billing")
///     .with_scheduled(true)
///     .with_recursion(true)
///     .run(&pool)
///     .await?;
/// assert_eq!(summary.succeeded, 3);
/// summary.assert_fifo();
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Drain {
    queue: String,
    group: Option<String>,
    with_scheduled: bool,
    with_recursion: bool,
    max_attempts: usize,
    limits: Limits,
}

impl Drain {
    /// A drain of queue `queue`.
    pub fn queue(queue: impl Into<String>) -> Drain {
        let defaults = RunnerConfig::default();
        Drain {
            queue: queue.into(),
            group: None,
            with_scheduled: false,
            with_recursion: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            limits: Limits {
                default_timeout: defaults.default_timeout,
                max_backoff: defaults.max_backoff,
                long_lease: defaults.long_lease,
            },
        }
    }

    /// Drains only group `group` of the queue. The queue's other groups and
    /// its ungrouped jobs are held back while each job is picked, as if
    /// another runner were running them.
    pub fn group(mut self, group: impl Into<String>) -> Drain {
        self.group = Some(group.into());
        self
    }

    /// Whether jobs that wait for a later time (delayed with `run_at` or
    /// `delay`, retrying after a backoff, snoozed groups) run at once
    /// instead of being left waiting (default: `false`). Their wait is cut
    /// short in the database (`run_after`, the group's `ready_at`, the
    /// snooze's end set to now), and their attempts count as usual. Rate
    /// limits still hold: no token is minted, so a group waiting for its
    /// next token is left waiting.
    pub fn with_scheduled(mut self, yes: bool) -> Drain {
        self.with_scheduled = yes;
        self
    }

    /// Whether jobs enqueued while the drain runs (by its handlers, say)
    /// are drained too (default: `false`: only jobs that existed when the
    /// drain started run; newer ones are left queued, to assert on).
    pub fn with_recursion(mut self, yes: bool) -> Drain {
        self.with_recursion = yes;
        self
    }

    /// The most attempts the drain runs (default
    /// [`DEFAULT_MAX_ATTEMPTS`]): a safety cap against handlers that
    /// enqueue forever or retry without end. Reaching it is an error.
    pub fn max_attempts(mut self, n: usize) -> Drain {
        self.max_attempts = n;
        self
    }

    /// The timeout of job types that set none (default: the runner's, 300 s).
    pub fn default_timeout(mut self, timeout: Duration) -> Drain {
        self.limits.default_timeout = timeout;
        self
    }

    /// Runs the drain on `pool` (it uses two of its connections, three
    /// with [`group`](Self::group) or without recursion).
    ///
    /// Errors: an invalid queue or group name, a cap of 0 or a zero
    /// timeout ([`Error::InvalidArgument`]); the cap reached
    /// ([`Error::InvalidArgument`], saying what ran); invalid registrations;
    /// database errors.
    pub async fn run(&self, pool: &Pool) -> Result<DrainSummary> {
        validate_queue(&self.queue)?;
        if let Some(group) = &self.group {
            validate_group(group)?;
        }
        if self.max_attempts == 0 {
            return Err(Error::InvalidArgument(
                "a drain's max_attempts must be at least 1".into(),
            ));
        }
        if self.limits.default_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "a drain's default_timeout must be longer than zero".into(),
            ));
        }
        let registry = Registry::global()?;
        let mut job_conn = pool.get_owned().await?;
        let mut book = pool.get_owned().await?;
        let newer_than = if self.with_recursion {
            i64::MAX
        } else {
            tsql::newest_job(&mut book).await?
        };
        let mut hold = if self.group.is_some() || !self.with_recursion {
            Some(pool.get_owned().await?)
        } else {
            None
        };
        let mut state = Draining {
            drain: self,
            registry,
            idle: self.idle_bounds(registry),
            queues: vec![self.queue.clone()],
            newer_than,
            summary: DrainSummary::default(),
            limits: self.limits,
        };
        let ran = state
            .run(&mut job_conn, &mut book, hold.as_deref_mut())
            .await;
        if ran.is_err() {
            // Leave nothing open on connections going back to the pool: no
            // transaction, and no long run's session lock.
            tsql::reset_session(&mut job_conn).await;
            if let Some(hold) = hold.as_deref_mut() {
                let _ = hold.batch_execute(sql::ROLLBACK).await;
            }
        }
        ran?;
        let (queued, later) = tsql::left(&mut book, &self.queue, self.group.as_deref()).await?;
        let mut summary = state.summary;
        summary.left_queued = queued as usize;
        summary.left_scheduled = later as usize;
        Ok(summary)
    }

    /// As a runner computes them (`runner::idle_bounds`): each type's
    /// timeout plus a grace before the server ends an idle job transaction.
    fn idle_bounds(&self, registry: &Registry) -> IdleBounds {
        let grace = RunnerConfig::default().idle_grace;
        let ms = |t: Duration| i32::try_from((t + grace).as_millis()).unwrap_or(i32::MAX);
        let (kinds, idle_ms) = registry
            .iter()
            .map(|r| {
                (
                    r.kind.to_owned(),
                    ms(r.timeout.unwrap_or(self.limits.default_timeout)),
                )
            })
            .unzip();
        IdleBounds {
            kinds,
            idle_ms,
            default_idle_ms: ms(self.limits.default_timeout),
        }
    }
}

/// A drain under way.
struct Draining<'d> {
    drain: &'d Drain,
    registry: &'static Registry,
    idle: IdleBounds,
    queues: Vec<String>,
    newer_than: i64,
    summary: DrainSummary,
    limits: Limits,
}

/// What one pick came to.
enum Step {
    Ran,
    /// Nothing could start: the drain is done.
    Done,
    /// Pick again.
    Again,
}

impl Draining<'_> {
    async fn run(
        &mut self,
        conn: &mut AsyncPgConnection,
        book: &mut AsyncPgConnection,
        mut hold: Option<&mut AsyncPgConnection>,
    ) -> Result<()> {
        let mut sweep_from = 0;
        let mut turn = 0;
        let mut empty_picks = 0;
        loop {
            promote(book, &self.queues).await?;
            if let Some(hold) = hold.as_deref_mut() {
                tsql::hold_back(
                    hold,
                    &self.drain.queue,
                    self.drain.group.as_deref(),
                    self.newer_than,
                )
                .await?;
            }
            conn.batch_execute(sql::BEGIN_JOB).await?;
            let request = PickRequest {
                queues: &self.queues,
                turn,
                sweep_from,
                idle: &self.idle,
                limit: 1,
                batch: 1,
                slot_batch: 1,
                held_elsewhere: &[],
                finishing_elsewhere: &[],
                start_at_once: true,
            };
            let picked = sql::pick(conn, &request).await;
            if let Some(hold) = hold.as_deref_mut() {
                hold.batch_execute(sql::COMMIT).await?;
            }
            turn = turn.wrapping_add(1);
            let step = match picked? {
                Picked::Nothing => {
                    conn.batch_execute(sql::COMMIT).await?;
                    let due = self.drain.with_scheduled
                        && tsql::make_due(book, &self.drain.queue, self.drain.group.as_deref())
                            .await?
                            > 0;
                    if due {
                        Step::Again
                    } else {
                        Step::Done
                    }
                }
                Picked::ReleaseAndPickAgain(slot) => {
                    conn.batch_execute(sql::COMMIT).await?;
                    sweep_from = slot.map_or(sweep_from, |s| s.wrapping_add(1));
                    Step::Again
                }
                Picked::Jobs { mut jobs, .. } => {
                    let job = jobs.swap_remove(0);
                    sweep_from = job.sweep_slot.map_or(sweep_from, |s| s.wrapping_add(1));
                    self.run_one(conn, book, job).await?
                }
            };
            match step {
                Step::Ran => empty_picks = 0,
                Step::Done => return Ok(()),
                Step::Again => {
                    empty_picks += 1;
                    if empty_picks > self.drain.max_attempts {
                        return Err(self.capped("picks that ran nothing"));
                    }
                }
            }
        }
    }

    fn capped(&self, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "the drain of queue {:?} reached its cap of {} {what} (see Drain::max_attempts); \
             it ran: {}",
            self.drain.queue,
            self.drain.max_attempts,
            self.summary.describe()
        ))
    }

    /// Runs one picked job in the open job transaction, writes its outcome
    /// and commits.
    async fn run_one(
        &mut self,
        conn: &mut AsyncPgConnection,
        book: &mut AsyncPgConnection,
        job: PickedJob,
    ) -> Result<Step> {
        if self.summary.runs.len() >= self.drain.max_attempts {
            conn.batch_execute(sql::ROLLBACK).await?;
            return Err(self.capped("attempts"));
        }
        let recorded =
            sql::start_attempts(book, None, &[job.id], &[job.max_attempts], DRAIN_RUNNER).await?;
        let attempt = recorded.iter().find(|(id, _)| *id == job.id).map(|r| r.1);
        if attempt == Some(0) {
            // Its group's rate limit has no token left: nothing recorded,
            // the job stays where it is. The drain stops here.
            conn.batch_execute(sql::ROLLBACK).await?;
            self.summary.throttled = true;
            return Ok(Step::Done);
        }
        let registration = self.registry.get(&job.kind);
        let done = match (attempt, registration) {
            (None, _) => {
                let error = format!(
                    "attempt {0} of {0} never finished (its runner crashed, was killed or \
                     lost its connection); no attempts left",
                    job.max_attempts
                );
                let attempt = job.max_attempts;
                Done::failed(job, attempt, error)
            }
            (Some(attempt), None) => {
                let error = format!(
                    "unknown job type {:?}: no handler is registered for it in this runner",
                    job.kind
                );
                Done::failed(job, attempt, error)
            }
            (Some(attempt), Some(registration)) if registration.long => {
                let ran =
                    attempt::run_long(conn, book, job, attempt, registration, &self.limits).await?;
                return Ok(match ran {
                    Some(done) => {
                        self.summary.record(done.event());
                        Step::Ran
                    }
                    None => Step::Again,
                });
            }
            (Some(attempt), Some(registration)) => {
                attempt::run_in_transaction(conn, job, attempt, registration, &self.limits).await?
            }
        };
        let outcome = sql::complete(conn, &[done.completion()]).await;
        if let Err(err) = outcome {
            conn.batch_execute(sql::ROLLBACK).await?;
            return Err(err.into());
        }
        conn.batch_execute(sql::COMMIT).await?;
        self.summary.record(done.event());
        Ok(Step::Ran)
    }
}

/// Makes every woken group of `queues` active, as a runner's listener does.
async fn promote(conn: &mut AsyncPgConnection, queues: &[String]) -> Result<()> {
    const BATCH: i32 = 1000;
    while sql::promote(conn, queues, BATCH).await?.groups >= BATCH {}
    Ok(())
}

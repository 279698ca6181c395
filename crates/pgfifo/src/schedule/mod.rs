//! Recurring jobs: a [`Schedule`] enqueues a job on every tick of a cron
//! expression, once per tick however many runners declare it.
//!
//! ```
//! use pgfifo::schedule::{Missed, Schedule};
//! use pgfifo::{async_trait, Handler, Job, JobContext, JobError, RunnerConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Job, Serialize, Deserialize)]
//! #[job(queue = "reports")]
//! struct NightlyReport {
//!     tenant: String,
//! }
//!
//! #[async_trait]
//! impl Handler for NightlyReport {
//!     async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
//!         Ok(())
//!     }
//! }
//!
//! let config = RunnerConfig::default().schedule(
//!     Schedule::new("nightly-report", "0 3 * * *", || NightlyReport { tenant: "tenant-7".into() })
//!         .time_zone("Europe/Berlin")
//!         .group("tenant-7")
//!         .on_missed(Missed::RunOnce),
//! );
//! # let _ = config;
//! ```
//!
//! Each runner that declares a schedule stores it in `pgfifo.schedule` at
//! [`runner::start`](crate::runner::start) and fires its ticks: a tick's
//! job is enqueued, and the schedule moves past the tick, in one
//! transaction that holds the schedule's row lock. See
//! `docs/recurring-jobs.md` for the rules (missed ticks, daylight saving
//! time, stale schedules).

mod plan;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub(crate) use plan::{compile, next_tick, parse, Compiled};

use crate::{EnqueueOptions, Error, Job, NewJob, Result, ScheduleProblem};

/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 200;

/// How late a tick may fire and still count as on time, unless set with
/// [`Schedule::grace`].
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// The most ticks [`Missed::RunEach`] may catch up at once.
pub const MAX_CATCH_UP: u32 = 10_000;

/// What a schedule does with ticks that passed while no runner fired them
/// (every runner was down or the schedule's declaring runners were gone).
///
/// A tick is *missed* when it comes due and is not fired within the
/// schedule's [grace](Schedule::grace) (default 1 minute): every due tick
/// but the latest is missed, and the latest too once it is late by more
/// than the grace. Ticks that pass while the schedule is paused are skipped
/// whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// Missed ticks enqueue nothing; the schedule goes on with its next
    /// tick on time.
    Skip,
    /// One job stands for all the missed ticks (the default): it gets the
    /// latest missed tick, with [`Tick::missed`] counting the others. A
    /// restart never floods the queue, and a deploy over 03:00 does not
    /// lose the nightly run.
    #[default]
    RunOnce,
    /// Every missed tick enqueues its own job, in tick order, up to `max`
    /// of them (the most recent; at most [`MAX_CATCH_UP`]).
    RunEach {
        /// The most ticks caught up at once.
        max: u32,
    },
}

impl Missed {
    /// The name stored in `pgfifo.schedule.missed`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::RunOnce => "once",
            Missed::RunEach { .. } => "each",
        }
    }

    /// How many ticks one firing may catch up.
    pub(crate) fn max_catch_up(self) -> u32 {
        match self {
            Missed::Skip | Missed::RunOnce => 1,
            Missed::RunEach { max } => max,
        }
    }
}

/// The tick a schedule's job is made for, given to the closure of
/// [`Schedule::for_tick`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tick {
    /// The schedule's name.
    pub schedule: String,
    /// When the tick was due (the cron expression's time, in its zone).
    pub at: SystemTime,
    /// How many due ticks right before this one got no job of their own:
    /// those this job stands for under [`Missed::RunOnce`], those dropped
    /// under [`Missed::Skip`] or beyond [`Missed::RunEach`]'s bound. (After
    /// a backlog of more than 100,000 ticks, only the last 100,000 or so
    /// are counted here; `pgfifo schedules` shows the total.)
    pub missed: u64,
}

/// Builds a tick's job: serializes it with the schedule's options.
type MakeJob = dyn Fn(&Tick, EnqueueOptions) -> Result<NewJob> + Send + Sync;

/// A recurring job: a name, a cron expression read in a time zone, and the
/// job to enqueue on each tick. Add it to a runner with
/// [`RunnerConfig::schedule`](crate::RunnerConfig::schedule).
///
/// The expression has five fields (minute, hour, day of month, month, day
/// of week), or six with seconds first, or seven with a year last; `L`,
/// `W`, `#` and the aliases `@hourly`, `@daily`, `@weekly`, `@monthly`,
/// `@yearly` work as in croner. Nothing is checked until
/// [`runner::start`](crate::runner::start), which refuses every problem of
/// every schedule at once, naming each schedule, and starts nothing.
///
/// By default the jobs go into a group named after the schedule, so one
/// schedule's runs never overlap and start in tick order; set another group
/// (a tenant's, to keep FIFO with its other jobs) with
/// [`group`](Self::group), or none with [`ungrouped`](Self::ungrouped).
#[derive(Clone)]
pub struct Schedule {
    pub(crate) name: String,
    pub(crate) expression: String,
    pub(crate) time_zone: String,
    pub(crate) options: EnqueueOptions,
    pub(crate) missed: Missed,
    pub(crate) grace: Duration,
    pub(crate) kind: &'static str,
    pub(crate) queue: &'static str,
    /// Checks that the job type is registered in this binary.
    pub(crate) registered: fn() -> Result<()>,
    /// Checks the options as enqueueing a job of this type would.
    pub(crate) check_options: fn(&EnqueueOptions) -> Result<()>,
    pub(crate) make: Arc<MakeJob>,
}

impl Schedule {
    /// A schedule named `name` that enqueues `job()` on every tick of the
    /// cron `expression` (in UTC unless [`time_zone`](Self::time_zone) says
    /// otherwise).
    pub fn new<J, F>(name: impl Into<String>, expression: impl Into<String>, job: F) -> Self
    where
        J: Job,
        F: Fn() -> J + Send + Sync + 'static,
    {
        Self::for_tick(name, expression, move |_: &Tick| job())
    }

    /// Like [`new`](Self::new), with the job made from the [`Tick`] it is
    /// for (to carry the tick's time, say, as the report's period).
    pub fn for_tick<J, F>(name: impl Into<String>, expression: impl Into<String>, job: F) -> Self
    where
        J: Job,
        F: Fn(&Tick) -> J + Send + Sync + 'static,
    {
        let name = name.into();
        let options = EnqueueOptions::group(name.clone());
        Self {
            name,
            expression: expression.into(),
            time_zone: "UTC".to_owned(),
            options,
            missed: Missed::default(),
            grace: DEFAULT_GRACE,
            kind: J::KIND,
            queue: J::QUEUE,
            registered: crate::job::check_registered::<J>,
            check_options: crate::job::check_options::<J>,
            make: Arc::new(move |tick: &Tick, options: EnqueueOptions| {
                NewJob::new(&job(tick), options)
            }),
        }
    }

    /// Reads the expression in this IANA time zone (`"Europe/Berlin"`,
    /// `"America/New_York"`; default `"UTC"`). Ticks follow the zone's
    /// daylight saving time as `docs/recurring-jobs.md` describes.
    pub fn time_zone(mut self, zone: impl Into<String>) -> Self {
        self.time_zone = zone.into();
        self
    }

    /// Enqueues the jobs into `group` (default: a group named after the
    /// schedule).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.options = self.options.with_group(Some(group.into()));
        self
    }

    /// Enqueues the jobs without a group: ticks may then run side by side.
    pub fn ungrouped(mut self) -> Self {
        self.options = self.options.with_group(None);
        self
    }

    /// Enqueues the jobs with these options (queue, priority, attempts,
    /// group…). Their group replaces the schedule's, so
    /// `EnqueueOptions::ungrouped()` makes the jobs ungrouped.
    pub fn options(mut self, options: EnqueueOptions) -> Self {
        self.options = options;
        self
    }

    /// What to do with ticks that passed while no runner fired them
    /// (default [`Missed::RunOnce`]).
    pub fn on_missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// How late a tick may fire and still count as on time (default
    /// [`DEFAULT_GRACE`], 1 minute). A later tick is missed and follows
    /// [`on_missed`](Self::on_missed).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron expression.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

/// Checks every schedule of a runner: all problems of all of them at once.
/// A name declared twice with the same definition counts once.
pub(crate) fn compile_all(schedules: &[Schedule]) -> Result<Vec<Arc<Compiled>>> {
    let mut problems = Vec::new();
    let mut compiled: Vec<Arc<Compiled>> = Vec::new();
    for schedule in schedules {
        match compile(schedule) {
            Ok(c) => match compiled.iter().find(|other| other.name == c.name) {
                Some(other) if other.definition != c.definition => problems.push(ScheduleProblem {
                    schedule: c.name.clone(),
                    problem: format!(
                        "declared twice with different definitions: {} and {}",
                        other.definition, c.definition
                    ),
                }),
                Some(_) => {}
                None => compiled.push(Arc::new(c)),
            },
            Err(found) => problems.extend(found.into_iter().map(|problem| ScheduleProblem {
                schedule: schedule.name.clone(),
                problem,
            })),
        }
    }
    if problems.is_empty() {
        Ok(compiled)
    } else {
        Err(Error::InvalidSchedules(problems))
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("expression", &self.expression)
            .field("time_zone", &self.time_zone)
            .field("kind", &self.kind)
            .field("options", &self.options)
            .field("missed", &self.missed)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

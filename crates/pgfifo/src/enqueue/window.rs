//! De-duplication windows per key (docs/dedup-windows.md): the options that
//! set them, and [`enqueue_batch_outcomes`], which says what each enqueue
//! did.

use std::time::Duration;

use diesel_async::AsyncPgConnection;

use super::{EnqueueOptions, NewJob};
use crate::db;
use crate::db::enqueue::EnqueueArrays;
use crate::db::enqueue_window::WindowArrays;
use crate::names::MAX_GROUP_LEN;
use crate::{Error, JobId, Result};

/// How a window treats enqueues of its key (see [`EnqueueOptions::unique_for`],
/// [`EnqueueOptions::debounce`], [`EnqueueOptions::throttle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowMode {
    /// No second job for the period after the key's job was enqueued,
    /// whatever that job's state.
    Unique,
    /// While the key's job is queued, an enqueue replaces its payload and
    /// moves its start to now + the quiet period.
    Debounce,
    /// At most one job per key in each period-aligned slot of time.
    Throttle,
}

impl WindowMode {
    /// The mode's name in the database (`unique`, `debounce`, `throttle`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unique => "unique",
            Self::Debounce => "debounce",
            Self::Throttle => "throttle",
        }
    }
}

/// A de-duplication window: a key, its mode and its period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The key (per queue).
    pub key: String,
    /// How enqueues of the key are treated.
    pub mode: WindowMode,
    /// The window's length (debounce: the quiet period).
    pub period: Duration,
}

/// What an enqueue did, from [`enqueue_batch_outcomes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnqueueOutcome {
    /// A new job was written.
    Created,
    /// A unique key or an open unique window returned an existing job.
    Deduplicated,
    /// A queued job of the key got this payload (and a later start).
    Debounced,
    /// The key's throttle slot is taken: nothing was written.
    Throttled,
}

impl EnqueueOutcome {
    fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "created" => Self::Created,
            "deduplicated" => Self::Deduplicated,
            "debounced" => Self::Debounced,
            "throttled" => Self::Throttled,
            other => {
                return Err(Error::InvalidOption(format!(
                    "pgfifo.enqueue_outcomes returned an unknown outcome {other:?}"
                )))
            }
        })
    }
}

/// One row of [`enqueue_batch_outcomes`]: the job's id and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job's id, or the existing one's the enqueue was folded into.
    pub id: JobId,
    /// What the enqueue did.
    pub outcome: EnqueueOutcome,
}

impl EnqueueOptions {
    /// No second job with `key` (in the job's queue) for `period` after
    /// this one is enqueued, whatever its state, finished jobs included:
    /// enqueues inside the window return this job's id
    /// ([`EnqueueOutcome::Deduplicated`]).
    pub fn unique_for(self, key: impl Into<String>, period: Duration) -> Self {
        self.with_window(key.into(), WindowMode::Unique, period)
    }

    /// Debounce by `key`: while the key's job has not started, an enqueue
    /// replaces its payload and moves its start to now + `quiet`, returning
    /// its id ([`EnqueueOutcome::Debounced`]); the job keeps its place in
    /// its group, which waits behind it. Once it has started, a new job is
    /// created. Not together with [`run_at`](Self::run_at) or
    /// [`run_in`](Self::run_in).
    pub fn debounce(self, key: impl Into<String>, quiet: Duration) -> Self {
        self.with_window(key.into(), WindowMode::Debounce, quiet)
    }

    /// At most one job with `key` per `period`, in slots aligned to the
    /// period (from the Unix epoch): enqueues in a slot that has its job
    /// write nothing and return that job's id ([`EnqueueOutcome::Throttled`]).
    pub fn throttle(self, key: impl Into<String>, period: Duration) -> Self {
        self.with_window(key.into(), WindowMode::Throttle, period)
    }

    fn with_window(mut self, key: String, mode: WindowMode, period: Duration) -> Self {
        self.windows_given = self.windows_given.saturating_add(1);
        self.window = Some(Window { key, mode, period });
        self
    }

    /// The window set here, if any.
    pub fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }
}

/// Checks the window options; returns the window with its period in
/// microseconds. Fails on two windows, a window with a unique key, a
/// debounce with a start time, an empty or too long key, a zero period.
pub(super) fn checked(options: &EnqueueOptions) -> Result<Option<(Window, i64)>> {
    let Some(window) = options.window.clone() else {
        return Ok(None);
    };
    if options.windows_given > 1 {
        return Err(Error::InvalidOption(
            "a job takes one window: unique_for, debounce or throttle, not two".into(),
        ));
    }
    let mode = window.mode.as_str();
    if options.unique_key.is_some() {
        return Err(Error::InvalidOption(format!(
            "a job takes a unique_key or a {mode} window, not both"
        )));
    }
    if window.mode == WindowMode::Debounce && (options.run_at.is_some() || options.delay.is_some())
    {
        return Err(Error::InvalidOption(
            "a debounced job starts at now + its quiet period: run_at and run_in do not apply"
                .into(),
        ));
    }
    if window.key.is_empty() || window.key.len() > MAX_GROUP_LEN || window.key.contains('\0') {
        return Err(Error::InvalidOption(format!(
            "the {mode} window's key must be 1 to {MAX_GROUP_LEN} bytes without NUL"
        )));
    }
    let us = i64::try_from(window.period.as_micros()).unwrap_or(i64::MAX);
    if us <= 0 {
        return Err(Error::InvalidOption(format!(
            "the {mode} window's period must be at least 1 microsecond, got {:?}",
            window.period
        )));
    }
    Ok(Some((window, us)))
}

/// Whether any job of a batch has a window.
pub(super) fn any_window(jobs: &[NewJob]) -> bool {
    jobs.iter().any(|j| j.window.is_some())
}

/// Enqueues many jobs in one round trip, like [`enqueue_batch`](crate::enqueue_batch),
/// and says for each, in input order, what happened: a new job, or an
/// existing one that a unique key or a window folded it into. Rows are
/// handled in order: a batch that holds one key twice gets what two
/// enqueues one after the other would get (the second is deduplicated,
/// debounced or throttled into the first's job).
///
/// Slower than [`enqueue_batch`](crate::enqueue_batch) for large batches
/// (each job is a call of its own on the server); `enqueue_batch` uses it
/// only for batches that hold a window.
pub async fn enqueue_batch_outcomes(
    conn: &mut AsyncPgConnection,
    jobs: impl IntoIterator<Item = NewJob>,
) -> Result<Vec<Enqueued>> {
    let jobs: Vec<NewJob> = jobs.into_iter().collect();
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, outcomes) = run(conn, jobs).await?;
    ids.into_iter()
        .zip(outcomes)
        .map(|(id, outcome)| {
            Ok(Enqueued {
                id,
                outcome: EnqueueOutcome::parse(&outcome)?,
            })
        })
        .collect()
}

/// The jobs through `pgfifo.enqueue_outcomes`.
pub(super) async fn run(
    conn: &mut AsyncPgConnection,
    jobs: Vec<NewJob>,
) -> Result<(Vec<JobId>, Vec<String>)> {
    let mut arrays = EnqueueArrays::default();
    let mut windows = WindowArrays::default();
    for job in jobs {
        match job.push_into(&mut arrays) {
            Some((window, us)) => {
                windows.key.push(Some(window.key));
                windows.mode.push(Some(window.mode.as_str()));
                windows.period_us.push(Some(us));
            }
            None => {
                windows.key.push(None);
                windows.mode.push(None);
                windows.period_us.push(None);
            }
        }
    }
    Ok(db::enqueue_window::enqueue_outcomes(conn, arrays, windows).await?)
}

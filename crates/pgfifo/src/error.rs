//! The one error type of pgfifo's API.
//!
//! A handler's failure is not an [`Error`]: it is a [`JobError`](crate::JobError)
//! recorded on the job. `Error` is what the caller of an API function sees.

use std::fmt;

/// The result type of pgfifo's API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error returned by pgfifo's API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A queue name is empty or longer than [`MAX_QUEUE_LEN`](crate::MAX_QUEUE_LEN) bytes.
    #[error("invalid queue name {name:?}: {reason}")]
    InvalidQueue {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A group name is empty or longer than [`MAX_GROUP_LEN`](crate::MAX_GROUP_LEN) bytes.
    #[error("invalid group name {name:?}: {reason}")]
    InvalidGroup {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// An enqueue option is out of range (for example `max_attempts = 0`).
    #[error("invalid enqueue option: {0}")]
    InvalidOption(String),
    /// The job type is not registered in this binary (no `#[derive(Job)]`
    /// with a `Handler` linked in), so no runner built from it could run it.
    #[error("job type {0:?} is not registered: derive `Job` on it and implement `Handler`")]
    UnknownJobType(String),
    /// One or more job registrations are invalid or share a kind. Every
    /// problem is listed.
    #[error("invalid job registrations:{}", ListProblems(.0))]
    InvalidRegistrations(Vec<RegistrationProblem>),
    /// One or more schedules of [`RunnerConfig`](crate::RunnerConfig) are
    /// invalid (a bad cron expression or time zone, a name declared twice
    /// with different definitions…). Every problem is listed, and the
    /// runner did not start.
    #[error("invalid schedules:{}", ListProblems(.0))]
    InvalidSchedules(Vec<ScheduleProblem>),
    /// No schedule has this name.
    #[error("no schedule named {0:?}")]
    ScheduleNotFound(String),
    /// The schedule is declared by live runners, so it cannot be deleted:
    /// remove it from their configuration (and restart them) first.
    #[error("schedule {name:?} is declared by live runners ({}); remove it from their configuration first", .runners.join(", "))]
    ScheduleDeclared {
        /// The schedule.
        name: String,
        /// The live runners that declare it.
        runners: Vec<String>,
    },
    /// The job payload could not be serialized to JSON.
    #[error("job payload does not serialize to JSON: {0}")]
    Serialize(#[source] serde_json::Error),
    /// Enqueue (or an operation that changes a group) was called in a
    /// transaction that is not READ COMMITTED, carried here. pgfifo relies on
    /// per-statement snapshots to keep group heads exact.
    #[error("pgfifo needs a READ COMMITTED transaction (found {0})")]
    IsolationLevel(String),
    /// The `pgfifo` schema is missing or older than this library: run
    /// [`migrate`](crate::migrate()) (or `pgfifo migrate up`).
    #[error(
        "the pgfifo schema of this database is {}; this library (pgfifo {}) needs version {needed}: \
         run `pgfifo migrate up` (or pgfifo::migrate) with this release",
        schema_version(*found),
        crate::migrate::RELEASE
    )]
    SchemaOutdated {
        /// The newest applied migration, if any.
        found: Option<i64>,
        /// The newest migration this library ships.
        needed: i64,
    },
    /// An applied migration's SQL differs from the one this library ships
    /// under the same version (the database was migrated by another build).
    #[error("pgfifo migration {0} in the database differs from this library's; the schema was migrated by another pgfifo build")]
    SchemaMismatch(i64),
    /// The database's schema is newer than this library knows: a newer
    /// pgfifo migrated it.
    #[error(
        "the pgfifo schema of this database is at version {found}, newer than this library \
         (pgfifo {release}, schema version {known}) knows: a newer pgfifo migrated it; run that \
         release (`pgfifo migrate status` lists the versions; see docs/upgrading.md)",
        found = .0,
        release = crate::migrate::RELEASE,
        known = crate::migrate::latest_version()
    )]
    SchemaTooNew(i64),
    /// The database's functions are not this library's: another release or
    /// build installed them. Run [`migrate`](crate::migrate()) with this one.
    #[error(
        "the pgfifo functions of this database were installed by {}, not by this library \
         (pgfifo {}): run `pgfifo migrate up` (or pgfifo::migrate) with this release",
        installer(installed_by),
        crate::migrate::RELEASE
    )]
    FunctionsDiffer {
        /// The release that installed them.
        installed_by: String,
    },
    /// [`distribute`](crate::migrate::distribute) was called on a database
    /// without the citus extension.
    #[error(
        "laying pgfifo out over Citus needs the citus extension in this database, and the \
         coordinator's URL: run CREATE EXTENSION citus on the coordinator (docs/scaling.md)"
    )]
    CitusMissing,
    /// A migration was run on a Citus worker node: pgfifo's schema is laid
    /// out, and applications connect, through the coordinator.
    #[error(
        "this database is on a Citus worker node: run pgfifo migrate (and point the \
         application) at the coordinator"
    )]
    CitusWorker,
    /// What the distributed layout (Citus) does not run yet was asked for
    /// on it: named here (docs/scaling.md lists what runs there).
    #[error("{0}: not available on the distributed layout (Citus) yet (docs/scaling.md)")]
    NotDistributed(String),
    /// No connection could be taken from the pool in time, or the pool
    /// could not open one.
    #[error("could not get a database connection from the pool: {0}")]
    Pool(#[source] bb8::RunError<diesel_async::pooled_connection::PoolError>),
    /// A database error.
    #[error("database error: {0}")]
    Database(#[source] diesel::result::Error),
    /// The database server accepted the connection but did not complete the
    /// startup exchange in time.
    #[error("the database server did not answer within {0:?}")]
    ConnectTimeout(std::time::Duration),
    /// Connecting to the database failed.
    #[error("could not connect to the database: {0}")]
    Connection(#[from] diesel::ConnectionError),
    /// The runner was configured with settings that cannot work.
    #[error("invalid runner configuration: {0}")]
    InvalidConfig(String),
    /// Waiting for running jobs during shutdown failed (a worker task panicked).
    #[error("runner shutdown failed: {0}")]
    Shutdown(String),
    /// No job has this id (it never existed, or it was purged).
    #[error("no job with id {0}")]
    JobNotFound(crate::JobId),
    /// The job is running (its transaction holds it), so it cannot be changed
    /// now. Wait for it to finish, or for its timeout.
    #[error("job {0} is running; wait for it to finish (or for its timeout) and try again")]
    JobRunning(crate::JobId),
    /// The operation needs a job in another state (for example cancelling a
    /// job that already finished).
    #[error("job {id} is {state}: {needed}")]
    JobState {
        /// The job.
        id: crate::JobId,
        /// Its current state.
        state: String,
        /// What the operation needed.
        needed: String,
    },
    /// The group's head is running, so the operation cannot change it now.
    #[error("the head of group {group:?} in queue {queue:?} is running; wait for it to finish (or for its timeout) and try again")]
    GroupBusy {
        /// The queue.
        queue: String,
        /// The group.
        group: String,
    },
    /// An argument of an operator command is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No batch has this id (see [`batch`](crate::batch)).
    #[error("no batch has id {0}")]
    BatchNotFound(crate::BatchId),
    /// The batch is closed: no job can be added to it (see
    /// [`batch::add`](crate::batch::add)).
    #[error("batch {0} is closed: no job can be added")]
    BatchClosed(crate::BatchId),
    /// A dependency of an enqueued job does not exist (see
    /// [`EnqueueOptions::depends_on`](crate::EnqueueOptions::depends_on)):
    /// nothing was enqueued.
    #[error("the dependency {0} does not exist")]
    DependencyNotFound(crate::Dependency),
}

impl From<bb8::RunError<diesel_async::pooled_connection::PoolError>> for Error {
    fn from(err: bb8::RunError<diesel_async::pooled_connection::PoolError>) -> Self {
        Error::Pool(err)
    }
}

/// Database errors, with pgfifo's own refusals turned into the variants
/// that name them (told by constraint name, see `db::error`).
impl From<diesel::result::Error> for Error {
    fn from(err: diesel::result::Error) -> Self {
        use crate::db::error::{detail, refusal, Refusal};
        match refusal(&err) {
            Some(Refusal::ReadCommitted) => {
                Error::IsolationLevel(detail(&err).unwrap_or("another isolation level").to_owned())
            }
            Some(refusal @ (Refusal::BatchMissing | Refusal::BatchClosed)) => {
                match detail(&err).and_then(|d| d.parse().ok()) {
                    Some(id) if refusal == Refusal::BatchMissing => Error::BatchNotFound(id),
                    Some(id) => Error::BatchClosed(id),
                    None => Error::Database(err),
                }
            }
            Some(Refusal::DependencyMissing) => {
                match detail(&err).and_then(crate::Dependency::parse) {
                    Some(dependency) => Error::DependencyNotFound(dependency),
                    None => Error::Database(err),
                }
            }
            _ => Error::Database(err),
        }
    }
}

/// A schema version as the errors name it: `at version 2 (pgfifo 0.1.0)`.
fn schema_version(found: Option<i64>) -> String {
    match found {
        None => "missing (never migrated)".to_owned(),
        Some(v) => match crate::migrate::release_of(v) {
            Some(release) => format!("at version {v} (pgfifo {release})"),
            None => format!("at version {v}"),
        },
    }
}

/// Who installed functions, as the errors name it.
fn installer(release: &str) -> String {
    if release == crate::migrate::RELEASE {
        format!("another build of pgfifo {release}")
    } else {
        format!("pgfifo {release}")
    }
}

/// One invalid registration found when the registry was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationProblem {
    /// The job's kind ([`Job::KIND`](crate::Job::KIND)).
    pub kind: String,
    /// The Rust type that registered it.
    pub rust_type: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for RegistrationProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job {:?} ({}): {}",
            self.kind, self.rust_type, self.problem
        )
    }
}

/// One invalid schedule found by [`runner::start`](crate::runner::start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleProblem {
    /// The schedule's name.
    pub schedule: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ScheduleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "schedule {:?}: {}", self.schedule, self.problem)
    }
}

struct ListProblems<'a, P>(&'a [P]);

impl<P: fmt::Display> fmt::Display for ListProblems<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in self.0 {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

//! Enqueueing jobs: one, or a batch in one round trip, on any connection,
//! including inside the application's own transaction.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel_async::AsyncPgConnection;

use crate::db;
use crate::db::enqueue::EnqueueArrays;
use crate::names::{validate_group, validate_queue, MAX_GROUP_LEN};
use crate::{BatchId, Dependency, DependencyFailure, Error, JobId, Result};

mod after;
mod window;
pub use window::{enqueue_batch_outcomes, EnqueueOutcome, Enqueued, Window, WindowMode};

/// Options of one enqueued job. Start from [`EnqueueOptions::group`] or
/// [`EnqueueOptions::ungrouped`].
///
/// ```
/// use std::time::Duration;
/// use pgfifo::EnqueueOptions;
///
/// let options = EnqueueOptions::group("tenant-42")
///     .run_in(Duration::from_secs(60))
///     .priority(10)
///     .unique_key("invoice-7")
///     .max_attempts(3);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    group: Option<String>,
    queue: Option<String>,
    priority: Option<i16>,
    max_attempts: Option<u32>,
    unique_key: Option<String>,
    run_at: Option<SystemTime>,
    delay: Option<Duration>,
    window: Option<Window>,
    windows_given: u8,
    dependencies: Vec<Dependency>,
    on_dependency_failure: Option<DependencyFailure>,
}

impl EnqueueOptions {
    /// A job of group `group`: it runs after every earlier job of the group
    /// has finished, never at the same time as another job of the group.
    pub fn group(group: impl Into<String>) -> Self {
        Self {
            group: Some(group.into()),
            ..Self::default()
        }
    }

    /// A job serialized with nothing: it may run at any time, in parallel with
    /// any other job.
    pub fn ungrouped() -> Self {
        Self::default()
    }

    /// Puts the job in `queue` instead of its type's queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Priority of the job when it is its group's head: among ready groups,
    /// higher priorities start first. It never reorders jobs within a group.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// How many times the job may start before it is marked failed (at least 1).
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// While an unfinished job of the same queue holds this key, enqueueing
    /// another is a no-op that returns the existing job's id.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// Do not start the job before `at`. A grouped job waiting for its time
    /// holds its group: later jobs of the group wait behind it (FIFO).
    pub fn run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(at);
        self.delay = None;
        self
    }

    /// Do not start the job before `delay` has passed (by the database's
    /// clock). Like [`run_at`](Self::run_at), it holds the job's group.
    pub fn run_in(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.run_at = None;
        self
    }

    /// Do not start the job before the jobs `ids` have succeeded (added to
    /// those given before). They must exist: an unknown id is
    /// [`Error::DependencyNotFound`], and nothing is enqueued. A waiting
    /// job holds its group like a delayed job: later jobs of the group wait
    /// behind it (FIFO). If one fails for good, is cancelled or skipped,
    /// [`on_dependency_failure`](Self::on_dependency_failure) decides. Not
    /// with a unique key, a de-duplication window or in a
    /// [`Batch`](crate::Batch). See `docs/batches.md`, "Dependencies".
    pub fn depends_on(mut self, ids: impl IntoIterator<Item = JobId>) -> Self {
        self.dependencies
            .extend(ids.into_iter().map(Dependency::Job));
        self
    }

    /// Do not start the job before batch `batch` has succeeded (it is
    /// closed and every job of it succeeded), like
    /// [`depends_on`](Self::depends_on). A batch that completes otherwise
    /// counts as a failed dependency.
    pub fn after_batch(mut self, batch: BatchId) -> Self {
        self.dependencies.push(Dependency::Batch(batch));
        self
    }

    /// What the job does when a dependency fails for good, is cancelled or
    /// skipped: [`DependencyFailure::Cancel`] unless set.
    pub fn on_dependency_failure(mut self, policy: DependencyFailure) -> Self {
        self.on_dependency_failure = Some(policy);
        self
    }
}

impl EnqueueOptions {
    /// The same options with this group (`None`: ungrouped).
    pub(crate) fn with_group(mut self, group: Option<String>) -> Self {
        self.group = group;
        self
    }

    /// The group, if any.
    pub(crate) fn group_name(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// The queue set here, if any (else the job type's).
    pub(crate) fn queue_name(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The options as a JSON object with every field, for comparing two
    /// declarations of a schedule.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let mut json = serde_json::json!({
            "group": self.group,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "unique_key": self.unique_key,
            "run_at_us": self.run_at.and_then(|at| micros_since_epoch(at).ok()),
            "delay_us": self.delay.map(micros),
        });
        // Only when set: schedules declared before windows compare equal.
        if let Some(w) = &self.window {
            json["window"] = serde_json::json!({
                "key": w.key, "mode": w.mode.as_str(), "period_us": micros(w.period),
            });
        }
        if !self.dependencies.is_empty() {
            json["dependencies"] = self.dependencies.iter().map(ToString::to_string).collect();
            json["on_dependency_failure"] = self
                .on_dependency_failure
                .unwrap_or_default()
                .as_str()
                .into();
        }
        json
    }
}

/// A job ready to be enqueued: the serialized payload with its options,
/// validated. Build many and pass them to [`enqueue_batch`].
#[derive(Debug, Clone)]
pub struct NewJob {
    queue: String,
    group: Option<String>,
    kind: &'static str,
    payload: serde_json::Value,
    priority: i16,
    max_attempts: i32,
    unique_key: Option<String>,
    run_at_us: Option<i64>,
    delay_us: Option<i64>,
    window: Option<(Window, i64)>,
    dependencies: Vec<Dependency>,
    on_dependency_failure: DependencyFailure,
}

/// What [`NewJob`] takes from the job's type: its kind and its defaults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KindDefaults {
    pub kind: &'static str,
    pub queue: &'static str,
    pub max_attempts: u32,
    pub priority: i16,
}

impl NewJob {
    /// A job of a kind with `defaults` and this `payload`, with its options
    /// checked. Fails, writing nothing, when the queue or group name is empty
    /// or too long, or an option is out of range.
    pub(crate) fn build(
        defaults: KindDefaults,
        payload: serde_json::Value,
        options: EnqueueOptions,
    ) -> Result<Self> {
        let window = window::checked(&options)?;
        let queue = options.queue.unwrap_or_else(|| defaults.queue.to_owned());
        validate_queue(&queue)?;
        if let Some(group) = &options.group {
            validate_group(group)?;
        }
        let max_attempts = options.max_attempts.unwrap_or(defaults.max_attempts);
        if max_attempts == 0 || max_attempts > i32::MAX as u32 {
            return Err(Error::InvalidOption(format!(
                "max_attempts must be between 1 and {}, got {max_attempts}",
                i32::MAX
            )));
        }
        if let Some(key) = &options.unique_key {
            if key.is_empty() || key.len() > MAX_GROUP_LEN {
                return Err(Error::InvalidOption(format!(
                    "unique_key must be 1 to {MAX_GROUP_LEN} bytes"
                )));
            }
            if key.contains('\0') {
                return Err(Error::InvalidOption(
                    "unique_key contains a NUL character (\\u0000), which PostgreSQL text cannot hold"
                        .into(),
                ));
            }
        }
        if let Some(path) = nul_in(&payload, &mut String::new()) {
            return Err(Error::InvalidOption(format!(
                "the payload of {} contains a NUL character (\\u0000) at {path}, which PostgreSQL \
                 jsonb cannot hold: encode it (e.g. base64) or drop it",
                defaults.kind
            )));
        }
        if !options.dependencies.is_empty() && (options.unique_key.is_some() || window.is_some()) {
            return Err(Error::InvalidOption(format!(
                "a job with dependencies ({}) cannot have a unique key or a de-duplication window",
                defaults.kind
            )));
        }
        let run_at_us = options.run_at.map(micros_since_epoch).transpose()?;
        let delay_us = options
            .delay
            .map(|d| {
                i64::try_from(d.as_micros())
                    .map_err(|_| Error::InvalidOption(format!("delay {d:?} is too long")))
            })
            .transpose()?;
        Ok(Self {
            queue,
            group: options.group,
            kind: defaults.kind,
            payload,
            priority: options.priority.unwrap_or(defaults.priority),
            max_attempts: max_attempts as i32,
            unique_key: options.unique_key,
            run_at_us,
            delay_us,
            window,
            dependencies: options.dependencies,
            on_dependency_failure: options.on_dependency_failure.unwrap_or_default(),
        })
    }

    /// Appends the job's columns to `arrays` (the arguments of
    /// `pgfifo.enqueue`); returns its de-duplication window, if any, with
    /// the window's period in microseconds.
    pub(crate) fn push_into(self, arrays: &mut EnqueueArrays) -> Option<(Window, i64)> {
        arrays.queue.push(self.queue);
        arrays.group.push(self.group);
        arrays.kind.push(self.kind);
        arrays.payload.push(self.payload);
        arrays.priority.push(self.priority);
        arrays.max_attempts.push(self.max_attempts);
        arrays.unique_key.push(self.unique_key);
        arrays.run_at_us.push(self.run_at_us);
        arrays.delay_us.push(self.delay_us);
        self.window
    }

    /// Checks that the job can be a batch's: a batch's jobs are its own, so
    /// a unique key or a de-duplication window (which may return another
    /// job's id) is refused; a callback (`callback`) starts when its event
    /// fires, so a start time is refused too.
    pub(crate) fn check_for_batch(&self, callback: bool) -> Result<()> {
        let what = if callback {
            "a batch callback"
        } else {
            "a job of a batch"
        };
        if self.unique_key.is_some() || self.window.is_some() {
            return Err(Error::InvalidOption(format!(
                "{what} ({}) cannot have a unique key or a de-duplication window",
                self.kind
            )));
        }
        if !self.dependencies.is_empty() {
            return Err(Error::InvalidOption(format!(
                "{what} ({}) cannot have dependencies",
                self.kind
            )));
        }
        if callback && (self.run_at_us.is_some() || self.delay_us.is_some()) {
            return Err(Error::InvalidOption(format!(
                "{what} ({}) starts when its event fires: run_at and run_in are not supported",
                self.kind
            )));
        }
        Ok(())
    }

    /// The queue the job goes to.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The job's group, if any.
    pub fn group_name(&self) -> Option<&str> {
        self.group.as_deref()
    }
}

/// Enqueues many jobs in one round trip and returns their ids in input order.
///
/// Within a group, jobs are ordered as given. Like a single enqueue, it joins
/// the connection's transaction if one is open: the jobs become visible to
/// runners when it commits and vanish if it rolls back. The transaction must
/// be READ COMMITTED (PostgreSQL's default). Open it through diesel
/// (`conn.transaction(…)`), not with a `BEGIN` of your own: outside what
/// diesel sees as a transaction, a single job into an idle group makes the
/// group active in the enqueue itself and keeps the group's row locked
/// until the transaction commits, which holds back the group's other jobs
/// if the transaction goes on.
pub async fn enqueue_batch(
    conn: &mut AsyncPgConnection,
    jobs: impl IntoIterator<Item = NewJob>,
) -> Result<Vec<JobId>> {
    let jobs: Vec<NewJob> = jobs.into_iter().collect();
    if after::any_dependency(&jobs) {
        return after::run(conn, jobs).await;
    }
    if window::any_window(&jobs) {
        return Ok(window::run(conn, jobs).await?.0);
    }
    let mut arrays = EnqueueArrays::default();
    for job in jobs {
        job.push_into(&mut arrays);
    }
    if arrays.queue.is_empty() {
        return Ok(Vec::new());
    }
    #[cfg(feature = "otel")]
    if let Some((span, trace)) = crate::otel::enqueue_span(&arrays.queue) {
        use tracing::Instrument;
        arrays.trace = Some(trace);
        let enqueued = db::enqueue::enqueue(conn, arrays)
            .instrument(span.clone())
            .await;
        if enqueued.is_err() {
            crate::otel::enqueue_failed(&span);
        }
        return Ok(enqueued?);
    }
    Ok(db::enqueue::enqueue(conn, arrays).await?)
}

/// Where in `value` a string (or an object key) holds a NUL character, as a
/// path like `$.items[2].name`; `None` if nowhere. (jsonb rejects
/// `\u0000`.)
fn nul_in(value: &serde_json::Value, path: &mut String) -> Option<String> {
    use serde_json::Value;
    fn shown(path: &str) -> String {
        format!("${path}")
    }
    match value {
        Value::String(s) if s.contains('\0') => Some(shown(path)),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let found = nul_in(item, path);
            path.truncate(len);
            found
        }),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let len = path.len();
            path.push('.');
            path.push_str(key);
            let found = if key.contains('\0') {
                Some(shown(path))
            } else {
                nul_in(item, path)
            };
            path.truncate(len);
            found
        }),
        _ => None,
    }
}

fn micros_since_epoch(at: SystemTime) -> Result<i64> {
    let micros = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::InvalidOption("run_at is before 1970".into()))?
        .as_micros();
    i64::try_from(micros)
        .map_err(|_| Error::InvalidOption("run_at is too far in the future".into()))
}

#[cfg(test)]
mod tests {
    use super::nul_in;
    use serde_json::json;

    #[test]
    fn a_nul_anywhere_in_a_payload_is_found_with_its_path() {
        let find = |v: serde_json::Value| nul_in(&v, &mut String::new());
        assert_eq!(find(json!({"a": [1, {"b": "ok"}]})), None);
        assert_eq!(find(json!("x\u{0}y")), Some("$".into()));
        assert_eq!(
            find(json!({"items": [{"name": "a"}, {"name": "b\u{0}"}]})),
            Some("$.items[1].name".into())
        );
        assert_eq!(find(json!({"k\u{0}": 1})), Some("$.k\u{0}".into()));
    }
}

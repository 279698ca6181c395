//! The registry of job types linked into the binary.
//!
//! `#[derive(Job)]` submits one [`Registration`] per type through `inventory`.
//! The registry is collected once, validated (duplicate kinds, bad settings)
//! and then read without locks. Iteration order of `inventory` is unspecified,
//! so everything here is sorted by kind.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::context::JobContext;
use crate::error::{Error, RegistrationProblem};
use crate::job_error::JobError;
use crate::names::{MAX_KIND_LEN, MAX_QUEUE_LEN};

/// Runs a handler on a raw JSON payload: deserializes, then calls `handle`
/// (see `handler::run_erased`).
pub(crate) type RunFn = for<'a, 'b> fn(
    &'a serde_json::Value,
    &'a mut JobContext<'b>,
) -> BoxFuture<'a, Result<(), JobError>>;

/// One job type as the derive registers it (built by
/// [`handler::registration`](crate::handler::registration), in a `const`
/// context).
#[doc(hidden)]
#[derive(Debug)]
pub struct Registration {
    /// The job's kind ([`Job::KIND`](crate::Job::KIND)).
    pub(crate) kind: &'static str,
    pub(crate) queue: &'static str,
    /// The Rust type's name, for messages.
    pub(crate) rust_type: fn() -> &'static str,
    pub(crate) max_attempts: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backoff: Duration,
    pub(crate) priority: i16,
    /// Runs in long mode ([`Job::LONG`](crate::Job::LONG)).
    pub(crate) long: bool,
    pub(crate) run: RunFn,
    /// The JSON Schema of the payload, when the type has one (see
    /// [`job_types`](crate::job_types)).
    pub(crate) schema: SchemaFn,
}

impl Registration {
    /// The same registration with the payload's JSON Schema from `schema`
    /// (the derive passes the type's schema probe).
    pub const fn with_schema(mut self, schema: SchemaFn) -> Self {
        self.schema = schema;
        self
    }
}

/// Gives the JSON Schema of a type's payload, or `None` (see
/// [`job_types`](crate::job_types)).
pub type SchemaFn = fn() -> Option<serde_json::Value>;

/// The [`SchemaFn`] of a type without a schema.
pub(crate) fn no_schema() -> Option<serde_json::Value> {
    None
}

inventory::collect!(Registration);

/// The validated set of job types, keyed by kind.
#[derive(Debug)]
pub(crate) struct Registry {
    by_kind: BTreeMap<&'static str, &'static Registration>,
}

impl Registry {
    /// The registry of this binary, validated on first use.
    pub(crate) fn global() -> Result<&'static Registry, Error> {
        static GLOBAL: OnceLock<Result<Registry, Vec<RegistrationProblem>>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Registry::build(inventory::iter::<Registration>))
            .as_ref()
            .map_err(|problems| Error::InvalidRegistrations(problems.clone()))
    }

    /// Builds and validates a registry, reporting every problem at once.
    pub(crate) fn build<'a>(
        registrations: impl IntoIterator<Item = &'static Registration> + 'a,
    ) -> Result<Registry, Vec<RegistrationProblem>> {
        let mut all: Vec<&'static Registration> = registrations.into_iter().collect();
        all.sort_by(|a, b| (a.kind, (a.rust_type)()).cmp(&(b.kind, (b.rust_type)())));
        let mut problems = Vec::new();
        let mut by_kind = BTreeMap::new();
        for reg in all {
            if let Some(problem) = invalid_reason(reg) {
                problems.push(RegistrationProblem {
                    kind: reg.kind.to_owned(),
                    rust_type: (reg.rust_type)().to_owned(),
                    problem,
                });
                continue;
            }
            if let Some(first) = by_kind.insert(reg.kind, reg) {
                problems.push(RegistrationProblem {
                    kind: reg.kind.to_owned(),
                    rust_type: (reg.rust_type)().to_owned(),
                    problem: format!("the kind is already used by `{}`", (first.rust_type)()),
                });
            }
        }
        if problems.is_empty() {
            Ok(Registry { by_kind })
        } else {
            Err(problems)
        }
    }

    pub(crate) fn get(&self, kind: &str) -> Option<&'static Registration> {
        self.by_kind.get(kind).copied()
    }

    /// Every registration, sorted by kind.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &'static Registration> + '_ {
        self.by_kind.values().copied()
    }

    /// Every queue that has at least one registered job type, sorted.
    pub(crate) fn queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = self.by_kind.values().map(|r| r.queue.to_owned()).collect();
        queues.sort();
        queues.dedup();
        queues
    }
}

fn invalid_reason(reg: &Registration) -> Option<String> {
    if reg.kind.is_empty() {
        return Some("the job kind is empty".into());
    }
    if reg.queue.is_empty() || reg.queue.len() > MAX_QUEUE_LEN {
        return Some(format!(
            "queue name `{}` must be 1 to {MAX_QUEUE_LEN} bytes",
            reg.queue
        ));
    }
    if reg.kind.len() > MAX_KIND_LEN {
        return Some(format!("the job kind is longer than {MAX_KIND_LEN} bytes"));
    }
    if reg.max_attempts == 0 {
        return Some("max_attempts must be at least 1".into());
    }
    if reg.timeout == Some(Duration::ZERO) {
        return Some("timeout must be longer than zero".into());
    }
    None
}

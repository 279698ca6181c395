//! The job types registered in this binary, described for people and for
//! producers in other languages: kind, queue, settings, and the JSON Schema
//! of the payload (`pgfifo job-types --json`, docs/enqueue-from-sql.md).
//!
//! A schema comes from [schemars](https://docs.rs/schemars) 1.x: with
//! pgfifo's `schema` feature on, a job type that also derives
//! `schemars::JsonSchema` has its payload's schema here; other types (and
//! every type without the feature) have none, and nothing else changes.
//! `#[derive(Job)]` finds out which by itself (see [`SchemaProbe`]).

use std::marker::PhantomData;

use serde::Serialize;

use crate::registry::Registry;
use crate::Result;

/// One registered job type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobType {
    /// Its kind: what a producer passes as `kind` to `pgfifo.add_job`.
    pub kind: String,
    /// Its default queue: a producer in another language must pass it as
    /// `queue` (the SQL API does not know the type's attributes).
    pub queue: String,
    /// The Rust type's name.
    pub rust_type: String,
    /// How many times a job may start by default.
    pub max_attempts: u32,
    /// Its default priority.
    pub priority: i16,
    /// How long one run may take, in milliseconds (`None`: the runner's
    /// default timeout).
    pub timeout_ms: Option<u64>,
    /// The first retry delay, in milliseconds.
    pub backoff_ms: u64,
    /// Whether its jobs run in long mode.
    pub long: bool,
    /// The JSON Schema of its payload, when the type derives
    /// `schemars::JsonSchema` and pgfifo's `schema` feature is on.
    pub payload_schema: Option<serde_json::Value>,
}

/// Every job type registered in this binary (by `#[derive(Job)]`), sorted
/// by kind. Fails when the registrations are invalid (two types with one
/// kind, say), as starting a runner would.
///
/// ```
/// for job_type in pgfifo::job_types()? {
///     println!("{} on queue {}", job_type.kind, job_type.queue);
/// }
/// # Ok::<(), pgfifo::Error>(())
/// ```
pub fn job_types() -> Result<Vec<JobType>> {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Ok(Registry::global()?
        .iter()
        .map(|r| JobType {
            kind: r.kind.to_owned(),
            queue: r.queue.to_owned(),
            rust_type: (r.rust_type)().to_owned(),
            max_attempts: r.max_attempts,
            priority: r.priority,
            timeout_ms: r.timeout.map(millis),
            backoff_ms: millis(r.backoff),
            long: r.long,
            payload_schema: (r.schema)(),
        })
        .collect())
}

/// Finds, for a concrete type `T`, whether it has a JSON Schema, without
/// requiring one: `(&SchemaProbe::<T>::new()).payload_schema()` calls
/// [`PayloadSchema`] when `T: schemars::JsonSchema` (and the `schema`
/// feature is on), else [`NoPayloadSchema`] (method resolution tries the
/// receiver `&SchemaProbe<T>` before `&&SchemaProbe<T>`). Not public API:
/// the derive's output uses it.
#[doc(hidden)]
pub struct SchemaProbe<T>(PhantomData<T>);

impl<T> SchemaProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        SchemaProbe(PhantomData)
    }
}

impl<T> Default for SchemaProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The probe's answer for a type with a schema. Not public API.
#[doc(hidden)]
pub trait PayloadSchema {
    /// The payload's JSON Schema.
    fn payload_schema(&self) -> Option<serde_json::Value>;
}

/// The probe's answer for a type without one. Not public API.
#[doc(hidden)]
pub trait NoPayloadSchema {
    /// `None`.
    fn payload_schema(&self) -> Option<serde_json::Value> {
        None
    }
}

impl<T> NoPayloadSchema for &SchemaProbe<T> {}

#[cfg(feature = "schema")]
impl<T: schemars::JsonSchema> PayloadSchema for SchemaProbe<T> {
    fn payload_schema(&self) -> Option<serde_json::Value> {
        Some(schemars::schema_for!(T).to_value())
    }
}

//! The derive macro of [pgfifo](https://docs.rs/pgfifo): `#[derive(Job)]`.
//!
//! Do not depend on this crate directly: add `pgfifo`, which re-exports the
//! derive beside the `Job` trait of the same name, and whose hidden
//! `__private` module is what the generated code refers to.
//!
//! The macro is a pipeline of small modules, after `serde_derive` and
//! `thiserror`:
//!
//! - `attr` parses the `#[job(...)]` attributes, rejecting unknown and
//!   duplicate keys and values of the wrong type;
//! - `ast` is the parsed model of the type, with the defaults of each setting;
//! - `valid` checks what parsing cannot (ranges, lengths, unions, generics);
//! - `expand` drives the pipeline and generates the code;
//! - `fallback` is what is emitted instead when anything failed;
//! - `ctxt` collects the errors of every phase, `duration` parses `"30s"`.
//!
//! Every error is collected before anything is reported, so one compilation
//! shows all the mistakes of a type at once, each pointing at its token.

mod ast;
mod attr;
mod ctxt;
mod duration;
mod expand;
mod fallback;
mod valid;

use proc_macro::TokenStream;

/// Implements `pgfifo::Job` for a struct or an enum and registers the type's
/// `pgfifo::Handler` with the runner.
///
/// The type must also implement `Serialize` and `Deserialize`, have no generic
/// parameters or lifetimes, and implement `pgfifo::Handler` by hand.
///
/// `kind` is what a job is stored and looked up under (`pgfifo::Job::KIND`): change
/// it only together with the jobs already enqueued under the old one.
///
/// Settings, all optional, in one or several `#[job(...)]` attributes:
///
/// | key            | value                              | default             |
/// |----------------|------------------------------------|---------------------|
/// | `kind`         | string, 1 to 256 bytes             | the type's name     |
/// | `queue`        | string, 1 to 128 bytes             | `"default"`         |
/// | `max_attempts` | integer, at least 1                | `5`                 |
/// | `timeout`      | duration string, e.g. `"30s"`      | the runner's        |
/// | `backoff`      | duration string, e.g. `"500ms"`    | `"1s"`              |
/// | `priority`     | integer in `i16`, may be negative  | `0`                 |
/// | `long`         | a flag, no value                   | off                 |
///
/// `long` runs the type's jobs in **long mode**, for work that runs for
/// minutes or hours (reports, exports, video): the job holds its group
/// without an open database transaction, so it never holds back VACUUM.
/// **What it gives up:** `ctx.conn()` is then a plain connection in
/// autocommit, and what the handler writes through it commits as it goes,
/// not atomically with the job's success. A crash mid-run keeps the writes
/// made so far and runs the job again: make its writes idempotent (upserts
/// keyed by the job id, or a row that records each finished step). See
/// [`pgfifo::Job::LONG`] and `docs/failure-model.md`.
///
/// A duration is an integer followed by one unit among `ms`, `s`, `m` and `h`,
/// with nothing in between (`"250ms"`, `"30s"`, `"5m"`, `"1h"`); it must not
/// be zero.
///
/// ```
/// use std::time::Duration;
///
/// use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Job, Serialize, Deserialize)]
/// #[job(queue = "billing", kind = "charge", max_attempts = 3)]
/// #[job(timeout = "30s", backoff = "500ms", priority = -2)]
/// struct ChargeInvoice {
///     invoice_id: i64,
/// }
///
/// #[async_trait]
/// impl Handler for ChargeInvoice {
///     async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
///         Ok(())
///     }
/// }
///
/// assert_eq!(ChargeInvoice::KIND, "charge");
/// assert_eq!(ChargeInvoice::TIMEOUT, Some(Duration::from_secs(30)));
/// assert_eq!(ChargeInvoice::PRIORITY, -2);
/// ```
#[proc_macro_derive(Job, attributes(job))]
pub fn derive_job(input: TokenStream) -> TokenStream {
    expand::derive(input.into()).into()
}

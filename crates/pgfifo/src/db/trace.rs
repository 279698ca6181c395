//! The W3C trace context a job may carry from its enqueue to its attempts
//! (table `pgfifo.job_trace`; written by [`enqueue`](super::enqueue), read
//! by the [pick](super::pick); see `docs/tracing.md`).

/// A `traceparent` and its `tracestate`, as the W3C Trace Context
/// specification writes them in HTTP headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    /// `version-traceid-parentid-flags`, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
    pub traceparent: String,
    /// Vendors' entries (`None`: none).
    pub tracestate: Option<String>,
}

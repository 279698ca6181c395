//! Traces from enqueue to run (the `otel` feature; `docs/tracing.md`).
//!
//! At enqueue, when the current `tracing` span has an OpenTelemetry context
//! (a `tracing-opentelemetry` layer is installed and a span is entered),
//! pgfifo opens a producer span `enqueue {queue}` under it and stores that
//! span's W3C trace context with every job of the call. Each attempt's span,
//! `run {queue}`, takes the stored context as its parent and as a link (the
//! OpenTelemetry messaging conventions' creation context): so one trace
//! holds the request that enqueued, the enqueue, every attempt and whatever
//! the handler traces. Without a current context nothing is stored, and no
//! span is opened at enqueue.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::db::pick::PickedJob;
use crate::db::trace::TraceContext;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The span of one enqueue call and the trace context its jobs carry, if a
/// span with a valid OpenTelemetry context is current; `None` otherwise
/// (nothing is stored). `queues`: the queue of each job.
pub(crate) fn enqueue_span(queues: &[String]) -> Option<(tracing::Span, TraceContext)> {
    let current = tracing::Span::current();
    if current.is_disabled() || !current.context().span().span_context().is_valid() {
        return None;
    }
    let first = queues.first()?;
    let one_queue = queues.iter().all(|q| q == first);
    let span = tracing::info_span!(
        "pgfifo.enqueue",
        otel.name = tracing::field::Empty,
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "pgfifo",
        messaging.operation.type = "send",
        messaging.operation.name = "enqueue",
        messaging.destination.name = tracing::field::Empty,
        messaging.batch.message_count = tracing::field::Empty,
    );
    if one_queue {
        span.record("otel.name", format!("enqueue {first}"));
        span.record("messaging.destination.name", first.as_str());
    } else {
        span.record("otel.name", "enqueue");
    }
    if queues.len() > 1 {
        span.record("messaging.batch.message_count", queues.len());
    }
    let mut carrier = Carrier::default();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    let traceparent = carrier.0.remove(TRACEPARENT)?;
    let tracestate = carrier.0.remove(TRACESTATE).filter(|s| !s.is_empty());
    Some((
        span,
        TraceContext {
            traceparent,
            tracestate,
        },
    ))
}

/// Marks an enqueue span as failed.
pub(crate) fn enqueue_failed(span: &tracing::Span) {
    span.record("otel.status_code", "ERROR");
}

/// The span of one attempt of `job`, continuing the trace of its enqueue
/// when the job carries one.
pub(crate) fn attempt_span(job: &PickedJob, attempt: Option<i32>) -> tracing::Span {
    let span = tracing::info_span!(
        "pgfifo.job",
        id = job.id,
        kind = %job.kind,
        queue = %job.queue,
        group = job.group_id.as_deref().unwrap_or(""),
        attempt = attempt,
        otel.name = %format_args!("run {}", job.queue),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "pgfifo",
        messaging.operation.type = "process",
        messaging.operation.name = "run",
        messaging.destination.name = %job.queue,
        messaging.message.id = %job.id,
        messaging.pgfifo.group = job.group_id.as_deref(),
        messaging.pgfifo.attempt = attempt,
        messaging.pgfifo.kind = %job.kind,
    );
    if let Some(stored) = &job.trace {
        let cx = TraceContextPropagator::new().extract(stored);
        let creation = cx.span().span_context().clone();
        if creation.is_valid() && !span.is_disabled() {
            // Both, before anything reads the span's context (which starts
            // it): the link is the conventions' creation context, the
            // parent keeps every attempt in the enqueue's trace.
            span.add_link(creation);
            let _ = span.set_parent(cx);
        }
    }
    span
}

/// Marks an attempt's span as failed (its handler returned an error,
/// panicked or timed out).
pub(crate) fn attempt_failed(span: &tracing::Span) {
    span.record("otel.status_code", "ERROR");
}

#[derive(Default)]
struct Carrier(HashMap<String, String>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

impl Extractor for TraceContext {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(&self.traceparent),
            TRACESTATE => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

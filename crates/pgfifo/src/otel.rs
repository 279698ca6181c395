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

/// `messaging.system`.
const SYSTEM: &str = "pgfifo";
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
    );
    // The conventions' attributes go to OpenTelemetry only, not to the
    // span's `tracing` fields that every log line inside it would repeat.
    span.set_attribute("messaging.system", SYSTEM);
    span.set_attribute("messaging.operation.type", "send");
    span.set_attribute("messaging.operation.name", "enqueue");
    if one_queue {
        span.record("otel.name", format!("enqueue {first}"));
        span.set_attribute("messaging.destination.name", first.clone());
    } else {
        span.record("otel.name", "enqueue");
    }
    if queues.len() > 1 {
        span.set_attribute(
            "messaging.batch.message_count",
            i64::try_from(queues.len()).unwrap_or(i64::MAX),
        );
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
    );
    if span.is_disabled() {
        return span;
    }
    span.set_attribute("messaging.system", SYSTEM);
    span.set_attribute("messaging.operation.type", "process");
    span.set_attribute("messaging.operation.name", "run");
    span.set_attribute("messaging.destination.name", job.queue.clone());
    span.set_attribute("messaging.message.id", job.id.to_string());
    if let Some(group) = &job.group_id {
        span.set_attribute("messaging.pgfifo.group", group.clone());
    }
    if let Some(attempt) = attempt {
        span.set_attribute("messaging.pgfifo.attempt", i64::from(attempt));
    }
    span.set_attribute("messaging.pgfifo.kind", job.kind.clone());
    if let Some(stored) = &job.trace {
        let cx = TraceContextPropagator::new().extract(stored);
        let creation = cx.span().span_context().clone();
        if creation.is_valid() {
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

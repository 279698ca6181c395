//! Traces from enqueue to run (the `otel` feature, docs/tracing.md): the
//! spans go to the OpenTelemetry SDK's in-memory exporter through a
//! `tracing-opentelemetry` layer, set as the default subscriber of every
//! thread of the test's own runtime (the runner's tasks run on them).

use std::time::Duration;

use opentelemetry::trace::{
    SpanId, SpanKind, Status, TraceContextExt, TraceId, TracerProvider as _,
};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, JobId};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const LIMIT: Duration = Duration::from_secs(30);

/// Attempt 1 returns an error (a retry), attempt 2 "crashes" (terminates
/// its own database session, as a killed worker would leave it), attempt 3
/// does its work in a span of its own and succeeds.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "traced", max_attempts = 5, backoff = "10ms")]
struct TracedJob {
    n: i64,
}

#[async_trait]
impl Handler for TracedJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        match ctx.attempt() {
            1 => Err(JobError::retry("first attempt fails")),
            2 => {
                diesel_async::RunQueryDsl::execute(
                    diesel::sql_query("SELECT pg_terminate_backend(pg_backend_pid())"),
                    ctx.conn(),
                )
                .await?;
                Err(JobError::permanent(
                    "the backend survived pg_terminate_backend",
                ))
            }
            _ => {
                let work = tracing::info_span!("traced.work", n = self.n);
                let _entered = work.enter();
                Ok(())
            }
        }
    }
}

/// The exporter, and a runtime whose every thread (workers and blocking
/// ones) sends its spans to it; the provider flushes at the end.
struct Traced {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    dispatch: tracing::Dispatch,
    runtime: tokio::runtime::Runtime,
}

impl Traced {
    fn new() -> Traced {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("pgfifo-tests"));
        let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(layer));
        let on_thread = dispatch.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_start(move || {
                // For the thread's whole life (the guard would reset it).
                std::mem::forget(tracing::dispatcher::set_default(&on_thread));
            })
            .build()
            .expect("runtime");
        Traced {
            exporter,
            provider,
            dispatch,
            runtime,
        }
    }

    fn block_on<F: std::future::Future>(&self, test: F) -> F::Output {
        tracing::dispatcher::with_default(&self.dispatch, || self.runtime.block_on(test))
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().expect("flush");
        self.exporter.get_finished_spans().expect("spans")
    }
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_text(span: &SpanData, key: &str) -> Option<String> {
    attr(span, key).map(|v| v.as_str().into_owned())
}

async fn wait_outcome(
    events: &mut broadcast::Receiver<JobEvent>,
    id: JobId,
    done: impl Fn(&JobOutcome) -> bool,
) -> Vec<JobOutcome> {
    tokio::time::timeout(LIMIT, async {
        let mut seen = Vec::new();
        loop {
            match events.recv().await {
                Ok(event) if event.id == id => {
                    let last = done(&event.outcome);
                    seen.push(event.outcome);
                    if last {
                        return seen;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(err) => panic!("runner events: {err}"),
            }
        }
    })
    .await
    .expect("the job's last outcome")
}

/// One trace holds the request that enqueued, the enqueue, each attempt (a
/// retry after an error, a rerun after a crash, the success) and the span
/// the handler opened; each attempt is a child of the enqueue span and
/// links to it, with the messaging conventions' attributes.
#[test]
fn one_trace_covers_enqueue_every_attempt_and_the_handler() {
    let traced = Traced::new();
    let (job_id, request_trace, request_span) = traced.block_on(async {
        let db = TestDb::new().await;
        let request = tracing::info_span!("http.request");
        let cx = request.context();
        let (trace_id, span_id) = (
            cx.span().span_context().trace_id(),
            cx.span().span_context().span_id(),
        );
        let job_id = db
            .enqueue(TracedJob { n: 7 }, "tenant-1")
            .instrument(request.clone())
            .await;
        drop(request);
        let stored = db
            .text(&format!(
                "SELECT traceparent FROM pgfifo.job_trace WHERE job_id = {job_id}"
            ))
            .await
            .expect("the job's trace context is stored");
        assert!(
            stored.starts_with(&format!("00-{trace_id}-")),
            "{stored} continues trace {trace_id}"
        );

        let runner = db.start_runner(test_config().concurrency(2)).await;
        let mut events = runner.subscribe();
        let seen = wait_outcome(&mut events, job_id, |o| *o == JobOutcome::Succeeded).await;
        runner.shutdown().await.unwrap();
        assert_eq!(db.job_state(job_id).await, "succeeded 3");
        assert_eq!(db.attempt_rows(job_id).await, 3, "events: {seen:?}");
        (job_id, trace_id, span_id)
    });

    let spans = traced.spans();
    let in_trace: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == request_trace)
        .collect();
    let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_ref()).collect();

    let enqueue: Vec<&&SpanData> = in_trace
        .iter()
        .filter(|s| s.name == "enqueue traced")
        .collect();
    assert_eq!(enqueue.len(), 1, "one enqueue span in {names:?}");
    let enqueue = enqueue[0];
    assert_eq!(enqueue.parent_span_id, request_span, "under the request");
    assert_eq!(enqueue.span_kind, SpanKind::Producer);
    assert_eq!(
        attr_text(enqueue, "messaging.system").as_deref(),
        Some("pgfifo")
    );
    assert_eq!(
        attr_text(enqueue, "messaging.destination.name").as_deref(),
        Some("traced")
    );
    assert_eq!(
        attr_text(enqueue, "messaging.operation.type").as_deref(),
        Some("send")
    );

    let mut attempts: Vec<&&SpanData> =
        in_trace.iter().filter(|s| s.name == "run traced").collect();
    attempts.sort_by_key(|s| s.start_time);
    let numbers: Vec<Option<String>> = attempts
        .iter()
        .map(|s| attr_text(s, "messaging.pgfifo.attempt"))
        .collect();
    assert_eq!(
        numbers,
        vec![Some("1".into()), Some("2".into()), Some("3".into())],
        "every attempt is in the trace: {names:?}"
    );
    let creation = enqueue.span_context.clone();
    for attempt in &attempts {
        assert_eq!(attempt.parent_span_id, enqueue.span_context.span_id());
        assert!(
            attempt.parent_span_is_remote,
            "the parent came from the job's row"
        );
        assert_eq!(attempt.span_kind, SpanKind::Consumer);
        let links: Vec<_> = attempt
            .links
            .links
            .iter()
            .map(|l| &l.span_context)
            .collect();
        assert_eq!(links.len(), 1, "one link: the creation context");
        assert_eq!(links[0].trace_id(), creation.trace_id());
        assert_eq!(links[0].span_id(), creation.span_id());
        assert_eq!(
            attr_text(attempt, "messaging.system").as_deref(),
            Some("pgfifo")
        );
        assert_eq!(
            attr_text(attempt, "messaging.destination.name").as_deref(),
            Some("traced")
        );
        assert_eq!(
            attr_text(attempt, "messaging.message.id"),
            Some(job_id.to_string())
        );
        assert_eq!(
            attr_text(attempt, "messaging.pgfifo.group").as_deref(),
            Some("tenant-1")
        );
        assert_eq!(
            attr_text(attempt, "messaging.operation.type").as_deref(),
            Some("process")
        );
    }
    assert!(
        matches!(attempts[0].status, Status::Error { .. }),
        "the failed attempt is an error: {:?}",
        attempts[0].status
    );
    assert!(
        !matches!(attempts[2].status, Status::Error { .. }),
        "the last attempt succeeded"
    );

    let work: Vec<&&SpanData> = in_trace
        .iter()
        .filter(|s| s.name == "traced.work")
        .collect();
    assert_eq!(
        work.len(),
        1,
        "the handler's span is in the trace: {names:?}"
    );
    assert_eq!(
        work[0].parent_span_id,
        attempts[2].span_context.span_id(),
        "under the attempt that ran it"
    );
}

/// Without a current span nothing is stored, and each attempt starts a
/// trace of its own, without a link.
#[test]
fn without_a_current_span_nothing_is_stored() {
    let traced = Traced::new();
    let job_id = traced.block_on(async {
        let db = TestDb::new().await;
        let job_id = db.enqueue(TracedJob { n: 1 }, "tenant-2").await;
        assert_eq!(
            db.scalar("SELECT count(*) FROM pgfifo.job_trace").await,
            0,
            "no trace context without a span"
        );
        let runner = db.start_runner(test_config()).await;
        let mut events = runner.subscribe();
        wait_outcome(&mut events, job_id, |o| *o == JobOutcome::Succeeded).await;
        runner.shutdown().await.unwrap();
        job_id
    });
    let spans = traced.spans();
    assert!(
        spans.iter().all(|s| s.name != "enqueue traced"),
        "no enqueue span without a current span"
    );
    let attempts: Vec<&SpanData> = spans.iter().filter(|s| s.name == "run traced").collect();
    assert_eq!(attempts.len(), 3, "three attempts of job {job_id}");
    let traces: Vec<TraceId> = attempts.iter().map(|s| s.span_context.trace_id()).collect();
    for attempt in &attempts {
        assert_eq!(attempt.parent_span_id, SpanId::INVALID, "a root span");
        assert!(attempt.links.links.is_empty());
    }
    assert!(
        traces[0] != traces[1] && traces[1] != traces[2] && traces[0] != traces[2],
        "three separate traces: {traces:?}"
    );
}

/// A span current at enqueue that belongs to no OpenTelemetry trace (the
/// harness's subscriber has no OpenTelemetry layer) stores nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_without_an_opentelemetry_layer_stores_nothing() {
    let db = TestDb::new().await;
    let job_id = db
        .enqueue(TracedJob { n: 2 }, "tenant-3")
        .instrument(tracing::info_span!("plain"))
        .await;
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job_trace WHERE job_id = {job_id}"
        ))
        .await,
        0
    );
}

/// A long-mode job (no open transaction while it runs) that fails its first
/// attempt.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "traced", long, max_attempts = 3, backoff = "10ms")]
struct TracedLongJob {
    n: i64,
}

#[async_trait]
impl Handler for TracedLongJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry("first long attempt fails"));
        }
        Ok(())
    }
}

/// A batch enqueue has one span, with the batch's size; each of its jobs,
/// long-mode ones included, continues it.
#[test]
fn a_batch_and_long_jobs_continue_the_trace() {
    let traced = Traced::new();
    let (ids, request_trace) = traced.block_on(async {
        let db = TestDb::new().await;
        let request = tracing::info_span!("batch.request");
        let trace_id = request.context().span().span_context().trace_id();
        let jobs = vec![
            pgfifo::NewJob::new(
                &TracedLongJob { n: 1 },
                pgfifo::EnqueueOptions::group("long-1"),
            )
            .unwrap(),
            pgfifo::NewJob::new(&TracedJob { n: 2 }, pgfifo::EnqueueOptions::group("long-2"))
                .unwrap(),
        ];
        let ids = async {
            let mut conn = db.conn().await;
            pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap()
        }
        .instrument(request)
        .await;
        assert_eq!(
            db.scalar("SELECT count(*) FROM pgfifo.job_trace").await,
            2,
            "both jobs carry the context"
        );
        let runner = db.start_runner(test_config().concurrency(2)).await;
        let mut events = runner.subscribe();
        tokio::time::timeout(LIMIT, async {
            let mut succeeded = Vec::new();
            while succeeded.len() < ids.len() {
                match events.recv().await {
                    Ok(event) if event.outcome == JobOutcome::Succeeded => succeeded.push(event.id),
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(err) => panic!("runner events: {err}"),
                }
            }
        })
        .await
        .expect("both jobs succeed");
        runner.shutdown().await.unwrap();
        (ids, trace_id)
    });
    let spans = traced.spans();
    let enqueue: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == request_trace && s.name == "enqueue traced")
        .collect();
    assert_eq!(enqueue.len(), 1, "one span for the batch");
    assert_eq!(
        attr_text(enqueue[0], "messaging.batch.message_count").as_deref(),
        Some("2")
    );
    let long_runs: Vec<&SpanData> = spans
        .iter()
        .filter(|s| {
            s.name == "run traced"
                && attr_text(s, "messaging.message.id") == Some(ids[0].to_string())
        })
        .collect();
    assert_eq!(long_runs.len(), 2, "two attempts of the long job");
    for run in &long_runs {
        assert_eq!(run.span_context.trace_id(), request_trace);
        assert_eq!(run.parent_span_id, enqueue[0].span_context.span_id());
    }
    assert_eq!(
        long_runs
            .iter()
            .filter(|s| matches!(s.status, Status::Error { .. }))
            .count(),
        1,
        "the failed long attempt is an error"
    );
}

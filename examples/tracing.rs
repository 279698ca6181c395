//! Traces from enqueue to run, sent to an OpenTelemetry collector over OTLP.
//!
//! Run it with a collector listening for OTLP/HTTP (Jaeger, Tempo, the
//! OpenTelemetry Collector…; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, default
//! `http://localhost:4318/v1/traces`):
//!
//! ```sh
//! docker run --rm -p 16686:16686 -p 4318:4318 jaegertracing/all-in-one   # for instance
//! cargo run -p pgfifo-examples --example tracing --features otel
//! ```
//!
//! It creates a fresh database `pgfifo_tracing_example` on the server of
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! and, inside a span standing for an incoming HTTP request, enqueues a
//! sync for a tenant whose first attempt fails. The runner retries it; the
//! handler traces its own work. One trace then shows the request, the
//! enqueue (`enqueue syncs`), both attempts (`run syncs`, children of the
//! enqueue, linked to it) and the handler's span under the attempt that ran
//! it. Without a collector the spans are dropped with an export error on
//! stderr; the example runs all the same. docs/tracing.md explains the set-up.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use pgfifo::runner::JobOutcome;
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, RunnerConfig};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Copies a tenant's records to its external account; the first attempt
/// finds the account's API down.
#[derive(Job, Serialize, Deserialize)]
#[job(queue = "syncs", max_attempts = 3, backoff = "100ms")]
struct SyncTenant {
    tenant: String,
}

#[async_trait]
impl Handler for SyncTenant {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry("the account's API did not answer"));
        }
        // The handler's own spans land under the attempt's span.
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        .instrument(tracing::info_span!("upload records", tenant = %self.tenant))
        .await;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The exporter and the provider: spans go out in batches, from a thread
    // of the exporter's own.
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .unwrap_or_else(|_| "http://localhost:4318/v1/traces".to_owned());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("pgfifo-tracing-example")
                .build(),
        )
        .build();

    // `tracing` spans, pgfifo's included, become OpenTelemetry spans.
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(tracing_subscriber::fmt::layer())
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("pgfifo-example")))
        .init();

    let (_server, pool) =
        pgfifo_examples::example_database("tracing", "pgfifo_tracing_example", 8).await?;

    // What a web handler would do: enqueue inside the request's span.
    let request = tracing::info_span!("POST /tenants/acme/sync", otel.kind = "server");
    let id = async {
        let mut conn = pool.get().await?;
        SyncTenant {
            tenant: "acme".into(),
        }
        .enqueue(&mut conn, "acme")
        .await
    }
    .instrument(request)
    .await?;
    println!("enqueued sync {id}");

    let runner = pgfifo::runner::start(pool, RunnerConfig::default().concurrency(2)).await?;
    let mut events = runner.subscribe();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv()).await??;
        println!(
            "job {} attempt {}: {:?}",
            event.id, event.attempt, event.outcome
        );
        if event.id == id && event.outcome == JobOutcome::Succeeded {
            break;
        }
    }
    runner.shutdown().await?;
    // Sends what is still buffered.
    provider.shutdown()?;
    Ok(())
}

//! The process's `tracing` subscriber: the log lines (text or JSON, on
//! stderr, filtered by `JOBFENCE_LOG`) and, with `serve --otlp-endpoint`,
//! the spans exported over OTLP/gRPC (docs/operating.md "Tracing").
//!
//! Without an endpoint nothing of OpenTelemetry is set up: no tracer, no
//! exporter thread, and the server reads no `traceparent` header.

use crate::cli::LogFormat;
use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The service name every exported span carries (`service.name`).
const SERVICE_NAME: &str = "jobfence";

/// Longest wait, on exit, for the last spans to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What was set up, to be shut down on exit ([`Telemetry::shutdown`]).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the subscriber: the log lines in `format` and, when
/// `otlp_endpoint` is given, the OpenTelemetry layer exporting every span
/// to it (batched, on a thread of its own). Must run inside the runtime:
/// the gRPC exporter's channel is spawned on it.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("JOBFENCE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal();
    let Some(endpoint) = otlp_endpoint else {
        // Without an exporter, the plain subscriber of the log lines: a
        // stack of optional layers cost each call measurably more
        // (docs/benchmarks.md, "Traces across the wire").
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi);
        match format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
        return Ok(Telemetry { provider: None });
    };
    let provider = Some(tracer_provider(endpoint)?);
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(SERVICE_NAME))
            .with_tracked_inactivity(false)
    });
    let text = matches!(format, LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
    });
    let json = matches!(format, LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(otel)
        .with(text)
        .with(json)
        .init();
    tracing::info!(endpoint, "exporting spans over OTLP/gRPC");
    Ok(Telemetry { provider })
}

/// A tracer provider exporting to `endpoint` over OTLP/gRPC, naming this
/// service and its release.
fn tracer_provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("the OTLP exporter to {endpoint}"))?;
    let resource = Resource::builder()
        .with_service_name(SERVICE_NAME)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build())
}

impl Telemetry {
    /// Sends the spans not exported yet and stops the exporter (waiting
    /// at most [`FLUSH_TIMEOUT`]). On a blocking thread: the exporter's
    /// channel runs on this runtime, which must stay free meanwhile.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the last spans were not all exported"),
            Err(e) => tracing::warn!(error = %e, "the span exporter did not stop"),
        }
    }
}

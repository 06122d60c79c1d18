//! OpenTelemetry traces: the request path's `tracing` spans exported over OTLP/gRPC, and the
//! W3C trace context carried from the client to the engine.
//!
//! Off by default (`tracing.enabled`). When on, [`otel_layer`] builds an OTLP span exporter
//! (tonic, batched), installs the W3C `traceparent` propagator and returns the
//! `tracing-opentelemetry` layer the binary adds to its subscriber. The endpoint is
//! `tracing.otlp_endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter reads it), else
//! `http://localhost:4317`; the service name is `tracing.service_name`, else
//! `OTEL_SERVICE_NAME`, else `prefixgate`.
//!
//! What is traced ([`span`]): one span per inference request, a child of the client's
//! `traceparent` when it sent one, with the routing decision as attributes; one child span per
//! upstream attempt, whose context is injected into the request sent upstream (so vLLM's own
//! spans, with `--otlp-traces-endpoint`, join the trace); the first byte and a resume as
//! events, a resume's continuation as a child span. Without the layer these are plain
//! `tracing` spans and propagation does nothing (the client's `traceparent` is forwarded as
//! any header is).

pub mod config;
pub mod logs;
pub mod propagation;
pub mod span;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

pub use config::TracingConfig;

/// The exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the OTLP trace exporter: {0}")]
pub struct TelemetryError(String);

/// The running trace pipeline; [`Telemetry::shutdown`] flushes the spans still batched.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Exports what is batched and stops the exporter (at the binary's exit).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "the trace exporter did not shut down cleanly");
        }
    }
}

/// The `tracing` layer that turns spans into OpenTelemetry spans.
pub type OtelLayer<S> =
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>;

/// With `tracing.enabled`, the layer that exports spans over OTLP and the pipeline behind
/// it; `None` when tracing is off. Must run inside the Tokio runtime (the gRPC channel lives
/// on it).
pub fn otel_layer<S>(
    config: &TracingConfig,
) -> Result<Option<(OtelLayer<S>, Telemetry)>, TelemetryError>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    if !config.enabled {
        return Ok(None);
    }
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = &config.otlp_endpoint {
        exporter = exporter.with_endpoint(endpoint.clone());
    }
    let exporter = exporter
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    let mut resource = Resource::builder();
    if let Some(name) = &config.service_name {
        resource = resource.with_service_name(name.clone());
    } else if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("prefixgate");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("prefixgate");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok(Some((layer, Telemetry { provider })))
}

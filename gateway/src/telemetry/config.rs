//! The `[tracing]` settings: whether spans are exported over OTLP, where to, and as which
//! service.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// OpenTelemetry traces over OTLP/gRPC.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Export a span per request (routing decision, upstream attempts, first byte, resume)
    /// over OTLP/gRPC, and carry the client's W3C `traceparent` on to the engine.
    pub enabled: bool,
    /// The OTLP/gRPC collector (`http://host:4317`); unset: `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// else `http://localhost:4317`.
    pub otlp_endpoint: Option<String>,
    /// The traces' `service.name`; unset: `OTEL_SERVICE_NAME`, else `prefixgate`.
    pub service_name: Option<String>,
}

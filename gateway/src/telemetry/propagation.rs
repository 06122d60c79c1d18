//! W3C trace context (`traceparent`, `tracestate`) between HTTP headers and spans, through
//! the propagator [`super::otel_layer`] installs (none, so nothing, when tracing is off).

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Headers as a propagator reads them.
struct Reader<'a>(&'a HeaderMap);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Headers as a propagator writes them.
struct Writer<'a>(&'a mut HeaderMap);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Makes `span` a child of the trace context the client's `headers` carry, if any.
pub fn continue_client_trace(span: &tracing::Span, headers: &HeaderMap) {
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Reader(headers)));
    // Fails only when the span is disabled (not traced): nothing to continue then.
    let _ = span.set_parent(parent);
}

/// Writes `span`'s trace context into `headers` (replacing the client's `traceparent`), so
/// the engine's spans are its children.
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&context, &mut Writer(headers));
    });
}

//! OpenTelemetry traces end to end: the `prefixgate` binary with `tracing.enabled`, in front of
//! a replica of the test's own that records the headers it receives, exporting to an OTLP
//! trace receiver the test serves (opentelemetry-proto's `TraceService` on tonic, on
//! 127.0.0.1:0). A client's W3C `traceparent` reaches the engine in the same trace, with the
//! gateway's upstream-attempt span as its parent, and the receiver holds the gateway's spans
//! under the client's span: `inference` (with the routing decision) its child,
//! `upstream_attempt` the inference span's.

#![expect(
    clippy::unwrap_used,
    reason = "the receiver and helpers run only in tests: a panic is a failed assertion"
)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use support::{DEADLINE, binary, serve_replica};

/// The client's trace and span, as it would send them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The spans the receiver was sent.
#[derive(Debug, Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.spans.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Serves the receiver on 127.0.0.1:0; its endpoint URL.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        format!("http://{addr}")
    }

    /// The span named `name`, once it has arrived (bounded).
    async fn span(&self, name: &str) -> Span {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(span) = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|s| s.name == name)
                .cloned()
            {
                return span;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no span {name} exported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span's attribute as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    Some(match value.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(n) => n.to_string(),
        other => format!("{other:?}"),
    })
}

#[tokio::test]
async fn a_client_traceparent_reaches_the_engine_and_the_gateways_spans_join_its_trace() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let recorded = Arc::clone(&seen);
    let chat = axum::routing::post(move |headers: HeaderMap| async move {
        recorded.lock().unwrap().push(headers);
        axum::Json(serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        }))
    });
    let replica = serve_replica(
        "engine-a",
        "m",
        axum::Router::new().route("/v1/chat/completions", chat),
    )
    .await;
    let backend = format!("engine-a={}", replica.url);
    let otlp = format!("tracing.otlp_endpoint={endpoint}");
    let running = binary::start(
        &[
            "--backend",
            &backend,
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--set",
            "engine_scrape.enabled=false",
            "--set",
            "tracing.enabled=true",
            "--set",
            &otlp,
            "--set",
            "tracing.service_name=prefixgate-test",
        ],
        false,
    )
    .await;

    let client = support::http_client();
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let request = http::Request::post(format!("http://{}/v1/chat/completions", running.api))
        .header("content-type", "application/json")
        .header("traceparent", &traceparent)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#,
        )))
        .unwrap();
    let answer = client.request(request).await.unwrap();
    assert_eq!(answer.status(), 200);

    // The engine got the client's trace, under the gateway's attempt span.
    let sent = seen.lock().unwrap()[0]["traceparent"]
        .to_str()
        .unwrap()
        .to_owned();
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!(parts[1], TRACE_ID, "the client's trace id: {sent}");
    assert_ne!(
        parts[2], CLIENT_SPAN,
        "the gateway's span as the parent: {sent}"
    );

    let inference = receiver.span("inference").await;
    assert_eq!(hex(&inference.trace_id), TRACE_ID);
    assert_eq!(
        hex(&inference.parent_span_id),
        CLIENT_SPAN,
        "a child of the client's span"
    );
    assert_eq!(
        attribute(&inference, "routing.pod").as_deref(),
        Some("engine-a")
    );
    assert!(attribute(&inference, "routing.policy").is_some());
    assert_eq!(
        attribute(&inference, "http.route").as_deref(),
        Some("/v1/chat/completions")
    );
    let attempt = receiver.span("upstream_attempt").await;
    assert_eq!(hex(&attempt.trace_id), TRACE_ID);
    assert_eq!(
        attempt.parent_span_id, inference.span_id,
        "a child of the request's span"
    );
    assert_eq!(
        hex(&attempt.span_id),
        parts[2],
        "the engine's parent is the attempt"
    );
    assert_eq!(attribute(&attempt, "pod").as_deref(), Some("engine-a"));
    assert_eq!(attribute(&attempt, "outcome").as_deref(), Some("200"));
    drop(running);
}

//! The gateway's HTTP surface as functions: [`app`] for the OpenAI listener and
//! [`metrics_app`] for the metrics listener, both over one shared [`AppState`].
//!
//! Keeping the routers as plain functions of their state lets unit tests drive them with
//! `oneshot` and lets [`crate::start`] bind them to real sockets.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use router_core::Strategy;
use router_core::text::Endpoint;
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::inference::inference;
use crate::metrics::Metrics;
use crate::proxy::UpstreamClient;
use crate::replicas::Replicas;

/// Settings the request path reads on every request.
#[derive(Debug, Clone)]
pub struct RequestSettings {
    pub default_strategy: Strategy,
    pub max_body_bytes: usize,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_retries: u32,
    /// Consecutive refused connections before a replica is ejected (passive health).
    pub eject_after_failures: u32,
}

/// Milliseconds since the gateway started, on tokio's clock (pausable in tests); the
/// router's index ages blocks by it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> router_core::Millis {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub router: router_core::Router,
    pub replicas: Arc<Replicas>,
    pub metrics: Metrics,
    pub client: UpstreamClient,
    pub settings: RequestSettings,
    pub clock: Clock,
}

/// The OpenAI API listener's routes.
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<AppState>>, r: Request| inference(s, Endpoint::ChatCompletions, r)),
        )
        .route(
            "/v1/completions",
            post(|s: State<Arc<AppState>>, r: Request| inference(s, Endpoint::Completions, r)),
        )
        .route(
            "/v1/embeddings",
            post(|s: State<Arc<AppState>>, r: Request| inference(s, Endpoint::Embeddings, r)),
        )
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(unknown_path)
        .with_state(state)
}

/// The metrics listener's routes.
pub fn metrics_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// The union of the models the replicas serve, in OpenAI's list shape.
async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<serde_json::Value> = state
        .replicas
        .models()
        .into_iter()
        .map(|id| {
            serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "prefixgate"})
        })
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// Liveness: the process serves HTTP.
async fn health() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

/// Readiness: at least one replica takes requests.
async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.replicas.any_ready() {
        axum::Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        let error = GatewayError::NoReadyReplica(String::new());
        let body = crate::error::openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no ready replica",
            error.code(),
            None,
        );
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(&state.replicas.snapshot());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn unknown_path(request: Request) -> Response {
    let mut response =
        GatewayError::UnknownPath(format!("{} {}", request.method(), request.uri().path()))
            .into_response();
    response.headers_mut().insert(
        crate::headers::REQUEST_ID,
        crate::headers::request_id(request.headers()),
    );
    response
}

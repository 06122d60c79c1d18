//! The gateway's HTTP surface as functions: [`app`] for the OpenAI listener and
//! [`metrics_app`] for the metrics listener, both over one shared [`AppState`], with the
//! small handlers (`/v1/models`, `/health`, `/ready`, `/metrics`, unknown paths); the
//! inference endpoints are [`super::inference`].
//!
//! Keeping the routers as plain functions of their state lets unit tests drive them with
//! `oneshot` and lets [`crate::start`] bind them to real sockets.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use router_core::text::Endpoint;

use crate::metrics::PodGauges;
use crate::request::error::GatewayError;
use crate::request::inference::inference;
use crate::state::AppState;

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
        .method_not_allowed_fallback(unknown_path)
        .with_state(state)
}

/// The metrics listener's routes.
pub fn metrics_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// The union of the models the replicas serve, in OpenAI's list shape.
async fn models(State(state): State<Arc<AppState>>, headers: http::HeaderMap) -> Response {
    if let Err(error) = state.admission.authenticate(&headers) {
        return error.into_response();
    }
    axum::Json(model_list(&state.replicas)).into_response()
}

/// `GET /v1/models`'s answer: the union of the models the replicas serve, in OpenAI's list
/// shape (also the ext_proc front end's answer to it).
pub fn model_list(replicas: &crate::replicas::Replicas) -> serde_json::Value {
    let data: Vec<serde_json::Value> = replicas
        .models()
        .into_iter()
        .map(|id| {
            serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "prefixgate"})
        })
        .collect();
    serde_json::json!({"object": "list", "data": data})
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
        let body = crate::request::error::openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no ready replica",
            error.code(),
            None,
        );
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = render_metrics(&state);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The metrics text with each replica's outstanding count and readiness as of now.
fn render_metrics(state: &AppState) -> String {
    let snapshot = state.replicas.snapshot();
    // Each replica's model list, held for the render (the gauges borrow it).
    let models: Vec<_> = snapshot.iter().map(|replica| replica.models()).collect();
    let missing: Vec<Vec<_>> = snapshot
        .iter()
        .map(|replica| replica.engine_missing().names().collect())
        .collect();
    state
        .metrics
        .render(
            snapshot
                .iter()
                .zip(&models)
                .zip(&missing)
                .map(|((replica, models), missing)| PodGauges {
                    pod: replica.name(),
                    outstanding: replica.load().outstanding(),
                    ready: replica.is_ready(),
                    models: models.as_slice(),
                    engine_waiting: replica.load().engine_stats().map(|s| u64::from(s.waiting)),
                    cache_trust: replica.load().cache_trust(),
                    engine_missing: missing.as_slice(),
                }),
        )
}

async fn unknown_path(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let error = GatewayError::UnknownPath(format!("{} {}", request.method(), request.uri().path()));
    // Counted like every other answer (no model, no pod), so a client calling a path the
    // gateway does not serve shows in the request counts.
    state
        .metrics
        .record_request("", "", error.status().as_u16());
    let mut response = error.into_response();
    response.headers_mut().insert(
        crate::request::headers::REQUEST_ID,
        crate::request::headers::request_id(request.headers()),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicas::Replica;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn state(replicas: Vec<Arc<Replica>>) -> Arc<AppState> {
        Arc::new(AppState::for_tests(replicas))
    }

    async fn call(router: Router, method: &str, path: &str, body: &str) -> (StatusCode, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn models_are_the_union_and_ready_needs_a_ready_replica() {
        let a = Arc::new(Replica::new("a", "127.0.0.1:1", vec!["m1".into()]));
        let b = Arc::new(Replica::new(
            "b",
            "127.0.0.1:2",
            vec!["m2".into(), "m1".into()],
        ));
        let state = state(vec![a.clone(), b.clone()]);
        let (status, body) = call(app(state.clone()), "GET", "/v1/models", "").await;
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<&str> = json["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["m1", "m2"]);
        assert_eq!(
            call(app(state.clone()), "GET", "/ready", "").await.0,
            StatusCode::OK
        );
        for replica in [&a, &b] {
            for _ in 0..3 {
                replica.report_failure(3);
            }
        }
        let (status, body) = call(app(state.clone()), "GET", "/ready", "").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no ready replica"), "{body}");
        assert_eq!(
            call(app(state), "GET", "/health", "").await.0,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn requests_are_refused_before_any_upstream_is_involved() {
        let a = Arc::new(Replica::new("a", "127.0.0.1:1", vec!["m".into()]));
        a.report_failure(1);
        let state = state(vec![a]);
        let chat = "/v1/chat/completions";
        let cases = [
            ("{", StatusCode::BAD_REQUEST, "invalid_json"),
            (
                r#"{"messages":[]}"#,
                StatusCode::BAD_REQUEST,
                "missing_model",
            ),
            (
                r#"{"model":"m","messages":[]}"#,
                StatusCode::BAD_REQUEST,
                "no messages in the request body",
            ),
            (
                r#"{"model":"x","messages":[{"role":"user","content":"hi"}]}"#,
                StatusCode::NOT_FOUND,
                "model_not_found",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
            ),
        ];
        for (body, status, code) in cases {
            let (got, text) = call(app(state.clone()), "POST", chat, body).await;
            assert_eq!(got, status, "{body}: {text}");
            assert!(text.contains(code), "{body}: {text}");
        }
        let (got, text) = call(app(state.clone()), "GET", chat, "").await;
        assert_eq!(got, StatusCode::NOT_FOUND, "wrong method: {text}");
        assert!(text.contains("GET /v1/chat/completions"), "{text}");
        let (got, text) = call(app(state.clone()), "POST", "/v1/nothing", "").await;
        assert_eq!(got, StatusCode::NOT_FOUND, "unknown path: {text}");
        let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(2000));
        let (got, text) = call(app(state.clone()), "POST", "/v1/completions", &big).await;
        assert_eq!(got, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
        let metrics = render_metrics(&state);
        assert!(
            metrics.contains(r#"prefixgate_requests_total{code="404",model="x",pod=""} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"prefixgate_requests_total{code="404",model="",pod=""} 2"#),
            "the wrong method and the unknown path are counted: {metrics}"
        );
    }

    #[tokio::test]
    async fn metrics_listener_serves_prometheus_text() {
        let state = state(vec![Arc::new(Replica::new("a", "127.0.0.1:1", vec![]))]);
        let (status, body) = call(metrics_app(state), "GET", "/metrics", "").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("aibrix_prefix_cache_indexer_status"),
            "{body}"
        );
        assert!(
            body.contains(r#"prefixgate_outstanding_requests{pod="a"} 0"#),
            "{body}"
        );
    }

    #[tokio::test]
    async fn per_pod_gauges_follow_the_load_view() {
        let replica = Arc::new(Replica::new("a", "h:1", vec![]));
        let state = state(vec![Arc::clone(&replica)]);
        let guard = replica.load().acquire();
        let text = render_metrics(&state);
        assert!(
            text.contains(r#"prefixgate_outstanding_requests{pod="a"} 1"#),
            "{text}"
        );
        drop(guard);
        replica.report_failure(1);
        let text = render_metrics(&state);
        assert!(
            text.contains(r#"prefixgate_outstanding_requests{pod="a"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"prefixgate_replica_ready{pod="a"} 0"#),
            "{text}"
        );
    }
}

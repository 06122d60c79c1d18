//! The replica's HTTP surface as one axum `Router` (app-as-a-function, so tests can call it
//! without a socket), plus the small endpoints: `/v1/models`, `/health`, `/ping`,
//! `/version`, `/tokenize`, `/metrics`, `/reset_prefix_cache` and the mock's control
//! endpoint `/mock/health`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::api_error::ApiError;
use super::envelope::to_json;
use super::generation::{body_rejection, chat_completions, completions};
use super::metrics_text::{self, MetricsSnapshot};
use super::replica::Replica;
use super::request::{Endpoint, PromptInput, json_object, parse_generation};
use crate::tokenizer;

/// Largest request body accepted (a 32k-token prompt of long words fits many times over).
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// The router of one replica.
pub fn app(replica: Arc<Replica>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ping", get(health).post(health))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/metrics", get(metrics))
        .route("/metrics/", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/mock/health", post(control_health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(replica)
}

/// FastAPI's answer for an unknown path.
async fn not_found() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        r#"{"detail":"Not Found"}"#.to_owned(),
    )
}

/// FastAPI's answer for a known path with the wrong method.
async fn method_not_allowed() -> Response {
    json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        r#"{"detail":"Method Not Allowed"}"#.to_owned(),
    )
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `GET /health`, `GET|POST /ping`: 200 with an empty body; 503 while health failure is
/// injected or when the engine loop has died (vLLM's `EngineDeadError`).
async fn health(State(replica): State<Arc<Replica>>) -> StatusCode {
    if replica.healthy() && replica.driver.is_running() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

#[derive(Deserialize)]
struct HealthControl {
    fail_for: f64,
}

/// `POST /mock/health?fail_for=SECONDS`: `/health` answers 503 for that many engine
/// seconds (0 makes it healthy again).
async fn control_health(
    State(replica): State<Arc<Replica>>,
    query: Result<Query<HealthControl>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(control)) = query else {
        return ApiError::bad_request("expected ?fail_for=SECONDS").into_response();
    };
    if !(control.fail_for.is_finite() && control.fail_for >= 0.0) {
        return ApiError::bad_request("fail_for must be finite and >= 0").into_response();
    }
    replica.fail_health_for(control.fail_for);
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /reset_prefix_cache` (vLLM's dev-mode endpoint): forgets every cached block and
/// publishes `AllBlocksCleared`. Like vLLM it answers 200 either way; while requests hold
/// blocks nothing is reset and a warning is logged.
async fn reset_prefix_cache(State(replica): State<Arc<Replica>>) -> StatusCode {
    if !replica.driver.reset_prefix_cache() {
        tracing::warn!(replica = %replica.name, "prefix cache not reset: blocks are in use");
    }
    StatusCode::OK
}

async fn version() -> Response {
    json_response(StatusCode::OK, r#"{"version":"0.32.0"}"#.to_owned())
}

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: [ModelCard<'a>; 1],
}

#[derive(Serialize)]
struct ModelCard<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: &'a str,
    parent: Option<()>,
    max_model_len: usize,
    permission: [ModelPermission; 1],
}

#[derive(Serialize)]
struct ModelPermission {
    id: String,
    object: &'static str,
    created: u64,
    allow_create_engine: bool,
    allow_sampling: bool,
    allow_logprobs: bool,
    allow_search_indices: bool,
    allow_view: bool,
    allow_fine_tuning: bool,
    organization: &'static str,
    group: Option<()>,
    is_blocking: bool,
}

/// `GET /v1/models`: vLLM's `ModelList` with the one served model.
async fn models(State(replica): State<Arc<Replica>>) -> Response {
    let list = ModelList {
        object: "list",
        data: [ModelCard {
            id: &replica.model,
            object: "model",
            created: replica.created,
            owned_by: "vllm",
            root: &replica.model,
            parent: None,
            max_model_len: replica.max_model_len,
            permission: [ModelPermission {
                id: format!("modelperm-{:032x}", u128::from(replica.created)),
                object: "model_permission",
                created: replica.created,
                allow_create_engine: false,
                allow_sampling: true,
                allow_logprobs: true,
                allow_search_indices: false,
                allow_view: true,
                allow_fine_tuning: false,
                organization: "*",
                group: None,
                is_blocking: false,
            }],
        }],
    };
    json_response(StatusCode::OK, to_json(&list))
}

#[derive(Serialize)]
struct Tokenized {
    count: usize,
    max_model_len: usize,
    tokens: Vec<u32>,
    token_strs: Option<()>,
}

/// `POST /tokenize` with `{"prompt": …}` or `{"messages": […]}` (chat template applied);
/// `model`, when given, must be the served one.
async fn tokenize(
    State(replica): State<Arc<Replica>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return body_rejection(&rejection).into_response(),
    };
    match tokenize_body(&replica, &body) {
        Ok(tokens) => json_response(
            StatusCode::OK,
            to_json(&Tokenized {
                count: tokens.len(),
                max_model_len: replica.max_model_len,
                tokens,
                token_strs: None,
            }),
        ),
        Err(e) => e.into_response(),
    }
}

fn tokenize_body(replica: &Replica, body: &[u8]) -> Result<Vec<u32>, ApiError> {
    let fields = json_object(body)?;
    match fields.get("model") {
        Some(Value::String(model)) if *model != replica.model => {
            return Err(ApiError::unknown_model(model, &replica.model));
        }
        // The generation parser below judges a model of the wrong type.
        _ => {}
    }
    // vLLM's tokenize flags: the mock's tokenizer has no special tokens, so
    // `add_special_tokens` changes nothing; the chat template's `add_generation_prompt` and
    // `continue_final_message` are read by the generation parser, as for a chat request.
    let _add_special_tokens = tokenize_flag(&fields, "add_special_tokens")?;
    let endpoint = if fields.contains_key("messages") {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let bytes = serde_json::to_vec(&fields)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    let params = parse_generation(endpoint, &bytes)?;
    Ok(match params.prompt {
        PromptInput::Text(text) => tokenizer::encode(&text),
        PromptInput::Tokens(ids) => ids,
    })
}

fn tokenize_flag(
    fields: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<bool>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(*flag)),
        Some(other) => Err(ApiError::validation(
            "bool_type",
            name,
            "Input should be a valid boolean",
            &other.to_string(),
        )),
    }
}

/// `GET /metrics`: Prometheus text.
async fn metrics(State(replica): State<Arc<Replica>>) -> Response {
    let snapshot = replica.driver.inspect(MetricsSnapshot::of);
    let text = metrics_text::render(&snapshot, &replica.model);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics_text::CONTENT_TYPE),
    );
    response
}

//! The two generation endpoints, `/v1/chat/completions` and `/v1/completions`: validate,
//! apply any injected failure, submit to the engine, answer streamed or whole.
//!
//! Order of checks, as in vLLM: the body (400), the model name (404), the context length
//! (400, vLLM 0.32's messages); only a valid request meets its injected failure, so a failure
//! test never hides a malformed request.
//!
//! The context, as vLLM 0.32 treats it: a prompt that fills it is refused (`param:
//! "input_tokens"`), and so is a `max_tokens` above it (`param: "max_tokens"`); a
//! `max_tokens` that fits alone but not after the prompt is cut to the room left, and the
//! answer ends with `finish_reason: "length"` there. Without `max_tokens`, chat generates up
//! to the context and completions 16 tokens (OpenAI's default for the endpoint).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::api_error::ApiError;
use super::engine_driver::SubmitError;
use super::envelope::ResponseMeta;
use super::replica::Replica;
use super::request::{Endpoint, PromptInput, parse_generation};
use super::sse::{ResponsePlan, collected_response, stream_response};
use crate::model::EngineRequest;
use crate::tokenizer;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(replica): State<Arc<Replica>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(replica, Endpoint::Chat, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(replica): State<Arc<Replica>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(replica, Endpoint::Completions, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// A body the extractor could not read (too large, broken stream) in vLLM's error shape.
pub fn body_rejection(rejection: &BytesRejection) -> ApiError {
    ApiError::with_status(rejection.status(), rejection.body_text())
}

async fn generate(
    replica: Arc<Replica>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|r| body_rejection(&r))?;
    let failure = replica.failure_for(&headers)?;
    let params = parse_generation(endpoint, &body)?;
    let model = params
        .model
        .clone()
        .unwrap_or_else(|| replica.model.clone());
    if model != replica.model {
        return Err(ApiError::unknown_model(&model, &replica.model));
    }
    let prompt = match params.prompt {
        PromptInput::Text(text) => tokenizer::encode(&text),
        PromptInput::Tokens(ids) => ids,
    };
    let max_tokens = context_check(
        endpoint,
        prompt.len(),
        params.max_tokens,
        replica.max_model_len,
    )?;

    if failure.hang {
        tracing::debug!(replica = %replica.name, "injected hang");
        // Ends when the client leaves or the replica shuts down (either drops this future).
        std::future::pending::<()>().await;
    }
    if let Some(secs) = failure.slow_start {
        tokio::time::sleep(replica.driver.clock().wall(secs)).await;
    }
    if let Some(code) = failure.status {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return Err(ApiError::with_status(
            status,
            format!("mock-engine injected failure ({})", failure),
        ));
    }

    let submission = replica
        .driver
        .submit(EngineRequest {
            prompt,
            max_tokens,
            ignore_eos: params.ignore_eos,
        })
        .map_err(|e| match e {
            SubmitError::Admission(e) => ApiError::bad_request(e.to_string()),
            SubmitError::Stopped => {
                ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        })?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok());
    let plan = ResponsePlan {
        endpoint,
        meta: ResponseMeta::new(prefix, request_id, &model),
        include_usage: params.include_usage,
        continuous_usage: params.continuous_usage,
        block_size: u32::try_from(replica.block_size).unwrap_or(u32::MAX),
        abort_after: failure.abort_after,
        stall_after: failure.stall_after,
    };
    if params.stream {
        Ok(stream_response(submission, plan))
    } else {
        Ok(collected_response(submission, plan).await)
    }
}

/// Completions' `max_tokens` when the request gives none (OpenAI's default).
const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// vLLM 0.32's length checks, done before any injected failure so that an invalid request is
/// a 400 whatever the failure plan says. Returns the effective `max_tokens` (see the module
/// docs); the model repeats its own checks on submit, which this keeps it from failing.
fn context_check(
    endpoint: Endpoint,
    prompt: usize,
    max_tokens: Option<u32>,
    max_model_len: usize,
) -> Result<u32, ApiError> {
    if prompt >= max_model_len {
        return Err(ApiError::bad_param(
            "input_tokens",
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your prompt contains at least {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt})"
            ),
        ));
    }
    let room = u32::try_from(max_model_len - prompt).unwrap_or(u32::MAX);
    match (max_tokens, endpoint) {
        (Some(n), _) if n as usize > max_model_len => Err(ApiError::bad_param(
            "max_tokens",
            format!(
                "max_tokens={n} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens. (parameter=max_tokens, value={n})"
            ),
        )),
        (Some(n), _) => Ok(n.min(room)),
        (None, Endpoint::Chat) => Ok(room),
        (None, Endpoint::Completions) => Ok(COMPLETIONS_DEFAULT_MAX_TOKENS.min(room)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_checks_follow_vllm_0_32() {
        let check = |endpoint, prompt, max_tokens| {
            context_check(endpoint, prompt, max_tokens, 100).map_err(|e| e.param)
        };
        assert_eq!(check(Endpoint::Chat, 10, None), Ok(90));
        assert_eq!(check(Endpoint::Completions, 10, None), Ok(16));
        assert_eq!(check(Endpoint::Completions, 95, None), Ok(5));
        assert_eq!(check(Endpoint::Chat, 10, Some(90)), Ok(90));
        // Fits the context alone, not after the prompt: cut to the room left.
        assert_eq!(check(Endpoint::Chat, 10, Some(95)), Ok(90));
        assert_eq!(
            check(Endpoint::Chat, 10, Some(101)),
            Err(Some("max_tokens".into()))
        );
        for prompt in [100, 101] {
            assert_eq!(
                check(Endpoint::Chat, prompt, Some(1)),
                Err(Some("input_tokens".into()))
            );
        }
    }
}

//! The two generation endpoints, `/v1/chat/completions` and `/v1/completions`: validate,
//! apply any injected failure, submit to the engine, answer streamed or whole.
//!
//! Order of checks, as in vLLM: the body (400), the model name (404), the context length
//! (400, the model's own vLLM messages); only a valid request meets its injected failure, so
//! a failure test never hides a malformed request.

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
use crate::model::{AdmissionError, EngineRequest};
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
    if params.model != replica.model {
        return Err(ApiError::unknown_model(&params.model));
    }
    let prompt = match params.prompt {
        PromptInput::Text(text) => tokenizer::encode(&text),
        PromptInput::Tokens(ids) => ids,
    };
    let max_tokens = context_check(prompt.len(), params.max_tokens, replica.max_model_len)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;

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
        meta: ResponseMeta::new(prefix, request_id, &params.model),
        include_usage: params.include_usage,
        abort_after: failure.abort_after,
    };
    if params.stream {
        Ok(stream_response(submission, plan))
    } else {
        Ok(collected_response(submission, plan).await)
    }
}

/// vLLM's length checks, done before any injected failure so that an invalid request is a 400
/// whatever the failure plan says (the model repeats them on submit). Returns the effective
/// `max_tokens`: when absent, whatever room the context leaves, as in vLLM.
fn context_check(
    prompt: usize,
    max_tokens: Option<u32>,
    max_model_len: usize,
) -> Result<u32, AdmissionError> {
    if prompt == 0 {
        return Err(AdmissionError::EmptyPrompt);
    }
    let too_long = AdmissionError::PromptTooLong {
        prompt,
        max_model_len,
    };
    match max_tokens {
        // Without max_tokens vLLM needs room for one token.
        None if prompt >= max_model_len => Err(too_long),
        None => Ok(u32::try_from(max_model_len - prompt).unwrap_or(u32::MAX)),
        Some(_) if prompt > max_model_len => Err(too_long),
        Some(0) => Err(AdmissionError::ZeroMaxTokens),
        Some(n) if prompt.saturating_add(n as usize) > max_model_len => {
            Err(AdmissionError::MaxTokensTooLarge {
                max_tokens: n,
                prompt,
                max_model_len,
            })
        }
        Some(n) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_checks_follow_vllm() {
        assert_eq!(context_check(10, None, 100), Ok(90));
        assert_eq!(context_check(10, Some(90), 100), Ok(90));
        assert_eq!(
            context_check(0, Some(1), 100),
            Err(AdmissionError::EmptyPrompt)
        );
        for (prompt, max_tokens) in [(100, None), (101, None), (101, Some(1))] {
            assert!(
                matches!(
                    context_check(prompt, max_tokens, 100),
                    Err(AdmissionError::PromptTooLong { .. })
                ),
                "{prompt} {max_tokens:?}"
            );
        }
        assert!(matches!(
            context_check(10, Some(91), 100),
            Err(AdmissionError::MaxTokensTooLarge {
                max_tokens: 91,
                prompt: 10,
                max_model_len: 100
            })
        ));
    }
}

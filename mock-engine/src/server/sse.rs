//! Turning a request's token channel into a response body: the SSE event stream of a
//! streamed request, or the collected text of a non-streamed one.
//!
//! Wire format (reference §1.3–1.4): every event is `data: <json>\n\n` and the stream ends
//! with `data: [DONE]\n\n`. Chat sends the role chunk together with the first token (both at
//! TTFT); completions have no role chunk. The last token's chunk carries `finish_reason`; a
//! usage chunk with `choices: []` follows when `stream_options.include_usage` is set, and
//! with `continuous_usage_stats` too every chunk carries the running count.
//!
//! The body owns the request's [`Submission`], so a client that goes away (hyper drops the
//! body) aborts the request in the model. An injected `abort-after=N` ends the body with an
//! error after `N` tokens, which makes hyper drop the connection without `[DONE]`; an injected
//! `stall-after=N` sends nothing after `N` tokens and leaves the connection open.

use std::io;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use super::engine_driver::Submission;
use super::envelope::{ResponseMeta, RunningUsage, UsageCounts, usage_chunk};
use super::request::Endpoint;
use super::{chat, completions};
use crate::model::{FinishReason, TokenOutput};
use crate::tokenizer;

/// How one response is written.
#[derive(Debug, Clone)]
pub struct ResponsePlan {
    pub endpoint: Endpoint,
    pub meta: ResponseMeta,
    pub include_usage: bool,
    /// `continuous_usage_stats` (with `include_usage`): the running count in every chunk.
    pub continuous_usage: bool,
    /// Tokens per KV block, for chat's `created_cache_tokens`.
    pub block_size: u32,
    /// Injected: drop the connection after this many tokens.
    pub abort_after: Option<u32>,
    /// Injected: send nothing more after this many tokens, the connection open.
    pub stall_after: Option<u32>,
}

/// The error a body stream ends with when the connection must be dropped.
fn dropped(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, why.to_owned())
}

struct StreamState {
    submission: Option<Submission>,
    plan: ResponsePlan,
    sent: u32,
}

/// A streamed response: `text/event-stream`, one event per token.
pub fn stream_response(submission: Submission, plan: ResponsePlan) -> Response {
    let state = StreamState {
        submission: Some(submission),
        plan,
        sent: 0,
    };
    let events = stream::unfold(state, |mut state| async move {
        if state.plan.stall_after.is_some_and(|n| state.sent >= n) {
            // A hung engine: the request leaves the model, the connection stays open and
            // silent until the client goes.
            drop(state.submission.take());
            return std::future::pending().await;
        }
        let submission = state.submission.as_mut()?;
        if state.plan.abort_after.is_some_and(|n| state.sent >= n) {
            // Let hyper flush the tokens already written: an error polled straight after
            // them would discard its write buffer, and the client must see exactly N.
            tokio::task::yield_now().await;
            // Dropping the submission aborts the request in the model.
            state.submission = None;
            return Some((Err(dropped("injected abort-after")), state));
        }
        let Some(token) = submission.tokens.recv().await else {
            // The driver stopped (replica shutting down): end without [DONE].
            state.submission = None;
            return Some((Err(dropped("replica shut down")), state));
        };
        let bytes = encode_token_events(&state.plan, &token);
        state.sent += 1;
        if token.finish.is_some() {
            if let Some(mut submission) = state.submission.take() {
                submission.guard.finished();
            }
        }
        Some((Ok::<Bytes, io::Error>(bytes), state))
    });
    let mut response = Body::from_stream(events).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}

/// The events one token produces: role chunk (chat, first token), the token's chunk, and
/// after the last token the usage chunk and `[DONE]`.
fn encode_token_events(plan: &ResponsePlan, token: &TokenOutput) -> Bytes {
    let mut out = String::new();
    let text = tokenizer::decode(token.token);
    let finish = token.finish.map(finish_reason);
    let mut event = |json: &str| {
        out.push_str("data: ");
        out.push_str(json);
        out.push_str("\n\n");
    };
    // The stream's last chunk before [DONE] carries the fingerprint.
    let last = finish.is_some() && !plan.include_usage;
    let running = |done: u32| {
        plan.continuous_usage
            .then(|| RunningUsage::after(token.prompt_tokens, done))
    };
    let counted = running(token.index + 1);
    match plan.endpoint {
        Endpoint::Chat => {
            if token.index == 0 {
                event(&chat::role_chunk(&plan.meta, running(0)));
            }
            event(&chat::token_chunk(&plan.meta, &text, finish, last, counted));
        }
        Endpoint::Completions => event(&completions::token_chunk(
            &plan.meta, &text, finish, last, counted,
        )),
    }
    if token.finish.is_some() {
        if plan.include_usage {
            let object = match plan.endpoint {
                Endpoint::Chat => chat::CHUNK_OBJECT,
                Endpoint::Completions => completions::OBJECT,
            };
            event(&usage_chunk(&plan.meta, object, &usage_of(plan, token)));
        }
        out.push_str("data: [DONE]\n\n");
    }
    Bytes::from(out)
}

/// A non-streamed response: waits for every token, then writes the full body.
pub async fn collected_response(mut submission: Submission, plan: ResponsePlan) -> Response {
    let mut text = String::new();
    let mut received = 0u32;
    loop {
        if plan.abort_after.is_some_and(|n| received >= n) {
            drop(submission);
            return dropped_response("injected abort-after");
        }
        if plan.stall_after.is_some_and(|n| received >= n) {
            drop(submission);
            return std::future::pending().await;
        }
        let Some(token) = submission.tokens.recv().await else {
            return dropped_response("replica shut down");
        };
        received += 1;
        text.push_str(&tokenizer::decode(token.token));
        if let Some(reason) = token.finish {
            submission.guard.finished();
            let usage = usage_of(&plan, &token);
            let body = match plan.endpoint {
                Endpoint::Chat => chat::full_body(&plan.meta, &text, finish_reason(reason), &usage),
                Endpoint::Completions => {
                    completions::full_body(&plan.meta, &text, finish_reason(reason), &usage)
                }
            };
            let mut response = Body::from(body).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return response;
        }
    }
}

/// A 200 whose body fails at once: hyper sends the head, then drops the connection.
fn dropped_response(why: &'static str) -> Response {
    let body = stream::once(async move { Err::<Bytes, io::Error>(dropped(why)) });
    Body::from_stream(body).into_response()
}

fn usage_of(plan: &ResponsePlan, token: &TokenOutput) -> UsageCounts {
    // vLLM's chat counts the prompt's full blocks this request wrote (those it did not find
    // cached); its completions leave the count null.
    let created = match plan.endpoint {
        Endpoint::Chat => {
            let block = plan.block_size.max(1);
            Some((token.prompt_tokens / block * block).saturating_sub(token.cached_tokens))
        }
        Endpoint::Completions => None,
    };
    UsageCounts {
        prompt_tokens: token.prompt_tokens,
        completion_tokens: token.index + 1,
        cached_tokens: token.cached_tokens,
        created_cache_tokens: created,
    }
}

fn finish_reason(reason: FinishReason) -> &'static str {
    reason.as_str()
}

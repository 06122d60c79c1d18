//! The request path of the OpenAI inference endpoints, step by step:
//! admit ([`crate::admit`]) → read the body ([`crate::request::parse`]) → parse it, choose a
//! strategy and charge the tenant's tokens ([`crate::request::prepare`]) → choose a replica
//! ([`crate::request::pick`]) → forward with retries ([`crate::request::proxy`]) → answer with the replica's
//! status and headers plus prefixgate's routing headers ([`crate::request::headers`]) and a body that
//! releases the pod when it ends ([`crate::request::release`]).
//!
//! Errors before the response are answered here, OpenAI-shaped, with the request id.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::HeaderValue;
use hyper::body::Incoming;
use router_core::text::Endpoint;

use crate::admit::{AdmissionPermit, TokenHold};
use crate::request::error::GatewayError;
use crate::request::headers;
use crate::request::parse;
use crate::request::prepare::prepare;
use crate::request::proxy::{self, Forwarded, Outgoing};
use crate::request::release::{Completion, GuardedBody};
use crate::request::resume::reconnect::Reconnector;
use crate::request::resume::{self, Resume};
use crate::state::AppState;
use crate::telemetry::{propagation, span};
use tracing::Instrument;

/// Serves one chat, completion or embedding request.
pub async fn inference(
    State(state): State<Arc<AppState>>,
    endpoint: Endpoint,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let request_id = headers::request_id(&parts.headers);
    let span = span::request(parts.uri.path(), request_id.to_str().unwrap_or_default());
    propagation::continue_client_trace(&span, &parts.headers);
    let mut model = String::new();
    let served = serve(&state, endpoint, parts, body, &request_id, &mut model)
        .instrument(span)
        .await;
    match served {
        Ok(response) => response,
        Err(error) => {
            tracing::debug!(%error, request_id = ?request_id, "request refused");
            let pod = error.pod().unwrap_or_default();
            state
                .metrics
                .record_request(&model, pod, error.status().as_u16());
            // A replica to blame (a first-byte timeout) is named as on a routed answer.
            let target = HeaderValue::from_str(pod).ok().filter(|_| !pod.is_empty());
            let mut response = error.into_response();
            response
                .headers_mut()
                .insert(headers::REQUEST_ID, request_id);
            if let Some(target) = target {
                response.headers_mut().insert(headers::TARGET_POD, target);
            }
            response
        }
    }
}

async fn serve(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    parts: http::request::Parts,
    body: Body,
    request_id: &HeaderValue,
    model: &mut String,
) -> Result<Response, GatewayError> {
    let permit = state.admission.admit(&parts.headers, &state.metrics)?;
    let bytes = parse::read_body(&parts.headers, body, state.settings.max_body_bytes).await?;
    let mut prepared = prepare(state, endpoint, &parts.headers, &bytes, model).await?;
    let plan = resume::plan::plan(
        state.settings.resume.enabled,
        endpoint,
        &parts.headers,
        prepared.fields.stream,
        &bytes,
    )?;
    // A resumable request goes upstream asking for the engine's running token count.
    let bytes = plan
        .as_ref()
        .and_then(resume::plan::Plan::upstream_body)
        .unwrap_or(bytes);
    let outgoing = Outgoing::prepare(&parts, bytes, request_id);
    // A resumable request keeps what it sent, for its continuations.
    let resume = plan.map(|plan| {
        let reconnect = Reconnector::new(
            Arc::clone(state),
            prepared.strategy,
            endpoint,
            outgoing.clone(),
            tracing::Span::current(),
        );
        Resume::new(
            plan,
            state.settings.resume,
            Box::new(reconnect),
            state.metrics.clone(),
        )
    });
    let forwarded = proxy::forward(
        state,
        prepared.strategy,
        &prepared.fields,
        prepared.tokens_to_hash(),
        outgoing,
        &[],
    )
    .await;
    let forwarded = match forwarded {
        Ok(forwarded) => forwarded,
        Err(error) => {
            // No replica ran the request, so its tokens go back, except after a first-byte
            // timeout: the replica may still be running it.
            if !matches!(error, GatewayError::UpstreamTimeout { .. }) {
                prepared.refund_tokens();
            }
            return Err(error);
        }
    };
    Ok(respond(
        state,
        &prepared.fields.model,
        forwarded,
        Held {
            permit,
            tokens: prepared.tokens,
            resume,
        },
        request_id,
    ))
}

/// What the response body keeps besides the pod: the admission permit, the tenant's token
/// charge and, for a resumable stream, its resume.
struct Held {
    permit: AdmissionPermit,
    tokens: Option<TokenHold>,
    resume: Option<Resume<Incoming>>,
}

/// The client's response: the replica's status and headers plus the routing headers, and
/// its body in a [`GuardedBody`] holding the pod's guard, the admission permit and the
/// tenant's token charge until it ends.
fn respond(
    state: &AppState,
    model: &str,
    forwarded: Forwarded,
    held: Held,
    request_id: &HeaderValue,
) -> Response {
    let Held {
        permit,
        tokens,
        resume,
    } = held;
    let Forwarded {
        response,
        picked,
        sent_at,
    } = forwarded;
    let (upstream, upstream_body) = response.into_parts();
    // A replica that answered with an error generated nothing: the tenant's tokens go back.
    let tokens = match tokens {
        Some(tokens) if !upstream.status.is_success() => {
            tokens.refund();
            None
        }
        tokens => tokens,
    };
    let sse = upstream
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    picked
        .metrics
        .record_request(model, upstream.status.as_u16());
    let body = GuardedBody::new(
        upstream_body,
        picked.guard,
        sse,
        state.settings.idle_timeout,
        Completion {
            metrics: picked.metrics,
            sent_at,
            clock: state.clock,
        },
    )
    .with_first_token_limit(state.settings.first_token_timeout)
    .with_permit(permit)
    .with_ticket(picked.ticket)
    .with_token_hold(tokens)
    .with_cut(state.cut.clone())
    .with_span(tracing::Span::current())
    // Only a stream that began well is carried on; an error answer passes as it is.
    .with_resume(resume.filter(|_| sse && upstream.status.is_success()));
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = upstream.status;
    headers::copy_response_headers(&upstream.headers, response.headers_mut());
    headers::set_routing_headers(
        response.headers_mut(),
        request_id,
        &picked.decision,
        picked.replica.authority(),
    );
    response
}

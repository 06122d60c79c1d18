//! Steps 4–5 of the request path: forward the bytes upstream, with bounded retries.
//!
//! Requests go through the shared pooled client of [`crate::upstream`].
//! An attempt that fails **before any response byte** (connect refused, reset, or a 502/503
//! status) is retried on another replica chosen by the same policy, at most `max_retries`
//! times; nothing has reached the client yet, so a retry is invisible to it. When no other
//! replica is left, a replica's own 502/503 answer passes through; refused connections end in
//! a 502 of the gateway's. A replica that sends no response headers within the first-byte
//! timeout is not retried (the request may be running there) and the client gets 504. Once headers arrive, the response is committed.
//! A shutdown whose drain deadline passes while an attempt still waits for its headers ends
//! the wait with 503 `gateway_shutting_down` (the upstream request is dropped, so cancelled).
//!
//! What every attempt sends (method, path, headers, body) is prepared once ([`Outgoing`]),
//! and a retry routes with the prompt's block hashes taken back from the failed attempt, so
//! a retry neither rebuilds the headers nor hashes the prompt again. A replica whose
//! connection was refused is also taken out of the prefix index for this prompt
//! ([`router_core::Router::forget_placement`]): the decision recorded it there, as AIBrix
//! records every decision, but nothing reached it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;

use bytes::Bytes;
use http::request::Parts;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use router_core::text::RoutingFields;
use router_core::{Session, Strategy};
use tokio::time::Instant;

use crate::replicas::{HealthChange, Replica};
use crate::request::error::GatewayError;
use crate::request::headers;
use crate::request::headers::SessionHeaders;
use crate::request::pick::{Picked, Skip, pick};
use crate::state::AppState;
use crate::telemetry::{propagation, span};
use crate::upstream::describe;
use tracing::Instrument;

/// A response whose headers arrived, with the pick it came from.
#[derive(Debug)]
pub struct Forwarded {
    pub response: Response<Incoming>,
    pub picked: Picked,
    pub sent_at: Instant,
}

/// Why one attempt failed.
#[derive(Debug)]
enum AttemptError {
    /// Before any response byte; another replica may be tried.
    Retryable { reason: String, connect: bool },
    /// No response headers in time.
    Timeout,
    /// The shutdown's drain deadline passed first.
    Cut,
}

/// What every attempt of one request sends upstream, prepared once.
#[derive(Debug, Clone)]
pub struct Outgoing {
    method: Method,
    /// The client's path and query, shared (not copied) by every attempt.
    path_and_query: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
}

impl Outgoing {
    pub fn prepare(parts: &Parts, body: Bytes, request_id: &HeaderValue) -> Self {
        let client = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip());
        Outgoing {
            method: parts.method.clone(),
            path_and_query: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
            headers: headers::upstream_request_headers(&parts.headers, request_id, client),
            body,
        }
    }

    /// The same request with another body (a resumed stream's continuation).
    pub fn with_body(&self, body: Bytes) -> Self {
        Outgoing {
            body,
            ..self.clone()
        }
    }

    /// The headers for one attempt: the last one takes the prepared map, earlier ones a
    /// copy, so that a retry finds it whole.
    fn headers_for(&mut self, last: bool) -> HeaderMap {
        if last {
            std::mem::take(&mut self.headers)
        } else {
            self.headers.clone()
        }
    }
}

/// Picks a replica and forwards the prepared request, retrying another replica on early
/// failures; never to the replicas named in `avoid` (those that failed a resumed stream).
pub async fn forward(
    state: &AppState,
    strategy: Strategy,
    fields: &RoutingFields,
    tokens: Option<&[u8]>,
    mut outgoing: Outgoing,
    avoid: &[String],
) -> Result<Forwarded, GatewayError> {
    let max_attempts = state.settings.max_retries.saturating_add(1);
    let mut tried: Vec<Arc<Replica>> = Vec::new();
    // The prompt's block hashes, taken back from a failed attempt's decision for the next.
    let mut hashes: Option<Vec<u64>> = None;
    // What each failed attempt met, in order ("a: connection refused; b: answered 503").
    let mut failures = String::new();
    // A 502/503 answer kept in case no other replica can be tried: passing the replica's own
    // answer through says more than a gateway error would.
    let mut refused: Option<Forwarded> = None;
    // Owned: the session names the header map's values, and the last attempt takes the map.
    let session_headers = SessionHeaders::of(&outgoing.headers);
    let session = session_headers.session();
    for attempt in 1..=max_attempts {
        let next = pick_next(
            state,
            strategy,
            fields,
            tokens,
            hashes.take(),
            session,
            Skip {
                tried: &tried,
                failed_streams: avoid,
            },
        );
        let Some(mut picked) = next? else { break };
        let sent_at = Instant::now();
        let replica = Arc::clone(&picked.replica);
        // Borrowed, not copied: the name is only needed when the attempt fails.
        let pod = replica.name();
        let headers = outgoing.headers_for(attempt == max_attempts);
        match traced_send(state, &picked, &outgoing, headers, attempt).await {
            Ok(response) if is_retryable_status(response.status()) => {
                note_failure(
                    &mut failures,
                    format_args!("{pod} answered {}", response.status()),
                );
                hashes = Some(std::mem::take(&mut picked.decision.prefix_hashes));
                refused = Some(Forwarded {
                    response,
                    picked,
                    sent_at,
                });
            }
            Ok(response) => {
                return Ok(Forwarded {
                    response,
                    picked,
                    sent_at,
                });
            }
            Err(AttemptError::Timeout) => return Err(first_byte_timeout(state, pod)),
            // Returning drops `picked`: the pod's outstanding count is released.
            Err(AttemptError::Cut) => return Err(GatewayError::ShuttingDown { pod: pod.into() }),
            Err(AttemptError::Retryable { reason, connect }) => {
                if connect {
                    refused_connection(state, &replica, &fields.model, &picked);
                }
                note_failure(&mut failures, format_args!("{pod}: {reason}"));
                hashes = Some(std::mem::take(&mut picked.decision.prefix_hashes));
                // `picked` (and its outstanding guard) is dropped here: the pod is released.
            }
        }
        tracing::debug!(%pod, attempt, %failures, "upstream attempt failed");
        tried.push(replica);
    }
    refused.map_or_else(|| Err(unavailable(&fields.model, &tried, failures)), Ok)
}

/// The 502 of a request every attempt of which failed (`failures` says how, in order).
fn unavailable(model: &str, tried: &[Arc<Replica>], failures: String) -> GatewayError {
    GatewayError::UpstreamUnavailable {
        model: model.to_owned(),
        attempts: u32::try_from(tried.len()).unwrap_or(u32::MAX),
        failures,
    }
}

/// The next attempt's replica; `None` when every replica was tried (the failure is theirs,
/// not a lack of replicas). A retry is counted against the replica that failed the last.
fn pick_next(
    state: &AppState,
    strategy: Strategy,
    fields: &RoutingFields,
    tokens: Option<&[u8]>,
    hashes: Option<Vec<u64>>,
    session: Session<'_>,
    skip: Skip<'_>,
) -> Result<Option<Picked>, GatewayError> {
    let picked = match pick(state, strategy, fields, tokens, hashes, session, skip) {
        Ok(picked) => picked,
        Err(GatewayError::NoReadyReplica(_)) if !skip.tried.is_empty() => return Ok(None),
        Err(error) => return Err(error),
    };
    if let Some(failed) = skip.tried.last() {
        failed.metrics(&state.metrics).record_retry();
    }
    Ok(Some(picked))
}

/// One attempt in its own span: the decision recorded on the request's span, the attempt's
/// trace context sent upstream, its outcome noted.
async fn traced_send(
    state: &AppState,
    picked: &Picked,
    outgoing: &Outgoing,
    mut headers: HeaderMap,
    attempt: u32,
) -> Result<Response<Incoming>, AttemptError> {
    span::record_decision(&picked.decision);
    let attempt_span = span::attempt(picked.replica.name(), attempt);
    propagation::inject(&attempt_span, &mut headers);
    let sent = send(state, &picked.replica, outgoing, headers)
        .instrument(attempt_span.clone())
        .await;
    record_outcome(&attempt_span, &sent);
    sent
}

/// Notes how an attempt ended on its span: the status, or why it failed.
fn record_outcome(span: &tracing::Span, sent: &Result<Response<Incoming>, AttemptError>) {
    match sent {
        Ok(response) => span.record("outcome", response.status().as_u16()),
        Err(AttemptError::Retryable { reason, .. }) => span.record("outcome", reason.as_str()),
        Err(AttemptError::Timeout) => span.record("outcome", "first_byte_timeout"),
        Err(AttemptError::Cut) => span.record("outcome", "shutdown"),
    };
}

/// The 504 of a replica that sent no response headers within the first-byte timeout.
fn first_byte_timeout(state: &AppState, pod: &str) -> GatewayError {
    GatewayError::UpstreamTimeout {
        pod: pod.to_owned(),
        timeout_ms: u64::try_from(state.settings.first_byte_timeout.as_millis())
            .unwrap_or(u64::MAX),
    }
}

/// A replica refused the connection: nothing reached it, so the prefix index forgets that
/// it was sent this prompt, and the failure counts towards ejecting it.
fn refused_connection(state: &AppState, replica: &Replica, model: &str, picked: &Picked) {
    state
        .router
        .forget_placement(model, &picked.decision.prefix_hashes, replica.name());
    if replica.report_failure(state.settings.eject_after_failures) == HealthChange::Ejected {
        state.metrics.record_ejection(replica.name());
    }
}

/// Appends one attempt's failure to the list.
fn note_failure(failures: &mut String, failure: std::fmt::Arguments<'_>) {
    use std::fmt::Write as _;
    if !failures.is_empty() {
        failures.push_str("; ");
    }
    // Writing into a String cannot fail.
    let _ = failures.write_fmt(failure);
}

/// 502 and 503 from a replica mean it did not take the request (vLLM answers 503 while
/// starting or overloaded); other statuses are the replica's answer and pass through.
fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::BAD_GATEWAY || status == StatusCode::SERVICE_UNAVAILABLE
}

/// One attempt: the request to one replica, up to its response headers.
async fn send(
    state: &AppState,
    replica: &Replica,
    outgoing: &Outgoing,
    headers: HeaderMap,
) -> Result<Response<Incoming>, AttemptError> {
    // Built from parts: the client's path is shared, not copied, and only the authority is
    // parsed (no formatted string to parse again).
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(http::uri::Scheme::HTTP);
    uri.authority = Some(
        replica
            .authority()
            .parse()
            .map_err(|e| AttemptError::Retryable {
                reason: format!("bad replica address {:?}: {e}", replica.authority()),
                connect: false,
            })?,
    );
    uri.path_and_query = Some(outgoing.path_and_query.clone());
    let mut request = Request::builder()
        .method(outgoing.method.clone())
        .uri(uri)
        .body(Full::new(outgoing.body.clone()))
        .map_err(|e| AttemptError::Retryable {
            reason: format!("cannot build the upstream request: {e}"),
            connect: false,
        })?;
    *request.headers_mut() = headers;
    let answer = tokio::time::timeout(
        state.settings.first_byte_timeout,
        state.client.request(request),
    );
    // At the shutdown's cut the wait ends and the upstream request is dropped (cancelled),
    // so the client gets a 503 instead of a connection aborted a moment later.
    let answered = tokio::select! {
        biased;
        () = state.cut.cancelled() => return Err(AttemptError::Cut),
        answered = answer => answered,
    };
    match answered {
        Err(_elapsed) => Err(AttemptError::Timeout),
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => {
            let connect = error.is_connect();
            Err(AttemptError::Retryable {
                reason: describe(&error),
                connect,
            })
        }
    }
}

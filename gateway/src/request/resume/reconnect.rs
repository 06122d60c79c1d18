//! The HTTP front end's [`Reconnect`]: a continuation is routed through the router like any
//! request (its prompt, the original plus the text so far, is hashed, so a replica that
//! holds that prefix in its cache is preferred) among the replicas that have not failed this
//! request, and sent with the original request's headers and bounded pre-first-byte
//! retries ([`proxy::forward`]). Only a `2xx` SSE answer carries the stream on.

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use router_core::Strategy;
use router_core::text::{Endpoint, Text};

use crate::request::parse;
use crate::request::proxy::{self, Outgoing};
use crate::request::resume::{Reconnect, Reconnecting, Resumed};
use crate::state::AppState;
use crate::telemetry::span;
use tracing::Instrument;

/// What a continuation of one request is sent with.
#[derive(Debug)]
pub struct Reconnector {
    state: Arc<AppState>,
    strategy: Strategy,
    endpoint: Endpoint,
    /// The original request as sent upstream; each continuation swaps its body.
    outgoing: Outgoing,
    /// The replicas that failed this request's stream, in order.
    failed: Vec<String>,
    /// The request's span, each continuation's parent.
    span: tracing::Span,
}

impl Reconnector {
    pub fn new(
        state: Arc<AppState>,
        strategy: Strategy,
        endpoint: Endpoint,
        outgoing: Outgoing,
        span: tracing::Span,
    ) -> Self {
        Reconnector {
            state,
            strategy,
            endpoint,
            outgoing,
            failed: Vec::new(),
            span,
        }
    }
}

impl Reconnect<Incoming> for Reconnector {
    fn reconnect(&mut self, failed_pod: &str, body: Bytes) -> Reconnecting<Incoming> {
        self.failed.push(failed_pod.to_owned());
        let state = Arc::clone(&self.state);
        let (strategy, endpoint) = (self.strategy, self.endpoint);
        let outgoing = self.outgoing.with_body(body.clone());
        let avoid = self.failed.clone();
        let span = span::resume(&self.span, failed_pod);
        let continuation = async move {
            let fields = parse::fields(endpoint, &body, Text::Build).map_err(|e| e.to_string())?;
            let forwarded = proxy::forward(&state, strategy, &fields, None, outgoing, &avoid)
                .await
                .map_err(|e| e.to_string())?;
            let status = forwarded.response.status();
            forwarded
                .picked
                .metrics
                .record_request(&fields.model, status.as_u16());
            let pod = forwarded.picked.replica.name();
            let sse = forwarded
                .response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if !status.is_success() || !sse {
                return Err(format!(
                    "replica {pod} answered the continuation with {status}"
                ));
            }
            Ok(Resumed {
                body: forwarded.response.into_body(),
                picked: forwarded.picked,
                sent_at: forwarded.sent_at,
            })
        };
        Box::pin(continuation.instrument(span))
    }
}

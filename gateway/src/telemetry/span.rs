//! The spans of the request path, their names and attributes in one place.
//!
//! - `inference` (kind server): one per request; `http.route`, `request_id`, and the routing
//!   decision once made: `routing.policy`, `routing.pod`, `routing.selection`,
//!   `routing.match_percent`, `routing.outstanding` (the chosen pod's outstanding count at
//!   the decision). Events: `first_byte`, `resumed`.
//! - `upstream_attempt` (kind client): one per attempt, `pod` and `attempt`, and its
//!   `outcome` (the status, or why it failed). Its context is what the engine receives.
//! - `resume`: a continuation's routing and attempts after a mid-stream break, `failed_pod`.

use router_core::Decision;
use tracing::field::Empty;

/// The target of every span made here (the module's path), by which the log layer tells them
/// from other spans.
pub const TARGET: &str = module_path!();

/// The span of one inference request on `route`.
pub fn request(route: &str, request_id: &str) -> tracing::Span {
    tracing::info_span!(
        "inference",
        otel.kind = "server",
        http.route = route,
        request_id,
        routing.policy = Empty,
        routing.pod = Empty,
        routing.selection = Empty,
        routing.match_percent = Empty,
        routing.outstanding = Empty,
    )
}

/// The span of a resume's continuation, a child of the request's.
pub fn resume(request: &tracing::Span, failed_pod: &str) -> tracing::Span {
    tracing::info_span!(
        parent: request,
        "resume",
        failed_pod,
        routing.policy = Empty,
        routing.pod = Empty,
        routing.selection = Empty,
        routing.match_percent = Empty,
        routing.outstanding = Empty,
    )
}

/// The span of one upstream attempt, a child of the current span.
pub fn attempt(pod: &str, attempt: u32) -> tracing::Span {
    tracing::info_span!(
        "upstream_attempt",
        otel.kind = "client",
        pod,
        attempt,
        outcome = Empty,
    )
}

/// Records `decision` on the current span (the request's, or a resume's).
pub fn record_decision(decision: &Decision) {
    let span = tracing::Span::current();
    span.record("routing.policy", decision.strategy.as_str());
    span.record("routing.pod", decision.pod_name.as_str());
    if let Some(selection) = decision.selection {
        span.record("routing.selection", selection.as_str());
    }
    if let Some(percent) = decision.match_percent {
        span.record("routing.match_percent", percent);
    }
    span.record("routing.outstanding", decision.outstanding_at_selection);
}

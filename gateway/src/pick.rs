//! Step 3 of the request path: choose a replica through router-core.
//!
//! The strategy comes from the `routing-strategy` header or the configured default
//! (embeddings always use `least-request`: they have no prefix to reuse). The candidates are
//! the ready replicas serving the model, taken from the current snapshot without a lock; the
//! router counts the request against the chosen pod atomically and returns the guard that
//! the response body will hold. Prefix-cache decisions move the AIBrix counters here.

use std::sync::Arc;
use std::time::Instant;

use http::HeaderMap;
use router_core::text::{Endpoint, RoutingFields};
use router_core::{Candidate, Decision, OutstandingGuard, RouteError, RouteRequest, Strategy};

use crate::app::AppState;
use crate::error::GatewayError;
use crate::headers::ROUTING_STRATEGY;
use crate::replicas::Replica;

/// A chosen replica, the decision that chose it, and the request's hold on it.
#[derive(Debug)]
pub struct Picked {
    pub replica: Arc<Replica>,
    pub decision: Decision,
    pub guard: OutstandingGuard,
}

/// The strategy for a request: the header's (validated), else `default`.
pub fn strategy(
    headers: &HeaderMap,
    default: Strategy,
    endpoint: Endpoint,
) -> Result<Strategy, GatewayError> {
    let requested = match headers.get(&ROUTING_STRATEGY) {
        None => default,
        Some(value) => {
            let text = value.to_str().map_err(|_| {
                GatewayError::UnknownStrategy(
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })?;
            text.trim()
                .parse()
                .map_err(|_| GatewayError::UnknownStrategy(text.to_owned()))?
        }
    };
    Ok(match endpoint {
        Endpoint::Embeddings => Strategy::LeastRequest,
        Endpoint::ChatCompletions | Endpoint::Completions => requested,
    })
}

/// Chooses a ready replica for `fields.model`, skipping the replicas named in `exclude`
/// (those already tried for this request).
pub fn pick(
    state: &AppState,
    strategy: Strategy,
    fields: &RoutingFields,
    exclude: &[Arc<Replica>],
) -> Result<Picked, GatewayError> {
    let snapshot = state.replicas.snapshot();
    let serving: Vec<&Arc<Replica>> = snapshot
        .iter()
        .filter(|r| r.serves(&fields.model))
        .collect();
    if serving.is_empty() {
        return Err(GatewayError::UnknownModel(fields.model.clone()));
    }
    let ready: Vec<&Arc<Replica>> = serving
        .into_iter()
        .filter(|r| r.is_ready() && !exclude.iter().any(|x| Arc::ptr_eq(x, r)))
        .collect();
    if ready.is_empty() {
        return Err(GatewayError::NoReadyReplica(fields.model.clone()));
    }
    let candidates: Vec<Candidate<'_>> = ready
        .iter()
        .map(|r| Candidate {
            name: r.name(),
            load: r.load(),
        })
        .collect();
    let request = RouteRequest {
        model: &fields.model,
        text: &fields.text,
    };
    let started = Instant::now();
    let routed = state.router.route(
        strategy,
        &request,
        &candidates,
        &mut rand::rng(),
        state.clock.now_ms(),
    );
    let latency = started.elapsed();
    match routed {
        Ok(routed) => {
            state
                .metrics
                .record_decision(&fields.model, &routed.decision, latency);
            let replica = Arc::clone(ready[routed.decision.pod]);
            Ok(Picked {
                replica,
                decision: routed.decision,
                guard: routed.guard,
            })
        }
        Err(RouteError::NoReadyPod(model)) => Err(GatewayError::NoReadyReplica(model)),
        Err(RouteError::Tokenize(error)) => {
            if strategy.uses_prefix_index() {
                state
                    .metrics
                    .record_routing_error(&fields.model, "tokenize_failed", latency);
            }
            Err(GatewayError::Routing(error.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(ROUTING_STRATEGY, value.parse().unwrap());
        headers
    }

    #[test]
    fn header_overrides_the_default() {
        let s = strategy(
            &with_header("prefix-cache"),
            Strategy::Random,
            Endpoint::ChatCompletions,
        );
        assert_eq!(s.unwrap(), Strategy::PrefixCache);
        let s = strategy(&HeaderMap::new(), Strategy::Random, Endpoint::Completions);
        assert_eq!(s.unwrap(), Strategy::Random);
    }

    #[test]
    fn unknown_strategy_is_a_400_even_for_embeddings() {
        for endpoint in [Endpoint::ChatCompletions, Endpoint::Embeddings] {
            let error = strategy(&with_header("fastest"), Strategy::Random, endpoint).unwrap_err();
            assert_eq!(error, GatewayError::UnknownStrategy("fastest".into()));
        }
    }

    #[test]
    fn embeddings_use_least_request() {
        let s = strategy(
            &with_header("prefix-cache"),
            Strategy::Random,
            Endpoint::Embeddings,
        );
        assert_eq!(s.unwrap(), Strategy::LeastRequest);
    }
}

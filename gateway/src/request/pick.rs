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
use router_core::{Candidate, Decision, InFlight, RouteError, RouteRequest, Session, Strategy};

use crate::cluster::SharedTicket;
use crate::metrics::PodMetrics;
use crate::replicas::Replica;
use crate::request::error::GatewayError;
use crate::request::headers::ROUTING_STRATEGY;
use crate::state::AppState;

/// A chosen replica, the decision that chose it, and the request's hold on it.
#[derive(Debug)]
pub struct Picked {
    pub replica: Arc<Replica>,
    /// The replica's metric series.
    pub metrics: Arc<PodMetrics>,
    pub decision: Decision,
    pub guard: InFlight,
    /// The request's messages to the other gateways (cluster sharing): its release goes
    /// out when this drops, so it travels with the guard.
    pub ticket: Option<SharedTicket>,
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

/// The replicas a request must not be sent to: those already tried for it (by identity)
/// and those named as having failed its resumed stream (by name: a failed replica may have
/// left the set since).
#[derive(Debug, Clone, Copy, Default)]
pub struct Skip<'a> {
    pub tried: &'a [Arc<Replica>],
    pub failed_streams: &'a [String],
}

impl Skip<'_> {
    fn keeps(&self, replica: &Arc<Replica>) -> bool {
        !self.tried.iter().any(|x| Arc::ptr_eq(x, replica))
            && !self
                .failed_streams
                .iter()
                .any(|name| name == replica.name())
    }
}

/// Chooses a ready replica for `fields.model`, skipping those `skip` names. `tokens`, with
/// KV-event sync, is the prompt as the engine tokenized it (4-byte big-endian ids), hashed
/// instead of the text. `hashes`, on a retry, are the prompt's block hashes from the failed
/// attempt's decision, routed with instead of hashing the prompt again. `session` is the
/// session the request names (its `x-session-id` and `x-aibrix-session-key`).
pub fn pick(
    state: &AppState,
    strategy: Strategy,
    fields: &RoutingFields,
    tokens: Option<&[u8]>,
    hashes: Option<Vec<u64>>,
    session: Session<'_>,
    skip: Skip<'_>,
) -> Result<Picked, GatewayError> {
    pick_among(
        state,
        strategy,
        fields,
        tokens,
        hashes,
        session,
        &|replica| skip.keeps(replica),
    )
}

/// [`pick`] among the ready replicas of the model that `eligible` keeps (the subset an
/// Envoy endpoint picker is told to pick from, the replicas not tried yet).
pub fn pick_among(
    state: &AppState,
    strategy: Strategy,
    fields: &RoutingFields,
    tokens: Option<&[u8]>,
    hashes: Option<Vec<u64>>,
    session: Session<'_>,
    eligible: &dyn Fn(&Arc<Replica>) -> bool,
) -> Result<Picked, GatewayError> {
    let snapshot = state.replicas.snapshot();
    let candidates = candidates(&snapshot, &fields.model, eligible)?;
    let request = RouteRequest {
        model: &fields.model,
        text: &fields.text,
        tokens,
        session,
        // A `max_tokens` that is no count gives its stream no clock (the replica refuses it).
        max_tokens: fields.max_tokens.as_ref().ok().copied().flatten(),
    };
    let started = Instant::now();
    let routed = state.router.route_with_hashes(
        strategy,
        &request,
        hashes,
        &candidates,
        &mut rand::rng(),
        state.clock.now_ms(),
    );
    let latency = started.elapsed();
    match routed {
        Ok(routed) => {
            // The decision indexes `candidates`; the replica is the one owning that load view
            // (found by identity, not by re-reading readiness, which may have changed since).
            // Always found: the candidates are this snapshot's.
            let chosen = candidates.get(routed.decision.pod).map(|c| c.load);
            let Some(replica) = snapshot
                .iter()
                .find(|r| chosen.is_some_and(|load| Arc::ptr_eq(r.load(), load)))
                .map(Arc::clone)
            else {
                return Err(GatewayError::NoReadyReplica(fields.model.clone()));
            };
            let metrics = replica.metrics(&state.metrics);
            metrics.record_decision(&fields.model, &routed.decision, latency);
            let ticket = state
                .cluster
                .as_ref()
                .map(|cluster| cluster.decided(&fields.model, &routed.decision, &routed.guard));
            Ok(Picked {
                replica,
                metrics,
                decision: routed.decision,
                guard: routed.guard,
                ticket,
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

/// The ready, eligible replicas serving `model`, as the router sees them. One pass and one
/// vector: this runs for every request, and the chosen replica is found again by its load
/// view rather than kept in a second vector.
fn candidates<'s>(
    snapshot: &'s [Arc<Replica>],
    model: &str,
    eligible: &dyn Fn(&Arc<Replica>) -> bool,
) -> Result<Vec<Candidate<'s>>, GatewayError> {
    let mut serving = false;
    let mut candidates: Vec<Candidate<'_>> = Vec::with_capacity(snapshot.len());
    for replica in snapshot.iter().filter(|r| r.serves(model)) {
        serving = true;
        if replica.is_ready() && eligible(replica) {
            candidates.push(Candidate {
                name: replica.name(),
                address: replica.authority(),
                load: replica.load(),
            });
        }
    }
    if !serving {
        // A replica whose models are not known yet (its /v1/models has not answered) may
        // serve the model: "not found" is only said when every replica has answered, since
        // clients take a 404 as permanent and a 503 as "try again".
        if snapshot.iter().any(|r| r.models().is_empty()) {
            return Err(GatewayError::NoReadyReplica(model.to_owned()));
        }
        return Err(GatewayError::UnknownModel(model.to_owned()));
    }
    if candidates.is_empty() {
        return Err(GatewayError::NoReadyReplica(model.to_owned()));
    }
    Ok(candidates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(replicas: Vec<Arc<Replica>>) -> AppState {
        AppState::for_tests(replicas)
    }

    fn fields(model: &str) -> RoutingFields {
        router_core::text::routing_fields(
            Endpoint::Completions,
            format!(r#"{{"model":"{model}","prompt":"hi"}}"#).as_bytes(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn picks_only_ready_untried_replicas_of_the_model_and_counts_against_them() {
        let other = Arc::new(Replica::new("other", "127.0.0.1:1", vec!["x".into()]));
        let down = Arc::new(Replica::new("down", "127.0.0.1:2", vec!["m".into()]));
        let a = Arc::new(Replica::new("a", "127.0.0.1:3", vec!["m".into()]));
        let b = Arc::new(Replica::new("b", "127.0.0.1:4", vec!["m".into()]));
        down.report_failure(1);
        let state = state(vec![other, down, a.clone(), b.clone()]);
        let mut held = Vec::new();
        for _ in 0..6 {
            let picked = pick(
                &state,
                Strategy::LeastRequest,
                &fields("m"),
                None,
                None,
                Session::default(),
                Skip::default(),
            )
            .unwrap();
            // The replica handed back is the one the decision names and counts against.
            assert_eq!(picked.replica.name(), picked.decision.pod_name);
            assert!(["a", "b"].contains(&picked.replica.name()));
            held.push(picked);
        }
        assert_eq!((a.load().outstanding(), b.load().outstanding()), (3, 3));
        let only_b = pick(
            &state,
            Strategy::Random,
            &fields("m"),
            None,
            None,
            Session::default(),
            Skip {
                tried: std::slice::from_ref(&a),
                failed_streams: &[],
            },
        )
        .unwrap();
        assert_eq!(only_b.replica.name(), "b");
        let failed_on_a = ["a".to_owned()];
        let not_a = pick(
            &state,
            Strategy::Random,
            &fields("m"),
            None,
            None,
            Session::default(),
            Skip {
                tried: &[],
                failed_streams: &failed_on_a,
            },
        )
        .unwrap();
        assert_eq!(
            not_a.replica.name(),
            "b",
            "a replica that failed the stream is skipped"
        );
        let error = pick(
            &state,
            Strategy::Random,
            &fields("m"),
            None,
            None,
            Session::default(),
            Skip {
                tried: &[a, b],
                failed_streams: &[],
            },
        )
        .unwrap_err();
        assert!(
            matches!(error, GatewayError::NoReadyReplica(_)),
            "{error:?}"
        );
        let error = pick(
            &state,
            Strategy::Random,
            &fields("y"),
            None,
            None,
            Session::default(),
            Skip::default(),
        )
        .unwrap_err();
        assert!(matches!(error, GatewayError::UnknownModel(_)), "{error:?}");
    }

    #[tokio::test]
    async fn a_model_is_not_unknown_while_a_replica_s_models_are() {
        // A static backend without a configured model that was down at start: its models
        // are not known, so the model may be its; 503 (try again), not 404 (give up).
        let cold = Arc::new(Replica::new("cold", "127.0.0.1:1", vec![]));
        cold.report_failure(1);
        let state = state(vec![Arc::clone(&cold)]);
        let error = pick(
            &state,
            Strategy::Random,
            &fields("m"),
            None,
            None,
            Session::default(),
            Skip::default(),
        )
        .unwrap_err();
        assert!(
            matches!(error, GatewayError::NoReadyReplica(_)),
            "{error:?}"
        );
        assert!(!state.replicas.any_ready(), "nothing can be served yet");
        cold.set_models(vec!["m".into()]);
        cold.report_success(1);
        assert!(state.replicas.any_ready());
        let error = pick(
            &state,
            Strategy::Random,
            &fields("other"),
            None,
            None,
            Session::default(),
            Skip::default(),
        )
        .unwrap_err();
        assert!(matches!(error, GatewayError::UnknownModel(_)), "{error:?}");
    }

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

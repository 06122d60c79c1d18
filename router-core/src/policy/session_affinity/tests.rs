//! `session-affinity` through the router: AIBrix's resolution order and fallback.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::load::PodLoad;
use crate::{RouteRequest, Router, RouterConfig, Strategy};

pub(crate) const ADDRESSES: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

/// Pods at `addresses`, named by them, with `loads`.
pub(crate) fn pods<'a>(addresses: &'a [&'a str], loads: &'a [Arc<PodLoad>]) -> Vec<Candidate<'a>> {
    addresses
        .iter()
        .zip(loads)
        .map(|(&address, load)| Candidate {
            name: address,
            address,
            load,
        })
        .collect()
}

/// The pod `session-affinity` routes a request with `session` to, on a router of its own.
fn routed_to(session: Session<'_>, pods: &[Candidate<'_>], seed: u64) -> String {
    let router = Router::new(RouterConfig::default()).unwrap();
    let request = RouteRequest {
        model: "m",
        text: "hello",
        tokens: None,
        session,
        max_tokens: None,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let routed = router
        .route(Strategy::SessionAffinity, &request, pods, &mut rng, 0)
        .unwrap();
    routed.decision.pod_name
}

fn key(key: &[u8]) -> Session<'_> {
    Session {
        id: None,
        key: Some(key),
    }
}

#[test]
fn the_same_key_lands_on_the_same_pod_its_rendezvous_names() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let pods = pods(&ADDRESSES, &loads);
    // rendezvous.rs: "session-42" scores highest on 10.0.0.3:8000.
    for seed in 0..20 {
        assert_eq!(routed_to(key(b"session-42"), &pods, seed), "10.0.0.3:8000");
    }
    // Loads do not matter: session-affinity is not load-aware (as AIBrix's is not).
    let _held: Vec<_> = (0..5).map(|_| loads[2].acquire()).collect();
    assert_eq!(routed_to(key(b"session-42"), &pods, 99), "10.0.0.3:8000");
}

#[test]
fn a_key_whose_pod_is_not_ready_moves_to_the_next_by_rendezvous() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let ready = pods(&ADDRESSES[..2], &loads[..2]);
    // Without 10.0.0.3, the highest of the other two scores: 10.0.0.2 (0xc904… > 0x273b…).
    for seed in 0..10 {
        assert_eq!(routed_to(key(b"session-42"), &ready, seed), "10.0.0.2:8000");
    }
}

#[test]
fn a_session_id_naming_a_ready_pod_wins_over_the_key() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let pods = pods(&ADDRESSES, &loads);
    let id = session_id::encode("10.0.0.1:8000");
    let both = Session {
        id: Some(id.as_bytes()),
        key: Some(b"session-42"),
    };
    for seed in 0..10 {
        assert_eq!(routed_to(both, &pods, seed), "10.0.0.1:8000");
    }
    // An id naming no ready pod, or not base64 at all, is ignored: the key decides.
    for id in [session_id::encode("10.0.0.9:8000"), "%%%".to_owned()] {
        let stale = Session {
            id: Some(id.as_bytes()),
            key: Some(b"session-42"),
        };
        assert_eq!(routed_to(stale, &pods, 1), "10.0.0.3:8000");
    }
}

#[test]
fn no_session_or_an_oversized_key_is_routed_at_random() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let pods = pods(&ADDRESSES, &loads);
    let long = vec![b'k'; MAX_SESSION_KEY_BYTES + 1];
    let longest = vec![b'k'; MAX_SESSION_KEY_BYTES];
    let landed = |session: Session<'_>| {
        (0..60)
            .map(|seed| routed_to(session, &pods, seed))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    assert_eq!(landed(Session::default()), 3);
    assert_eq!(
        landed(key(&long)),
        3,
        "a 257-byte key is ignored, as AIBrix does"
    );
    assert_eq!(landed(key(b"")), 3, "an empty key is no key");
    assert_eq!(landed(key(&longest)), 1, "a 256-byte key is honoured");
}

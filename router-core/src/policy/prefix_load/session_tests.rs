//! `prefix-load`'s session term and its spread among near-equal pods, through the router.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::load::{Candidate, InFlight, PodLoad, RequestWork};
use crate::policy::Session;
use crate::policy::session_affinity::{self, session_id};
use crate::{RouteRequest, Router, RouterConfig, Strategy};

/// rendezvous.rs: this key lands on 10.0.0.3:8000 among the three.
const KEY: &[u8] = b"session-42";

fn router(session_held_share: f64) -> Router {
    let mut config = RouterConfig {
        block_size: 4,
        ..RouterConfig::default()
    };
    config.prefix_load.session_held_share = session_held_share;
    Router::new(config).unwrap()
}

fn pods(loads: &[Arc<PodLoad>]) -> Vec<Candidate<'_>> {
    session_affinity::tests::pods(&session_affinity::tests::ADDRESSES, loads)
}

/// `requests` answered requests of `blocks` prompt blocks each on `load`.
fn busy(load: &Arc<PodLoad>, requests: usize, blocks: u64) -> Vec<InFlight> {
    (0..requests)
        .map(|_| {
            let mut guard = load.acquire_work(RequestWork {
                blocks,
                prefill_blocks: blocks,
                shared_prefix: None,
                copies_prefix: false,
                max_tokens: None,
            });
            guard.first_byte(0);
            guard
        })
        .collect()
}

/// Where `prefix-load` sends a 40-block prompt (160 bytes, unknown to the index) of
/// `session`.
fn routed_to(router: &Router, session: Session<'_>, pods: &[Candidate<'_>]) -> String {
    let text = "t".repeat(160);
    let request = RouteRequest {
        model: "m",
        text: &text,
        tokens: None,
        session,
        max_tokens: None,
    };
    let mut rng = StdRng::seed_from_u64(7);
    let routed = router
        .route(Strategy::PrefixLoad, &request, pods, &mut rng, 0)
        .unwrap();
    routed.decision.pod_name
}

fn keyed() -> Session<'static> {
    Session {
        id: None,
        key: Some(KEY),
    }
}

#[test]
fn a_session_stays_on_its_pod_while_that_pod_has_room() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let _work = busy(&loads[2], 1, 20);
    let pods = pods(&loads);
    // Its pod is busier than two idle pods, but its cache (0.8 of the prompt: 8 of 40 blocks
    // to prefill, 5 × 8 + 20 = 60) beats an idle pod's whole prefill (2 × 40 = 80).
    assert_eq!(routed_to(&router(0.8), keyed(), &pods), "10.0.0.3:8000");
    // Without the term, or without a session, an idle pod takes it.
    assert_ne!(routed_to(&router(0.0), keyed(), &pods), "10.0.0.3:8000");
    assert_ne!(
        routed_to(&router(0.8), Session::default(), &pods),
        "10.0.0.3:8000"
    );
}

#[test]
fn a_session_moves_when_its_pod_has_no_room() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    // 4 × 40 active blocks: 5 × 8 + 160 = 200 there, against 80 on an idle pod.
    let _work = busy(&loads[2], 4, 40);
    let pods = pods(&loads);
    assert_ne!(routed_to(&router(0.8), keyed(), &pods), "10.0.0.3:8000");
}

#[test]
fn the_session_id_names_the_pod_before_the_key() {
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let work: Vec<_> = loads.iter().flat_map(|load| busy(load, 1, 20)).collect();
    let pods = pods(&loads);
    let id = session_id::encode("10.0.0.1:8000");
    let both = Session {
        id: Some(id.as_bytes()),
        key: Some(KEY),
    };
    assert_eq!(routed_to(&router(0.8), both, &pods), "10.0.0.1:8000");
    drop(work);
}

#[test]
fn a_burst_of_new_prompts_spreads_over_equal_pods() {
    // Six prompts nobody holds, arriving at once on three idle pods: each decision counts
    // against its pod at once, so no pod takes a second before each has one.
    let router = router(0.8);
    let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
    let pods = pods(&loads);
    let mut rng = StdRng::seed_from_u64(11);
    let held: Vec<_> = (0..6)
        .map(|n| {
            let text = format!("{n:04}").repeat(40);
            let request = RouteRequest {
                model: "m",
                text: &text,
                tokens: None,
                session: Session::default(),
                max_tokens: None,
            };
            router
                .route(Strategy::PrefixLoad, &request, &pods, &mut rng, 0)
                .unwrap()
        })
        .collect();
    let counts: Vec<u64> = loads.iter().map(|load| load.outstanding()).collect();
    assert_eq!(counts, [2, 2, 2]);
    drop(held);
}

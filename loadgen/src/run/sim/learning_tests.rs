//! The simulator teaches the router what the gateway's responses would: each engine's
//! `cached_tokens`, as vLLM reports them (absent when nothing hit), reach the pod's load view
//! when a routed request ends (docs/ROUTING.md, "Learning from responses").

use mock_engine::model::EngineProfile;
use rand::SeedableRng;
use rand::rngs::StdRng;
use router_core::Strategy;
use router_core::load::CacheTrust;

use super::cluster::{Arrival, SimCluster, Target};
use super::options::SimOptions;
use crate::workload::{PlannedRequest, Prompt};

fn cluster(kv_sync: bool) -> SimCluster {
    let mut options = SimOptions::seed_like(EngineProfile::builtin("l20-qwen27b-fp8").unwrap());
    options.kv_sync = kv_sync;
    options.cluster(StdRng::seed_from_u64(1)).unwrap()
}

fn arrival(index: usize, at: f64, text: &str, target: Target) -> Arrival {
    Arrival {
        request: PlannedRequest {
            index,
            family: 0,
            at,
            prompt: Prompt::Text(text.to_owned()),
            max_tokens: 4,
        },
        target,
    }
}

fn trust(cluster: &SimCluster, replica: usize) -> CacheTrust {
    cluster.gateways().get(0).unwrap().loads[replica].cache_trust()
}

/// Replica 1 is warmed straight through its engine (the router never sees it); then a
/// request of the same family is routed onto it, and one with nothing in common.
fn warm_then_route(cluster: &mut SimCluster) {
    let family = "the quick brown fox jumps over the lazy dog ".repeat(100);
    let served = cluster
        .drive(
            vec![
                arrival(0, 0.0, &format!("{family} first"), Target::Direct(1)),
                arrival(
                    1,
                    5.0,
                    &format!("{family} second"),
                    Target::RoutedOnto(Strategy::PrefixLoad, 1),
                ),
                arrival(
                    2,
                    10.0,
                    &"a prompt of its own, shared with nobody ".repeat(100),
                    Target::RoutedOnto(Strategy::PrefixLoad, 1),
                ),
            ],
            None,
        )
        .unwrap();
    assert!(served.iter().all(|s| s.engine == 1));
    let cached = |i: usize| served[i].record.usage.unwrap().cached_tokens.unwrap();
    assert!(cached(1) >= 880, "the warm family hit: {}", cached(1));
    assert_eq!(cached(2), 0);
}

#[test]
fn a_warm_replica_the_index_never_saw_teaches_its_hit() {
    let mut cluster = cluster(false);
    assert_eq!(trust(&cluster, 1), CacheTrust::default());
    warm_then_route(&mut cluster);
    let learned = trust(&cluster, 1);
    // The family's blocks were there though the index credited none to replica 1; the
    // second prompt confirmed its (empty) belief, and its nothing-hit answer carried no
    // cached_tokens, read as 0 because replica 1 had reported them before.
    assert_eq!(learned.held, 1.0);
    assert!(
        (0.3..0.6).contains(&learned.unheld),
        "about one prompt's worth of two: {learned:?}"
    );
    assert_eq!(
        trust(&cluster, 0),
        CacheTrust::default(),
        "replica 0 taught nothing"
    );
    assert_eq!(
        cluster.router().config().prefix_load.learn_weight,
        1.0,
        "the default"
    );
}

#[test]
fn with_kv_event_sync_the_index_sees_the_engines_and_nothing_is_applied() {
    let mut cluster = cluster(true);
    warm_then_route(&mut cluster);
    assert_eq!(cluster.router().config().prefix_load.learn_weight, 0.0);
}

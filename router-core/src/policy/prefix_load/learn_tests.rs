//! `prefix-load` reads what the engines' `cached_tokens` taught about each pod
//! (`learn_weight`), and `prefix-cache`, the A/B reference, does not.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::load::{Candidate, PodLoad, RequestWork, Usage, Verdict};
use crate::{RouteRequest, Router, RouterConfig, Strategy};

/// Ten 4-byte blocks per prompt.
fn router(learn_weight: f64) -> Router {
    let mut config = RouterConfig {
        block_size: 4,
        ..RouterConfig::default()
    };
    config.prefix_load.learn_weight = learn_weight;
    Router::new(config).unwrap()
}

/// A request to `load` that the index believed fully cached there (10 of 10 blocks) ends
/// with the engine reporting `cached` of 40 prompt tokens.
fn respond(load: &Arc<PodLoad>, cached: Option<u64>) -> Option<Verdict> {
    let mut flight = load.decide(
        RequestWork {
            blocks: 10,
            prefill_blocks: 0,
            shared_prefix: None,
            copies_prefix: false,
            max_tokens: None,
        },
        0,
    );
    flight.first_byte(10);
    flight.end(
        20,
        Some(Usage {
            prompt_tokens: 40,
            cached_tokens: cached,
            completion_tokens: 4,
        }),
    )
}

/// Which pod `strategy` sends `text` to, with pod a carrying 40 blocks of work already.
fn choose(router: &Router, strategy: Strategy, text: &str, a: &Arc<PodLoad>) -> String {
    let b = PodLoad::new();
    let _busy = a.acquire_work(RequestWork {
        blocks: 40,
        prefill_blocks: 0,
        shared_prefix: None,
        copies_prefix: false,
        max_tokens: None,
    });
    let pods = [
        Candidate {
            name: "a",
            address: "a",
            load: a,
        },
        Candidate {
            name: "b",
            address: "b",
            load: &b,
        },
    ];
    let request = RouteRequest {
        model: "m",
        text,
        tokens: None,
        session: Default::default(),
        max_tokens: None,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let routed = router
        .route(strategy, &request, &pods, &mut rng, 0)
        .unwrap();
    routed.decision.pod_name
}

#[test]
fn a_replica_that_lost_what_the_index_believes_is_trusted_less_by_prefix_load_only() {
    let family = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
    for learn_weight in [1.0, 0.0] {
        let router = router(learn_weight);
        let hashes = router.hashes(family).unwrap();
        assert_eq!(hashes.len(), 10);
        let a = PodLoad::new();
        // The index believes pod a holds the family (say an earlier request went there).
        router.record_placement("m", &hashes, "a", None, 0);
        // a carries 40 blocks of work; b would prefill 10 blocks at weight 5: a hit on a
        // (cost 40) beats a cold prefill on b (50).
        assert_eq!(choose(&router, Strategy::PrefixLoad, family, &a), "a");
        // a's engine confirms a hit, then is restarted: the next prompt the index believed
        // whole there hit nothing (vLLM's null details, read as 0 once a reported them).
        assert_eq!(respond(&a, Some(36)), Some(Verdict::Confirmed));
        assert_eq!(respond(&a, None), Some(Verdict::Missed));
        // The index is unchanged: a still holds the family's blocks as far as it knows.
        let names = ["a"];
        assert_eq!(router.index().match_blocks("m", &hashes, &names), [10]);
        // prefix-cache reads the index alone: the best match, whatever a's responses said.
        assert_eq!(choose(&router, Strategy::PrefixCache, family, &a), "a");
        let expected = if learn_weight > 0.0 { "b" } else { "a" };
        assert_eq!(
            choose(&router, Strategy::PrefixLoad, family, &a),
            expected,
            "learn_weight {learn_weight}: a's believed hit is worth about half now"
        );
    }
}

#[test]
fn a_replica_holding_what_the_index_never_credited_is_trusted_more() {
    let family = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
    let router = router(1.0);
    let b = PodLoad::new();
    // b's engine reported a 36-token hit on a prompt the index thought cold there (warm-up
    // sent straight to the engine, say).
    let mut flight = b.decide(
        RequestWork {
            blocks: 10,
            prefill_blocks: 10,
            shared_prefix: None,
            copies_prefix: false,
            max_tokens: None,
        },
        0,
    );
    flight.first_byte(10);
    let verdict = flight.end(
        20,
        Some(Usage {
            prompt_tokens: 40,
            cached_tokens: Some(36),
            completion_tokens: 4,
        }),
    );
    assert_eq!(verdict, Some(Verdict::Surprised));
    let trust = b.cache_trust();
    assert!((trust.unheld - 0.9).abs() < 1e-12, "{trust:?}");
    // The family is known on a only; a busy (40 blocks), b idle but 10 blocks to prefill:
    // b is now expected to hold 9 of them.
    let hashes = router.hashes(family).unwrap();
    router.record_placement("m", &hashes, "a", None, 0);
    let a = PodLoad::new();
    let _busy = a.acquire_work(RequestWork {
        blocks: 40,
        prefill_blocks: 0,
        shared_prefix: None,
        copies_prefix: false,
        max_tokens: None,
    });
    let pods = [
        Candidate {
            name: "a",
            address: "a",
            load: &a,
        },
        Candidate {
            name: "b",
            address: "b",
            load: &b,
        },
    ];
    let request = RouteRequest {
        model: "m",
        text: family,
        tokens: None,
        session: Default::default(),
        max_tokens: None,
    };
    let mut rng = StdRng::seed_from_u64(0);
    let routed = router
        .route(Strategy::PrefixLoad, &request, &pods, &mut rng, 0)
        .unwrap();
    assert_eq!(routed.decision.pod_name, "b");
}

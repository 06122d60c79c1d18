use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::load::PodLoad;
use crate::tokenize::{TiktokenTokenizer, TokenizerKind};

fn request(text: &str) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        text,
        tokens: None,
        session: Default::default(),
        max_tokens: None,
    }
}

/// A router with `block_size`-byte blocks, the rest as default.
fn router_with_blocks(block_size: usize) -> Router {
    Router::new(RouterConfig {
        block_size,
        ..RouterConfig::default()
    })
    .unwrap()
}

/// `abcdefgh` (two 4-byte blocks) routed by prefix-cache at time 0.
fn route_abcdefgh(router: &Router, pods: &[Candidate<'_>], rng: &mut StdRng) -> Routed {
    router
        .route(Strategy::PrefixCache, &request("abcdefgh"), pods, rng, 0)
        .unwrap()
}

/// Pods "a" and "b" with these loads.
fn pods_a_and_b<'a>(a: &'a Arc<PodLoad>, b: &'a Arc<PodLoad>) -> [Candidate<'a>; 2] {
    [
        Candidate {
            name: "a",
            address: "a",
            load: a,
        },
        Candidate {
            name: "b",
            address: "b",
            load: b,
        },
    ]
}

#[test]
fn engine_tokens_replace_the_text_tokenizer() {
    let router = router_with_blocks(8);
    let bytes = crate::kv_sync::token_bytes(&[1, 2, 3, 4]);
    let request = RouteRequest {
        model: "m",
        text: "some other text entirely",
        tokens: Some(&bytes),
        session: Default::default(),
        max_tokens: None,
    };
    let text_only = RouteRequest {
        tokens: None,
        ..request
    };
    assert_eq!(
        router.request_hashes(&request).unwrap(),
        block_hashes(&bytes, 8, 0)
    );
    assert_ne!(
        router.request_hashes(&request).unwrap(),
        router.request_hashes(&text_only).unwrap()
    );
    let (a, b) = (PodLoad::new(), PodLoad::new());
    let pods = pods_a_and_b(&a, &b);
    let mut rng = StdRng::seed_from_u64(0);
    let routed = router
        .route(Strategy::PrefixCache, &request, &pods, &mut rng, 0)
        .unwrap();
    assert_eq!(routed.decision.prefix_hashes, block_hashes(&bytes, 8, 0));
}

#[test]
fn families_are_recorded_only_for_prefix_load_s_family_term() {
    let (a, b) = (PodLoad::new(), PodLoad::new());
    let pods = pods_a_and_b(&a, &b);
    let served = || {
        let window = 60_000;
        a.families().count(0, window).families + b.families().count(0, window).families
    };
    // Two prompt families of at least one full block (128 bytes) each.
    let text = "first family ".repeat(20);
    let other = "second family ".repeat(20);
    let text = text.as_str();
    let mut rng = StdRng::seed_from_u64(0);
    let off = Router::new(RouterConfig::default()).unwrap();
    let routed = off.route(Strategy::PrefixLoad, &request(text), &pods, &mut rng, 0);
    drop(routed.unwrap());
    assert_eq!(served(), 0, "family term off: nothing recorded");
    let mut config = RouterConfig::default();
    config.prefix_load.family_weight = 16.0;
    let on = Router::new(config).unwrap();
    for strategy in [Strategy::LeastRequest, Strategy::Random] {
        drop(
            on.route(strategy, &request(text), &pods, &mut rng, 0)
                .unwrap(),
        );
    }
    assert_eq!(served(), 0, "strategies that hash nothing record nothing");
    for strategy in [Strategy::PrefixLoad, Strategy::PrefixCache] {
        drop(
            on.route(strategy, &request(text), &pods, &mut rng, 0)
                .unwrap(),
        );
        drop(
            on.route(strategy, &request(&other), &pods, &mut rng, 0)
                .unwrap(),
        );
    }
    // Two families, each counted once per pod it went to.
    assert!((2..=4).contains(&served()), "{}", served());
}

#[test]
fn hashes_given_back_route_as_the_prompt_would() {
    let router = router_with_blocks(4);
    let (a, b) = (PodLoad::new(), PodLoad::new());
    let pods = pods_a_and_b(&a, &b);
    let mut rng = StdRng::seed_from_u64(0);
    let first = route_abcdefgh(&router, &pods, &mut rng);
    let hashes = first.decision.prefix_hashes.clone();
    // The prompt now matches the first pod fully: a retry with the hashes taken back
    // decides as hashing the text again would.
    let again = router
        .route_with_hashes(
            Strategy::PrefixCache,
            &request("ignored, the hashes are given"),
            Some(hashes.clone()),
            &pods,
            &mut rng,
            0,
        )
        .unwrap();
    assert_eq!(again.decision.prefix_hashes, hashes);
    assert_eq!(again.decision.pod, first.decision.pod);
    assert_eq!(again.decision.match_percent, Some(100));
    // Strategies that do not hash drop them.
    let plain = router
        .route_with_hashes(
            Strategy::LeastRequest,
            &request("abcdefgh"),
            Some(hashes),
            &pods,
            &mut rng,
            0,
        )
        .unwrap();
    assert!(plain.decision.prefix_hashes.is_empty());
}

#[test]
fn a_forgotten_placement_leaves_the_index_for_other_pods() {
    let router = router_with_blocks(4);
    let hashes = router.hashes("abcdefgh").unwrap();
    router.record_placement("m", &hashes, "a", None, 0);
    router.record_placement("m", &hashes, "b", None, 0);
    router.forget_placement("m", &hashes, "a");
    assert_eq!(
        router.index().match_blocks("m", &hashes, &["a", "b"]),
        [0, 2]
    );
    router.forget_placement("m", &hashes, "b");
    assert!(router.index().is_empty(), "a block no pod holds is dropped");
}

#[test]
fn no_pod_is_an_error_naming_the_model() {
    let router = Router::new(RouterConfig::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let err = router
        .route(Strategy::PrefixCache, &request("x"), &[], &mut rng, 0)
        .unwrap_err();
    assert_eq!(err, RouteError::NoReadyPod("m".to_owned()));
}

#[test]
fn a_single_pod_is_routed_without_policy_or_index() {
    let router = router_with_blocks(4);
    let load = PodLoad::with_outstanding(7);
    let pods = [Candidate {
        name: "only",
        address: "only",
        load: &load,
    }];
    let mut rng = StdRng::seed_from_u64(0);
    let routed = route_abcdefgh(&router, &pods, &mut rng);
    assert_eq!(routed.decision.pod_name, "only");
    assert_eq!(routed.decision.selection, None);
    assert_eq!(routed.decision.bucket(), None);
    assert_eq!(routed.decision.outstanding_at_selection, 7);
    assert_eq!(load.outstanding(), 8);
    assert!(router.index().is_empty());
    drop(routed);
    assert_eq!(load.outstanding(), 7);
}

#[test]
fn only_prefix_aware_strategies_hash_and_add() {
    let router = router_with_blocks(4);
    let (a, b) = (PodLoad::new(), PodLoad::new());
    let pods = pods_a_and_b(&a, &b);
    let mut rng = StdRng::seed_from_u64(0);
    for strategy in [Strategy::Random, Strategy::LeastRequest] {
        let routed = router
            .route(strategy, &request("abcdefgh"), &pods, &mut rng, 0)
            .unwrap();
        assert!(routed.decision.prefix_hashes.is_empty());
        assert_eq!(routed.decision.selection, None);
    }
    assert!(router.index().is_empty());
    let routed = route_abcdefgh(&router, &pods, &mut rng);
    assert_eq!(
        routed.decision.prefix_hashes,
        [0xe47f32a254016b00, 0xd48dd7253a12cb4b]
    );
    assert_eq!(router.index().len(), 2);
}

#[test]
fn the_configured_tokenizer_and_seed_shape_the_hashes() {
    let text = "hello world, the quick brown fox jumps over the lazy dog";
    let tiktoken = Router::new(RouterConfig {
        tokenizer: TokenizerKind::Tiktoken,
        block_size: 16,
        hash_seed: 42,
        ..RouterConfig::default()
    })
    .unwrap();
    let ids = TiktokenTokenizer::cl100k_base().unwrap().ids(text);
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_be_bytes()).collect();
    let expected = block_hashes(&bytes, 16, 42);
    assert!(!expected.is_empty());
    assert_eq!(tiktoken.hashes(text).unwrap(), expected);
    let character = Router::new(RouterConfig::default()).unwrap();
    assert_ne!(character.hashes(text).unwrap(), expected);
}

proptest::proptest! {
    /// Every strategy picks one of the candidates, `least-request` a least-loaded one,
    /// and every count returns to its start when the guards drop.
    #[test]
    fn every_strategy_picks_a_candidate(
        counts in proptest::collection::vec(0u64..10, 2..6),
        strategy in proptest::sample::select(Strategy::ALL.to_vec()),
        seed in proptest::prelude::any::<u64>(),
    ) {
        let router = router_with_blocks(4);
        let loads: Vec<_> = counts.iter().map(|&c| PodLoad::with_outstanding(c)).collect();
        let names: Vec<String> = (0..counts.len()).map(|i| format!("pod-{i}")).collect();
        let pods: Vec<Candidate<'_>> = names
            .iter()
            .zip(&loads)
            .map(|(name, load)| Candidate {
                name,
                address: name,
                load,
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(seed);
        let routed = router
            .route(strategy, &request("abcdefgh"), &pods, &mut rng, 0)
            .unwrap();
        let pod = routed.decision.pod;
        proptest::prop_assert!(pod < counts.len());
        proptest::prop_assert_eq!(&routed.decision.pod_name, &names[pod]);
        if strategy == Strategy::LeastRequest {
            proptest::prop_assert_eq!(counts[pod], *counts.iter().min().unwrap());
        }
        drop(routed);
        let after: Vec<u64> = loads.iter().map(|load| load.outstanding()).collect();
        proptest::prop_assert_eq!(after, counts);
    }
}

#[test]
fn an_invalid_config_is_refused() {
    let err = Router::new(RouterConfig {
        block_size: 0,
        ..RouterConfig::default()
    })
    .unwrap_err();
    assert_eq!(err.key, "block_size");
}

/// `prefix-load` recalls a placement the index has evicted (its `recall_blocks` memory);
/// `prefix-cache`, which must stay AIBrix's, and a KV-synced router do not.
#[test]
fn prefix_load_recalls_what_the_index_forgot() {
    let small_index = |kv_sync: bool| {
        Router::new(
            RouterConfig {
                block_size: 4,
                block_capacity: 16,
                ..RouterConfig::default()
            }
            .for_kv_sync(kv_sync),
        )
        .unwrap()
    };
    // 32 blocks sent to "a", then 16 others to "b" fill the index and evict all of them.
    let first = "0123456789abcdef".repeat(8);
    let extended = format!("{first}and a follow-up question");
    let (a, b) = (PodLoad::new(), PodLoad::new());
    let pods = pods_a_and_b(&a, &b);
    let mut rng = StdRng::seed_from_u64(0);
    let route = |router: &Router, strategy, rng: &mut StdRng| {
        let hashes = router.hashes(&first).unwrap();
        router.record_placement("m", &hashes, "a", None, 0);
        let other = router.hashes(&"z".repeat(64)).unwrap();
        router.record_placement("m", &other, "b", None, 1);
        assert_eq!(router.index().match_blocks("m", &hashes, &["a"]), [0]);
        router
            .route(strategy, &request(&extended), &pods, rng, 2)
            .unwrap()
            .decision
    };
    let recalled = route(&small_index(false), Strategy::PrefixLoad, &mut rng);
    assert_eq!(recalled.pod_name, "a");
    assert_eq!(recalled.match_percent, Some(84), "32 of 38 blocks");
    let aibrix = route(&small_index(false), Strategy::PrefixCache, &mut rng);
    assert_eq!(aibrix.match_percent, Some(0));
    let synced = route(&small_index(true), Strategy::PrefixLoad, &mut rng);
    assert_eq!(synced.match_percent, Some(0));
}

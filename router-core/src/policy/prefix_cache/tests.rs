//! AIBrix v0.7.0's own tables for the prefix-cache policy (`prefix_cache_routing_test.go`,
//! `prefix_cache_test.go`), the σ-filter properties of the reference notes §1.7, and property
//! tests of the whole decision through the [`Router`](crate::Router).

use std::sync::Arc;

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::config::RouterConfig;
use crate::decision::Decision;
use crate::load::{Candidate, InFlight, PodLoad};
use crate::policy::Strategy;
use crate::router::{RouteRequest, Router};

fn rng() -> StdRng {
    StdRng::seed_from_u64(2422)
}

/// `TestGetTargetPodOnLoadImbalance` (threshold 8): counts → which pods the gate keeps.
#[test]
fn aibrix_load_imbalance_table() {
    let cases: [(&[u64], Option<&[usize]>); 11] = [
        (&[10, 10, 10, 10], None),
        (&[0, 10, 20], Some(&[0])),
        (&[0, 0, 10, 20], Some(&[0, 1])),
        (&[0, 8], None),
        (&[0, 9], Some(&[0])),
        (&[], None),
        (&[10], None),
        (&[0, 0, 0], None),
        (&[0, 5, 50, 100], Some(&[0])),
        (&[1, 2, 3, 9], None),
        (&[2, 2, 8, 16], Some(&[0, 1])),
    ];
    for (counts, expected) in cases {
        assert_eq!(
            imbalance_gate(counts, 8).as_deref(),
            expected,
            "counts {counts:?}"
        );
    }
}

/// `TestLoadImbalanceEdgeCases`: extreme counts and thresholds (our counts are unsigned, so
/// AIBrix's MinInt32 cases become 0 and the spread can be the whole u64 range).
#[test]
fn load_imbalance_edge_cases() {
    let max = u64::MAX;
    assert_eq!(imbalance_gate(&[0, max], 8).as_deref(), Some(&[0][..]));
    assert_eq!(imbalance_gate(&[max, max], 0), None);
    assert_eq!(
        imbalance_gate(&[max - 1, max], 0).as_deref(),
        Some(&[0][..])
    );
    assert_eq!(imbalance_gate(&[0, max], max), None);
    assert_eq!(
        imbalance_gate(&[0, i32::MAX as u64], 8).as_deref(),
        Some(&[0][..])
    );
    assert_eq!(imbalance_gate(&[0, 1], 0).as_deref(), Some(&[0][..]));
    assert_eq!(imbalance_gate(&[3, 3], 0), None);
}

/// `TestGetTargetPodFromMatchedPods`: (counts, matches as (pod, %), k) → pods allowed.
#[test]
fn aibrix_matched_pods_table() {
    type Case = (
        &'static [u64],
        &'static [(usize, u8)],
        f64,
        &'static [usize],
    );
    let cases: [Case; 11] = [
        (&[5, 10, 15], &[(0, 100), (1, 50), (2, 25)], 1.0, &[0]),
        (&[100, 10, 12], &[(0, 100), (1, 80), (2, 60)], 1.0, &[1]),
        (&[20, 10, 30], &[(0, 50), (1, 50), (2, 50)], 1.0, &[1]),
        (&[11, 12, 13], &[(0, 90), (1, 80), (2, 70)], -10.0, &[]),
        (&[10, 20], &[], 1.0, &[]),
        (&[10, 20], &[(0, 75)], 2.0, &[0]),
        (&[11, 10, 12], &[(0, 100), (1, 90), (2, 80)], 5.0, &[0]),
        (&[1, 2, 3, 4], &[(0, 50), (1, 60)], 1.0, &[1]),
        (&[1, 2, 3, 4], &[(0, 50), (1, 50), (2, 50)], 1.0, &[0]),
        (&[1, 1, 1, 4], &[(0, 50), (1, 50), (2, 50)], 1.0, &[0, 1, 2]),
        (&[1, 10, 1, 4], &[(0, 50), (1, 100)], 1.0, &[0]),
    ];
    let mut rng = rng();
    for (counts, matched, k, allowed) in cases {
        let mut seen = Vec::new();
        for _ in 0..64 {
            let pick = pick_matched(counts, matched, k, &mut rng);
            match pick {
                None => assert!(allowed.is_empty(), "{counts:?} {matched:?}: nothing picked"),
                Some(pod) => {
                    assert!(
                        allowed.contains(&pod),
                        "{counts:?} {matched:?} k={k}: {pod}"
                    );
                    if !seen.contains(&pod) {
                        seen.push(pod);
                    }
                }
            }
        }
        // Remaining ties are random: every tied pod comes up.
        assert_eq!(seen.len(), allowed.len(), "{counts:?} {matched:?}");
    }
}

/// `TestPrefixMatchingStandardDeviationEdgeCases` (k may be 0 or negative there; our config
/// refuses k < 1, the filter function itself takes any k).
#[test]
fn aibrix_standard_deviation_edge_cases() {
    let max32 = i32::MAX as u64;
    type Case = (
        &'static str,
        [u64; 3],
        &'static [(usize, u8)],
        f64,
        Option<usize>,
    );
    let cases: [Case; 10] = [
        (
            "zero factor",
            [10, 15, 20],
            &[(0, 100), (1, 90), (2, 80)],
            0.0,
            Some(0),
        ),
        (
            "negative factor",
            [10, 10, 10],
            &[(0, 100), (1, 90), (2, 80)],
            -1.0,
            Some(0),
        ),
        (
            "huge factor",
            [1000, 10, 15],
            &[(0, 100), (1, 90), (2, 80)],
            1000.0,
            Some(0),
        ),
        (
            "sample sd is 1",
            [100, 101, 102],
            &[(0, 90), (1, 80), (2, 70)],
            1.0,
            Some(0),
        ),
        (
            "k 0 keeps ≤ mean",
            [200, 201, 202],
            &[(0, 90), (1, 80), (2, 70)],
            0.0,
            Some(0),
        ),
        (
            "same match",
            [50, 10, 30],
            &[(0, 75), (1, 75), (2, 75)],
            2.0,
            Some(1),
        ),
        ("single within", [5, 50, 60], &[(1, 80)], 2.0, Some(1)),
        ("single over", [5, 200, 10], &[(1, 100)], 1.0, None),
        (
            "extreme",
            [max32, 0, 5],
            &[(0, 100), (1, 50), (2, 25)],
            1.0,
            Some(1),
        ),
        (
            "zero variance",
            [10, 10, 10],
            &[(0, 90), (1, 80), (2, 70)],
            1.0,
            Some(0),
        ),
    ];
    let mut rng = rng();
    for (name, counts, matched, k, expected) in cases {
        assert_eq!(
            pick_matched(&counts, matched, k, &mut rng),
            expected,
            "{name}"
        );
    }
}

/// `TestLoadImbalanceEdgeCases` with the values an unsigned count can take.
#[test]
fn aibrix_load_imbalance_extremes() {
    let max32 = i32::MAX as u64;
    assert_eq!(imbalance_gate(&[max32, max32 - 1], 8), None);
    assert_eq!(
        imbalance_gate(&[max32 - 20, max32], 8).as_deref(),
        Some(&[0][..])
    );
    assert_eq!(imbalance_gate(&[5, 10, 15], 0).as_deref(), Some(&[0][..]));
    assert_eq!(imbalance_gate(&[max32, max32, max32], 8), None);
    assert_eq!(
        imbalance_gate(&[0, 0, max32], 8).as_deref(),
        Some(&[0, 1][..])
    );
}

/// `TestSelectTargetPodWithLeastRequestCountEdgeCases`: the fallback takes the minimum.
#[test]
fn aibrix_least_request_extremes() {
    let max32 = i32::MAX as u64;
    let mut rng = rng();
    assert_eq!(least_loaded_of(&[max32, max32 - 1, max32], &mut rng), 1);
    assert_eq!(least_loaded_of(&[0, max32, 10], &mut rng), 0);
    assert_eq!(least_loaded_of(&[u64::MAX], &mut rng), 0);
    let mut seen = [false; 3];
    for _ in 0..64 {
        seen[least_loaded_of(&[max32, max32, max32], &mut rng)] = true;
    }
    assert_eq!(seen, [true; 3]);
}

/// The reference notes' verified vectors for the σ filter (§1.7).
#[test]
fn sigma_filter_vectors() {
    let mut rng = rng();
    let only_last = |counts: &[u64], k: f64, rng: &mut StdRng| {
        pick_matched(counts, &[(counts.len() - 1, 100)], k, rng)
    };
    assert_eq!(only_last(&[0, 0, 3], 1.0, &mut rng), None);
    assert_eq!(only_last(&[0, 0, 0, 0, 9], 2.0, &mut rng), Some(4));
    assert_eq!(only_last(&[0, 0, 0, 0, 0, 9], 2.0, &mut rng), None);
    // Sample, not population, deviation: (0, 0, 3) with k = 1 has limit 1 + √3 ≈ 2.73.
    assert!((load_limit(&[0, 0, 3], 1.0) - (1.0 + 3f64.sqrt())).abs() < 1e-12);
    assert_eq!(load_limit(&[7], 2.0), 7.0);
}

proptest! {
    /// With two pods the filter never rejects for any integer k ≥ 1 (the flaw in the seed).
    #[test]
    fn two_pods_never_rejected(a in 0u64..1_000_000, b in 0u64..1_000_000, k in 1u64..5) {
        let mut rng = rng();
        let counts = [a, b];
        for pod in 0..2 {
            prop_assert_eq!(pick_matched(&counts, &[(pod, 50)], k as f64, &mut rng), Some(pod));
        }
    }

    /// Samuelson: no count exceeds mean + k·σ when k ≥ (n − 1)/√n, so the filter can only
    /// reject with n ≥ 3 at k = 1, n ≥ 6 at k = 2, n ≥ 11 at k = 3.
    #[test]
    fn samuelson_bound(counts in proptest::collection::vec(0u64..10_000, 2..16)) {
        let n = counts.len() as f64;
        let k = (n - 1.0) / n.sqrt();
        let limit = load_limit(&counts, k);
        let max = *counts.iter().max().unwrap_or(&0) as f64;
        prop_assert!(max <= limit + 1e-9 * limit.max(1.0), "max {} limit {}", max, limit);
    }
}

// ---- Whole decisions through the router --------------------------------------------------

fn router(block_size: usize, threshold: u64, k: u64) -> Router {
    Router::new(RouterConfig {
        block_size,
        imbalance_abs_count: threshold,
        stddev_factor: k,
        ..RouterConfig::default()
    })
    .unwrap()
}

struct Pods {
    names: Vec<String>,
    loads: Vec<Arc<PodLoad>>,
}

impl Pods {
    fn idle(n: usize) -> Self {
        Pods::with_counts(&vec![0; n])
    }

    fn with_counts(counts: &[u64]) -> Self {
        Pods {
            names: (1..=counts.len()).map(|i| format!("p{i}")).collect(),
            loads: counts
                .iter()
                .map(|&c| PodLoad::with_outstanding(c))
                .collect(),
        }
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.names
            .iter()
            .zip(&self.loads)
            .map(|(name, load)| Candidate {
                name,
                address: name,
                load,
            })
            .collect()
    }

    fn count(&self, name: &str) -> u64 {
        let i = self.names.iter().position(|n| n == name).unwrap();
        self.loads[i].outstanding()
    }
}

fn route(
    router: &Router,
    pods: &Pods,
    text: &str,
    rng: &mut StdRng,
    guards: &mut Vec<InFlight>,
) -> Decision {
    let routed = router
        .route(
            Strategy::PrefixCache,
            &RouteRequest {
                model: "m1",
                text,
                tokens: None,
                session: Default::default(),
                max_tokens: None,
            },
            &pods.candidates(),
            rng,
            0,
        )
        .unwrap();
    guards.push(routed.guard);
    routed.decision
}

/// `Test_PrefixCacheE2E` (v0.7.0): four pods, character tokenizer, block 4, threshold 8,
/// k = 1; every routed request stays outstanding.
#[test]
fn aibrix_prefix_cache_e2e() {
    for seed in 0..16 {
        let mut rng = StdRng::seed_from_u64(seed);
        let router = router(4, 8, 1);
        let pods = Pods::idle(4);
        let mut guards = Vec::new();

        let first = route(&router, &pods, "abcdegfh", &mut rng, &mut guards);
        assert_eq!(first.selection, Some(Selection::LeastRequestFallback));
        assert_eq!(first.match_percent, Some(0));
        let owner = first.pod_name.clone();

        let other = route(&router, &pods, "wxyz", &mut rng, &mut guards);
        assert_ne!(other.pod_name, owner);

        let again = route(&router, &pods, "abcdegfh", &mut rng, &mut guards);
        assert_eq!(again.pod_name, owner);
        assert_eq!(again.selection, Some(Selection::PrefixMatch));
        assert_eq!(again.match_percent, Some(100));

        // Counts are now {owner: 2, other: 1, two idle}: the owner holds "abcd" but is over
        // mean + σ, so an idle pod takes it.
        let abcd = route(&router, &pods, "abcd", &mut rng, &mut guards);
        assert_ne!(abcd.pod_name, owner);
        assert_eq!(pods.count(&abcd.pod_name), 1);
        assert_eq!(abcd.selection, Some(Selection::PrefixMatchSkipped));
        let second = abcd.pod_name.clone();

        // Owner and `second` both hold block "abcd" (33 %); `second` is less loaded.
        let longer = route(&router, &pods, "abcdefghijkl", &mut rng, &mut guards);
        assert_eq!(longer.pod_name, second);
        assert_eq!(longer.match_percent, Some(33));

        // `second` holds both blocks of "abcdefgh" (100 %), the owner one (50 %).
        let both = route(&router, &pods, "abcdefgh", &mut rng, &mut guards);
        assert_eq!(both.pod_name, second);
        assert_eq!(both.match_percent, Some(100));
        assert!(!both.imbalance);

        // Six more requests on `second` (3 → 9) against an idle pod: 9 − 0 > 8, the gate
        // fires, only the idle pod is matched, it holds nothing, so it gets the request.
        let second_load = &pods.loads[pods.names.iter().position(|n| *n == second).unwrap()];
        for _ in 0..6 {
            guards.push(second_load.acquire());
        }
        let idle: Vec<&String> = pods.names.iter().filter(|n| pods.count(n) == 0).collect();
        assert_eq!(idle.len(), 1, "seed {seed}");
        let gated = route(&router, &pods, "abcdefgh", &mut rng, &mut guards);
        assert_eq!(&gated.pod_name, idle[0]);
        assert!(gated.imbalance);
        assert_eq!(gated.selection, Some(Selection::LeastRequestFallback));
        assert_eq!(gated.match_percent, Some(0));

        drop(guards);
        assert!(pods.loads.iter().all(|load| load.outstanding() == 0));
    }
}

#[test]
fn gate_restricts_matching_but_a_min_pod_that_matches_wins() {
    let router = router(4, 2, 2);
    let pods = Pods::with_counts(&[0, 0, 5]);
    let mut rng = rng();
    let mut guards = Vec::new();
    router
        .index()
        .add("m1", &router.hashes("abcdefgh").unwrap(), "p3", 0);
    router
        .index()
        .add("m1", &router.hashes("abcd").unwrap(), "p2", 0);
    let decision = route(&router, &pods, "abcdefgh", &mut rng, &mut guards);
    assert!(decision.imbalance);
    assert_eq!(decision.pod_name, "p2");
    assert_eq!(decision.selection, Some(Selection::PrefixMatch));
    assert_eq!(decision.match_percent, Some(50));
}

/// AIBrix v0.7.0 keeps a pod whose match rounds down to 0 % (`hash.go`: one block of more
/// than 100 is `1·100/n = 0`, stored in the map all the same) and routes by
/// `len(matchedPods) > 0`: the holder of the first block wins by the σ filter (`prefix_match`,
/// bucket "0") even though the other pod is less loaded, where a least-request fallback
/// would pick the other pod.
#[test]
fn a_match_that_rounds_down_to_zero_percent_is_still_a_match() {
    // 101 blocks of 4 bytes.
    let text = "abcd".repeat(101);
    for seed in 0..8 {
        // A fresh index each time (a decision adds the blocks): p1 holds only the first.
        let router = router(4, 16, 2);
        let hashes = router.hashes(&text).unwrap();
        assert_eq!(hashes.len(), 101);
        router.index().add("m1", &hashes[..1], "p1", 0);
        assert_eq!(router.index().match_names("m1", &hashes, &["p1"]), [0]);
        assert_eq!(
            router.index().match_blocks("m1", &hashes, &["p1", "p2"]),
            [1, 0]
        );
        // p1 is busier (1 against 0), within mean + 2σ: only a match sends it there.
        let pods = Pods::with_counts(&[1, 0]);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut guards = Vec::new();
        let decision = route(&router, &pods, &text, &mut rng, &mut guards);
        assert_eq!(decision.pod_name, "p1", "seed {seed}");
        assert_eq!(decision.selection, Some(Selection::PrefixMatch));
        assert_eq!(decision.match_percent, Some(0));
        assert_eq!(decision.bucket().map(|b| b.as_str()), Some("0"));
    }
}

#[test]
fn short_prompts_and_empty_text_fall_back() {
    let router = router(128, 16, 2);
    let pods = Pods::with_counts(&[3, 1]);
    let mut rng = rng();
    let mut guards = Vec::new();
    for text in ["", "shorter than one block"] {
        let decision = route(&router, &pods, text, &mut rng, &mut guards);
        assert_eq!(decision.selection, Some(Selection::LeastRequestFallback));
        assert_eq!(decision.match_percent, Some(0));
        assert!(decision.prefix_hashes.is_empty());
    }
    assert!(router.index().is_empty(), "no full block, nothing added");
}

fn prompt(family: u8, tail: u8) -> String {
    let mut text: String = (0..40)
        .map(|i| char::from(b'a' + (family + i) % 26))
        .collect();
    text.push(char::from(b'A' + tail % 26));
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any sequence of requests over any loads: the chosen pod is one of the candidates,
    /// under imbalance it is a least-loaded pod, and every count returns to its start once
    /// the guards drop.
    #[test]
    fn decisions_respect_candidates_gate_and_counting(
        counts in proptest::collection::vec(0u64..40, 2..7),
        requests in proptest::collection::vec((0u8..4, 0u8..3, any::<bool>()), 1..40),
        threshold in 0u64..20,
        k in 1u64..4,
        seed in any::<u64>(),
    ) {
        let router = router(8, threshold, k);
        let pods = Pods::with_counts(&counts);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut guards = Vec::new();
        for (family, tail, keep) in requests {
            let before: Vec<u64> = pods.loads.iter().map(|l| l.outstanding()).collect();
            let decision = route(&router, &pods, &prompt(family, tail), &mut rng, &mut guards);
            prop_assert!(decision.pod < counts.len());
            prop_assert_eq!(&decision.pod_name, &pods.names[decision.pod]);
            prop_assert_eq!(decision.outstanding_at_selection, before[decision.pod]);
            let min = *before.iter().min().unwrap();
            let max = *before.iter().max().unwrap();
            prop_assert_eq!(decision.imbalance, max - min > threshold);
            if decision.imbalance {
                prop_assert_eq!(before[decision.pod], min);
            }
            if !keep {
                guards.pop();
            }
        }
        drop(guards);
        let after: Vec<u64> = pods.loads.iter().map(|l| l.outstanding()).collect();
        prop_assert_eq!(after, counts);
    }

    /// Two pods within the gate: a pod holding the prefix is always chosen over one that
    /// does not, however loaded it is (the σ filter cannot reject with two pods).
    #[test]
    fn two_pods_follow_the_prefix_within_the_gate(a in 0u64..=16, b in 0u64..=16, seed in any::<u64>()) {
        let router = router(8, 16, 2);
        let pods = Pods::with_counts(&[a, b]);
        let text = prompt(1, 1);
        router.index().add("m1", &router.hashes(&text).unwrap(), "p1", 0);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut guards = Vec::new();
        let decision = route(&router, &pods, &text, &mut rng, &mut guards);
        prop_assert_eq!(decision.pod_name.as_str(), "p1");
        prop_assert_eq!(decision.selection, Some(Selection::PrefixMatch));
    }
}

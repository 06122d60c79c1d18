//! Cost ordering and invariants of `prefix-load`, deterministic and seeded.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::index::PrefixIndex;
use crate::load::{Candidate, InFlight, RequestWork};
use crate::policy::PolicyInput;

const MODEL: &str = "m";

/// A pod's state: outstanding requests of `blocks` prompt blocks each, of which the first
/// `pending` have not answered yet (each still to prefill `blocks` blocks).
#[derive(Debug, Clone, Copy, Default)]
struct PodState {
    outstanding: u64,
    pending: u64,
    /// The prefix the outstanding requests share (`RequestWork::shared_prefix`).
    prefix: Option<u64>,
}

struct Cluster {
    names: Vec<String>,
    loads: Vec<Arc<PodLoad>>,
    guards: Vec<InFlight>,
    index: PrefixIndex,
    weights: PrefixLoadConfig,
}

impl Cluster {
    fn new(states: &[PodState], blocks: u64) -> Self {
        let names: Vec<String> = (0..states.len()).map(|i| format!("pod-{i}")).collect();
        let loads: Vec<Arc<PodLoad>> = states.iter().map(|_| PodLoad::new()).collect();
        let mut guards = Vec::new();
        for (state, load) in states.iter().zip(&loads) {
            for i in 0..state.outstanding {
                let mut guard = load.acquire_work(RequestWork {
                    blocks,
                    prefill_blocks: blocks,
                    shared_prefix: state.prefix,
                    copies_prefix: false,
                    max_tokens: None,
                });
                if i >= state.pending {
                    guard.first_byte(0);
                }
                guards.push(guard);
            }
        }
        Cluster {
            names,
            loads,
            guards,
            index: PrefixIndex::new(1000, 60_000),
            // The cost model's boundaries are tested exactly, with no spread around the
            // cheapest (the spread has its tests in `spread.rs` and `session_tests.rs`).
            weights: PrefixLoadConfig {
                spread_fraction: 0.0,
                ..PrefixLoadConfig::default()
            },
        }
    }

    /// Records `hashes` as held by pod `pod`.
    fn hold(&self, pod: usize, hashes: &[u64]) {
        self.index.add(MODEL, hashes, &self.names[pod], 0);
    }

    fn choose(&self, hashes: &[u64], seed: u64) -> Choice {
        self.choose_at(hashes, seed, 0)
    }

    /// The same cluster with `prefix-load`'s family term at `weight` (off by default).
    fn with_family_weight(mut self, weight: f64) -> Self {
        self.weights.family_weight = weight;
        self
    }

    /// Pod `i` has served `families[i]` distinct prompt families, two requests of each (so
    /// they have recurred), the last at time 0.
    fn serve_families(&self, families: &[u64]) {
        self.serve_prompts(families, 2);
    }

    /// Pod `i` has served `prompts[i]` distinct first blocks, `requests` requests of each,
    /// all at time 0.
    fn serve_prompts(&self, prompts: &[u64], requests: u32) {
        let window = self.weights.family_window_millis();
        for (pod, &n) in prompts.iter().enumerate() {
            for family in 0..n {
                let root = 1_000_000 * (pod as u64 + 1) + family;
                for _ in 0..requests {
                    self.loads[pod].families().record(root, 0, window);
                }
            }
        }
    }

    fn choose_at(&self, hashes: &[u64], seed: u64, now: crate::Millis) -> Choice {
        let pods: Vec<Candidate<'_>> = self
            .names
            .iter()
            .zip(&self.loads)
            .map(|(name, load)| Candidate {
                name,
                address: name,
                load,
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(seed);
        PrefixLoad::new(self.weights.clone()).choose(&mut PolicyInput {
            model: MODEL,
            pods: &pods,
            hashes,
            index: &self.index,
            found: Default::default(),
            recall: None,
            session: Default::default(),
            rng: &mut rng,
            now,
        })
    }
}

fn request(family: u64, blocks: u64) -> Vec<u64> {
    (0..blocks).map(|i| family << 32 | i).collect()
}

fn busy(outstanding: u64) -> PodState {
    PodState {
        outstanding,
        ..PodState::default()
    }
}

/// `busy(outstanding)`, every request sharing the prefix that ends with block `last`.
fn busy_with(outstanding: u64, last: u64) -> PodState {
    PodState {
        outstanding,
        prefix: Some(last),
        ..PodState::default()
    }
}

#[test]
fn uncached_blocks_recovers_the_held_run() {
    for n in 1..=100u64 {
        for k in 0..=n {
            let pct = (k * 100 / n) as u8;
            assert_eq!(uncached_blocks(n, pct), n - k, "{k} of {n}");
        }
    }
    assert_eq!(uncached_blocks(0, 100), 0);
    assert_eq!(uncached_blocks(400, 100), 0);
    assert_eq!(uncached_blocks(400, 0), 400);
}

#[test]
fn a_cached_pod_with_spare_room_wins() {
    let cluster = Cluster::new(&[busy(2), busy(1), busy(2)], 40);
    let hashes = request(7, 40);
    cluster.hold(0, &hashes);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 0);
        assert_eq!(choice.selection, Some(Selection::PrefixMatch));
        assert_eq!(choice.match_percent, Some(100));
        assert!(!choice.imbalance);
    }
}

#[test]
fn with_equal_loads_the_cached_pod_wins() {
    let cluster = Cluster::new(&[busy(3), busy(3)], 40);
    let hashes = request(1, 40);
    cluster.hold(1, &hashes[..30]);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 1);
        assert_eq!(choice.match_percent, Some(75));
    }
}

#[test]
fn a_busy_owner_keeps_a_hot_prefix_until_its_extra_work_outweighs_a_prefill() {
    // Against a busy pod, the owner gives up the cache once it carries more than
    // `prefill_weight` (5) requests' worth of work beyond that pod's.
    let hashes = request(2, 40);
    let cluster = Cluster::new(&[busy(7), busy(1)], 40);
    cluster.hold(0, &hashes);
    let choice = cluster.choose(&hashes, 0);
    assert_eq!(choice.pod, 1);
    assert_eq!(choice.selection, Some(Selection::CostModel));
    assert_eq!(choice.match_percent, Some(0));
    assert!(choice.imbalance);
    // Four requests more are not enough to give up the cache.
    let cluster = Cluster::new(&[busy(5), busy(1)], 40);
    cluster.hold(0, &hashes);
    assert_eq!(cluster.choose(&hashes, 0).pod, 0);
}

#[test]
fn an_idle_pod_takes_a_copy_of_a_hot_prefix_early() {
    // An idle pod's prefill is priced at `idle_prefill_weight` (2): an owner carrying three
    // requests of the prefix loses the next one to it, while the copy is still fast there.
    let hashes = request(2, 40);
    let cluster = Cluster::new(&[busy_with(3, hashes[39]), busy(0)], 40);
    cluster.hold(0, &hashes);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 1);
        assert_eq!(choice.selection, Some(Selection::CostModel));
        assert_eq!(choice.shared_prefix, Some(hashes[39]));
    }
    // An owner with one request keeps its family: copying would cost more than it saves.
    let cluster = Cluster::new(&[busy_with(1, hashes[39]), busy(0)], 40);
    cluster.hold(0, &hashes);
    for seed in 0..20 {
        assert_eq!(cluster.choose(&hashes, seed).pod, 0);
    }
}

#[test]
fn an_idle_pod_gets_no_cheap_copy_of_a_prefix_nobody_is_requesting() {
    // The owner is as loaded as above, but with other prefixes' requests: this one's family
    // is served by nobody right now, so the idle price does not apply and it stays.
    let hashes = request(2, 40);
    let cluster = Cluster::new(&[busy_with(3, 99), busy(0)], 40);
    cluster.hold(0, &hashes);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 0);
        assert_eq!(choice.selection, Some(Selection::PrefixMatch));
    }
    // A new prefix (no pod holds any of it) still prefers the idle pod.
    for seed in 0..20 {
        assert_eq!(cluster.choose(&request(5, 40), seed).pod, 1);
    }
}

#[test]
fn a_copy_in_progress_is_not_a_hit() {
    // Pod 1 holds the prefix in the index only because a copy was routed there, and that
    // copy has not answered yet: the next request of the prefix would wait for it.
    let hashes = request(2, 40);
    let cluster = Cluster::new(&[busy_with(2, hashes[39]), busy(0)], 40);
    cluster.hold(0, &hashes);
    cluster.hold(1, &hashes);
    let mut copy = cluster.loads[1].acquire_work(RequestWork {
        blocks: 40,
        prefill_blocks: 40,
        shared_prefix: Some(hashes[39]),
        copies_prefix: true,
        max_tokens: None,
    });
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 0, "the owner, not the pod still copying");
    }
    // Once the copy has answered, pod 1 holds the prefix for real and is the lighter one.
    copy.first_byte(0);
    assert_eq!(cluster.loads[1].prefix_counts(hashes[39]).copying, 0);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 1);
        assert_eq!(choice.selection, Some(Selection::PrefixMatch));
    }
    drop(copy);
}

#[test]
fn a_copy_of_a_prefix_in_use_is_priced_below_one_of_a_quiet_prefix() {
    // copy_weight 1: a copy pays 1 + 1 / (1 + n) prefills, n = the prefix's requests in
    // flight on its holder. Owner: 7 requests' work (280 blocks); the other pod: 1 request.
    let hashes = request(2, 40);
    let with_copy_weight = |owner: PodState| {
        let mut cluster = Cluster::new(&[owner, busy(1)], 40);
        cluster.weights.copy_weight = 1.0;
        cluster.hold(0, &hashes);
        cluster
    };
    // All 7 are this prefix's: the copy costs 200 + 25 + 40 < 280, so it spills.
    let hot = with_copy_weight(busy_with(7, hashes[39]));
    assert_eq!(hot.choose(&hashes, 0).pod, 1);
    // None is: the copy costs 200 + 200 + 40 > 280, so the family stays with its owner.
    let quiet = with_copy_weight(busy_with(7, 99));
    assert_eq!(quiet.choose(&hashes, 0).pod, 0);
    // Off (the default), the quiet prefix spills too.
    let off = Cluster::new(&[busy_with(7, 99), busy(1)], 40);
    off.hold(0, &hashes);
    assert_eq!(off.choose(&hashes, 0).pod, 1);
}

#[test]
fn pending_prefills_push_a_cold_request_away() {
    // Same outstanding counts; pod 0 still has a cold prefill in progress.
    let cluster = Cluster::new(
        &[
            PodState {
                outstanding: 2,
                pending: 1,
                prefix: None,
            },
            busy(2),
        ],
        40,
    );
    for seed in 0..20 {
        let choice = cluster.choose(&request(3, 40), seed);
        assert_eq!(choice.pod, 1);
        assert_eq!(choice.selection, Some(Selection::LeastRequestFallback));
    }
}

#[test]
fn with_no_match_it_is_least_loaded_and_ties_are_random() {
    let cluster = Cluster::new(&[busy(4), busy(1), busy(1), busy(2)], 40);
    let hashes = request(4, 40);
    let mut seen = [0u32; 4];
    for seed in 0..200 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.selection, Some(Selection::LeastRequestFallback));
        assert_eq!(choice.match_percent, Some(0));
        seen[choice.pod] += 1;
    }
    assert_eq!((seen[0], seen[3]), (0, 0), "{seen:?}");
    assert!(seen[1] > 0 && seen[2] > 0, "{seen:?}");
}

#[test]
fn a_new_family_goes_where_fewer_families_are_served() {
    // Equal loads: the pod serving fewer families takes the new one, whichever pod it is.
    for (families, expected) in [([4, 3], 1), ([2, 5], 0)] {
        let cluster = Cluster::new(&[busy(3), busy(3)], 40).with_family_weight(16.0);
        cluster.serve_families(&families);
        for seed in 0..20 {
            let choice = cluster.choose(&request(8, 40), seed);
            assert_eq!(choice.pod, expected, "{families:?}");
            assert_eq!(choice.selection, Some(Selection::LeastRequestFallback));
        }
    }
    // Families idle for a window no longer count: a tie again, broken at random.
    let cluster = Cluster::new(&[busy(3), busy(3)], 40).with_family_weight(16.0);
    cluster.serve_families(&[4, 3]);
    let later = 2 * cluster.weights.family_window_millis();
    let chosen: Vec<usize> = (0..40)
        .map(|seed| cluster.choose_at(&request(8, 40), seed, later).pod)
        .collect();
    assert!(chosen.contains(&0) && chosen.contains(&1), "{chosen:?}");
}

#[test]
fn one_off_prompts_are_not_families_and_steer_nothing() {
    // Every first block seen once: the share fades to nothing, ties stay random.
    let cluster = Cluster::new(&[busy(3), busy(3)], 40).with_family_weight(16.0);
    cluster.serve_prompts(&[10, 0], 1);
    let chosen: Vec<usize> = (0..40)
        .map(|seed| cluster.choose(&request(8, 40), seed).pod)
        .collect();
    assert!(chosen.contains(&0) && chosen.contains(&1), "{chosen:?}");
    // Half of them recurring (the first 5 of 10 seen again): the charge is half as strong.
    // Pod 0 is charged 8 prompts, so a new family goes to a pod 7 requests busier, but not
    // to one 9 requests busier.
    for (other, expected) in [(10, 1), (12, 0)] {
        let cluster = Cluster::new(&[busy(3), busy(other)], 40).with_family_weight(16.0);
        cluster.serve_prompts(&[10, 0], 1);
        cluster.serve_families(&[5, 0]);
        assert_eq!(cluster.choose(&request(8, 40), 0).pod, expected, "{other}");
    }
}

#[test]
fn the_family_charge_is_bounded_by_family_weight_prompts() {
    // Pod 0 serves every family lately routed, so it is charged `family_weight` (16)
    // prompts for a new one: it still takes it when pod 1 carries more than that much
    // extra work, and not when pod 1 carries less.
    for (other, expected) in [(18, 0), (16, 1)] {
        let cluster = Cluster::new(&[busy(1), busy(other)], 40).with_family_weight(16.0);
        cluster.serve_families(&[10, 0]);
        assert_eq!(cluster.choose(&request(8, 40), 0).pod, expected, "{other}");
    }
    // However many families it serves: the charge is a share, not a count.
    let cluster = Cluster::new(&[busy(1), busy(18)], 40).with_family_weight(16.0);
    cluster.serve_families(&[1000, 0]);
    assert_eq!(cluster.choose(&request(8, 40), 0).pod, 0);
}

#[test]
fn families_do_not_move_a_request_its_pod_holds() {
    let cluster = Cluster::new(&[busy(3), busy(3)], 40).with_family_weight(16.0);
    cluster.serve_families(&[10, 0]);
    let hashes = request(3, 40);
    cluster.hold(0, &hashes);
    for seed in 0..20 {
        let choice = cluster.choose(&hashes, seed);
        assert_eq!(choice.pod, 0);
        assert_eq!(choice.selection, Some(Selection::PrefixMatch));
    }
}

#[test]
fn by_default_families_change_nothing() {
    let cluster = Cluster::new(&[busy(3), busy(3)], 40);
    cluster.serve_families(&[10, 0]);
    let chosen: Vec<usize> = (0..40)
        .map(|seed| cluster.choose(&request(8, 40), seed).pod)
        .collect();
    assert!(chosen.contains(&0) && chosen.contains(&1), "{chosen:?}");
}

#[test]
fn a_prompt_without_full_blocks_goes_by_outstanding_count() {
    let cluster = Cluster::new(&[busy(2), busy(0)], 40);
    let choice = cluster.choose(&[], 0);
    assert_eq!(choice.pod, 1);
    assert_eq!(choice.selection, Some(Selection::LeastRequestFallback));
}

#[test]
fn a_scraped_engine_queue_is_priced_in() {
    let cluster = Cluster::new(&[busy(3), busy(4)], 40);
    let hashes = request(5, 40);
    cluster.hold(0, &hashes);
    assert_eq!(cluster.choose(&hashes, 0).pod, 0);
    cluster.loads[0].set_engine_stats(crate::load::EngineStats {
        running: 1,
        waiting: 5,
        kv_usage: 0.9,
    });
    assert_eq!(cluster.choose(&hashes, 0).pod, 1);
    drop(cluster.guards);
}

#[test]
fn an_engine_queue_of_pending_prefills_is_not_counted_twice() {
    // Pod 0 still has a prefill pending: its engine queue is that prefill, which `pending`
    // already prices, so the scraped queue adds nothing and the cache keeps the request.
    let states = [
        PodState {
            outstanding: 3,
            pending: 1,
            prefix: None,
        },
        busy(4),
    ];
    let cluster = Cluster::new(&states, 40);
    let hashes = request(6, 40);
    cluster.hold(0, &hashes);
    cluster.loads[0].set_engine_stats(crate::load::EngineStats {
        running: 2,
        waiting: 5,
        kv_usage: 0.5,
    });
    for seed in 0..20 {
        assert_eq!(cluster.choose(&hashes, seed).pod, 0);
    }
}

proptest::proptest! {
    /// The chosen pod is always a candidate, and with nothing cached and no pending prefill
    /// it is a least-loaded pod (so its count never exceeds another's).
    #[test]
    fn nothing_cached_means_least_loaded(
        counts in proptest::collection::vec(0u64..12, 2..9),
        blocks in 0u64..64,
        seed in proptest::prelude::any::<u64>(),
    ) {
        let states: Vec<PodState> = counts.iter().map(|&c| busy(c)).collect();
        let cluster = Cluster::new(&states, blocks.max(1));
        let choice = cluster.choose(&request(9, blocks), seed);
        proptest::prop_assert!(choice.pod < counts.len());
        proptest::prop_assert_eq!(counts[choice.pod], *counts.iter().min().unwrap());
    }

    /// Whatever is cached, the chosen pod's load exceeds the least-loaded pod's by at most
    /// the prefill weight's worth of requests: the cache never buys more imbalance than one
    /// prefill is worth.
    #[test]
    fn the_cache_buys_a_bounded_imbalance(
        counts in proptest::collection::vec(0u64..12, 2..9),
        holders in proptest::collection::vec(0u8..=100, 2..9),
        seed in proptest::prelude::any::<u64>(),
    ) {
        let n = counts.len().min(holders.len());
        let states: Vec<PodState> = counts[..n].iter().map(|&c| busy(c)).collect();
        let blocks = 20u64;
        let cluster = Cluster::new(&states, blocks);
        let hashes = request(11, blocks);
        for (pod, &pct) in holders[..n].iter().enumerate() {
            let held = (u64::from(pct) * blocks / 100) as usize;
            cluster.hold(pod, &hashes[..held]);
        }
        let choice = cluster.choose(&hashes, seed);
        proptest::prop_assert!(choice.pod < n);
        let min = *counts[..n].iter().min().unwrap();
        let bound = cluster.weights.prefill_weight;
        proptest::prop_assert!(
            (counts[choice.pod] - min) as f64 <= bound,
            "chose {} with counts {:?}", choice.pod, &counts[..n]
        );
    }
}

#[path = "give_up_tests.rs"]
mod give_up_tests;

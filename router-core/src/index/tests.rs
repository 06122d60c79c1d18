//! Tests of the prefix index: AIBrix's match table, LRU by add, TTL boundaries, sharding and
//! memory bounds, and a concurrency smoke test.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::hash::block_hashes;

const MODEL: &str = "m1";

fn percents(index: &PrefixIndex, hashes: &[u64], pods: &[&str]) -> Vec<u8> {
    index.match_names(MODEL, hashes, pods)
}

/// AIBrix `Test_PrefixHashTableE2E`: block size 4, bytes 1..=13 (three full blocks).
#[test]
fn aibrix_prefix_hash_table_e2e() {
    let index = PrefixIndex::new(100, 60_000);
    let bytes: Vec<u8> = (1..=13).collect();
    let hashes = block_hashes(&bytes, 4, 0);
    assert_eq!(hashes.len(), 3);
    index.add(MODEL, &hashes, "p1", 0);
    index.add(MODEL, &hashes[..2], "p2", 0);
    index.add(MODEL, &hashes[..1], "p4", 0);
    assert_eq!(
        percents(&index, &hashes, &["p1", "p2", "p3", "p4"]),
        [100, 66, 0, 33]
    );
    // The same prefix asked by a longer request: the denominator is its own block count.
    let longer: Vec<u8> = (1..=17).collect();
    let longer = block_hashes(&longer, 4, 0);
    assert_eq!(percents(&index, &longer, &["p1", "p2"]), [75, 50]);
    // A different model shares no pods, even for the same blocks.
    assert_eq!(index.match_names("m2", &hashes, &["p1", "p2"]), [0, 0]);
}

#[test]
fn match_pods_fills_the_caller_s_pods_and_forgets_their_last_match() {
    let index = PrefixIndex::new(100, 60_000);
    let hashes = [10, 11, 12];
    index.add(MODEL, &hashes, "a", 0);
    index.add(MODEL, &hashes[..1], "b", 0);
    let mut pods = [PodMatch::new("a"), PodMatch::new("b"), PodMatch::new("c")];
    index.match_pods(MODEL, &hashes, &mut pods);
    assert_eq!(pods.map(|pod| pod.held()), [3, 1, 0]);
    assert_eq!(
        index.match_blocks(MODEL, &hashes, &["a", "b", "c"]),
        [3, 1, 0]
    );
    // The same pods reused for the next request (a policy's scratch): no earlier run
    // carries over, whether the walk stops at the first block or never starts.
    index.match_pods(MODEL, &[99, 10], &mut pods);
    assert_eq!(pods.map(|pod| pod.held()), [0, 0, 0]);
    index.match_pods(MODEL, &hashes, &mut pods);
    index.match_pods(MODEL, &[], &mut pods);
    assert_eq!(pods.map(|pod| pod.held()), [0, 0, 0]);
}

#[test]
fn match_names_answers_in_the_pods_order() {
    let index = PrefixIndex::new(100, 60_000);
    let hashes = [10, 11];
    index.add(MODEL, &hashes, "b", 0);
    assert_eq!(index.match_names(MODEL, &hashes, &["a", "b"]), [0, 100]);
    assert_eq!(index.match_names(MODEL, &hashes, &["b", "a"]), [100, 0]);
    assert_eq!(index.match_names(MODEL, &[], &["a", "b"]), [0, 0]);
}

#[test]
fn a_pod_that_stops_matching_keeps_its_earlier_percentage() {
    let index = PrefixIndex::new(100, 60_000);
    // Raw hashes (not a chain) so that a pod can hold blocks 0 and 2 but not 1.
    let hashes = [10, 11, 12, 13];
    index.add(MODEL, &[10, 12, 13], "gap", 0);
    index.add(MODEL, &[10, 11, 12], "three", 0);
    assert_eq!(percents(&index, &hashes, &["gap", "three"]), [25, 75]);
    // A pod outside the candidates never counts, and does not keep the walk going.
    assert_eq!(percents(&index, &hashes, &["gap"]), [25]);
    assert_eq!(percents(&index, &hashes, &["absent"]), [0]);
}

#[test]
fn floor_percentages() {
    let index = PrefixIndex::new(100, 60_000);
    let hashes: Vec<u64> = (100..107).collect();
    for held in 1..=7 {
        let pod = format!("p{held}");
        index.add(MODEL, &hashes[..held], &pod, 0);
        assert_eq!(
            percents(&index, &hashes, &[pod.as_str()]),
            [(held * 100 / 7) as u8],
            "{held} of 7 blocks"
        );
    }
}

#[test]
fn lookups_do_not_save_a_block_from_eviction() {
    let index = PrefixIndex::new(3, 60_000);
    for (t, hash) in [1u64, 2, 3].into_iter().enumerate() {
        index.add(MODEL, &[hash], "p", t as Millis);
    }
    // Block 1 is looked up many times, but only adds refresh.
    for _ in 0..5 {
        assert_eq!(percents(&index, &[1], &["p"]), [100]);
    }
    index.add(MODEL, &[4], "p", 10);
    assert_eq!(
        percents(&index, &[1], &["p"]),
        [0],
        "block 1 was the oldest add"
    );
    assert_eq!(index.len(), 3);
    // Re-adding block 2 refreshes it, so block 3 is evicted next.
    index.add(MODEL, &[2], "q", 11);
    index.add(MODEL, &[5], "p", 12);
    assert_eq!(percents(&index, &[2], &["p"]), [100]);
    assert_eq!(percents(&index, &[3], &["p"]), [0]);
    assert_eq!(index.len(), 3);
}

#[test]
fn eviction_removes_the_whole_block() {
    let index = PrefixIndex::new(1, 60_000);
    index.add(MODEL, &[7], "p", 0);
    index.add("m2", &[7], "q", 0);
    assert_eq!(index.match_names("m2", &[7], &["q"]), [100]);
    index.add(MODEL, &[8], "p", 1);
    assert_eq!(percents(&index, &[7], &["p"]), [0]);
    assert_eq!(index.match_names("m2", &[7], &["q"]), [0]);
}

#[test]
fn ttl_is_strictly_greater_since_last_add() {
    let index = PrefixIndex::new(100, 1_000);
    index.add(MODEL, &[1], "p", 0);
    index.add(MODEL, &[2], "p", 0);
    assert_eq!(index.sweep(1_000), 0, "exactly the TTL old is still live");
    index.add(MODEL, &[2], "p", 500);
    assert_eq!(index.sweep(1_001), 1);
    assert_eq!(percents(&index, &[1], &["p"]), [0]);
    assert_eq!(percents(&index, &[2], &["p"]), [100]);
    assert_eq!(index.sweep(1_500), 0);
    assert_eq!(index.sweep(1_501), 1);
    assert!(index.is_empty());
}

#[test]
fn unswept_blocks_still_match() {
    let index = PrefixIndex::new(100, 1_000);
    index.add(MODEL, &[1], "p", 0);
    assert_eq!(percents(&index, &[1], &["p"]), [100]);
    assert_eq!(index.sweep(5_000), 1);
    assert_eq!(percents(&index, &[1], &["p"]), [0]);
}

#[test]
fn shards_split_capacity_exactly_and_bound_memory() {
    let index = PrefixIndex::new(200_000, 60_000);
    assert_eq!(index.shards.len(), MAX_SHARDS);
    let shares: usize = index.shards.iter().map(|s| lock(s).capacity()).sum();
    assert_eq!(shares, 200_000);
    assert_eq!(PrefixIndex::new(2_047, 1).shards.len(), 1);
    assert_eq!(PrefixIndex::new(2_048, 1).shards.len(), 2);

    let mut rng = StdRng::seed_from_u64(7);
    let pods = ["pod-0", "pod-1"];
    for chunk in 0..2_500u64 {
        let hashes: Vec<u64> = (0..128).map(|_| rng.random()).collect();
        index.add(MODEL, &hashes, pods[(chunk % 2) as usize], chunk);
    }
    let held = index.len();
    assert!(held <= 200_000, "{held}");
    assert!(
        held > 190_000,
        "per-shard LRU keeps nearly all capacity in use: {held}"
    );
    let per_block = index.heap_bytes() / held;
    assert!(
        (48..=160).contains(&per_block),
        "{per_block} bytes per block, documented as about 100"
    );
}

#[test]
fn concurrent_adds_matches_removes_and_sweeps() {
    let index = Arc::new(PrefixIndex::new(4_096, 60_000));
    let threads = 4;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let index = Arc::clone(&index);
            scope.spawn(move || {
                let mut rng = StdRng::seed_from_u64(t);
                let pod = format!("pod-{t}");
                for round in 0..2_000u64 {
                    let family: u64 = rng.random_range(0..32);
                    let bytes: Vec<u8> = (0..64).map(|i| (family * 31 + i) as u8).collect();
                    let hashes = block_hashes(&bytes, 8, 0);
                    let seen = index.match_names(MODEL, &hashes, &[pod.as_str(), "other"]);
                    assert!(seen.iter().all(|&p| p <= 100));
                    index.add(MODEL, &hashes, &pod, round);
                    assert_eq!(
                        index.match_names(MODEL, &hashes[..1], &[pod.as_str()]),
                        [100]
                    );
                    // The one-shard operations, interleaved with matches that hold every
                    // shard: none may wait on a match that waits on it.
                    if round % 100 == 99 {
                        index.remove(MODEL, hashes[7], "absent");
                        index.sweep(round);
                    }
                }
            });
        }
    });
    assert!(index.len() <= 4_096);
    // Every thread added every family it drew; 32 families × 8 blocks fit easily.
    let bytes: Vec<u8> = (0..64).map(|i| i as u8).collect();
    let hashes = block_hashes(&bytes, 8, 0);
    let all = index.match_names(MODEL, &hashes, &["pod-0", "pod-1", "pod-2", "pod-3"]);
    assert_eq!(all, [100, 100, 100, 100]);
}

/// Adds are grouped by shard; within a shard the request's block order must survive, so the
/// earliest blocks of a request are the first evicted, in every shard.
#[test]
fn grouped_adds_keep_request_order_within_each_shard() {
    let index = PrefixIndex::new(2_048, 60_000);
    assert_eq!(index.shards.len(), 2);
    let mut rng = StdRng::seed_from_u64(11);
    let first: Vec<u64> = (0..2_048).map(|_| rng.random()).collect();
    index.add(MODEL, &first, "p", 0);
    let second: Vec<u64> = (0..300).map(|_| rng.random()).collect();
    index.add(MODEL, &second, "p", 1);
    assert_eq!(index.len(), 2_048);
    for shard in 0..2 {
        let positions: Vec<(usize, bool)> = first
            .iter()
            .enumerate()
            .filter(|&(_, &hash)| index.shard_of(hash) == shard)
            .map(|(i, &hash)| (i, index.match_names(MODEL, &[hash], &["p"]) == [100]))
            .collect();
        let last_evicted = positions.iter().filter(|p| !p.1).map(|p| p.0).max();
        let first_kept = positions.iter().filter(|p| p.1).map(|p| p.0).min();
        if let (Some(evicted), Some(kept)) = (last_evicted, first_kept) {
            assert!(
                evicted < kept,
                "shard {shard}: evicted {evicted} after kept {kept}"
            );
        }
        assert!(last_evicted.is_some(), "shard {shard} evicted nothing");
    }
}

#[test]
fn debug_output_is_a_summary() {
    let index = PrefixIndex::new(100, 60_000);
    index.add(MODEL, &(0..50).collect::<Vec<u64>>(), "p", 0);
    let printed = format!("{index:?}");
    assert!(printed.contains("capacity: 100"), "{printed}");
    assert!(printed.len() < 120, "{printed}");
}

#[test]
fn remove_forgets_one_pod_of_one_model() {
    // Sharded (2 048 blocks → 2 shards), so the removal finds the block's own shard.
    let index = PrefixIndex::new(2_048, 60_000);
    let hashes = block_hashes(b"abcdefghijklmnop", 4, 0);
    index.add(MODEL, &hashes, "a", 0);
    index.add(MODEL, &hashes, "b", 0);
    index.add("m2", &hashes, "a", 0);
    assert!(index.remove(MODEL, hashes[1], "a"));
    assert!(!index.remove(MODEL, hashes[1], "a"), "already gone");
    assert_eq!(percents(&index, &hashes, &["a", "b"]), [25, 100]);
    assert_eq!(index.match_names("m2", &hashes, &["a"]), [100]);
    assert_eq!(index.len(), 4, "blocks other pods hold stay");
    for (model, pod) in [(MODEL, "a"), (MODEL, "b"), ("m2", "a")] {
        assert!(index.remove(model, hashes[3], pod));
    }
    assert_eq!(index.len(), 3, "a block nobody holds is dropped");
}

#[test]
fn blocks_held_by_counts_a_pods_blocks_once_across_models_and_shards() {
    // Sharded (2 048 blocks → 2 shards): the count walks every shard.
    let index = PrefixIndex::new(2_048, 60_000);
    let hashes = block_hashes(b"abcdefghijklmnop", 4, 0);
    index.add(MODEL, &hashes, "a", 0);
    index.add("m2", &hashes[..2], "a", 0);
    index.add(MODEL, &hashes[..3], "b", 0);
    assert_eq!(
        index.blocks_held_by("a"),
        4,
        "a block held for two models counts once"
    );
    assert_eq!(index.blocks_held_by("b"), 3);
    assert_eq!(index.blocks_held_by("nobody"), 0);
    assert!(index.remove(MODEL, hashes[0], "b"));
    assert_eq!(index.blocks_held_by("b"), 2);
}

proptest::proptest! {
    /// An add after a match (slots taken from the match's notes) leaves the index exactly as
    /// a plain add does, even when other adds, removes and sweeps between the two evict the
    /// matched blocks and give their slots to other blocks.
    #[test]
    fn add_after_match_equals_a_plain_add(seed in proptest::prelude::any::<u64>()) {
        let mut rng = StdRng::seed_from_u64(seed);
        // 2 048 blocks: two shards of 1 024, filled past capacity by the pool below.
        let noted = PrefixIndex::new(2_048, 1_000);
        let plain = PrefixIndex::new(2_048, 1_000);
        let pool: Vec<u64> = (0..3_000).map(|_| rng.random()).collect();
        let pods = ["a", "b", "c"];
        for now in 0..40 {
            let start = rng.random_range(0..pool.len() - 200);
            let request = &pool[start..start + rng.random_range(1..200)];
            let pod = pods[rng.random_range(0..pods.len())];
            let candidates: Vec<PodMatch> = pods.iter().map(|p| PodMatch::new(p)).collect();
            let mut found = FoundBlocks::default();
            let (mut seen_noted, mut seen_plain) = (candidates.clone(), candidates);
            noted.match_pods_noting(MODEL, request, &mut seen_noted, &mut found);
            plain.match_pods(MODEL, request, &mut seen_plain);
            proptest::prop_assert_eq!(&seen_noted, &seen_plain);
            // Between the match and its add, other requests evict, remove and sweep.
            for index in [&noted, &plain] {
                let mut rng = StdRng::seed_from_u64(seed ^ now);
                let other = rng.random_range(0..pool.len() - 400);
                index.add(MODEL, &pool[other..other + 400], "d", now * 10);
                for _ in 0..20 {
                    let hash = request[rng.random_range(0..request.len())];
                    for pod in pods {
                        index.remove(MODEL, hash, pod);
                    }
                }
                index.sweep(now * 10);
            }
            noted.add_after_match(MODEL, request, pod, now * 10 + 5, &found);
            plain.add(MODEL, request, pod, now * 10 + 5);
        }
        for (noted, plain) in noted.shards.iter().zip(plain.shards.iter()) {
            let (noted, plain) = (lock(noted), lock(plain));
            proptest::prop_assert_eq!(noted.oldest_first(), plain.oldest_first());
        }
        let everything: Vec<u64> = pool.clone();
        for pod in pods.iter().chain(&["d"]) {
            proptest::prop_assert_eq!(noted.blocks_held_by(pod), plain.blocks_held_by(pod));
        }
        for hash in everything {
            proptest::prop_assert_eq!(
                noted.match_blocks(MODEL, &[hash], &pods),
                plain.match_blocks(MODEL, &[hash], &pods)
            );
        }
    }
}

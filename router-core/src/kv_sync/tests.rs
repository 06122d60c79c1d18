//! KV-event sync against the index: engine-fed hashes equal request-side hashes, parents
//! chain across events, removals touch one pod, misaligned and orphaned events are refused.

use super::*;
use crate::hash::block_hashes;
use crate::index::PrefixIndex;

pub(super) const MODEL: &str = "m";
/// vLLM's default block of 16 tokens; the router's default 128 bytes = 32 tokens = 2 blocks.
pub(super) const ENGINE_TOKENS: usize = 16;

pub(super) fn settings(router_block_bytes: usize) -> SyncSettings {
    SyncSettings {
        router_block_bytes,
        seed: 7,
        max_engine_blocks: DEFAULT_MAX_ENGINE_BLOCKS,
    }
}

pub(super) fn models() -> Vec<String> {
    vec![MODEL.to_owned()]
}

/// A prompt of `blocks` engine blocks, token i = 1000 + i.
pub(super) fn prompt(blocks: usize) -> Vec<u32> {
    (0..(blocks * ENGINE_TOKENS) as u32)
        .map(|i| 1000 + i)
        .collect()
}

/// Engine hashes for blocks `range` (opaque ids: anything stable per block works).
pub(super) fn engine_hash(block: usize) -> u64 {
    0xE000_0000 + block as u64
}

/// The `BlockStored` for engine blocks `from..to` of `tokens`.
pub(super) fn stored(tokens: &[u32], from: usize, to: usize) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: (from..to).map(engine_hash).collect(),
        parent: (from > 0).then(|| engine_hash(from - 1)),
        token_ids: tokens[from * ENGINE_TOKENS..to * ENGINE_TOKENS].to_vec(),
        block_size: ENGINE_TOKENS,
    }
}

pub(super) fn request_hashes(tokens: &[u32], settings: &SyncSettings) -> Vec<u64> {
    block_hashes(
        &token_bytes(tokens),
        settings.router_block_bytes,
        settings.seed,
    )
}

#[test]
fn engine_fed_hashes_equal_request_hashes_across_events() {
    for router_bytes in [64, 128, 256] {
        let settings = settings(router_bytes);
        let index = PrefixIndex::new(1_000, 60_000);
        let mut sync = PodSync::new();
        let tokens = prompt(7);
        // Split unevenly: 3 blocks, then 1 (its parent from the first event), then 3.
        for (from, to) in [(0, 3), (3, 4), (4, 7)] {
            sync.apply(
                &stored(&tokens, from, to),
                "b",
                &models(),
                &index,
                &settings,
                0,
            )
            .unwrap();
        }
        let hashes = request_hashes(&tokens, &settings);
        assert_eq!(hashes.len(), 7 * ENGINE_TOKENS * 4 / router_bytes);
        assert_eq!(index.len(), hashes.len(), "exactly the router blocks");
        assert_eq!(
            index.match_names(MODEL, &hashes, &["a", "b"]),
            [0, 100],
            "router block {router_bytes} bytes"
        );
        // A longer request sharing the stored prefix matches its share.
        let longer = request_hashes(&prompt(14), &settings);
        let pct = index.match_names(MODEL, &longer, &["b"])[0];
        assert_eq!(usize::from(pct), hashes.len() * 100 / longer.len());
    }
}

#[test]
fn a_parent_from_an_earlier_event_chains_and_an_unknown_one_is_refused() {
    let settings = settings(128);
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(2);
    // One engine block is half a router block: nothing is indexed until the second arrives.
    let first = sync
        .apply(&stored(&tokens, 0, 1), "b", &models(), &index, &settings, 0)
        .unwrap();
    assert_eq!(first.added, 0);
    let second = sync
        .apply(&stored(&tokens, 1, 2), "b", &models(), &index, &settings, 0)
        .unwrap();
    assert_eq!(second.added, 1);
    let hashes = request_hashes(&tokens, &settings);
    assert_eq!(index.match_names(MODEL, &hashes, &["b"]), [100]);

    let orphan = stored(&prompt(6), 5, 6);
    let error = sync
        .apply(&orphan, "b", &models(), &index, &settings, 0)
        .unwrap_err();
    assert_eq!(error, SyncError::UnknownParent(engine_hash(4)));
    assert_eq!(error.kind(), "unknown_parent");
}

#[test]
fn a_removed_block_stops_matching_on_that_pod_only() {
    let settings = settings(128);
    let index = PrefixIndex::new(1_000, 60_000);
    let tokens = prompt(4);
    let hashes = request_hashes(&tokens, &settings);
    let (mut a, mut b) = (PodSync::new(), PodSync::new());
    for (sync, pod) in [(&mut a, "a"), (&mut b, "b")] {
        sync.apply(&stored(&tokens, 0, 4), pod, &models(), &index, &settings, 0)
            .unwrap();
    }
    assert_eq!(index.match_names(MODEL, &hashes, &["a", "b"]), [100, 100]);
    // Evicting engine block 2 (the first half of router block 1) loses router block 1 on b.
    let removed = b
        .apply(
            &KvEvent::BlockRemoved {
                block_hashes: vec![engine_hash(2), 0xdead],
            },
            "b",
            &models(),
            &index,
            &settings,
            0,
        )
        .unwrap();
    assert_eq!(removed.removed, 1);
    assert_eq!(index.match_names(MODEL, &hashes, &["a", "b"]), [100, 50]);
    assert_eq!(b.len(), 3);
}

#[test]
fn all_blocks_cleared_drops_that_pods_entries() {
    let settings = settings(64);
    let index = PrefixIndex::new(1_000, 60_000);
    let tokens = prompt(3);
    let hashes = request_hashes(&tokens, &settings);
    let (mut a, mut b) = (PodSync::new(), PodSync::new());
    for (sync, pod) in [(&mut a, "a"), (&mut b, "b")] {
        sync.apply(&stored(&tokens, 0, 3), pod, &models(), &index, &settings, 0)
            .unwrap();
    }
    let cleared = a
        .apply(
            &KvEvent::AllBlocksCleared,
            "a",
            &models(),
            &index,
            &settings,
            0,
        )
        .unwrap();
    assert_eq!(cleared.removed, 3);
    assert!(a.is_empty());
    assert_eq!(index.match_names(MODEL, &hashes, &["a", "b"]), [0, 100]);
    assert_eq!(b.clear("b", &index), 3);
    assert!(index.is_empty());
}

#[test]
fn misaligned_block_sizes_are_refused() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(2);
    // 100 bytes is not a whole number of 64-byte engine blocks; 32 bytes is half of one.
    for router_bytes in [100, 32] {
        let error = sync
            .apply(
                &stored(&tokens, 0, 2),
                "b",
                &models(),
                &index,
                &settings(router_bytes),
                0,
            )
            .unwrap_err();
        assert_eq!(
            error,
            SyncError::Misaligned {
                engine_tokens: ENGINE_TOKENS,
                router_bytes
            }
        );
        assert!(
            error
                .to_string()
                .contains("multiple of 4 × the engine's block size")
        );
    }
    assert!(index.is_empty() && sync.is_empty());
}

#[test]
fn a_full_map_refuses_further_blocks_but_keeps_the_completed_ones() {
    let settings = SyncSettings {
        max_engine_blocks: 3,
        ..settings(64)
    };
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let error = sync
        .apply(
            &stored(&prompt(5), 0, 5),
            "b",
            &models(),
            &index,
            &settings,
            0,
        )
        .unwrap_err();
    assert_eq!(error.kind(), "pod_map_full");
    assert_eq!((sync.len(), index.len()), (3, 3));
}

#[test]
fn a_block_stored_again_refreshes_without_recounting() {
    let settings = settings(128);
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    sync.apply(&stored(&tokens, 0, 2), "b", &models(), &index, &settings, 0)
        .unwrap();
    // The engine re-stores blocks 0..4 (e.g. replayed): the known ones keep their chain.
    let again = sync
        .apply(&stored(&tokens, 0, 4), "b", &models(), &index, &settings, 5)
        .unwrap();
    assert_eq!(again.added, 2);
    assert_eq!(sync.len(), 4);
    let hashes = request_hashes(&tokens, &settings);
    assert_eq!(index.match_names(MODEL, &hashes, &["b"]), [100]);
}

proptest::proptest! {
    /// However a prompt's blocks are split into events, and whatever whole number of engine
    /// blocks a router block spans, the engine-fed index matches the request side's hashes
    /// in full; evicting one engine block cuts the match at the router block holding it.
    #[test]
    fn any_split_matches_in_full_and_an_eviction_cuts_at_its_router_block(
        blocks in 1usize..24,
        per_router in proptest::sample::select(vec![1usize, 2, 4]),
        cuts in proptest::collection::vec(1usize..24, 0..6),
        evicted in 0usize..24,
    ) {
        let settings = settings(4 * ENGINE_TOKENS * per_router);
        let index = PrefixIndex::new(1_000, 60_000);
        let mut sync = PodSync::new();
        let tokens = prompt(blocks);
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c < blocks).collect();
        bounds.extend([0, blocks]);
        bounds.sort_unstable();
        bounds.dedup();
        for pair in bounds.windows(2) {
            sync.apply(&stored(&tokens, pair[0], pair[1]), "b", &models(), &index, &settings, 0)
                .unwrap();
        }
        let hashes = request_hashes(&tokens, &settings);
        proptest::prop_assert_eq!(hashes.len(), blocks / per_router);
        proptest::prop_assert_eq!(index.len(), hashes.len());
        if hashes.is_empty() {
            return Ok(());
        }
        proptest::prop_assert_eq!(index.match_names(MODEL, &hashes, &["b"]), vec![100]);
        let evicted = evicted % blocks;
        sync.apply(
            &KvEvent::BlockRemoved { block_hashes: vec![engine_hash(evicted)] },
            "b",
            &models(),
            &index,
            &settings,
            0,
        )
        .unwrap();
        let kept = (evicted / per_router).min(hashes.len());
        let expected = (kept * 100 / hashes.len()) as u8;
        proptest::prop_assert_eq!(index.match_names(MODEL, &hashes, &["b"]), vec![expected]);
    }
}

#[test]
fn a_block_stored_again_after_an_eviction_is_a_member_of_its_router_block_again() {
    let settings = settings(128);
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    let hashes = request_hashes(&tokens, &settings);
    let evict_2 = KvEvent::BlockRemoved {
        block_hashes: vec![engine_hash(2)],
    };
    sync.apply(&stored(&tokens, 0, 4), "b", &models(), &index, &settings, 0)
        .unwrap();
    sync.apply(&evict_2, "b", &models(), &index, &settings, 0)
        .unwrap();
    assert_eq!(index.match_names(MODEL, &hashes, &["b"]), [50]);
    // Block 2 is recomputed; block 3 was never evicted, so it completes router block 1 from
    // its stored chain, and block 2 must learn that router block again.
    let again = sync
        .apply(&stored(&tokens, 0, 4), "b", &models(), &index, &settings, 0)
        .unwrap();
    assert_eq!(again.added, 2);
    assert_eq!(index.match_names(MODEL, &hashes, &["b"]), [100]);
    let evicted = sync
        .apply(&evict_2, "b", &models(), &index, &settings, 0)
        .unwrap();
    assert_eq!(
        evicted.removed, 1,
        "evicting block 2 again drops router block 1"
    );
    assert_eq!(index.match_names(MODEL, &hashes, &["b"]), [50]);
}

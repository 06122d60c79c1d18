//! A data-parallel pod's index entry is the union of its ranks: a block stored by two ranks
//! and removed, cleared or restarted away by one stays indexed for the pod; a block only one
//! rank held goes with it; each rank's engine hashes are its own.

use super::tests::{MODEL, engine_hash, models, prompt, request_hashes, settings, stored};
use super::*;
use crate::index::PrefixIndex;

/// `sync` applies `event` as rank `rank` of pod "p" (router blocks of 128 bytes).
fn apply(sync: &mut PodSync, index: &PrefixIndex, rank: u32, event: &KvEvent) -> Applied {
    sync.apply_rank(rank, event, "p", &models(), index, &settings(128), 0)
        .unwrap()
}

fn removed(blocks: &[usize]) -> KvEvent {
    KvEvent::BlockRemoved {
        block_hashes: blocks.iter().map(|&b| engine_hash(b)).collect(),
    }
}

/// The pod's match for a 4-engine-block (2-router-block) prompt.
fn matched(index: &PrefixIndex, tokens: &[u32]) -> u8 {
    index.match_names(MODEL, &request_hashes(tokens, &settings(128)), &["p"])[0]
}

#[test]
fn a_block_two_ranks_store_stays_until_both_remove_it() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    for rank in [0, 1] {
        let applied = apply(&mut sync, &index, rank, &stored(&tokens, 0, 4));
        assert_eq!(applied.added, 2, "rank {rank}");
    }
    assert_eq!((sync.rank_len(0), sync.rank_len(1), sync.len()), (4, 4, 8));
    assert_eq!(matched(&index, &tokens), 100);
    // Rank 0 evicts engine block 2 (router block 1): rank 1 still holds it.
    assert_eq!(apply(&mut sync, &index, 0, &removed(&[2])).removed, 0);
    assert_eq!(matched(&index, &tokens), 100);
    // Rank 1 evicts it too: now no rank holds router block 1.
    assert_eq!(apply(&mut sync, &index, 1, &removed(&[3])).removed, 1);
    assert_eq!(matched(&index, &tokens), 50);
    assert_eq!(sync.held_router_blocks(), 1);
}

#[test]
fn a_ranks_all_blocks_cleared_keeps_what_another_rank_holds() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let shared = prompt(4);
    // Rank 0 also holds a prompt of its own (engine hashes 100..): other tokens.
    let own: Vec<u32> = prompt(4).iter().map(|t| t + 50_000).collect();
    let own_event = KvEvent::BlockStored {
        block_hashes: (100..104).collect(),
        parent: None,
        token_ids: own.clone(),
        block_size: 16,
    };
    apply(&mut sync, &index, 0, &stored(&shared, 0, 4));
    apply(&mut sync, &index, 0, &own_event);
    apply(&mut sync, &index, 1, &stored(&shared, 0, 4));
    assert_eq!(
        (matched(&index, &shared), matched(&index, &own)),
        (100, 100)
    );
    let cleared = apply(&mut sync, &index, 0, &KvEvent::AllBlocksCleared);
    assert_eq!(
        cleared.removed, 2,
        "only rank 0's own prompt leaves the index"
    );
    assert_eq!((matched(&index, &shared), matched(&index, &own)), (100, 0));
    assert_eq!((sync.rank_len(0), sync.rank_len(1)), (0, 4));
    // Rank 1 clearing too empties the pod.
    assert_eq!(
        apply(&mut sync, &index, 1, &KvEvent::AllBlocksCleared).removed,
        2
    );
    assert!(index.is_empty() && sync.is_empty());
    assert_eq!(sync.held_router_blocks(), 0);
}

#[test]
fn a_rank_that_restarts_drops_only_what_no_other_rank_holds() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    // Rank 1 holds the whole prompt, rank 0 only its first router block.
    apply(&mut sync, &index, 0, &stored(&tokens, 0, 2));
    apply(&mut sync, &index, 1, &stored(&tokens, 0, 4));
    assert_eq!(
        sync.clear_rank(1, "p", &index),
        1,
        "router block 1 was rank 1's only"
    );
    assert_eq!(
        matched(&index, &tokens),
        50,
        "rank 0 still holds router block 0"
    );
    assert_eq!(sync.clear_rank(1, "p", &index), 0, "nothing left on rank 1");
    assert_eq!(
        sync.clear_rank(7, "p", &index),
        0,
        "a rank never heard from"
    );
    assert_eq!(sync.clear_rank(0, "p", &index), 1);
    assert!(index.is_empty());
}

#[test]
fn the_pod_leaving_drops_every_ranks_blocks() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    apply(&mut sync, &index, 0, &stored(&tokens, 0, 2));
    apply(&mut sync, &index, 3, &stored(&tokens, 0, 4));
    assert_eq!(sync.clear("p", &index), 2);
    assert!(index.is_empty() && sync.is_empty());
    assert_eq!(sync.held_router_blocks(), 0);
}

#[test]
fn each_ranks_engine_hashes_are_its_own() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(4);
    apply(&mut sync, &index, 1, &stored(&tokens, 0, 2));
    // Rank 0 never stored engine block 1, so it cannot be rank 0's parent…
    let error = sync
        .apply_rank(
            0,
            &stored(&tokens, 2, 4),
            "p",
            &models(),
            &index,
            &settings(128),
            0,
        )
        .unwrap_err();
    assert_eq!(error, SyncError::UnknownParent(engine_hash(1)));
    // …and rank 0 evicting a hash only rank 1 knows removes nothing.
    assert_eq!(apply(&mut sync, &index, 0, &removed(&[0, 1])).removed, 0);
    assert_eq!(matched(&index, &tokens), 50);
    assert_eq!(sync.rank_len(1), 2);
}

#[test]
fn a_rank_beyond_the_limit_is_refused() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let tokens = prompt(2);
    apply(&mut sync, &index, MAX_DP_RANKS - 1, &stored(&tokens, 0, 2));
    let error = sync
        .apply_rank(
            MAX_DP_RANKS,
            &stored(&tokens, 0, 2),
            "p",
            &models(),
            &index,
            &settings(128),
            0,
        )
        .unwrap_err();
    assert_eq!(error, SyncError::Rank(MAX_DP_RANKS));
    assert_eq!(error.kind(), "dp_rank_out_of_range");
    assert!(error.to_string().contains("64"), "{error}");
    assert_eq!(sync.len(), 2, "nothing of the refused event is kept");
}

proptest::proptest! {
    /// Whatever ranks store and evict, a router block is indexed for the pod exactly when
    /// some rank still holds every engine block of it (the union, never a rank's view).
    #[test]
    fn the_pods_index_entry_is_the_union_of_its_ranks(
        ops in proptest::collection::vec((0u32..3, proptest::bool::ANY, 0usize..8), 1..40),
    ) {
        let index = PrefixIndex::new(1_000, 60_000);
        let mut sync = PodSync::new();
        let tokens = prompt(8);
        // Engine blocks each rank holds (a rank stores the whole prompt, or evicts one block).
        let mut held = [[false; 8]; 3];
        for (rank, store, block) in ops {
            let rank_held = &mut held[rank as usize];
            if store {
                apply(&mut sync, &index, rank, &stored(&tokens, 0, 8));
                *rank_held = [true; 8];
            } else {
                apply(&mut sync, &index, rank, &removed(&[block]));
                rank_held[block] = false;
            }
        }
        let hashes = request_hashes(&tokens, &settings(128));
        for (router, hash) in hashes.iter().enumerate() {
            // A rank's eviction cuts its router block (and, for matching, what follows it,
            // but the index entry itself is per block).
            let expected = held.iter().any(|h| h[2 * router] && h[2 * router + 1]);
            let indexed = index.match_names(MODEL, &[*hash], &["p"])[0] == 100;
            proptest::prop_assert_eq!(indexed, expected, "router block {}", router);
        }
    }
}

//! Which data-parallel ranks of one pod hold each router block, so the pod's index entry is
//! the **union** of its ranks' caches.
//!
//! A vLLM server started with `--data-parallel-size N` runs N engine cores behind one API
//! endpoint, each with its own KV cache and its own event stream. The prefix index keys
//! blocks by pod, not by rank, so a rank's `BlockRemoved`, `AllBlocksCleared` or restart may
//! drop a router block from the index only when no other rank of the pod still holds it.
//! One bit per rank (at most [`MAX_DP_RANKS`]) per router block keeps every such decision
//! O(1): nothing here scans the index or another rank's blocks.
//!
//! Pure bookkeeping: the caller ([`super::pod_sync::PodSync`]) decides when to touch the
//! index.

use std::collections::HashMap;

/// The most data-parallel ranks one pod may have (one bit each in a `u64`).
pub const MAX_DP_RANKS: u32 = 64;

/// Router block hash → bit set of the ranks holding it; a block no rank holds has no entry.
#[derive(Debug, Default)]
pub(crate) struct RankHolders {
    masks: HashMap<u64, u64>,
}

impl RankHolders {
    /// Records that `rank` (below [`MAX_DP_RANKS`], checked by the caller) holds `router`.
    pub(crate) fn hold(&mut self, router: u64, rank: u32) {
        *self.masks.entry(router).or_insert(0) |= bit(rank);
    }

    /// Records that `rank` no longer holds `router`; returns whether another rank still
    /// does (then the pod's index entry must stay).
    pub(crate) fn release(&mut self, router: u64, rank: u32) -> bool {
        let Some(mask) = self.masks.get_mut(&router) else {
            return false;
        };
        *mask &= !bit(rank);
        if *mask == 0 {
            self.masks.remove(&router);
            return false;
        }
        true
    }

    /// The router blocks any rank holds.
    pub(crate) fn routers(&self) -> impl Iterator<Item = u64> + '_ {
        self.masks.keys().copied()
    }

    /// Forgets every rank's holdings (the pod left).
    pub(crate) fn clear(&mut self) {
        self.masks.clear();
    }

    /// Router blocks held by at least one rank.
    pub(crate) fn len(&self) -> usize {
        self.masks.len()
    }
}

fn bit(rank: u32) -> u64 {
    1u64.checked_shl(rank).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_stays_held_until_its_last_rank_releases_it() {
        let mut holders = RankHolders::default();
        holders.hold(7, 0);
        holders.hold(7, 63);
        holders.hold(7, 63);
        assert!(holders.release(7, 0), "rank 63 still holds it");
        assert!(!holders.release(7, 63), "no rank holds it any more");
        assert_eq!(holders.len(), 0, "an unheld block leaves no entry");
        assert!(!holders.release(7, 63), "releasing again finds no holder");
    }

    #[test]
    fn releasing_a_rank_that_never_held_it_keeps_the_holders() {
        let mut holders = RankHolders::default();
        holders.hold(9, 1);
        assert!(holders.release(9, 0));
        assert_eq!(holders.routers().collect::<Vec<_>>(), [9]);
        holders.clear();
        assert_eq!(holders.len(), 0);
    }
}

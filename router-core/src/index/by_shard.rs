//! A request's blocks grouped by the shard that holds them, so that an add locks each shard
//! once per request rather than once per block.

use smallvec::SmallVec;

use super::MAX_SHARDS;

/// Block positions of a request, on the stack for prompts up to 256 blocks (32 KB of text
/// at 128-byte blocks).
pub(super) type Positions = SmallVec<[u32; 256]>;

/// The positions of a request's blocks (indexes into its hashes), grouped by shard by a
/// stable counting sort: inside each shard the request's order survives, which is the only
/// order a shard's LRU list can see.
pub(super) struct ByShard {
    /// Shard `s`'s positions are `order[starts[s]..starts[s + 1]]`.
    starts: [u32; MAX_SHARDS + 1],
    order: Positions,
}

impl ByShard {
    /// `hashes` grouped by `shard_of`, which must answer below [`MAX_SHARDS`].
    pub(super) fn new(hashes: &[u64], shard_of: impl Fn(u64) -> usize) -> Self {
        let mut starts = [0u32; MAX_SHARDS + 1];
        for &hash in hashes {
            starts[shard_of(hash) + 1] += 1;
        }
        for shard in 0..MAX_SHARDS {
            starts[shard + 1] += starts[shard];
        }
        let mut next = starts;
        let mut order: Positions = SmallVec::from_elem(0, hashes.len());
        for (position, &hash) in hashes.iter().enumerate() {
            let shard = shard_of(hash);
            order[next[shard] as usize] = position as u32;
            next[shard] += 1;
        }
        ByShard { starts, order }
    }

    /// The positions of the request's blocks in `shard`, in request order.
    pub(super) fn in_shard(&self, shard: usize) -> &[u32] {
        &self.order[self.starts[shard] as usize..self.starts[shard + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_positions_by_shard_in_request_order() {
        let hashes = [5u64, 2, 7, 0, 2, 5];
        let grouped = ByShard::new(&hashes, |hash| (hash % 3) as usize);
        assert_eq!(grouped.in_shard(0), [3]);
        assert_eq!(grouped.in_shard(1), [2]);
        assert_eq!(grouped.in_shard(2), [0, 1, 4, 5]);
        assert!(grouped.in_shard(3).is_empty());
        assert!(ByShard::new(&[], |_| 0).in_shard(0).is_empty());
    }
}

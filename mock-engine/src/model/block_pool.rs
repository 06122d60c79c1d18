//! The paged KV cache: a fixed pool of blocks with reference counts and a prefix cache.
//!
//! Follows vLLM's `BlockPool` (reference §4.3): a block holding a full, hashed block of tokens
//! stays findable by its hash after its last user frees it; free blocks wait in an LRU
//! [`FreeQueue`]; a hit on a free cached block takes it back out of the queue; a cached block
//! is evicted only when the queue hands it out again. Block 0 is vLLM's reserved null block
//! and is never handed out, which is why usage divides by `num_gpu_blocks - 1`.

use std::collections::HashMap;

use super::free_queue::FreeQueue;
use super::kv_events::{KvEvent, KvEventLog};

/// Index of a block in the pool.
pub type BlockId = u32;

/// Why a pool request could not be served (the scheduler turns these into waiting or
/// preemption, never into a panic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBlocks;

#[derive(Clone, Debug)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    /// The hash a block is registered under in `cached`, if any.
    hash: Vec<Option<u64>>,
    cached: HashMap<u64, BlockId>,
    free: FreeQueue,
    /// KV-cache events since the last take (off unless enabled).
    events: KvEventLog,
}

impl BlockPool {
    /// A pool of `num_gpu_blocks` blocks (block 0 reserved), all free.
    pub fn new(num_gpu_blocks: usize) -> BlockPool {
        // Block ids are u32; a profile asking for more blocks than that is capped, which is
        // billions of tokens beyond any real GPU.
        let total = num_gpu_blocks.min(u32::MAX as usize - 1);
        let mut free = FreeQueue::new(total);
        for block in 1..total {
            free.push_back(block as BlockId);
        }
        BlockPool {
            ref_count: vec![0; total],
            hash: vec![None; total],
            cached: HashMap::new(),
            free,
            events: KvEventLog::default(),
        }
    }

    /// Blocks requests can use (all but the null block).
    pub fn usable(&self) -> usize {
        self.ref_count.len().saturating_sub(1)
    }

    /// Free blocks, cached ones included.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// vLLM's `kv_cache_usage_perc`: `1 - free/(num_gpu_blocks - 1)`.
    pub fn usage(&self) -> f64 {
        let usable = self.usable();
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.num_free() as f64 / usable as f64
    }

    /// The longest run of cached blocks matching `hashes` from the first, at most
    /// `max_blocks` long. Read-only: a hit is taken with [`BlockPool::touch`].
    pub fn lookup_prefix(&self, hashes: &[u64], max_blocks: usize) -> Vec<BlockId> {
        hashes
            .iter()
            .take(max_blocks)
            .map_while(|hash| self.cached.get(hash).copied())
            .collect()
    }

    /// Whether `hit` (from [`BlockPool::lookup_prefix`]) plus `new_blocks` fresh ones can be
    /// had now. Hit blocks that are free count against the free list, as in vLLM.
    pub fn can_allocate(&self, hit: &[BlockId], new_blocks: usize) -> bool {
        let evictable_hits = hit.iter().filter(|b| self.is_free(**b)).count();
        new_blocks + evictable_hits <= self.num_free()
    }

    /// Takes a reference on each hit block, pulling free ones out of the free list.
    pub fn touch(&mut self, hit: &[BlockId]) {
        for &block in hit {
            self.free.remove(block);
            if let Some(count) = self.ref_count.get_mut(block as usize) {
                *count += 1;
            }
        }
    }

    /// Hands out `n` blocks from the head of the free list, evicting their cached contents.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, OutOfBlocks> {
        if n > self.num_free() {
            return Err(OutOfBlocks);
        }
        let mut blocks = Vec::with_capacity(n);
        for _ in 0..n {
            let block = self.free.pop_front().ok_or(OutOfBlocks)?;
            self.evict(block);
            self.ref_count[block as usize] = 1;
            blocks.push(block);
        }
        Ok(blocks)
    }

    /// Registers a now-full block under `hash` so later requests can hit it. If another
    /// block already holds that hash (two requests computed the same block at once), this
    /// one stays unregistered and is recycled as a plain block when freed. Returns whether
    /// the block was registered (the caller announces exactly those: [`BlockPool::record_stored`]).
    pub fn cache(&mut self, block: BlockId, hash: u64) -> bool {
        let index = block as usize;
        if index >= self.hash.len() || self.hash[index].is_some() {
            return false;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.cached.entry(hash) {
            slot.insert(block);
            self.hash[index] = Some(hash);
            return true;
        }
        false
    }

    /// Starts or stops recording KV-cache events.
    pub fn set_events_enabled(&mut self, enabled: bool) {
        self.events.set_enabled(enabled);
    }

    pub fn events_enabled(&self) -> bool {
        self.events.is_enabled()
    }

    /// Records `BlockStored` for blocks the caller just registered with
    /// [`BlockPool::cache`] (the pool does not know their tokens).
    pub fn record_stored(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        block_size: usize,
    ) {
        self.events
            .stored(block_hashes, parent, token_ids, block_size);
    }

    /// Events recorded and not yet taken: the step in flight's, which the engine publishes
    /// when that step ends (tests compare the pool with what subscribers saw plus these).
    pub fn pending_events(&self) -> &[KvEvent] {
        self.events.pending()
    }

    /// The events recorded since the last take, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.take()
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached hash, only when no block is in use
    /// (a running request's blocks would otherwise lose their identity under it). Returns
    /// whether the cache was reset; records `AllBlocksCleared` when it was.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free() != self.usable() {
            return false;
        }
        self.cached.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        self.events.cleared();
        true
    }

    /// Every hash currently findable, in no particular order (tests and diagnostics).
    pub fn cached_hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.cached.keys().copied()
    }

    /// Drops one reference on each of a request's blocks, given in the request's order.
    /// They are released **in reverse**, so the request's last blocks reach the head of the
    /// LRU first and its prefix survives longest (vLLM's order).
    pub fn free(&mut self, blocks: &[BlockId]) {
        for &block in blocks.iter().rev() {
            let Some(count) = self.ref_count.get_mut(block as usize) else {
                continue;
            };
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.free.push_back(block);
            }
        }
    }

    /// Whether `hash` is currently findable (for tests and diagnostics).
    pub fn is_cached(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    /// References currently held on `block`.
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_count.get(block as usize).copied().unwrap_or(0)
    }

    /// Free block ids from the next to be reused to the last (for tests).
    pub fn free_order(&self) -> Vec<BlockId> {
        self.free.iter().collect()
    }

    /// Checks the pool against the references `holders` says exist (each request's block
    /// list): counts match, free ⇔ unreferenced, the cache map and block hashes agree.
    pub fn check(&self, holders: &[&[BlockId]]) -> Result<(), String> {
        let mut expected = vec![0u32; self.ref_count.len()];
        for blocks in holders {
            for &block in *blocks {
                let slot = expected
                    .get_mut(block as usize)
                    .ok_or_else(|| format!("block {block} out of range"))?;
                *slot += 1;
            }
        }
        if expected != self.ref_count {
            return Err("reference counts differ from the holders' block lists".into());
        }
        if self.ref_count.first().copied().unwrap_or(0) != 0 || self.free.contains(0) {
            return Err("the null block was handed out".into());
        }
        for (block, count) in self.ref_count.iter().enumerate().skip(1) {
            if (*count == 0) != self.free.contains(block as BlockId) {
                let listed = self.free.contains(block as BlockId);
                return Err(format!(
                    "block {block}: {count} references, in free list: {listed}"
                ));
            }
        }
        let used = self.ref_count.iter().filter(|c| **c > 0).count();
        if used + self.num_free() != self.usable() {
            return Err(format!(
                "used {used} + free {} ≠ {}",
                self.num_free(),
                self.usable()
            ));
        }
        for (hash, block) in &self.cached {
            if self.hash.get(*block as usize).copied().flatten() != Some(*hash) {
                return Err(format!(
                    "cache entry {hash:#x} → {block} disagrees with the block"
                ));
            }
        }
        let registered = self.hash.iter().filter(|h| h.is_some()).count();
        if registered != self.cached.len() {
            return Err("a block carries a hash the cache map does not know".into());
        }
        Ok(())
    }

    fn is_free(&self, block: BlockId) -> bool {
        self.free.contains(block)
    }

    /// Forgets a block's cached contents as it is reused (vLLM's lazy eviction).
    fn evict(&mut self, block: BlockId) {
        if let Some(hash) = self.hash.get_mut(block as usize).and_then(Option::take) {
            self.cached.remove(&hash);
            self.events.removed(hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_cached_free_blocks_as_free() {
        let mut pool = BlockPool::new(11); // 10 usable
        let blocks = pool.allocate(4).expect("4 of 10");
        assert!((pool.usage() - 0.4).abs() < 1e-12);
        pool.cache(blocks[0], 0xa);
        pool.free(&blocks);
        assert_eq!(pool.usage(), 0.0);
        assert!(pool.is_cached(0xa));
        pool.check(&[]).expect("consistent");
    }

    #[test]
    fn freed_blocks_are_reused_last_block_first_and_evicted_lazily() {
        let mut pool = BlockPool::new(5); // usable 1..=4
        let a = pool.allocate(3).expect("3 of 4");
        for (i, b) in a.iter().enumerate() {
            pool.cache(*b, 100 + i as u64);
        }
        pool.free(&a);
        // Block 4 was never used, then a's blocks in reverse: a[2], a[1], a[0].
        assert_eq!(pool.free_order(), vec![4, a[2], a[1], a[0]]);
        let b = pool.allocate(2).expect("2 of 4");
        assert_eq!(b, vec![4, a[2]]);
        assert!(!pool.is_cached(102), "reused block loses its hash");
        assert!(pool.is_cached(100) && pool.is_cached(101));
        pool.check(&[&b]).expect("consistent");
    }

    #[test]
    fn hits_take_references_and_leave_the_free_list() {
        let mut pool = BlockPool::new(6);
        let a = pool.allocate(2).expect("2 of 5");
        pool.cache(a[0], 7);
        pool.cache(a[1], 8);
        let hit = pool.lookup_prefix(&[7, 8, 9], 3);
        assert_eq!(hit, a);
        assert_eq!(pool.lookup_prefix(&[7, 8], 1), vec![a[0]]);
        // The walk stops at the first miss even if later hashes are cached.
        assert_eq!(pool.lookup_prefix(&[7, 99, 8], 3), vec![a[0]]);
        // Shared while running: two references, still counted once in usage.
        pool.touch(&hit);
        assert_eq!(pool.ref_count(a[0]), 2);
        assert!((pool.usage() - 0.4).abs() < 1e-12);
        pool.free(&a);
        pool.check(&[&hit]).expect("consistent");
        pool.free(&hit);
        // Now free but cached; a hit on them must count against the free list.
        let hit = pool.lookup_prefix(&[7, 8], 2);
        assert!(pool.can_allocate(&hit, 3));
        assert!(!pool.can_allocate(&hit, 4));
        assert_eq!(pool.allocate(6), Err(OutOfBlocks));
        pool.check(&[]).expect("consistent");
    }

    #[test]
    fn duplicate_hash_stays_unregistered() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate(2).expect("2 of 3");
        pool.cache(a[0], 5);
        pool.cache(a[1], 5);
        assert_eq!(pool.lookup_prefix(&[5], 1), vec![a[0]]);
        pool.check(&[&a]).expect("consistent");
    }
}

//! The prefix index: block hash → model → pods that were sent that block (AIBrix's local
//! indexer, `prefixcacheindexer/hash.go` over `lrustore`).
//!
//! Semantics, as in AIBrix v0.7.0:
//! - **Add** records every full block of a routed request for the chosen pod and refreshes the
//!   block's LRU position and TTL stamp. **Lookups refresh nothing**: a block that is only
//!   matched, never re-added, ages out.
//! - **Capacity** is in blocks, shared by all models; a new block past capacity evicts the
//!   least recently *added* block, whole (every model and pod in it).
//! - **TTL**: [`PrefixIndex::sweep`] removes blocks whose last add is strictly more than the
//!   TTL ago. The index never reads a clock; the caller sweeps periodically
//!   (`eviction_interval_secs`). Lookups do not check the TTL, as in AIBrix, so an unswept
//!   block still matches.
//! - **Remove** (KV-event sync only; AIBrix's local indexer has none) forgets one pod of one
//!   model for one block, when that pod's engine reports the block evicted.
//! - **Match** walks the request's hashes from the first block. Every candidate pod keeps its
//!   longest leading run of held blocks; `pct = floor((i+1)·100 / n)` with `n` the number of
//!   full blocks. A pod that stops matching keeps its earlier value and drops out; the walk
//!   stops when no candidate holds the block. There is no minimum threshold: a pod holding
//!   one block of more than 100 matches at 0 %, and is still a matched pod.
//!
//! Concurrency: the blocks are split over up to 8 shards by the top bits of the block hash,
//! each shard with its own lock, map and LRU list, so no lock covers the whole index. A match
//! locks one shard at a time, per block (holding it for one probe: taking all 8 once for the
//! walk saved 4.6 % of a lone decision but cost two threads on one hot prompt 31 % of their
//! throughput, `decision-threads` in the route bench); an add visits the
//! request's blocks grouped by shard and locks each shard once, holding it for that shard's
//! share of the request (about 20 of a 160-block request's blocks, a fraction of a
//! microsecond). Each shard holds
//! `capacity / shards` blocks (the remainder spread one each over the first shards) and
//! evicts its own oldest block. That approximates one global LRU closely: block hashes are
//! uniform, so every shard sees the same share of adds, and a shard's oldest block is among
//! the globally oldest (the shares differ by about `1/√(capacity/shards)`, under 1 % at the
//! default 200 000 blocks in 8 shards of 25 000). Small indexes (under 2 048 blocks, as in
//! tests) use a single shard and are an exact LRU.
//!
//! Model and pod names are stored as XXH64 digests of the name (8 bytes each): no interner,
//! no shared string table, and a collision between two live names has probability ~2⁻⁶⁴.
//!
//! Memory, per held block, on 64-bit targets: a 64-byte slot (hash, stamp, two `u32` LRU
//! links, the first (model, pod) pair inline, and the header of a side `Vec` for further
//! pairs), and a map bucket of 16 + 1 bytes at a load factor between 7/16 and 7/8: about
//! **86 bytes for a block held by one pod** (measured on a full 200 000-block index), plus
//! 16 bytes and an allocator header per further pod or model. The default 200 000 blocks
//! therefore cost about 17 MB. [`PrefixIndex::heap_bytes`] reports the figure for a live
//! index.

use std::sync::{Mutex, MutexGuard, PoisonError};

use xxhash_rust::xxh64::xxh64;

use crate::Millis;

mod by_shard;
mod found;
pub mod recall;
mod shard;

use by_shard::ByShard;
pub use found::FoundBlocks;
pub use recall::Recall;
use shard::{ModelKey, PodKey, Shard};

/// At most this many shards (a power of two). Few, because a request's blocks land in every
/// shard and an add locks each once: 8 shards are 8 lock round trips per add (64 were about
/// 56 for a 160-block request), and larger shards are a closer approximation of one LRU.
const MAX_SHARDS: usize = 8;
/// Shards are only split off while each keeps at least this many blocks, so that small
/// indexes stay exact LRUs.
const MIN_BLOCKS_PER_SHARD: usize = 1024;

/// One candidate pod of [`PrefixIndex::match_pods`], and its match once made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodMatch {
    key: PodKey,
    held: usize,
}

impl PodMatch {
    /// The pod named `pod`, not matched yet.
    pub fn new(pod: &str) -> Self {
        PodMatch {
            key: name_key(pod),
            held: 0,
        }
    }

    /// How many of the request's blocks the pod holds as a contiguous run from the first
    /// (0: none).
    pub fn held(&self) -> usize {
        self.held
    }
}

/// Which pods were sent which prompt blocks, per model.
pub struct PrefixIndex {
    shards: Box<[Mutex<Shard>]>,
    /// `64 − log2(shards)`: the shard is the hash's top bits. Unused with one shard.
    shard_shift: u32,
    ttl: Millis,
    capacity: usize,
}

impl std::fmt::Debug for PrefixIndex {
    /// A summary: the blocks themselves (up to hundreds of thousands) are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("shards", &self.shards.len())
            .field("capacity", &self.capacity)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Default for PrefixIndex {
    /// AIBrix's defaults: 200 000 blocks, 20 minutes.
    fn default() -> Self {
        PrefixIndex::new(200_000, 20 * 60 * 1000)
    }
}

impl PrefixIndex {
    /// An index holding at most `capacity_blocks` blocks, each expiring `ttl` after its last
    /// add. A capacity of 0 is taken as 1 (the config refuses 0).
    pub fn new(capacity_blocks: usize, ttl: Millis) -> Self {
        let capacity = capacity_blocks.max(1);
        let mut count = 1;
        while count < MAX_SHARDS && capacity / (count * 2) >= MIN_BLOCKS_PER_SHARD {
            count *= 2;
        }
        let shards = (0..count)
            .map(|i| {
                let share = capacity / count + usize::from(i < capacity % count);
                Mutex::new(Shard::new(share))
            })
            .collect();
        PrefixIndex {
            shards,
            shard_shift: 64 - count.trailing_zeros(),
            ttl,
            capacity,
        }
    }

    /// The capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The TTL since last add, in milliseconds.
    pub fn ttl(&self) -> Millis {
        self.ttl
    }

    /// Per pod of `pods` (names, same order), how many of the request's blocks the pod holds
    /// as a contiguous run from the first block; 0 when it holds none. Any run of at least
    /// one block is a match, even one whose percentage rounds down to 0 (one block of more
    /// than 100): AIBrix keeps such a pod among its matched pods, with 0 %.
    pub fn match_blocks(&self, model: &str, hashes: &[u64], pods: &[&str]) -> Vec<usize> {
        let mut matches: Vec<PodMatch> = pods.iter().map(|name| PodMatch::new(name)).collect();
        self.match_pods(model, hashes, &mut matches);
        matches.iter().map(PodMatch::held).collect()
    }

    /// [`match_blocks`](Self::match_blocks) into the caller's `pods`, which a policy keeps
    /// on its stack: each one's [`PodMatch::held`] is set.
    pub fn match_pods(&self, model: &str, hashes: &[u64], pods: &mut [PodMatch]) {
        self.walk(model, hashes, pods, None);
    }

    /// [`match_pods`](Self::match_pods), noting in `found` where each block it probed was
    /// held, for [`add_after_match`](Self::add_after_match) of the same hashes.
    pub fn match_pods_noting(
        &self,
        model: &str,
        hashes: &[u64],
        pods: &mut [PodMatch],
        found: &mut FoundBlocks,
    ) {
        self.walk(model, hashes, pods, Some(found));
    }

    fn walk(
        &self,
        model: &str,
        hashes: &[u64],
        pods: &mut [PodMatch],
        mut found: Option<&mut FoundBlocks>,
    ) {
        for pod in pods.iter_mut() {
            pod.held = 0;
        }
        if let Some(found) = found.as_deref_mut() {
            found.reset(hashes.len());
        }
        if hashes.is_empty() || pods.is_empty() {
            return;
        }
        let model = name_key(model);
        for (i, &hash) in hashes.iter().enumerate() {
            let shard = self.shard(hash);
            let Some((slot, holders)) = shard.find(hash) else {
                break;
            };
            if let Some(found) = found.as_deref_mut() {
                found.note(i, slot);
            }
            let mut any = false;
            // A pod still in the walk holds every block before this one; one that missed a
            // block has stopped short of `i` and keeps its run.
            for pod in pods.iter_mut().filter(|pod| pod.held == i) {
                if holders.contains(&(model, pod.key)) {
                    pod.held = i + 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }

    /// Per pod of `pods` (names, same order), the percentage of the request's full blocks
    /// that the pod holds as a contiguous run from the first block ([`match_percent`] of
    /// [`match_blocks`](Self::match_blocks)); 0 when it holds none.
    pub fn match_names(&self, model: &str, hashes: &[u64], pods: &[&str]) -> Vec<u8> {
        self.match_blocks(model, hashes, pods)
            .into_iter()
            .map(|held| match_percent(held, hashes.len()))
            .collect()
    }

    /// Records every block of a request for `pod`, refreshing LRU order and TTL.
    pub fn add(&self, model: &str, hashes: &[u64], pod: &str, now: Millis) {
        self.add_noted(model, hashes, pod, now, None);
    }

    /// [`add`](Self::add) of the hashes a [`match_pods_noting`](Self::match_pods_noting)
    /// has just matched into `found`: the blocks it found are reached without a second map
    /// probe each (a hint checked under the shard's lock; see [`FoundBlocks`]).
    pub fn add_after_match(
        &self,
        model: &str,
        hashes: &[u64],
        pod: &str,
        now: Millis,
        found: &FoundBlocks,
    ) {
        self.add_noted(model, hashes, pod, now, Some(found));
    }

    fn add_noted(
        &self,
        model: &str,
        hashes: &[u64],
        pod: &str,
        now: Millis,
        found: Option<&FoundBlocks>,
    ) {
        let pair = (name_key(model), name_key(pod));
        let slot = |at: usize| found.and_then(|found| found.slot(at));
        if self.shards.len() == 1 {
            let mut shard = lock(&self.shards[0]);
            for (at, &hash) in hashes.iter().enumerate() {
                shard.add_at(hash, slot(at), pair, now);
            }
            return;
        }
        let grouped = ByShard::new(hashes, |hash| self.shard_of(hash));
        for (shard, lock_of) in self.shards.iter().enumerate() {
            let positions = grouped.in_shard(shard);
            if positions.is_empty() {
                continue;
            }
            let mut shard = lock(lock_of);
            for &at in positions {
                let at = at as usize;
                shard.add_at(hashes[at], slot(at), pair, now);
            }
        }
    }

    /// Forgets that `pod` holds block `hash` for `model` (the engine evicted it; KV-event
    /// sync). Other pods and models keep the block; a block left with no pod is dropped.
    /// Returns whether the pod held it.
    pub fn remove(&self, model: &str, hash: u64, pod: &str) -> bool {
        self.shard(hash)
            .remove(hash, (name_key(model), name_key(pod)))
    }

    /// Removes blocks not added to for longer than the TTL; returns how many.
    pub fn sweep(&self, now: Millis) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).sweep(now, self.ttl))
            .sum()
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    /// How many blocks the index records for `pod`, any model (what the gateway believes the
    /// pod caches; for its admin listing). Walks every block, so not for the request path.
    pub fn blocks_held_by(&self, pod: &str) -> usize {
        let pod = name_key(pod);
        self.shards
            .iter()
            .map(|shard| lock(shard).count_pod(pod))
            .sum()
    }

    /// Whether the index holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate heap bytes held by the index (for the memory figure in the docs and the
    /// bench; walks every block, so not for the request path).
    pub fn heap_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).heap_bytes())
            .sum()
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        lock(&self.shards[self.shard_of(hash)])
    }

    fn shard_of(&self, hash: u64) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            (hash >> self.shard_shift) as usize
        }
    }
}

/// AIBrix's match percentage of `held` leading blocks of a `blocks`-block request:
/// `floor(held · 100 / blocks)`, 0 for a request with no full block.
pub fn match_percent(held: usize, blocks: usize) -> u8 {
    if blocks == 0 {
        return 0;
    }
    // Widened: held · 100 overflows nothing in u64, and held ≤ blocks keeps it ≤ 100.
    (held.min(blocks) as u64 * 100 / blocks as u64) as u8
}

/// A shard's lock. Nothing inside a shard panics short of a bug; if one ever did, the shard
/// is still memory-safe and at worst routes a few requests without their prefix, which beats
/// failing every later request, so a poisoned lock is used as is.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The key a model or pod name is stored under.
fn name_key(name: &str) -> ModelKey {
    xxh64(name.as_bytes(), 0)
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

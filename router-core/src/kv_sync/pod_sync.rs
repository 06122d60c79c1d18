//! One pod's KV-event sync state: which engine blocks it caches, and which router blocks
//! (the prefix index's hashes) those make up.
//!
//! The engine names blocks by its own hashes (sha256 in vLLM, opaque here) of `block_size`
//! tokens. The router hashes the request's token ids as 4-byte big-endian bytes in blocks of
//! `block_size` **bytes** with the chained XXH64 of [`crate::hash`]. A router block therefore
//! covers `m = router_bytes / (4 · engine_tokens)` engine blocks, and the two only line up
//! when that is a whole number (else the event is refused with [`SyncError::Misaligned`]).
//!
//! Every engine block is kept with the router chain up to it: the hash of the last complete
//! router block before or at it, and the bytes since (less than one router block). A
//! `BlockStored` continues the chain from its parent's entry, block by block **within the
//! event** (AIBrix v0.7.0 chains every block of an event to the event's parent, so only the
//! first block of a multi-block event ever matched); when a router block completes, it is
//! added to the index for this pod, and the `m` engine blocks that make it up remember it.
//! `BlockRemoved` removes the router block an evicted engine block belonged to from the index
//! for **this pod only** (AIBrix drops the prefix for every pod). `AllBlocksCleared` removes
//! every router block this pod's events added (AIBrix ignores it). Which models a block is
//! indexed under is the caller's choice (a LoRA adapter's blocks under the adapter's name:
//! [`super::index_models`]); a removal drops the router block under every model this pod's
//! events were indexed under, since router hashes do not say which model stored them.
//!
//! **Data-parallel ranks.** A vLLM server with `--data-parallel-size N` runs N engine cores
//! behind one endpoint, each publishing its own stream ([`PodSync::apply_rank`]). Each rank
//! has its own engine-block map (its own pool, its own hashes), and the pod's index entry is
//! the union of its ranks ([`super::rank_holders`]): a rank's `BlockRemoved`,
//! `AllBlocksCleared` ([`PodSync::clear_rank`], also for a rank that restarted) removes a
//! router block from the index only when no other rank of the pod still holds it. With one
//! rank (rank 0, what [`PodSync::apply`] uses) that is exactly the single-engine behaviour.
//!
//! The state is per pod and shared by that pod's rank subscribers (the gateway's tasks, one
//! per rank, behind one lock); the index it writes to is shared and locks per shard.

use std::collections::HashMap;

use xxhash_rust::xxh64::xxh64;

use crate::Millis;
use crate::index::PrefixIndex;
use crate::kv_sync::rank_holders::{MAX_DP_RANKS, RankHolders};
use crate::kv_sync::wire::KvEvent;

/// Engine blocks remembered per pod (per data-parallel rank), by default. vLLM pools hold
/// tens of thousands of blocks; the bound only stops a pod whose `BlockRemoved` events are
/// lost from growing the map forever.
pub const DEFAULT_MAX_ENGINE_BLOCKS: usize = 1 << 20;

/// How router blocks are made: the router's block size (bytes) and seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncSettings {
    pub router_block_bytes: usize,
    pub seed: u64,
    pub max_engine_blocks: usize,
}

/// Why an event was not applied (each has a counter label, [`SyncError::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    #[error(
        "engine block of {engine_tokens} tokens ({} bytes) does not divide the router block of {router_bytes} bytes: set the router block_size to a multiple of 4 × the engine's block size",
        4 * engine_tokens
    )]
    Misaligned {
        engine_tokens: usize,
        router_bytes: usize,
    },
    #[error("BlockStored's parent block {0:#x} is unknown (its event was missed)")]
    UnknownParent(u64),
    #[error("BlockStored has {tokens} token ids for {blocks} blocks of {block_size}")]
    TokenCount {
        tokens: usize,
        blocks: usize,
        block_size: usize,
    },
    #[error("the pod already maps {0} engine blocks; the rest of the event is dropped")]
    Full(usize),
    #[error("data-parallel rank {0} is out of range (a pod has at most {MAX_DP_RANKS} ranks)")]
    Rank(u32),
}

impl SyncError {
    /// The `error_type` label of the error counter.
    pub fn kind(&self) -> &'static str {
        match self {
            SyncError::Misaligned { .. } => "misaligned_block_size",
            SyncError::UnknownParent(_) => "unknown_parent",
            SyncError::TokenCount { .. } => "token_count",
            SyncError::Full(_) => "pod_map_full",
            SyncError::Rank(_) => "dp_rank_out_of_range",
        }
    }
}

/// What an applied event changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Router blocks added (or refreshed) in the index for this pod.
    pub added: usize,
    /// Router blocks removed from the index for this pod.
    pub removed: usize,
}

#[derive(Debug, Clone)]
struct EngineBlock {
    /// The engine block before this one (`None` for a prompt's first).
    parent: Option<u64>,
    /// The router hash of the last complete router block up to and including this block,
    /// or the seed when none is complete yet.
    chain: u64,
    /// Token bytes after that router block (shorter than a router block).
    pending: Box<[u8]>,
    /// The router block this engine block is part of, once complete.
    router: Option<u64>,
}

/// One pod's engine-block → router-block maps (one per data-parallel rank), which ranks
/// hold each router block, and the models it indexes blocks under.
#[derive(Debug, Default)]
pub struct PodSync {
    /// Engine hash → block, per rank (index = rank; grown when a rank first speaks).
    ranks: Vec<HashMap<u64, EngineBlock>>,
    /// Which ranks hold each router block this pod's events added.
    holders: RankHolders,
    /// Every model this pod's events were indexed under, so a removal finds them all.
    models: Vec<String>,
}

impl PodSync {
    pub fn new() -> Self {
        PodSync::default()
    }

    /// Engine blocks remembered, over every rank.
    pub fn len(&self) -> usize {
        self.ranks.iter().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.iter().all(HashMap::is_empty)
    }

    /// Engine blocks remembered for data-parallel rank `rank`.
    pub fn rank_len(&self, rank: u32) -> usize {
        self.ranks.get(rank as usize).map_or(0, HashMap::len)
    }

    /// Router blocks held by at least one rank of this pod.
    pub fn held_router_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Applies one event of a single-engine pod (data-parallel rank 0) for `pod`, which
    /// serves `models`, at `now`.
    pub fn apply(
        &mut self,
        event: &KvEvent,
        pod: &str,
        models: &[String],
        index: &PrefixIndex,
        settings: &SyncSettings,
        now: Millis,
    ) -> Result<Applied, SyncError> {
        self.apply_rank(0, event, pod, models, index, settings, now)
    }

    /// Applies one event published by data-parallel rank `rank` of `pod`.
    #[expect(
        clippy::too_many_arguments,
        reason = "apply's arguments plus the rank; a struct would only rename them"
    )]
    pub fn apply_rank(
        &mut self,
        rank: u32,
        event: &KvEvent,
        pod: &str,
        models: &[String],
        index: &PrefixIndex,
        settings: &SyncSettings,
        now: Millis,
    ) -> Result<Applied, SyncError> {
        if rank >= MAX_DP_RANKS {
            return Err(SyncError::Rank(rank));
        }
        for model in models {
            if !self.models.contains(model) {
                self.models.push(model.clone());
            }
        }
        match event {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
            } => self.stored(
                rank,
                block_hashes,
                *parent,
                token_ids,
                *block_size,
                pod,
                models,
                index,
                settings,
                now,
            ),
            KvEvent::BlockRemoved { block_hashes } => Ok(Applied {
                added: 0,
                removed: self.removed(rank, block_hashes, pod, index),
            }),
            KvEvent::AllBlocksCleared => Ok(Applied {
                added: 0,
                removed: self.clear_rank(rank, pod, index),
            }),
        }
    }

    /// Drops every router block this pod's events added, on every rank, and the whole map
    /// (the pod left, or its only engine cleared its cache). Returns how many index entries
    /// went.
    pub fn clear(&mut self, pod: &str, index: &PrefixIndex) -> usize {
        let mut routers: Vec<u64> = self
            .ranks
            .iter()
            .flat_map(HashMap::values)
            .filter_map(|b| b.router)
            .chain(self.holders.routers())
            .collect();
        routers.sort_unstable();
        routers.dedup();
        let removed = routers
            .into_iter()
            .map(|hash| self.index_remove(hash, pod, index))
            .sum();
        self.ranks.clear();
        self.holders.clear();
        removed
    }

    /// Drops data-parallel rank `rank`'s map (that engine cleared its cache, or restarted)
    /// and the router blocks it held that no other rank of the pod holds. Returns how many
    /// index entries went.
    pub fn clear_rank(&mut self, rank: u32, pod: &str, index: &PrefixIndex) -> usize {
        let Some(blocks) = self.ranks.get_mut(rank as usize) else {
            return 0;
        };
        let mut routers: Vec<u64> = blocks.drain().filter_map(|(_, b)| b.router).collect();
        routers.sort_unstable();
        routers.dedup();
        let mut removed = 0;
        for hash in routers {
            if !self.holders.release(hash, rank) {
                removed += self.index_remove(hash, pod, index);
            }
        }
        removed
    }

    /// Removes router block `hash` for `pod` under every model its events used.
    fn index_remove(&self, hash: u64, pod: &str, index: &PrefixIndex) -> usize {
        self.models
            .iter()
            .map(|model| usize::from(index.remove(model, hash, pod)))
            .sum()
    }

    /// Rank `rank`'s engine-block map, created when the rank first speaks.
    fn rank_blocks(&mut self, rank: u32) -> &mut HashMap<u64, EngineBlock> {
        let at = rank as usize;
        if self.ranks.len() <= at {
            self.ranks.resize_with(at + 1, HashMap::new);
        }
        // In range: resized just above.
        &mut self.ranks[at]
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the event's four fields plus where it goes; a struct would only rename them"
    )]
    fn stored(
        &mut self,
        rank: u32,
        hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        engine_tokens: usize,
        pod: &str,
        models: &[String],
        index: &PrefixIndex,
        settings: &SyncSettings,
        now: Millis,
    ) -> Result<Applied, SyncError> {
        let router_bytes = settings.router_block_bytes;
        let engine_bytes = engine_tokens.saturating_mul(4);
        if engine_bytes == 0 || router_bytes == 0 || router_bytes % engine_bytes != 0 {
            return Err(SyncError::Misaligned {
                engine_tokens,
                router_bytes,
            });
        }
        if Some(token_ids.len()) != hashes.len().checked_mul(engine_tokens) {
            return Err(SyncError::TokenCount {
                tokens: token_ids.len(),
                blocks: hashes.len(),
                block_size: engine_tokens,
            });
        }
        let per_router = router_bytes / engine_bytes;
        let blocks = self.rank_blocks(rank);
        let (mut chain, mut pending) = match parent {
            None => (settings.seed, Vec::with_capacity(router_bytes)),
            Some(p) => {
                let entry = blocks.get(&p).ok_or(SyncError::UnknownParent(p))?;
                (entry.chain, entry.pending.to_vec())
            }
        };
        let mut routers = Vec::new();
        let mut previous = parent;
        let mut input = Vec::with_capacity(8 + router_bytes);
        let mut full = None;
        for (&hash, tokens) in hashes.iter().zip(token_ids.chunks_exact(engine_tokens)) {
            if let Some(known) = blocks.get(&hash) {
                // Stored again (recomputed after a partial eviction): same prefix, same
                // chain; refresh its router block.
                chain = known.chain;
                pending = known.pending.to_vec();
                let completes = known.pending.is_empty().then_some(known.router).flatten();
                if let Some(router) = completes {
                    // It completes its router block (counted once, not once per member);
                    // members stored anew before it in this event learn that block.
                    routers.push(router);
                    learn_router(blocks, previous, router, per_router);
                }
                previous = Some(hash);
                continue;
            }
            if blocks.len() >= settings.max_engine_blocks {
                full = Some(SyncError::Full(blocks.len()));
                break;
            }
            pending.extend(tokens.iter().flat_map(|t| t.to_be_bytes()));
            let mut router = None;
            if pending.len() == router_bytes {
                input.clear();
                input.extend_from_slice(&chain.to_le_bytes());
                input.extend_from_slice(&pending);
                chain = xxh64(&input, settings.seed);
                pending.clear();
                router = Some(chain);
                routers.push(chain);
            }
            blocks.insert(
                hash,
                EngineBlock {
                    parent: previous,
                    chain,
                    pending: pending.clone().into_boxed_slice(),
                    router,
                },
            );
            if let Some(router) = router {
                learn_router(blocks, previous, router, per_router);
            }
            previous = Some(hash);
        }
        // What completed before a full map stopped the event is kept.
        for &router in &routers {
            self.holders.hold(router, rank);
        }
        index_add(index, models, &routers, pod, now);
        match full {
            Some(error) => Err(error),
            None => Ok(Applied {
                added: routers.len(),
                removed: 0,
            }),
        }
    }

    /// Forgets rank `rank`'s evicted engine blocks; a router block one of them belonged to
    /// leaves the index unless another rank of the pod holds it.
    fn removed(&mut self, rank: u32, hashes: &[u64], pod: &str, index: &PrefixIndex) -> usize {
        let mut routers = Vec::new();
        if let Some(blocks) = self.ranks.get_mut(rank as usize) {
            routers.extend(hashes.iter().filter_map(|h| blocks.remove(h)?.router));
        }
        let mut removed = 0;
        for router in routers {
            if !self.holders.release(router, rank) {
                removed += self.index_remove(router, pod, index);
            }
        }
        removed
    }
}

/// The `per_router - 1` engine blocks before the one completing `router` (from `previous`
/// back) learn it, so evicting any member of a router block removes it.
fn learn_router(
    blocks: &mut HashMap<u64, EngineBlock>,
    previous: Option<u64>,
    router: u64,
    per_router: usize,
) {
    let mut at = previous;
    for _ in 1..per_router {
        let Some(block) = at.and_then(|h| blocks.get_mut(&h)) else {
            break;
        };
        block.router = Some(router);
        at = block.parent;
    }
}

fn index_add(index: &PrefixIndex, models: &[String], routers: &[u64], pod: &str, now: Millis) {
    if routers.is_empty() {
        return;
    }
    for model in models {
        index.add(model, routers, pod, now);
    }
}

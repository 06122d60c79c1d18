//! Where a match found a request's blocks, so that the add which follows it in the same
//! decision (AIBrix re-adds every block of every routed request) goes straight to each
//! block's slot instead of probing the shard's map for it a second time.
//!
//! A noted slot is only a hint: between the match and the add another request may have
//! evicted the block, or swept or removed it and given its slot to another block. The add
//! takes the slot only while it still holds the same hash and is in its shard's LRU list
//! ([`super::shard::Shard::add_at`]), and probes the map otherwise, so a stale hint costs a
//! probe, never a wrong block.

use smallvec::SmallVec;

/// "Not found": the block was not probed (the walk ended before it) or is not held.
const NOT_FOUND: u32 = u32::MAX;

/// Per block of a request, the slot the match found it in (within the block's shard). Kept
/// by the caller across match and add; on the stack up to 256 blocks.
#[derive(Debug, Clone, Default)]
pub struct FoundBlocks {
    slots: SmallVec<[u32; 256]>,
}

impl FoundBlocks {
    /// Forgets the last request's slots and makes room for `blocks` blocks, none found.
    pub(super) fn reset(&mut self, blocks: usize) {
        self.slots.clear();
        self.slots.resize(blocks, NOT_FOUND);
    }

    /// Block `at` was found in `slot`.
    pub(super) fn note(&mut self, at: usize, slot: u32) {
        if let Some(noted) = self.slots.get_mut(at) {
            *noted = slot;
        }
    }

    /// The slot block `at` was found in, if it was.
    pub(super) fn slot(&self, at: usize) -> Option<u32> {
        self.slots
            .get(at)
            .copied()
            .filter(|&slot| slot != NOT_FOUND)
    }
}

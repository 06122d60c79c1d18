//! One shard of the prefix index: a map from block hash to a slot, and the slots threaded on
//! an intrusive doubly-linked list in order of last add (head = newest, tail = oldest).
//!
//! A shard is a plain single-threaded structure; [`super::PrefixIndex`] puts each behind its
//! own lock. Slots live in one `Vec` and link by `u32` index. A slot is one 64-byte cache line
//! holding the block's first (model, pod) pair inline, so a block sent to one pod costs one
//! slot and a map entry and no allocation of its own; further pairs go in a small side `Vec`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::Millis;

/// "No slot" in the LRU links.
const NIL: u32 = u32::MAX;

/// A (model key, pod key) pair; keys are XXH64 digests of the names (see the index module).
pub(super) type PodKey = u64;
pub(super) type ModelKey = u64;

#[derive(Debug)]
struct Slot {
    hash: u64,
    /// When the block was last added to (the shard's clock, see [`Shard::clock`]).
    last_add: Millis,
    prev: u32,
    next: u32,
    pods: BlockPods,
}

/// Every (model, pod) that was sent a block: the first inline, the rest in `more`, grown one
/// at a time with exact capacity (the bound on memory matters more than the rare realloc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BlockPods {
    first: (ModelKey, PodKey),
    more: Vec<(ModelKey, PodKey)>,
}

impl BlockPods {
    fn new(pair: (ModelKey, PodKey)) -> Self {
        BlockPods {
            first: pair,
            more: Vec::new(),
        }
    }

    /// Whether `pair` was sent this block.
    pub(super) fn contains(&self, pair: &(ModelKey, PodKey)) -> bool {
        self.first == *pair || self.more.contains(pair)
    }

    fn insert(&mut self, pair: (ModelKey, PodKey)) {
        if !self.contains(&pair) {
            self.more.reserve_exact(1);
            self.more.push(pair);
        }
    }

    /// Forgets `pair`; returns whether it was held and whether the block is now held by
    /// no one (the caller then drops the whole block).
    fn remove(&mut self, pair: &(ModelKey, PodKey)) -> (bool, bool) {
        if self.first == *pair {
            match self.more.pop() {
                Some(next) => {
                    self.first = next;
                    (true, false)
                }
                None => (true, true),
            }
        } else if let Some(at) = self.more.iter().position(|p| p == pair) {
            self.more.swap_remove(at);
            (true, false)
        } else {
            (false, false)
        }
    }

    #[cfg(test)]
    fn to_vec(&self) -> Vec<(ModelKey, PodKey)> {
        std::iter::once(self.first)
            .chain(self.more.iter().copied())
            .collect()
    }
}

/// A shard: blocks by hash, with LRU order by add and TTL since add.
#[derive(Debug)]
pub(super) struct Shard {
    capacity: usize,
    map: HashMap<u64, u32, BuildHasherDefault<BlockHashHasher>>,
    slots: Vec<Slot>,
    /// Slots freed by a sweep, reused before the slab grows.
    free: Vec<u32>,
    head: u32,
    tail: u32,
    /// The latest `now` any add has passed. Adds stamp blocks with this, so stamps never
    /// decrease from tail to head even when concurrent callers pass slightly out-of-order
    /// times; the sweep can then stop at the first live block from the tail.
    clock: Millis,
}

impl Shard {
    pub(super) fn new(capacity: usize) -> Self {
        Shard {
            capacity,
            map: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            clock: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// How many held blocks name `pod` (for any model). Walks every block.
    pub(super) fn count_pod(&self, pod: PodKey) -> usize {
        self.map
            .values()
            .filter(|&&slot| {
                let pods = &self.slots[slot as usize].pods;
                pods.first.1 == pod || pods.more.iter().any(|pair| pair.1 == pod)
            })
            .count()
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The pairs recorded for `hash`, if the block is held (tests only).
    #[cfg(test)]
    pub(super) fn pods(&self, hash: u64) -> Option<&BlockPods> {
        self.find(hash).map(|(_, pods)| pods)
    }

    /// The slot of block `hash` and the pairs recorded for it, if the block is held (the
    /// slot for [`add_at`](Self::add_at)). Does not touch LRU order: AIBrix
    /// refreshes blocks on add only, so a lookup never saves a block from eviction.
    pub(super) fn find(&self, hash: u64) -> Option<(u32, &BlockPods)> {
        let slot = *self.map.get(&hash)?;
        Some((slot, &self.slots[slot as usize].pods))
    }

    /// [`add`](Self::add) of a block a match found in `slot` earlier: when the slot still
    /// holds `hash` the map is not probed again. A slot holds a block while it is in the
    /// LRU list (every held block is, and eviction, sweep and remove unlink a block as they
    /// drop it), i.e. while it has a newer neighbour (`prev`) or is the head.
    pub(super) fn add_at(
        &mut self,
        hash: u64,
        slot: Option<u32>,
        pair: (ModelKey, PodKey),
        now: Millis,
    ) -> bool {
        let held = slot.filter(|&slot| {
            self.slots
                .get(slot as usize)
                .is_some_and(|entry| entry.hash == hash && (entry.prev != NIL || self.head == slot))
        });
        match held {
            Some(slot) => {
                self.clock = self.clock.max(now);
                self.refresh(slot, pair);
                false
            }
            None => self.add(hash, pair, now),
        }
    }

    /// Records `pair` for block `hash` at `now`, moving the block to the head. A new block
    /// past capacity evicts the least recently added one (the whole block, every model and
    /// pod). Returns whether a block was evicted.
    pub(super) fn add(&mut self, hash: u64, pair: (ModelKey, PodKey), now: Millis) -> bool {
        self.clock = self.clock.max(now);
        if let Some(&slot) = self.map.get(&hash) {
            self.refresh(slot, pair);
            return false;
        }
        let mut evicted = false;
        let slot = if self.map.len() >= self.capacity && self.tail != NIL {
            // Full: reuse the oldest block's slot for the new block.
            let oldest = self.tail;
            self.unlink(oldest);
            self.map.remove(&self.slots[oldest as usize].hash);
            evicted = true;
            oldest
        } else if let Some(slot) = self.free.pop() {
            slot
        } else {
            self.grow_slab();
            self.slots.push(Slot {
                hash,
                last_add: 0,
                prev: NIL,
                next: NIL,
                pods: BlockPods::new(pair),
            });
            (self.slots.len() - 1) as u32
        };
        let entry = &mut self.slots[slot as usize];
        entry.hash = hash;
        entry.last_add = self.clock;
        entry.pods = BlockPods::new(pair);
        self.map.insert(hash, slot);
        self.push_head(slot);
        evicted
    }

    /// A held block added to again: to the head, stamped, `pair` recorded.
    fn refresh(&mut self, slot: u32, pair: (ModelKey, PodKey)) {
        self.unlink(slot);
        self.push_head(slot);
        let entry = &mut self.slots[slot as usize];
        entry.last_add = self.clock;
        entry.pods.insert(pair);
    }

    /// Forgets that `pair` holds block `hash` (an engine evicted it). The block keeps its LRU
    /// position and stamp for the pairs that remain; when none remains it is dropped whole and
    /// its slot freed, exactly as the sweep frees one. Returns whether the pair was held.
    pub(super) fn remove(&mut self, hash: u64, pair: (ModelKey, PodKey)) -> bool {
        let Some(&slot) = self.map.get(&hash) else {
            return false;
        };
        let (held, empty) = self.slots[slot as usize].pods.remove(&pair);
        if empty {
            self.unlink(slot);
            self.map.remove(&hash);
            self.slots[slot as usize].pods.more = Vec::new();
            self.free.push(slot);
        }
        held
    }

    /// Removes blocks whose last add is more than `ttl` before `now` (strictly); returns how
    /// many. Walks from the oldest block and stops at the first live one.
    pub(super) fn sweep(&mut self, now: Millis, ttl: Millis) -> usize {
        let mut removed = 0;
        while self.tail != NIL {
            let oldest = self.tail;
            let entry = &self.slots[oldest as usize];
            if now.saturating_sub(entry.last_add) <= ttl {
                break;
            }
            let hash = entry.hash;
            self.unlink(oldest);
            self.map.remove(&hash);
            let entry = &mut self.slots[oldest as usize];
            entry.pods.more = Vec::new();
            self.free.push(oldest);
            removed += 1;
        }
        removed
    }

    /// Approximate heap bytes held (slots, extra pairs, map buckets, free list).
    pub(super) fn heap_bytes(&self) -> usize {
        let slots = self.slots.capacity() * std::mem::size_of::<Slot>();
        let pairs: usize = self
            .slots
            .iter()
            .map(|slot| slot.pods.more.capacity() * std::mem::size_of::<(ModelKey, PodKey)>())
            .sum();
        // hashbrown: one (key, value) bucket plus one control byte per bucket; buckets are
        // about capacity × 8/7 rounded up to a power of two.
        let buckets = (self.map.capacity() * 8 / 7).next_power_of_two();
        let map = buckets * (std::mem::size_of::<(u64, u32)>() + 1);
        slots + pairs + map + self.free.capacity() * 4
    }

    /// Grows the slab in steps that never overshoot the shard's capacity, so a full shard
    /// holds exactly `capacity` slots rather than the next power of two.
    fn grow_slab(&mut self) {
        if self.slots.len() == self.slots.capacity() {
            let room = self.capacity.saturating_sub(self.slots.len()).max(1);
            let step = self.slots.len().clamp(16, 1 << 16).min(room);
            self.slots.reserve_exact(step);
        }
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let entry = &self.slots[slot as usize];
            (entry.prev, entry.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let entry = &mut self.slots[slot as usize];
        entry.prev = NIL;
        entry.next = NIL;
    }

    fn push_head(&mut self, slot: u32) {
        let old_head = self.head;
        {
            let entry = &mut self.slots[slot as usize];
            entry.prev = NIL;
            entry.next = old_head;
        }
        if old_head == NIL {
            self.tail = slot;
        } else {
            self.slots[old_head as usize].prev = slot;
        }
        self.head = slot;
    }

    /// Hashes from the oldest to the newest (tests only).
    #[cfg(test)]
    pub(super) fn oldest_first(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        let mut at = self.tail;
        while at != NIL && out.len() <= self.slots.len() {
            out.push(self.slots[at as usize].hash);
            at = self.slots[at as usize].prev;
        }
        out
    }
}

/// Block hashes are already XXH64 digests, so the map only needs to spread them; a
/// multiply-rotate keeps both the high bits (hashbrown's tags) and the low bits (its bucket
/// index) varied even though the shard was chosen from some of the digest's bits.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte) ^ self.0.rotate_left(8));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_refreshes_order_and_eviction_takes_the_oldest() {
        let mut shard = Shard::new(3);
        for (i, hash) in [1u64, 2, 3].into_iter().enumerate() {
            assert!(!shard.add(hash, (0, 9), i as Millis));
        }
        assert_eq!(shard.oldest_first(), [1, 2, 3]);
        shard.add(1, (0, 8), 10);
        assert_eq!(shard.oldest_first(), [2, 3, 1]);
        assert!(shard.add(4, (0, 9), 11));
        assert_eq!(shard.oldest_first(), [3, 1, 4]);
        assert_eq!(
            shard.pods(1).map(BlockPods::to_vec),
            Some(vec![(0, 9), (0, 8)])
        );
        assert_eq!(shard.pods(4).map(BlockPods::to_vec), Some(vec![(0, 9)]));
        assert!(shard.pods(2).is_none());
        // Re-adding a known pair adds nothing; eviction reuses the slot with fresh pods.
        shard.add(1, (0, 8), 12);
        assert_eq!(
            shard.pods(1).map(BlockPods::to_vec),
            Some(vec![(0, 9), (0, 8)])
        );
        assert_eq!(std::mem::size_of::<Slot>(), 64);
        assert_eq!(shard.len(), 3);
    }

    #[test]
    fn sweep_frees_slots_for_reuse() {
        let mut shard = Shard::new(4);
        shard.add(1, (0, 1), 0);
        shard.add(2, (0, 1), 5);
        assert_eq!(shard.sweep(105, 100), 1);
        assert_eq!(shard.oldest_first(), [2]);
        shard.add(3, (0, 1), 105);
        assert_eq!(shard.slots.len(), 2, "the freed slot is reused");
        assert_eq!(shard.oldest_first(), [2, 3]);
    }

    #[test]
    fn remove_takes_one_pair_and_frees_an_empty_block() {
        let mut shard = Shard::new(3);
        shard.add(1, (0, 1), 0);
        shard.add(1, (0, 2), 1);
        shard.add(2, (0, 1), 2);
        assert!(!shard.remove(1, (0, 3)), "a pair never added");
        assert!(!shard.remove(9, (0, 1)), "a block never added");
        assert!(shard.remove(1, (0, 1)));
        assert_eq!(shard.pods(1).map(BlockPods::to_vec), Some(vec![(0, 2)]));
        assert_eq!(shard.oldest_first(), [1, 2], "order kept for the rest");
        assert!(shard.remove(1, (0, 2)));
        assert!(shard.pods(1).is_none());
        assert_eq!(shard.oldest_first(), [2]);
        assert_eq!(shard.len(), 1);
        // The freed slot is reused before the slab grows, and capacity still holds.
        shard.add(3, (0, 1), 3);
        shard.add(4, (0, 1), 4);
        assert_eq!(shard.slots.len(), 3);
        assert!(shard.add(5, (0, 1), 5), "full again: the oldest goes");
        assert_eq!(shard.oldest_first(), [3, 4, 5]);
    }

    #[test]
    fn a_found_slot_is_taken_only_while_it_still_holds_the_block() {
        let mut shard = Shard::new(3);
        for hash in [1u64, 2, 3] {
            shard.add(hash, (0, 1), 0);
        }
        let (slot_of_1, _) = shard.find(1).unwrap();
        assert!(
            !shard.add_at(1, Some(slot_of_1), (0, 2), 1),
            "still held: refreshed"
        );
        assert_eq!(shard.oldest_first(), [2, 3, 1]);
        assert_eq!(
            shard.pods(1).map(BlockPods::to_vec),
            Some(vec![(0, 1), (0, 2)])
        );

        // Block 2's slot is reused by block 4 between a match and its add: the hint is
        // stale, block 2 is added anew (evicting 3), and block 4 is left alone.
        let (slot_of_2, _) = shard.find(2).unwrap();
        shard.add(4, (0, 1), 2);
        assert_eq!(shard.find(4).map(|(slot, _)| slot), Some(slot_of_2));
        assert!(shard.add_at(2, Some(slot_of_2), (0, 2), 3));
        assert_eq!(shard.oldest_first(), [1, 4, 2]);
        assert_eq!(shard.pods(4).map(BlockPods::to_vec), Some(vec![(0, 1)]));
        assert_eq!(shard.pods(2).map(BlockPods::to_vec), Some(vec![(0, 2)]));

        // A slot freed by a remove still carries its old hash: not taken either.
        let (slot_of_4, _) = shard.find(4).unwrap();
        assert!(shard.remove(4, (0, 1)));
        assert!(!shard.add_at(4, Some(slot_of_4), (0, 3), 4));
        assert_eq!(shard.oldest_first(), [1, 2, 4]);
        assert_eq!(shard.len(), 3);
        assert_eq!(shard.pods(4).map(BlockPods::to_vec), Some(vec![(0, 3)]));
        // No hint, or a slot out of range, is a plain add.
        assert!(shard.add_at(5, None, (0, 1), 5));
        assert!(!shard.add_at(5, Some(999), (0, 2), 6));
        assert_eq!(shard.oldest_first(), [2, 4, 5]);
    }

    #[test]
    fn out_of_order_times_keep_stamps_monotonic() {
        let mut shard = Shard::new(4);
        shard.add(1, (0, 1), 50);
        shard.add(2, (0, 1), 40);
        // Block 2 is stamped 50, not 40: it cannot expire before the older block 1.
        assert_eq!(shard.sweep(150, 100), 0);
        assert_eq!(shard.sweep(151, 100), 2);
        assert_eq!(shard.len(), 0);
    }
}

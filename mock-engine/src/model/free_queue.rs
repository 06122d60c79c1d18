//! The KV pool's free list: an LRU queue of block ids with O(1) removal from the middle.
//!
//! vLLM keeps free blocks in a doubly linked list (`FreeKVCacheBlockQueue`): allocation pops
//! the head (the least recently freed block, evicting its cached contents), freed blocks are
//! appended at the tail, and a prefix-cache hit on a free block takes it out from wherever it
//! is. This is the same list over indices, so it needs no allocation after construction.

/// Marks "no neighbour" in the link arrays.
const NIL: u32 = u32::MAX;

/// A doubly linked list of block ids `0..capacity`, each present at most once.
#[derive(Clone, Debug)]
pub struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    present: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// An empty queue for block ids below `capacity` (which must fit in `u32` minus one).
    pub fn new(capacity: usize) -> FreeQueue {
        FreeQueue {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            present: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, block: u32) -> bool {
        self.present.get(block as usize).copied().unwrap_or(false)
    }

    /// Appends `block` at the tail (most recently freed). Ignored if already present or out of
    /// range, so a caller bug cannot corrupt the links.
    pub fn push_back(&mut self, block: u32) {
        let index = block as usize;
        if index >= self.present.len() || self.present[index] {
            return;
        }
        self.present[index] = true;
        self.prev[index] = self.tail;
        self.next[index] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.len += 1;
    }

    /// Removes and returns the head (least recently freed), if any.
    pub fn pop_front(&mut self) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.remove(head);
        Some(head)
    }

    /// Takes `block` out of the queue wherever it is; `false` if it was not there.
    pub fn remove(&mut self, block: u32) -> bool {
        if !self.contains(block) {
            return false;
        }
        let index = block as usize;
        let (prev, next) = (self.prev[index], self.next[index]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[index] = NIL;
        self.next[index] = NIL;
        self.present[index] = false;
        self.len -= 1;
        true
    }

    /// Block ids from head to tail (for tests and invariant checks; bounded by `len`).
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cursor = self.head;
        (0..self.len).map_while(move |_| {
            if cursor == NIL {
                return None;
            }
            let block = cursor;
            cursor = self.next[block as usize];
            Some(block)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_with_removal_from_the_middle() {
        let mut q = FreeQueue::new(8);
        for b in [3, 1, 4, 5] {
            q.push_back(b);
        }
        q.push_back(4); // already present: ignored
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![3, 1, 4, 5]);
        assert!(q.remove(4));
        assert!(!q.remove(4));
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![3, 1, 5]);
        assert_eq!(q.pop_front(), Some(3));
        assert!(q.remove(5));
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_front(), Some(1));
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
        q.push_back(9); // out of range: ignored
        assert!(q.is_empty());
        q.push_back(2);
        assert!(q.contains(2));
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![2]);
    }
}

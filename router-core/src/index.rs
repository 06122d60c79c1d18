//! The prefix index: block hash → model → pods that were sent that block.
//!
//! (Placeholder signatures; the implementation lands with the router-core issue.)

use crate::Millis;
use crate::load::Candidate;

/// Which pods were sent which prompt blocks, per model.
#[derive(Debug, Default)]
pub struct PrefixIndex {}

impl PrefixIndex {
    /// An index holding at most `capacity_blocks` blocks, each expiring `ttl` after its last
    /// add.
    pub fn new(_capacity_blocks: usize, _ttl: Millis) -> Self {
        PrefixIndex {}
    }

    /// Per candidate (same order), the percentage of the request's full blocks that the pod
    /// holds as a contiguous run from the first block; 0 when it holds none.
    pub fn match_prefix(&self, _model: &str, _hashes: &[u64], pods: &[Candidate<'_>]) -> Vec<u8> {
        vec![0; pods.len()]
    }

    /// Records every block of a request for `pod`, refreshing LRU order and TTL.
    pub fn add(&self, _model: &str, _hashes: &[u64], _pod: &str, _now: Millis) {}

    /// Removes blocks not added to for longer than the TTL; returns how many.
    pub fn sweep(&self, _now: Millis) -> usize {
        0
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        0
    }

    /// Whether the index holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

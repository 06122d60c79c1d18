//! `prefix-load`'s long memory of placements: every [`STRIDE`]th block of each routed
//! request, kept in a [`PrefixIndex`] of its own, so that it reaches [`STRIDE`] times further
//! back than an index of the same size.
//!
//! Why: the prefix index holds `block_capacity` blocks (AIBrix's 200 000, about 25 MB of
//! prompt text), LRU by add, while a fleet's engines cache many times that: 16 H200s of the
//! simulator's profile hold five times as much. A prompt that extends one sent a few minutes
//! earlier then finds its prefix forgotten by the index although the engine it went to still
//! holds it, and goes wherever load sends it (docs/POLICY-EVALUATION.md, "The trace at 16
//! replicas"). `prefix-cache` must keep AIBrix's index as deployed, so the index itself is
//! left alone; this memory only adds to what `prefix-load` reads.
//!
//! Hashes are chained (`crate::hash`): a block's hash names the whole prefix up to it, so a
//! pod recorded for the `k`th kept block was sent the request's first `k · STRIDE` blocks.
//! A match here is therefore a leading run in steps of [`STRIDE`] blocks, and a pod's match
//! is the longer of the index's exact run and this one ([`Recall::extend`]): the memory
//! never shortens what the index knows, and past what the index has forgotten it is short
//! by less than one stride. What it recalls the engine may since have evicted, as the index
//! may also believe; the engines' `cached_tokens` correct both the same way
//! ([`crate::load::CacheTrust`]).
//!
//! Placements are recorded and forgotten with the index's (`Router::record_placement`,
//! `forget_placement`) and expire with its TTL. With KV-event sync the index follows the
//! engines' own evictions, which this memory does not see, so it is off there.

use smallvec::SmallVec;

use super::{PodMatch, PrefixIndex};
use crate::Millis;

/// One block in this many is kept: 16 blocks of 128 bytes are about 500 tokens of prompt,
/// the most a recalled match can fall short of the truth, and 1/16 of the index's cost.
pub const STRIDE: usize = 16;

/// The kept blocks of one request, on the stack for prompts up to 512 blocks.
type Kept = SmallVec<[u64; 32]>;

/// A sparse, longer-reaching companion of the prefix index (see the module docs).
#[derive(Debug)]
pub struct Recall {
    kept: PrefixIndex,
}

impl Recall {
    /// A memory reaching back over `reach_blocks` blocks (it keeps `reach_blocks / STRIDE`
    /// of them), each expiring `ttl` after its last add; `None` for a reach of 0 (off).
    pub fn new(reach_blocks: usize, ttl: Millis) -> Option<Self> {
        (reach_blocks > 0).then(|| Recall {
            kept: PrefixIndex::new(reach_blocks.div_ceil(STRIDE), ttl),
        })
    }

    /// Records the request's kept blocks (every [`STRIDE`]th of `hashes`) for `pod`.
    pub fn add(&self, model: &str, hashes: &[u64], pod: &str, now: Millis) {
        let kept = kept(hashes);
        if !kept.is_empty() {
            self.kept.add(model, &kept, pod, now);
        }
    }

    /// Forgets that `pod` was sent the request's kept blocks.
    pub fn forget(&self, model: &str, hashes: &[u64], pod: &str) {
        for hash in kept(hashes) {
            self.kept.remove(model, hash, pod);
        }
    }

    /// Raises each of `pods`' match (already made on the index) to the leading run this
    /// memory recalls, when that is longer.
    pub fn extend(&self, model: &str, hashes: &[u64], pods: &mut [PodMatch]) {
        let kept = kept(hashes);
        if kept.is_empty() {
            return;
        }
        let mut recalled: SmallVec<[PodMatch; 16]> = pods.iter().copied().collect();
        self.kept.match_pods(model, &kept, &mut recalled);
        for (pod, recalled) in pods.iter_mut().zip(&recalled) {
            pod.held = pod.held.max(recalled.held * STRIDE);
        }
    }

    /// Removes kept blocks not added to for longer than the TTL; returns how many.
    pub fn sweep(&self, now: Millis) -> usize {
        self.kept.sweep(now)
    }

    /// Number of kept blocks held.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// Every [`STRIDE`]th block hash of a request: the last block of each whole stride.
fn kept(hashes: &[u64]) -> Kept {
    hashes
        .iter()
        .skip(STRIDE - 1)
        .step_by(STRIDE)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "m";

    fn chain(n: u64) -> Vec<u64> {
        (1..=n).collect()
    }

    fn held(recall: &Recall, index: &PrefixIndex, hashes: &[u64], pods: &[&str]) -> Vec<usize> {
        let mut matches: Vec<PodMatch> = pods.iter().map(|p| PodMatch::new(p)).collect();
        index.match_pods(MODEL, hashes, &mut matches);
        recall.extend(MODEL, hashes, &mut matches);
        matches.iter().map(PodMatch::held).collect()
    }

    #[test]
    fn recalls_whole_strides_the_index_forgot() {
        let index = PrefixIndex::new(100, 60_000);
        let recall = Recall::new(1000, 60_000).unwrap();
        let hashes = chain(40);
        recall.add(MODEL, &hashes, "a", 0);
        // The index never heard of it (or forgot it): the memory recalls two whole strides.
        assert_eq!(held(&recall, &index, &hashes, &["a", "b"]), [32, 0]);
        // A longer request sharing the first 20 blocks: one stride.
        let mut longer = chain(20);
        longer.extend(100..120);
        assert_eq!(held(&recall, &index, &longer, &["a", "b"]), [16, 0]);
    }

    #[test]
    fn never_shortens_what_the_index_knows() {
        let index = PrefixIndex::new(100, 60_000);
        let recall = Recall::new(1000, 60_000).unwrap();
        let hashes = chain(40);
        index.add(MODEL, &hashes[..37], "a", 0);
        recall.add(MODEL, &hashes, "a", 0);
        assert_eq!(held(&recall, &index, &hashes, &["a"]), [37]);
        // Under one stride nothing is kept.
        let short = chain(15);
        recall.add(MODEL, &short, "b", 0);
        assert!(recall.len() == 2);
        assert_eq!(held(&recall, &index, &short, &["b"]), [0]);
    }

    #[test]
    fn reaches_stride_times_further_than_an_index_of_its_size() {
        // 64 blocks of reach keep 4: an index of 4 blocks would hold a quarter of a stride.
        let recall = Recall::new(64, 60_000).unwrap();
        let index = PrefixIndex::new(4, 60_000);
        let first = chain(64);
        recall.add(MODEL, &first, "a", 0);
        index.add(MODEL, &first, "a", 0);
        assert_eq!(held(&recall, &index, &first, &["a"]), [64]);
        // A fifth kept block evicts the oldest, as in the index.
        let other: Vec<u64> = (1000..1016).collect();
        recall.add(MODEL, &other, "b", 1);
        assert_eq!(held(&recall, &index, &first, &["a"]), [0]);
    }

    #[test]
    fn forgets_and_expires_with_the_placement() {
        let index = PrefixIndex::new(100, 60_000);
        let recall = Recall::new(1000, 60_000).unwrap();
        let hashes = chain(32);
        recall.add(MODEL, &hashes, "a", 0);
        recall.add(MODEL, &hashes, "b", 0);
        recall.forget(MODEL, &hashes, "a");
        assert_eq!(held(&recall, &index, &hashes, &["a", "b"]), [0, 32]);
        assert_eq!(recall.sweep(60_000), 0);
        assert_eq!(recall.sweep(60_001), 2);
        assert!(recall.is_empty());
        assert!(Recall::new(0, 60_000).is_none());
    }
}

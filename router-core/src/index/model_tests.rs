//! The index against a model of what it must be: AIBrix's LRU by add, written the plainest
//! way (a list in order of last add, every operation a linear scan). One shard, as every
//! index under 2 048 blocks is, is that LRU exactly; random adds (re-adds of earlier blocks
//! among them), removes, sweeps and matches over a small pool of hashes, past capacity,
//! must leave both holding the same blocks in the same order with the same pods, and every
//! match must agree.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const MODELS: [&str; 2] = ["m1", "m2"];
const PODS: [&str; 3] = ["a", "b", "c"];

/// One held block of the model.
#[derive(Debug)]
struct Block {
    hash: u64,
    last_add: Millis,
    pairs: Vec<(&'static str, &'static str)>,
}

/// AIBrix's LRU by add: the oldest block first.
#[derive(Debug)]
struct Lru {
    capacity: usize,
    ttl: Millis,
    blocks: Vec<Block>,
    /// The latest `now` of any add: blocks are stamped with it, so stamps never decrease
    /// from the oldest to the newest (as the index's shard clock).
    clock: Millis,
}

impl Lru {
    fn add(&mut self, model: &'static str, hashes: &[u64], pod: &'static str, now: Millis) {
        self.clock = self.clock.max(now);
        for &hash in hashes {
            let mut block = match self.blocks.iter().position(|b| b.hash == hash) {
                Some(at) => self.blocks.remove(at),
                None => {
                    if self.blocks.len() >= self.capacity {
                        self.blocks.remove(0);
                    }
                    Block {
                        hash,
                        last_add: 0,
                        pairs: Vec::new(),
                    }
                }
            };
            block.last_add = self.clock;
            if !block.pairs.contains(&(model, pod)) {
                block.pairs.push((model, pod));
            }
            self.blocks.push(block);
        }
    }

    fn remove(&mut self, model: &'static str, hash: u64, pod: &'static str) -> bool {
        let Some(at) = self.blocks.iter().position(|b| b.hash == hash) else {
            return false;
        };
        let before = self.blocks[at].pairs.len();
        self.blocks[at].pairs.retain(|&pair| pair != (model, pod));
        let held = self.blocks[at].pairs.len() < before;
        if self.blocks[at].pairs.is_empty() {
            self.blocks.remove(at);
        }
        held
    }

    fn sweep(&mut self, now: Millis) -> usize {
        let before = self.blocks.len();
        let ttl = self.ttl;
        self.blocks
            .retain(|block| now.saturating_sub(block.last_add) <= ttl);
        before - self.blocks.len()
    }

    /// Per pod, its leading run of held blocks.
    fn held(&self, model: &str, hashes: &[u64], pods: &[&str]) -> Vec<usize> {
        pods.iter()
            .map(|&pod| {
                hashes
                    .iter()
                    .take_while(|&&hash| {
                        self.blocks
                            .iter()
                            .any(|b| b.hash == hash && b.pairs.contains(&(model, pod)))
                    })
                    .count()
            })
            .collect()
    }
}

proptest::proptest! {
    #[test]
    fn a_single_shard_is_aibrix_s_lru_by_add(seed in proptest::prelude::any::<u64>()) {
        let mut rng = StdRng::seed_from_u64(seed);
        let (capacity, ttl) = (64, 50);
        let index = PrefixIndex::new(capacity, ttl);
        let mut model = Lru { capacity, ttl, blocks: Vec::new(), clock: 0 };
        // 160 hashes for 64 slots: re-adds, evictions and returns of evicted blocks alike.
        let pool: Vec<u64> = (0..160).map(|_| rng.random()).collect();
        let mut now: Millis = 0;
        for _ in 0..300 {
            // Times mostly rise and sometimes step back (concurrent callers' clocks).
            now = (now + rng.random_range(0..8)).saturating_sub(rng.random_range(0..3));
            let start = rng.random_range(0..pool.len());
            let request = &pool[start..(start + rng.random_range(1..24)).min(pool.len())];
            let name = MODELS[rng.random_range(0..MODELS.len())];
            let pod = PODS[rng.random_range(0..PODS.len())];
            match rng.random_range(0..10) {
                0..=5 => {
                    index.add(name, request, pod, now);
                    model.add(name, request, pod, now);
                }
                6 | 7 => {
                    let hash = request[0];
                    proptest::prop_assert_eq!(
                        index.remove(name, hash, pod),
                        model.remove(name, hash, pod)
                    );
                }
                8 => proptest::prop_assert_eq!(index.sweep(now), model.sweep(now)),
                _ => proptest::prop_assert_eq!(
                    index.match_blocks(name, request, &PODS),
                    model.held(name, request, &PODS)
                ),
            }
            proptest::prop_assert_eq!(index.len(), model.blocks.len());
        }
        let order: Vec<u64> = model.blocks.iter().map(|b| b.hash).collect();
        proptest::prop_assert_eq!(lock(&index.shards[0]).oldest_first(), order);
        for name in MODELS {
            for &hash in &pool {
                proptest::prop_assert_eq!(
                    index.match_blocks(name, &[hash], &PODS),
                    model.held(name, &[hash], &PODS)
                );
            }
        }
    }
}

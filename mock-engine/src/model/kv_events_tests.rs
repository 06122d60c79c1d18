//! KV-cache events of the whole engine on a virtual clock: what a prefill stores, that a
//! prefix hit stores nothing, that parents chain, that eviction announces exactly the
//! evicted hashes, and that replaying the events rebuilds the pool's cache exactly.

use std::collections::HashSet;

use super::block_hash::extend_hashes;
use super::engine_tests::{request, tiny_profile};
use super::*;

/// What a subscriber rebuilds from the events: the set of cached hashes.
#[derive(Default)]
struct Subscriber {
    cached: HashSet<u64>,
    batches: Vec<KvEventBatch>,
}

impl Subscriber {
    /// Applies one batch, checking it is coherent with what came before.
    fn apply(&mut self, batch: KvEventBatch) {
        if let Some(last) = self.batches.last() {
            assert!(batch.ts >= last.ts, "batches come in time order");
        }
        assert!(!batch.events.is_empty(), "no empty batches");
        for event in &batch.events {
            match event {
                KvEvent::BlockStored {
                    block_hashes,
                    parent: parent_block_hash,
                    token_ids,
                    block_size,
                } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * block_size);
                    if let Some(parent) = parent_block_hash {
                        assert!(
                            self.cached.contains(parent),
                            "parent {parent:#x} is a block the subscriber knows"
                        );
                    }
                    // The hashes chain from the parent over the tokens.
                    let mut parent = parent_block_hash.unwrap_or(block_hash::ROOT_HASH);
                    for (hash, tokens) in block_hashes.iter().zip(token_ids.chunks(*block_size)) {
                        assert_eq!(*hash, block_hash::chain_hash(parent, tokens));
                        parent = *hash;
                        assert!(self.cached.insert(*hash), "{hash:#x} stored twice");
                    }
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for hash in block_hashes {
                        assert!(self.cached.remove(hash), "{hash:#x} removed, never stored");
                    }
                }
                KvEvent::AllBlocksCleared => self.cached.clear(),
            }
        }
        self.batches.push(batch);
    }

    fn stored(&self) -> Vec<&KvEvent> {
        self.events()
            .filter(|e| matches!(e, KvEvent::BlockStored { .. }))
            .collect()
    }

    fn removed(&self) -> Vec<u64> {
        self.events()
            .filter_map(|e| match e {
                KvEvent::BlockRemoved { block_hashes } => Some(block_hashes.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    fn events(&self) -> impl Iterator<Item = &KvEvent> {
        self.batches.iter().flat_map(|b| b.events.iter())
    }
}

fn pool_hashes(engine: &EngineModel) -> HashSet<u64> {
    engine.scheduler().pool().cached_hashes().collect()
}

/// Runs to idle step by step. After every step the subscriber's view, plus the events of
/// the step now in flight (published when it ends), equals the pool; when idle, the
/// subscriber's view alone does.
fn run_watching(engine: &mut EngineModel, subscriber: &mut Subscriber, max_steps: usize) {
    for _ in 0..max_steps {
        let Some(at) = engine.next_wakeup() else {
            assert!(engine.scheduler().pool().pending_events().is_empty());
            assert_eq!(
                subscriber.cached,
                pool_hashes(engine),
                "stored − removed = pool"
            );
            return;
        };
        engine.advance(at);
        engine.check_invariants().expect("invariants hold");
        for batch in engine.take_kv_event_batches() {
            subscriber.apply(batch);
        }
        let mut with_pending = subscriber.cached.clone();
        for event in engine.scheduler().pool().pending_events() {
            match event {
                KvEvent::BlockStored { block_hashes, .. } => with_pending.extend(block_hashes),
                KvEvent::BlockRemoved { block_hashes } => {
                    block_hashes.iter().for_each(|h| {
                        with_pending.remove(h);
                    });
                }
                KvEvent::AllBlocksCleared => with_pending.clear(),
            }
        }
        assert_eq!(with_pending, pool_hashes(engine), "stored − removed = pool");
    }
    panic!("engine still busy after {max_steps} steps");
}

fn engine_with_events(block_size: usize, num_gpu_blocks: usize) -> EngineModel {
    let mut engine = EngineModel::new(tiny_profile(block_size, num_gpu_blocks));
    engine.set_kv_events(true);
    engine
}

#[test]
fn a_prefill_stores_its_full_blocks_once_and_a_hit_stores_nothing() {
    let mut engine = engine_with_events(4, 33);
    let mut subscriber = Subscriber::default();
    let prompt: Vec<u32> = (100..110).collect(); // 2 full blocks of 4, 2 tokens over
    engine
        .submit(request(prompt.clone(), 1), 0.0)
        .expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);
    let mut hashes = Vec::new();
    extend_hashes(&mut hashes, &prompt, 4);
    assert_eq!(
        subscriber.stored(),
        vec![&KvEvent::BlockStored {
            block_hashes: hashes.clone(),
            parent: None,
            token_ids: prompt[..8].to_vec(),
            block_size: 4,
        }]
    );
    assert_eq!(subscriber.batches.len(), 1);
    // One 10 ms step from t = 0 (no frontend overhead in the tiny profile).
    assert!((subscriber.batches[0].ts - 0.01).abs() < 1e-12);

    engine.submit(request(prompt, 1), 1.0).expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);
    assert_eq!(subscriber.batches.len(), 1, "a full hit announces nothing");
    assert_eq!(engine.metrics().prefix_cache_hits, 8);
}

#[test]
fn new_blocks_after_a_hit_name_the_hit_as_parent_and_decode_blocks_chain_on() {
    let mut engine = engine_with_events(4, 33);
    let mut subscriber = Subscriber::default();
    let shared: Vec<u32> = (200..208).collect();
    engine
        .submit(request(shared.clone(), 1), 0.0)
        .expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);
    let mut longer = shared.clone();
    longer.extend(300..306); // 14 tokens: blocks 2 and 3 new, then decode fills block 3
    engine
        .submit(request(longer.clone(), 4), 1.0)
        .expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);

    let mut hashes = Vec::new();
    extend_hashes(&mut hashes, &longer, 4);
    let stored = subscriber.stored();
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert_eq!(
        stored[1],
        &KvEvent::BlockStored {
            block_hashes: vec![hashes[2]],
            parent: Some(hashes[1]),
            token_ids: longer[8..12].to_vec(),
            block_size: 4,
        }
    );
    // Block 3 fills during decode: 2 prompt tokens then the first 2 generated ones.
    let KvEvent::BlockStored {
        block_hashes,
        parent: parent_block_hash,
        token_ids,
        ..
    } = stored[2]
    else {
        unreachable!("filtered to BlockStored");
    };
    assert_eq!(*parent_block_hash, Some(hashes[2]));
    assert_eq!(block_hashes.len(), 1);
    assert_eq!(token_ids[..2], longer[12..14]);
    assert!(engine.scheduler().pool().is_cached(block_hashes[0]));
}

#[test]
fn eviction_under_pressure_removes_exactly_the_evicted_hashes() {
    // 4 usable blocks: A's 2 blocks, then B needs 3, so exactly one of A's goes.
    let mut engine = engine_with_events(4, 5);
    let mut subscriber = Subscriber::default();
    let a: Vec<u32> = (0..8).collect();
    engine.submit(request(a.clone(), 1), 0.0).expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);
    let mut a_hashes = Vec::new();
    extend_hashes(&mut a_hashes, &a, 4);
    engine
        .submit(request((50..62).collect(), 1), 1.0)
        .expect("fits");
    run_watching(&mut engine, &mut subscriber, 100);
    // A's blocks were freed last block first, so its second block is reused first.
    assert_eq!(subscriber.removed(), vec![a_hashes[1]]);
    let pool = engine.scheduler().pool();
    assert!(pool.is_cached(a_hashes[0]) && !pool.is_cached(a_hashes[1]));
}

#[test]
fn replaying_the_events_rebuilds_the_cache_under_churn_and_preemption() {
    // Families sharing prefixes on a pool too small for them all: hits, evictions,
    // preemptions and decode-filled blocks, checked after every step.
    let mut engine = engine_with_events(4, 12);
    let mut subscriber = Subscriber::default();
    for i in 0..24u32 {
        let family = i % 3;
        let mut prompt: Vec<u32> = (family * 1000..family * 1000 + 12).collect();
        prompt.extend([5000 + i, 6000 + i, 7000 + i]);
        engine
            .submit(request(prompt, 2 + i % 7), f64::from(i) * 0.015)
            .expect("fits");
    }
    run_watching(&mut engine, &mut subscriber, 10_000);
    assert!(
        !subscriber.removed().is_empty(),
        "the pool was under pressure"
    );
    assert!(engine.metrics().prefix_cache_hits > 0, "families hit");
}

#[test]
fn a_reset_clears_everything_only_when_idle() {
    let mut engine = engine_with_events(4, 33);
    let mut subscriber = Subscriber::default();
    engine
        .submit(request((0..9).collect(), 50), 0.0)
        .expect("fits");
    engine.advance(0.05);
    assert!(
        !engine.reset_prefix_cache(0.05),
        "a running request holds blocks"
    );
    run_watching(&mut engine, &mut subscriber, 1000);
    assert!(!pool_hashes(&engine).is_empty());
    assert!(engine.reset_prefix_cache(5.0));
    let batches = engine.take_kv_event_batches();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(batches[0].ts, 5.0);
    subscriber.apply(batches[0].clone());
    assert!(subscriber.cached.is_empty() && pool_hashes(&engine).is_empty());
    engine.check_invariants().expect("consistent after a reset");
}

#[test]
fn events_off_by_default_record_and_allocate_nothing() {
    let mut engine = EngineModel::new(tiny_profile(4, 5));
    engine
        .submit(request((0..8).collect(), 1), 0.0)
        .expect("fits");
    engine
        .submit(request((50..62).collect(), 1), 1.0)
        .expect("fits");
    super::engine_tests::run_to_idle(&mut engine, 100);
    let batches = engine.take_kv_event_batches();
    assert!(batches.is_empty());
    assert_eq!(batches.capacity(), 0);
    assert!(engine.reset_prefix_cache(2.0));
    assert_eq!(engine.take_kv_event_batches().capacity(), 0);
}

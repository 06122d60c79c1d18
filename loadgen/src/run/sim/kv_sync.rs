//! KV-event sync inside the simulated cluster (`SimOptions::kv_sync`): each engine model's
//! KV-cache event batches applied to the router's prefix index, as the gateway's
//! subscribers do with `[kv_sync]` on.
//!
//! The gateway receives vLLM's events over ZeroMQ a fraction of a millisecond after the
//! engine step that produced them, decodes them (`router_core::kv_sync::wire`) and applies
//! them with [`Router::apply_kv_event`], one [`PodSync`] per replica. The simulator skips the
//! sockets and the msgpack: the mock engine's events are the wire's own type, applied as
//! they are at the virtual time the step ended, before any arrival at that time is routed
//! (a sub-millisecond delay is far below the matrix's 0.6 s spacing, so modelling it would
//! change no decision). Everything an event did or failed to do is counted in
//! [`KvSyncStats`], so that a misaligned block size or a lost parent cannot quietly turn
//! sync into a no-op.

use std::collections::BTreeMap;

use mock_engine::model::KvEventBatch;
use router_core::Router;
use router_core::kv_sync::PodSync;

/// What sync did over a run or a phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvSyncStats {
    /// Engine event batches taken (one per engine step that changed its prefix cache).
    pub batches: u64,
    /// Events applied without error.
    pub events_applied: u64,
    /// Router blocks added (or refreshed) in the index for the event's replica.
    pub blocks_added: u64,
    /// Router blocks removed from the index for the event's replica.
    pub blocks_removed: u64,
    /// Events refused, by `SyncError::kind` (`misaligned_block_size`, `unknown_parent`, …).
    pub errors: BTreeMap<&'static str, u64>,
}

impl KvSyncStats {
    /// Events refused, all kinds together.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Adds `other`'s counts to these.
    pub fn absorb(&mut self, other: &KvSyncStats) {
        self.batches += other.batches;
        self.events_applied += other.events_applied;
        self.blocks_added += other.blocks_added;
        self.blocks_removed += other.blocks_removed;
        for (kind, n) in &other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
    }

    /// One line for a progress report: `events 812 applied (blocks +1500 −20), 0 errors`.
    pub fn summary(&self) -> String {
        let errors = if self.errors.is_empty() {
            "0 errors".to_owned()
        } else {
            let kinds: Vec<String> = self
                .errors
                .iter()
                .map(|(kind, n)| format!("{kind} {n}"))
                .collect();
            format!("{} errors ({})", self.error_count(), kinds.join(", "))
        };
        format!(
            "KV events {} applied in {} batches (router blocks +{} -{}), {errors}",
            self.events_applied, self.batches, self.blocks_added, self.blocks_removed
        )
    }
}

/// Every replica's sync state, indexed like the cluster's engines.
#[derive(Debug)]
pub struct ClusterSync {
    pods: Vec<PodSync>,
    /// The models each replica serves (the index keys blocks by model).
    models: Vec<String>,
    stats: KvSyncStats,
}

impl ClusterSync {
    /// Empty state for `replicas` replicas serving `model`.
    pub fn new(replicas: usize, model: &str) -> Self {
        ClusterSync {
            pods: (0..replicas).map(|_| PodSync::new()).collect(),
            models: vec![model.to_owned()],
            stats: KvSyncStats::default(),
        }
    }

    /// What has been applied so far.
    pub fn stats(&self) -> &KvSyncStats {
        &self.stats
    }

    /// Applies `batches` from replica `engine` (named `pod`) to `router`'s index at `now_ms`,
    /// in order.
    pub fn apply(
        &mut self,
        router: &Router,
        engine: usize,
        pod: &str,
        batches: Vec<KvEventBatch>,
        now_ms: u64,
    ) {
        let Some(sync) = self.pods.get_mut(engine) else {
            return;
        };
        for batch in batches {
            self.stats.batches += 1;
            for event in batch.events {
                match router.apply_kv_event(sync, &event, pod, &self.models, now_ms) {
                    Ok(applied) => {
                        self.stats.events_applied += 1;
                        self.stats.blocks_added += applied.added as u64;
                        self.stats.blocks_removed += applied.removed as u64;
                    }
                    Err(error) => *self.stats.errors.entry(error.kind()).or_default() += 1,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::RouterConfig;
    use router_core::kv_sync::KvEvent;

    fn stored(hashes: &[u64], parent: Option<u64>, block_size: usize) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent,
            token_ids: (0..(hashes.len() * block_size) as u32).collect(),
            block_size,
        }
    }

    fn batch(events: Vec<KvEvent>) -> Vec<KvEventBatch> {
        vec![KvEventBatch { ts: 0.0, events }]
    }

    #[test]
    fn stored_and_removed_blocks_reach_the_index_for_that_replica() {
        let router = Router::new(RouterConfig::default()).unwrap();
        let mut sync = ClusterSync::new(2, "m");
        // 4 engine blocks of 16 tokens = 2 router blocks of 128 bytes.
        sync.apply(
            &router,
            1,
            "B",
            batch(vec![stored(&[1, 2, 3, 4], None, 16)]),
            0,
        );
        assert_eq!(router.index().len(), 2);
        sync.apply(
            &router,
            1,
            "B",
            batch(vec![KvEvent::BlockRemoved {
                block_hashes: vec![4],
            }]),
            1,
        );
        let want = KvSyncStats {
            batches: 2,
            events_applied: 2,
            blocks_added: 2,
            blocks_removed: 1,
            errors: BTreeMap::new(),
        };
        assert_eq!(sync.stats(), &want);
        assert_eq!(router.index().len(), 1);
        sync.apply(&router, 1, "B", batch(vec![KvEvent::AllBlocksCleared]), 2);
        assert!(router.index().is_empty());
    }

    #[test]
    fn refused_events_are_counted_by_kind() {
        // 128-byte router blocks do not split into 12-token (48-byte) engine blocks.
        let router = Router::new(RouterConfig::default()).unwrap();
        let mut sync = ClusterSync::new(1, "m");
        sync.apply(&router, 0, "A", batch(vec![stored(&[1], None, 12)]), 0);
        sync.apply(&router, 0, "A", batch(vec![stored(&[2], Some(99), 16)]), 0);
        assert_eq!(sync.stats().events_applied, 0);
        assert_eq!(sync.stats().error_count(), 2);
        assert_eq!(sync.stats().errors["misaligned_block_size"], 1);
        assert_eq!(sync.stats().errors["unknown_parent"], 1);
        assert!(sync.stats().summary().contains("2 errors"));
        assert!(router.index().is_empty());
    }

    #[test]
    fn stats_add_up() {
        let mut total = KvSyncStats::default();
        let mut one = KvSyncStats {
            batches: 1,
            events_applied: 2,
            blocks_added: 3,
            blocks_removed: 4,
            errors: BTreeMap::new(),
        };
        one.errors.insert("unknown_parent", 5);
        total.absorb(&one);
        total.absorb(&one);
        assert_eq!(
            (total.batches, total.events_applied, total.blocks_added),
            (2, 4, 6)
        );
        assert_eq!((total.blocks_removed, total.error_count()), (8, 10));
    }
}

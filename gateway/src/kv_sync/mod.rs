//! KV-event sync in the gateway: every replica's vLLM KV-cache events feed the router's
//! prefix index, and prompts are tokenized by the engine so both sides hash the same ids
//! (AIBrix's `AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED` mode; docs/ROUTING.md, "KV-event
//! sync").
//!
//! - [`config`]: the `[kv_sync]` table, the AIBrix variable, a replica's endpoints;
//! - [`subscriber`]: one stream's SUB + replay subscription, applying batches;
//! - [`engine_tokens`]: the request side's `/tokenize` call;
//! - [`metrics`]: AIBrix's `aibrix_kvcache_zmq_*` counters;
//! - this module: [`spawn`], the supervisor that keeps one subscriber per data-parallel rank
//!   of every replica in the current set (`kv_sync.data_parallel_size`, 1 by default; rank
//!   `r` on the events and replay ports + `r`), all of a replica's ranks writing into one
//!   [`PodSync`] so its index entry is the union of its ranks; it restarts a subscriber that
//!   ended, and when a replica leaves stops its subscribers and drops what their events put
//!   in the index.
//!
//! The decoding and the engine-block → router-block mapping are router-core's
//! (`router_core::kv_sync`); this module only moves bytes and runs tasks.

pub mod config;
pub mod engine_tokens;
pub mod metrics;
pub mod subscriber;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use router_core::kv_sync::PodSync;
use tokio::task::JoinHandle;

pub use config::KvSyncConfig;
pub use metrics::KvSyncMetrics;

use crate::clock::Clock;
use crate::replicas::{Replica, Replicas};

/// How often the supervisor compares its subscribers with the replica set.
pub const SUPERVISE_INTERVAL: Duration = Duration::from_millis(250);

/// A replica's running subscribers (one per rank) and what they write to.
struct Running {
    replica: Arc<Replica>,
    sync: Arc<Mutex<PodSync>>,
    /// Per rank; `None` for a rank whose endpoints cannot be formed (logged once).
    tasks: Vec<Option<JoinHandle<()>>>,
}

impl Running {
    fn abort(&self) {
        for task in self.tasks.iter().flatten() {
            task.abort();
        }
    }
}

/// What KV sync works on, and nothing more of the app: the router whose index the events
/// feed, the replica set it follows, and the clock the index ages by.
#[derive(Debug, Clone)]
pub struct SyncHandles {
    pub router: Arc<router_core::Router>,
    pub replicas: Arc<Replicas>,
    pub clock: Clock,
}

/// Starts the supervisor; it runs until aborted, and its subscribers stop with it.
pub fn spawn(handles: SyncHandles, config: KvSyncConfig, metrics: KvSyncMetrics) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut subscribers = Subscribers(HashMap::new());
        let mut ticker = tokio::time::interval(SUPERVISE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            supervise(&handles, &config, &metrics, &mut subscribers.0);
        }
    })
}

/// The running subscribers, aborted when the supervisor's future is dropped (aborted).
struct Subscribers(HashMap<String, Running>);

impl Drop for Subscribers {
    fn drop(&mut self) {
        for running in self.0.values() {
            running.abort();
        }
    }
}

/// One supervision round: start subscribers for new replicas, restart ended ones, stop
/// and forget those whose replica left.
fn supervise(
    handles: &SyncHandles,
    config: &KvSyncConfig,
    metrics: &KvSyncMetrics,
    running: &mut HashMap<String, Running>,
) {
    let snapshot = handles.replicas.snapshot();
    running.retain(|name, sub| {
        let present = snapshot
            .iter()
            .any(|r| r.name() == name && Arc::ptr_eq(r, &sub.replica) && r.publishes_kv_events());
        if !present {
            sub.abort();
            let mut sync = sub.sync.lock().unwrap_or_else(PoisonError::into_inner);
            let removed = sync.clear(name, handles.router.index());
            for rank in 0..config.data_parallel_size {
                metrics.set_connection_status(name, rank, false);
            }
            tracing::info!(pod = %name, removed, "KV events: replica left; its blocks dropped");
        }
        present
    });
    for replica in snapshot.iter().filter(|r| r.publishes_kv_events()) {
        // A replica's rank-0 endpoints: its own (embedded engines), else the table's ports
        // on its host; rank r adds r to both ports.
        let base = replica
            .kv_events()
            .cloned()
            .unwrap_or_else(|| config.endpoints_for(replica.authority()));
        let sub = running
            .entry(replica.name().to_owned())
            .or_insert_with(|| Running {
                replica: Arc::clone(replica),
                sync: Arc::default(),
                tasks: Vec::new(),
            });
        let first = sub.tasks.is_empty();
        sub.tasks
            .resize_with(config.data_parallel_size as usize, || None);
        for (rank, task) in (0..config.data_parallel_size).zip(sub.tasks.iter_mut()) {
            // Started, and still running (or never startable, and already said so).
            let ended = task.as_ref().is_some_and(JoinHandle::is_finished);
            if !first && !ended {
                continue;
            }
            // New, or its task ended (a panic in the socket library): start over with the
            // same sync state, so nothing it indexed is lost or left behind.
            let Some(endpoints) = base.for_rank(rank) else {
                tracing::warn!(pod = %replica.name(), rank, events = %base.events,
                    "KV events: no port for this data-parallel rank; it is not followed");
                *task = None;
                continue;
            };
            *task = Some(tokio::spawn(subscriber::run(subscriber::Subscription {
                router: Arc::clone(&handles.router),
                clock: handles.clock,
                replica: Arc::clone(replica),
                rank,
                endpoints,
                sync: Arc::clone(&sub.sync),
                metrics: metrics.clone(),
                config: config.clone(),
            })));
        }
    }
}

#[cfg(test)]
mod tests {
    use router_core::kv_sync::KvEvent;

    use super::*;

    fn handles(replicas: Vec<Arc<Replica>>) -> SyncHandles {
        SyncHandles {
            router: Arc::new(
                router_core::Router::new(router_core::RouterConfig::default()).unwrap(),
            ),
            replicas: Arc::new(Replicas::new(replicas)),
            clock: Clock::new(),
        }
    }

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![1, 2],
            parent: None,
            token_ids: (0..32).collect(),
            block_size: 16,
        }
    }

    #[tokio::test]
    async fn a_replica_that_leaves_loses_its_subscriber_and_its_blocks() {
        let a = Arc::new(Replica::new("a", "127.0.0.1:1", vec!["m".into()]));
        let b = Arc::new(Replica::new("b", "127.0.0.1:2", vec!["m".into()]));
        let off =
            Arc::new(Replica::new("off", "127.0.0.1:3", vec!["m".into()]).without_kv_events());
        let state = handles(vec![a.clone(), b.clone(), off]);
        let registry = prometheus::Registry::new();
        let metrics = KvSyncMetrics::register(&registry).unwrap();
        let config = KvSyncConfig {
            enabled: true,
            ..KvSyncConfig::default()
        };
        let mut running = HashMap::new();
        supervise(&state, &config, &metrics, &mut running);
        let mut names: Vec<&String> = running.keys().collect();
        names.sort();
        assert_eq!(
            names,
            ["a", "b"],
            "the opted-out replica gets no subscriber"
        );
        // What the subscribers would have applied, straight into their sync states.
        for (name, sub) in &running {
            let mut sync = sub.sync.lock().unwrap();
            state
                .router
                .apply_kv_event(&mut sync, &stored(), name, &["m".to_owned()], 0)
                .unwrap();
        }
        assert_eq!(
            state.router.index().len(),
            1,
            "one 128-byte block, both pods"
        );
        let a_task = running["a"].tasks[0].as_ref().unwrap().abort_handle();
        state.replicas.replace(vec![b.clone()]);
        supervise(&state, &config, &metrics, &mut running);
        assert!(!running.contains_key("a"));
        assert!(running.contains_key("b"));
        let bytes = router_core::kv_sync::token_bytes(&(0..32).collect::<Vec<u32>>());
        let block = router_core::hash::block_hashes(&bytes, 128, 0);
        assert_eq!(
            state.router.index().match_names("m", &block, &["a", "b"]),
            [0, 100],
            "a's blocks went with it, b's stay"
        );
        // The aborted task ends (the abort is observed at its next await).
        for _ in 0..1_000 {
            if a_task.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(a_task.is_finished());
        drop(Subscribers(running));
    }

    #[tokio::test]
    async fn every_rank_of_a_replica_gets_a_subscriber_restarted_on_its_own() {
        let a = Arc::new(Replica::new("a", "127.0.0.1:1", vec!["m".into()]));
        let state = handles(vec![a]);
        let registry = prometheus::Registry::new();
        let metrics = KvSyncMetrics::register_ranked(&registry, 3).unwrap();
        let config = KvSyncConfig {
            enabled: true,
            data_parallel_size: 3,
            replay_port: 6000,
            ..KvSyncConfig::default()
        };
        let mut running = HashMap::new();
        supervise(&state, &config, &metrics, &mut running);
        let handles = |running: &HashMap<String, Running>| -> Vec<tokio::task::AbortHandle> {
            running["a"]
                .tasks
                .iter()
                .map(|t| t.as_ref().unwrap().abort_handle())
                .collect()
        };
        let first = handles(&running);
        assert_eq!(first.len(), 3, "one subscriber per rank");
        // Rank 1's task ends; the next round restarts it alone.
        first[1].abort();
        for _ in 0..1_000 {
            if first[1].is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(first[1].is_finished());
        supervise(&state, &config, &metrics, &mut running);
        let second = handles(&running);
        assert_eq!(second[0].id(), first[0].id(), "rank 0 kept running");
        assert_eq!(second[2].id(), first[2].id(), "rank 2 kept running");
        assert_ne!(second[1].id(), first[1].id(), "rank 1 restarted");
        assert!(!second[1].is_finished());
        drop(Subscribers(running));
    }
}

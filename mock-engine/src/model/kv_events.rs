//! vLLM's KV-cache events as the engine model produces them: what the prefix cache gained
//! and lost, in order, with no I/O and no encoding.
//!
//! The model mirrors vLLM's `BlockPool` (reference `vllm-surface.md` §3.3): a block whose
//! hash is registered in the prefix cache is announced once by [`KvEvent::BlockStored`]
//! (at the step that computes its tokens, never for a prefix hit), a cached block whose hash
//! is dropped because the free list hands it out again is announced by
//! [`KvEvent::BlockRemoved`] (freeing a finished request announces nothing: its blocks stay
//! cached), and a reset of the whole cache by [`KvEvent::AllBlocksCleared`]. The engine
//! takes the events once per step into a [`KvEventBatch`], as vLLM's scheduler does in
//! `update_from_output`. Encoding them on the wire is the publisher's business
//! ([`crate::kv_events`], with `router_core::kv_sync::wire`).
//!
//! Recording is off by default and then costs a branch: nothing is allocated.

use super::Seconds;

/// One change to the prefix cache: vLLM's event as the wire format defines it (one definition
/// for the publisher here and the gateway's subscriber). The mock serves no adapters, so its
/// events carry no LoRA name; `lora_id` is always none and `medium` always `"GPU"` on the wire.
/// A `BlockRemoved` carries one hash per event, as vLLM emits them (lazy eviction on reuse).
pub use router_core::kv_sync::KvEvent;

/// The events of one engine step, stamped with the step's end in engine seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    pub ts: Seconds,
    pub events: Vec<KvEvent>,
}

/// Where the pool records events between two takes. Disabled, every call is a no-op.
#[derive(Clone, Debug, Default)]
pub struct KvEventLog {
    enabled: bool,
    events: Vec<KvEvent>,
}

impl KvEventLog {
    /// Starts (or stops) recording; stopping drops what was recorded and not taken.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.events = Vec::new();
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Records `BlockStored` (ignored when disabled or when there are no blocks).
    pub fn stored(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        block_size: usize,
    ) {
        if !self.enabled || block_hashes.is_empty() {
            return;
        }
        self.events.push(KvEvent::BlockStored {
            block_hashes: block_hashes.to_vec(),
            parent,
            token_ids: token_ids.to_vec(),
            block_size,
        });
    }

    /// Records `BlockRemoved` for one evicted hash.
    pub fn removed(&mut self, block_hash: u64) {
        if self.enabled {
            self.events.push(KvEvent::BlockRemoved {
                block_hashes: vec![block_hash],
            });
        }
    }

    /// Records `AllBlocksCleared`.
    pub fn cleared(&mut self) {
        if self.enabled {
            self.events.push(KvEvent::AllBlocksCleared);
        }
    }

    /// What the next take returns, without taking it.
    pub fn pending(&self) -> &[KvEvent] {
        &self.events
    }

    /// Everything recorded since the last take, oldest first (empty, without allocating,
    /// when nothing was).
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_log_records_nothing() {
        let mut log = KvEventLog::default();
        log.stored(&[1], None, &[1, 2], 2);
        log.removed(1);
        log.cleared();
        assert!(log.take().is_empty());
        log.set_enabled(true);
        log.stored(&[], None, &[], 2);
        log.removed(7);
        log.cleared();
        assert_eq!(
            log.take(),
            vec![
                KvEvent::BlockRemoved {
                    block_hashes: vec![7]
                },
                KvEvent::AllBlocksCleared
            ]
        );
        assert!(log.take().is_empty(), "a take empties the log");
        log.removed(8);
        log.set_enabled(false);
        assert!(log.take().is_empty(), "disabling drops what was not taken");
    }
}

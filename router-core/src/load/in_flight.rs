//! A request's life on its pod as the router's load view sees it: **decided** (counted
//! against the pod with its work, [`PodLoad::decide`]) → **first byte** (the pod has
//! prefilled it: its pending prefill and copy mark end, [`InFlight::first_byte`]) → **end**
//! (its last byte, with the engine's usage when known: [`InFlight::end`]).
//!
//! One type for every runner: the gateway's response body drives it as bytes flow, the
//! simulator as its engine model emits tokens, and cluster sharing holds the other gateways'
//! requests in it. Whatever happens, the count and the work are released exactly once, when
//! the value ends or is dropped (an upstream failure, a client that goes away, a peer that is
//! forgotten). The transitions carry the caller's clock ([`Millis`]), so the lifecycle can
//! say how long the pod took to answer and to finish: what the per-replica speed estimates
//! learn from.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::decoding::Stream;
use super::evidence::Verdict;
use super::speed::{Completed, Usage};
use super::{PodLoad, RequestWork};
use crate::Millis;

/// One request in flight on one pod (see the module docs). Dropping it releases the count
/// and the work exactly once; [`end`](Self::end) does the same after recording the end.
#[derive(Debug)]
#[must_use = "dropping an InFlight immediately releases the outstanding count"]
pub struct InFlight {
    load: Arc<PodLoad>,
    at_selection: u64,
    blocks: u64,
    /// Pending-prefill blocks still held (0 once released).
    pending_prefill: u64,
    /// Still counted as unanswered on its pod (until the first byte).
    unanswered: bool,
    /// The prefill this request was expected to do on its pod, in blocks (kept after the
    /// first byte releases it from the pending sum).
    prefill_blocks: u64,
    shared_prefix: Option<u64>,
    /// Still counted as copying its shared prefix here (until the first byte).
    copying: bool,
    /// Routed while another request was still copying its prefix here.
    behind_copy: bool,
    /// Sent while the pod had no request outstanding (of any gateway).
    sent_to_idle: bool,
    /// When it was decided; `None` for a count taken without a decision (tests, warm-up
    /// holds, another gateway's request), whose timings mean nothing here.
    decided_at: Option<Millis>,
    first_byte_at: Option<Millis>,
    max_tokens: Option<u64>,
    /// Its stream's clock on its pod, from its first byte when its `max_tokens` is known.
    stream: Option<Arc<Stream>>,
}

impl InFlight {
    pub(super) fn new(
        load: Arc<PodLoad>,
        at_selection: u64,
        work: RequestWork,
        behind_copy: bool,
        sent_to_idle: bool,
    ) -> Self {
        InFlight {
            load,
            at_selection,
            blocks: work.blocks,
            pending_prefill: work.prefill_blocks,
            unanswered: true,
            prefill_blocks: work.prefill_blocks,
            shared_prefix: work.shared_prefix,
            copying: work.copies_prefix,
            behind_copy,
            sent_to_idle,
            decided_at: None,
            first_byte_at: None,
            max_tokens: work.max_tokens,
            stream: None,
        }
    }

    pub(super) fn decided_at(mut self, now: Millis) -> Self {
        self.decided_at = Some(now);
        self
    }

    /// The pod's outstanding count just before this request was counted.
    pub fn at_selection(&self) -> u64 {
        self.at_selection
    }

    /// The work this request holds on its pod: its blocks, and until its first byte its
    /// pending prefill and copy mark. What a gateway tells its peers when it decides.
    pub fn work(&self) -> RequestWork {
        RequestWork {
            blocks: self.blocks,
            prefill_blocks: self.pending_prefill,
            shared_prefix: self.shared_prefix,
            copies_prefix: self.copying,
            max_tokens: self.max_tokens,
        }
    }

    /// The prefill the request was expected to do on its pod when decided, in blocks.
    pub fn prefill_blocks(&self) -> u64 {
        self.prefill_blocks
    }

    /// When the request was decided, if it was ([`PodLoad::decide`]).
    pub fn decided(&self) -> Option<Millis> {
        self.decided_at
    }

    /// When its first byte came, once it has.
    pub fn first_byte_at(&self) -> Option<Millis> {
        self.first_byte_at
    }

    /// The first response byte arrived at `now`: the pod has prefilled this request, so its
    /// blocks stop counting as pending prefill (and it as unanswered), and a copy of its
    /// prefix is usable there from now on; the pod's speed learns its time to first token
    /// ([`ReplicaSpeed::answered`](super::ReplicaSpeed::answered)). Only the first call
    /// counts; the outstanding count and active blocks stay until the request ends.
    pub fn first_byte(&mut self, now: Millis) {
        if self.first_byte_at.is_none() {
            self.first_byte_at = Some(now);
            self.stream = self
                .max_tokens
                .map(|max_tokens| self.load.decoding.start(now, max_tokens));
            if let Some(decided) = self.decided_at {
                self.load.speed().answered(
                    now.saturating_sub(decided),
                    self.prefill_blocks,
                    self.sent_to_idle,
                );
            }
        }
        self.release_prefill();
    }

    /// `tokens` of the answer had streamed by `now()` (the first byte was the first): its
    /// stream's clock records it every [`PROGRESS_EVERY`](super::PROGRESS_EVERY) tokens,
    /// reading the clock only then. Returns whether it did, which is when a gateway tells its
    /// peers (cluster sharing), so that theirs record the same. Before the first byte, or
    /// without `max_tokens`, there is no clock and nothing is recorded.
    pub fn advance(&mut self, tokens: u64, now: impl FnOnce() -> Millis) -> bool {
        self.stream
            .as_ref()
            .is_some_and(|stream| stream.advance(tokens, now))
    }

    /// The last byte arrived at `now`, with the engine's `usage` when the response carried
    /// it: records what the request took on its pod ([`PodLoad::observe`]), then releases
    /// the count and the work. Returns what the engine's `cached_tokens` said about the
    /// prefix index ([`Verdict`]), if anything. A request that never answered (no first
    /// byte) or was never decided here teaches nothing and is only released.
    pub fn end(self, now: Millis, usage: Option<Usage>) -> Option<Verdict> {
        let mut verdict = None;
        if let (Some(decided), Some(first_byte)) = (self.decided_at, self.first_byte_at) {
            verdict = self.load.observe(&Completed {
                blocks: self.blocks,
                prefill_blocks: self.prefill_blocks,
                ttft: first_byte.saturating_sub(decided),
                decode: now.saturating_sub(first_byte),
                usage,
                sent_to_idle: self.sent_to_idle,
                behind_copy: self.behind_copy,
            });
        }
        drop(self);
        verdict
    }

    fn release_prefill(&mut self) {
        let pending = std::mem::take(&mut self.pending_prefill);
        if pending > 0 {
            self.load
                .pending_prefill_blocks
                .fetch_sub(pending, Ordering::AcqRel);
        }
        if std::mem::take(&mut self.unanswered) {
            self.load.unanswered.fetch_sub(1, Ordering::AcqRel);
        }
        if std::mem::take(&mut self.copying)
            && let Some(prefix) = self.shared_prefix
            && let Some(counts) = self.load.prefixes().get_mut(&prefix)
        {
            counts.copying = counts.copying.saturating_sub(1);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.release_prefill();
        if let Some(stream) = self.stream.take() {
            self.load.decoding.remove(&stream);
        }
        self.load
            .active_blocks
            .fetch_sub(self.blocks, Ordering::AcqRel);
        if let Some(prefix) = self.shared_prefix {
            let mut prefixes = self.load.prefixes();
            if let Some(counts) = prefixes.get_mut(&prefix) {
                counts.outstanding = counts.outstanding.saturating_sub(1);
                if counts.outstanding == 0 {
                    prefixes.remove(&prefix);
                }
            }
        }
        self.load.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

//! What one engine step computes, and what its end produces: vLLM v1's `schedule()` and
//! `update_from_output()` (reference §4.2) over the [`BlockPool`].
//!
//! Order within a step: running requests first, in admission order, each taking its next
//! prefill chunk or one decode token within the token budget; when a running request needs a
//! block and none is free, the newest running request is preempted (its blocks freed, its
//! progress dropped, put at the front of the waiting queue) until the allocation fits. Then,
//! only if nobody was preempted, waiting requests in FCFS order while fewer than
//! `max_num_seqs` run and blocks allow; a waiting request that does not fit blocks the queue.
//! Timing is not decided here: the engine asks [`super::step_time`] how long a step lasts and
//! calls [`Scheduler::complete`] at its end.

use std::collections::{HashMap, VecDeque};

use super::block_pool::{BlockId, BlockPool};
use super::kv_events::KvEvent;
use super::metrics::EngineMetrics;
use super::sequence::Sequence;
use super::{EngineProfile, FinishReason, RequestId, Seconds, TokenOutput};
use crate::tokenizer::generated_token;

/// Work for one request in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub id: RequestId,
    /// Tokens with KV computed before this step (the chunk's start position).
    pub start: usize,
    /// Tokens computed in this step.
    pub len: usize,
    /// A one-token step of a request that already generated (priced as decode).
    pub decode: bool,
    /// The chunk reaches the end of the known tokens, so the step samples a token.
    pub emits: bool,
}

/// The waiting and running queues, every admitted request's state, and the KV pool.
#[derive(Debug)]
pub struct Scheduler {
    block_size: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    pool: BlockPool,
    seqs: HashMap<RequestId, Sequence>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
}

impl Scheduler {
    pub fn new(profile: &EngineProfile) -> Scheduler {
        Scheduler {
            block_size: profile.block_size.max(1),
            max_num_seqs: profile.max_num_seqs,
            max_num_batched_tokens: profile.max_num_batched_tokens,
            pool: BlockPool::new(profile.num_gpu_blocks),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// A request past the frontend joins the back of the waiting queue.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Starts or stops recording KV-cache events in the pool.
    pub fn set_kv_events(&mut self, enabled: bool) {
        self.pool.set_events_enabled(enabled);
    }

    /// The KV-cache events recorded since the last take.
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.pool.take_events()
    }

    /// Resets the prefix cache if no block is in use ([`BlockPool::reset_prefix_cache`]).
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    /// Ids in the running queue, oldest admission first.
    pub fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// Ids in the waiting queue, next to be admitted first.
    pub fn waiting(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.waiting.iter().copied()
    }

    /// Plans one step starting at `now`; counts prefix-cache queries and preemptions.
    pub fn schedule(&mut self, now: Seconds, metrics: &mut EngineMetrics) -> Vec<ScheduledChunk> {
        let mut budget = self.max_num_batched_tokens;
        let mut chunks = Vec::new();
        let mut preempted = false;

        // Each pass either advances `index` or pops a running request, so it ends.
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let id = self.running[index];
            match self.schedule_running(id, budget, metrics) {
                RunningOutcome::Scheduled(chunk, preemptions) => {
                    preempted |= preemptions > 0;
                    budget -= chunk.len;
                    chunks.push(chunk);
                    index += 1;
                }
                RunningOutcome::PreemptedItself => {
                    preempted = true;
                    break;
                }
                RunningOutcome::Skipped => index += 1,
            }
        }

        // vLLM admits nobody in a step that had to preempt: memory is short.
        if !preempted {
            // Each pass pops a waiting request or stops.
            while budget > 0 && self.running.len() < self.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                match self.schedule_waiting(id, budget, now, metrics) {
                    WaitingOutcome::Admitted(chunk) => {
                        self.waiting.pop_front();
                        self.running.push(id);
                        budget -= chunk.len;
                        chunks.push(chunk);
                    }
                    WaitingOutcome::NoBlocks => break,
                    WaitingOutcome::Unknown => {
                        self.waiting.pop_front();
                    }
                }
            }
        }
        chunks
    }

    /// Applies the end of a step at `at`: every chunk that reached the end of its request's
    /// tokens samples one token; requests reaching `max_tokens` finish and free their blocks.
    /// Chunks of requests aborted meanwhile are ignored.
    pub fn complete(
        &mut self,
        chunks: &[ScheduledChunk],
        at: Seconds,
        metrics: &mut EngineMetrics,
    ) -> Vec<TokenOutput> {
        let mut outputs = Vec::new();
        for chunk in chunks.iter().filter(|c| c.emits) {
            let Some(seq) = self.seqs.get_mut(&chunk.id) else {
                continue;
            };
            let index = u32::try_from(seq.num_output()).unwrap_or(u32::MAX);
            let token = generated_token(seq.id, index);
            seq.tokens.push(token);
            metrics.on_token(seq, at);
            let finish =
                (seq.num_output() >= seq.max_tokens as usize).then_some(FinishReason::Length);
            outputs.push(TokenOutput {
                id: seq.id,
                token,
                index,
                finish,
                at,
                prompt_tokens: seq.prompt_tokens_u32(),
                cached_tokens: seq.cached_tokens_u32(),
            });
            if let Some(reason) = finish {
                self.finish(chunk.id, reason, at, metrics);
            }
        }
        outputs
    }

    /// Removes a request wherever it is, freeing its blocks; `false` if unknown.
    pub fn abort(&mut self, id: RequestId, now: Seconds, metrics: &mut EngineMetrics) -> bool {
        if !self.seqs.contains_key(&id) {
            return false;
        }
        self.finish(id, FinishReason::Abort, now, metrics);
        true
    }

    /// Checks block accounting against every request's block list (tests, proptests).
    pub fn check(&self) -> Result<(), String> {
        let holders: Vec<&[BlockId]> = self.seqs.values().map(|s| s.blocks.as_slice()).collect();
        self.pool.check(&holders)?;
        if self.running.len() > self.max_num_seqs {
            return Err(format!("{} running > max_num_seqs", self.running.len()));
        }
        for id in self.waiting.iter() {
            let seq = self.seqs.get(id).ok_or("waiting id without state")?;
            if !seq.blocks.is_empty() || seq.num_computed != 0 {
                return Err(format!("waiting request {id} holds blocks"));
            }
        }
        if self.waiting.len() + self.running.len() != self.seqs.len() {
            return Err("a request is in neither queue, or in both".into());
        }
        Ok(())
    }

    fn schedule_running(
        &mut self,
        id: RequestId,
        budget: usize,
        metrics: &mut EngineMetrics,
    ) -> RunningOutcome {
        let mut preemptions = 0;
        // Each pass pops one running request, so it ends.
        let (n, need) = loop {
            let Some(seq) = self.seqs.get(&id) else {
                return RunningOutcome::Skipped;
            };
            let n = seq.remaining().min(budget);
            if n == 0 {
                return RunningOutcome::Skipped;
            }
            let need = self
                .blocks_for(seq.num_computed + n)
                .saturating_sub(seq.blocks.len());
            if need <= self.pool.num_free() {
                break (n, need);
            }
            let Some(victim) = self.running.pop() else {
                return RunningOutcome::Skipped;
            };
            self.preempt(victim, metrics);
            preemptions += 1;
            if victim == id {
                return RunningOutcome::PreemptedItself;
            }
        };
        let Ok(fresh) = self.pool.allocate(need) else {
            return RunningOutcome::Skipped;
        };
        let block_size = self.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            self.pool.free(&fresh);
            return RunningOutcome::Skipped;
        };
        seq.blocks.extend(fresh);
        let chunk = advance_sequence(seq, n);
        cache_full_blocks(&mut self.pool, seq, block_size);
        RunningOutcome::Scheduled(chunk, preemptions)
    }

    fn schedule_waiting(
        &mut self,
        id: RequestId,
        budget: usize,
        now: Seconds,
        metrics: &mut EngineMetrics,
    ) -> WaitingOutcome {
        let block_size = self.block_size;
        let Some(seq) = self.seqs.get_mut(&id) else {
            return WaitingOutcome::Unknown;
        };
        // A hit is block-aligned and leaves at least the last token to compute, so the step
        // has something to sample from (vLLM's `num_tokens - 1` cap).
        seq.refresh_hashes(block_size);
        let max_hit_blocks = seq.num_tokens().saturating_sub(1) / block_size;
        let hit = self.pool.lookup_prefix(&seq.block_hashes, max_hit_blocks);
        let hit_tokens = hit.len() * block_size;
        // Counted on every examination, as vLLM does, even if allocation then fails.
        metrics.prefix_cache_queries += seq.num_tokens() as u64;
        metrics.prefix_cache_hits += hit_tokens as u64;

        let n = (seq.num_tokens() - hit_tokens).min(budget);
        let need = (hit_tokens + n)
            .div_ceil(block_size)
            .saturating_sub(hit.len());
        if !self.pool.can_allocate(&hit, need) {
            return WaitingOutcome::NoBlocks;
        }
        self.pool.touch(&hit);
        let fresh = match self.pool.allocate(need) {
            Ok(fresh) => fresh,
            Err(_) => {
                self.pool.free(&hit);
                return WaitingOutcome::NoBlocks;
            }
        };
        seq.num_cached_blocks = hit.len();
        seq.blocks = hit;
        seq.blocks.extend(fresh);
        seq.num_computed = hit_tokens;
        seq.first_scheduled.get_or_insert(now);
        seq.cached_tokens.get_or_insert(hit_tokens);
        let chunk = advance_sequence(seq, n);
        cache_full_blocks(&mut self.pool, seq, block_size);
        WaitingOutcome::Admitted(chunk)
    }

    /// Recompute preemption: drop the request's KV and progress, queue it first.
    fn preempt(&mut self, id: RequestId, metrics: &mut EngineMetrics) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.pool.free(&seq.blocks);
            seq.blocks.clear();
            seq.num_computed = 0;
            seq.num_cached_blocks = 0;
            self.waiting.push_front(id);
            metrics.preemptions += 1;
        }
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, at: Seconds, m: &mut EngineMetrics) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        self.running.retain(|r| *r != id);
        self.waiting.retain(|w| *w != id);
        self.pool.free(&seq.blocks);
        m.on_finish(&seq, reason, at);
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }
}

enum RunningOutcome {
    /// The chunk, and how many other requests were preempted to make room.
    Scheduled(ScheduledChunk, usize),
    /// The request was the newest running one and had to give up its own blocks.
    PreemptedItself,
    /// Nothing to do for it this step (no state or no remaining work).
    Skipped,
}

enum WaitingOutcome {
    Admitted(ScheduledChunk),
    /// Not enough free blocks: the request stays first in line.
    NoBlocks,
    /// A stale id (defensive; every waiting id has state).
    Unknown,
}

/// Marks `n` more tokens as computed by this step and describes the chunk.
fn advance_sequence(seq: &mut Sequence, n: usize) -> ScheduledChunk {
    let start = seq.num_computed;
    seq.num_computed += n;
    ScheduledChunk {
        id: seq.id,
        start,
        len: n,
        decode: n == 1 && seq.num_output() > 0 && start + 1 == seq.num_tokens(),
        emits: seq.num_computed == seq.num_tokens(),
    }
}

/// Registers the request's blocks that this step fills, so requests scheduled later can hit
/// them (vLLM caches at allocation time, for the tokens the step will compute). With events
/// on, each run of consecutive newly registered blocks is announced as one `BlockStored`
/// (one run per request per step, unless a block's hash was already cached by another
/// block, which splits the run: a subscriber then sees every hash stored exactly once).
fn cache_full_blocks(pool: &mut BlockPool, seq: &mut Sequence, block_size: usize) {
    seq.refresh_hashes(block_size);
    let full = (seq.num_computed / block_size)
        .min(seq.block_hashes.len())
        .min(seq.blocks.len());
    let events = pool.events_enabled();
    let mut run_start = None;
    for i in seq.num_cached_blocks..full {
        let registered = pool.cache(seq.blocks[i], seq.block_hashes[i]);
        if !events {
            continue;
        }
        match (registered, run_start) {
            (true, None) => run_start = Some(i),
            (false, Some(start)) => {
                announce_stored(pool, seq, start..i, block_size);
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run_start {
        announce_stored(pool, seq, start..full, block_size);
    }
    seq.num_cached_blocks = seq.num_cached_blocks.max(full);
}

/// Records `BlockStored` for the request's blocks `blocks` (indices into its block list).
fn announce_stored(
    pool: &mut BlockPool,
    seq: &Sequence,
    blocks: std::ops::Range<usize>,
    block_size: usize,
) {
    let parent = blocks
        .start
        .checked_sub(1)
        .and_then(|p| seq.block_hashes.get(p).copied());
    let hashes = seq.block_hashes.get(blocks.clone()).unwrap_or(&[]);
    let tokens = seq
        .tokens
        .get(blocks.start * block_size..blocks.end * block_size)
        .unwrap_or(&[]);
    pool.record_stored(hashes, parent, tokens, block_size);
}

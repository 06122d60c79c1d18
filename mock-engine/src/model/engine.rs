//! The clock-driven engine: admits requests through the frontend delay, runs steps back to
//! back, and turns step ends into tokens.
//!
//! Time is passed in. A request submitted at `t` reaches the scheduler at
//! `t + frontend_overhead`; a step starts as soon as the previous one ends, or when an idle
//! engine sees a request become schedulable; its duration comes from [`step_duration`] and
//! its tokens are stamped with its end time. [`EngineModel::advance`] replays every step that
//! ends by the given time, so the server can call it from a real-time loop and the simulator
//! from a virtual clock, with identical results.

use super::kv_events::KvEventBatch;
use super::metrics::EngineMetrics;
use super::scheduler::{ScheduledChunk, Scheduler};
use super::sequence::Sequence;
use super::step_time::step_duration;
use super::{
    AdmissionError, EngineProfile, EngineRequest, FinishReason, RequestId, Seconds, TokenOutput,
};

/// A step whose work is planned and whose tokens appear at `end`.
#[derive(Debug)]
struct InFlightStep {
    end: Seconds,
    chunks: Vec<ScheduledChunk>,
}

/// One simulated vLLM engine. Pure: no I/O, no clock, no threads.
#[derive(Debug)]
pub struct EngineModel {
    profile: EngineProfile,
    scheduler: Scheduler,
    /// Requests still in the frontend, ordered by the time they reach the scheduler.
    pending: Vec<Sequence>,
    in_flight: Option<InFlightStep>,
    metrics: EngineMetrics,
    next_id: RequestId,
    /// The latest time the engine has been told about or acted at; times passed in that lie
    /// before it are treated as it, so outputs never go back in time.
    clock: Seconds,
    /// KV-cache event batches not yet taken (empty unless events are on).
    kv_batches: Vec<KvEventBatch>,
}

impl EngineModel {
    pub fn new(profile: EngineProfile) -> EngineModel {
        EngineModel {
            scheduler: Scheduler::new(&profile),
            profile,
            pending: Vec::new(),
            in_flight: None,
            metrics: EngineMetrics::default(),
            next_id: 0,
            clock: 0.0,
            kv_batches: Vec::new(),
        }
    }

    pub fn profile(&self) -> &EngineProfile {
        &self.profile
    }

    /// A request arrives at `now`; it becomes schedulable at `now + frontend_overhead`.
    /// Refused (vLLM's 400) if the prompt is empty, `max_tokens` is 0, or prompt +
    /// `max_tokens` exceeds `max_model_len`.
    pub fn submit(
        &mut self,
        request: EngineRequest,
        now: Seconds,
    ) -> Result<RequestId, AdmissionError> {
        let prompt = request.prompt.len();
        let max_model_len = self.profile.max_model_len;
        if prompt == 0 {
            return Err(AdmissionError::EmptyPrompt);
        }
        if prompt > max_model_len {
            return Err(AdmissionError::PromptTooLong {
                prompt,
                max_model_len,
            });
        }
        if request.max_tokens == 0 {
            return Err(AdmissionError::ZeroMaxTokens);
        }
        if prompt + request.max_tokens as usize > max_model_len {
            return Err(AdmissionError::MaxTokensTooLarge {
                max_tokens: request.max_tokens,
                prompt,
                max_model_len,
            });
        }
        let arrival = self.at_or_after_clock(now);
        let id = self.next_id;
        self.next_id += 1;
        let ready_at = arrival + self.profile.frontend_overhead;
        let seq = Sequence::new(id, request.prompt, request.max_tokens, arrival, ready_at);
        // Keep `pending` ordered by ready time, FCFS among equal times.
        let slot = self.pending.partition_point(|p| p.ready_at <= ready_at);
        self.pending.insert(slot, seq);
        Ok(id)
    }

    /// The client went away: the request finishes with reason `abort` and its blocks are
    /// freed (they stay cached). A token of it in the step in flight is dropped. No-op for an
    /// unknown or finished id. No [`TokenOutput`] is produced: the caller asked for it.
    pub fn abort(&mut self, id: RequestId, now: Seconds) {
        let now = self.at_or_after_clock(now);
        if let Some(slot) = self.pending.iter().position(|p| p.id == id) {
            let seq = self.pending.remove(slot);
            self.metrics.on_finish(&seq, FinishReason::Abort, now);
            return;
        }
        self.scheduler.abort(id, now, &mut self.metrics);
    }

    /// Runs every step that ends at or before `now` (a step starts as soon as the previous
    /// one ends, or when the first request becomes schedulable), returning their tokens in
    /// order. `f64::INFINITY` runs until the engine is idle.
    pub fn advance(&mut self, now: Seconds) -> Vec<TokenOutput> {
        let mut outputs = Vec::new();
        if now.is_nan() {
            return outputs;
        }
        // Each pass completes a step (finite work: every step computes at least one token of
        // a request that needs finitely many) or moves pending requests in; so it ends.
        loop {
            if let Some(step) = &self.in_flight {
                if step.end > now {
                    break;
                }
                let Some(step) = self.in_flight.take() else {
                    break;
                };
                self.clock = self.clock.max(step.end);
                outputs.extend(
                    self.scheduler
                        .complete(&step.chunks, step.end, &mut self.metrics),
                );
                self.collect_kv_events(step.end);
                self.start_step(step.end);
                continue;
            }
            match self.pending.first() {
                Some(first) if first.ready_at.max(self.clock) <= now => {
                    let at = first.ready_at.max(self.clock);
                    self.clock = at;
                    self.start_step(at);
                }
                _ => break,
            }
        }
        if now.is_finite() {
            self.clock = self.clock.max(now);
        }
        outputs
    }

    /// When `advance` next has something to do (end of the step in flight, or the next
    /// request becoming schedulable); `None` when idle.
    pub fn next_wakeup(&self) -> Option<Seconds> {
        if let Some(step) = &self.in_flight {
            return Some(step.end);
        }
        self.pending.first().map(|p| p.ready_at.max(self.clock))
    }

    /// Requests holding KV and taking part in steps (`vllm:num_requests_running`).
    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    /// Requests queued for the scheduler, preempted ones included
    /// (`vllm:num_requests_waiting`). Requests still in the frontend are not counted.
    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    /// `1 - free/(num_gpu_blocks - 1)`; cached-but-free blocks count as free.
    pub fn kv_usage(&self) -> f64 {
        self.scheduler.pool().usage()
    }

    /// All counters and histograms (plain data).
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// The scheduler's queues and KV pool, read-only (for tests and diagnostics).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Starts or stops recording vLLM's KV-cache events ([`super::kv_events`]); off by
    /// default. Stopping drops batches not yet taken.
    pub fn set_kv_events(&mut self, enabled: bool) {
        self.scheduler.set_kv_events(enabled);
        if !enabled {
            self.kv_batches = Vec::new();
        }
    }

    /// The KV-cache event batches of the steps that ended since the last take, oldest first:
    /// one batch per step that changed the prefix cache, stamped with the step's end (as
    /// vLLM's scheduler takes them once per step). Empty, without allocating, when off.
    pub fn take_kv_event_batches(&mut self) -> Vec<KvEventBatch> {
        std::mem::take(&mut self.kv_batches)
    }

    /// vLLM's `reset_prefix_cache`: forgets every cached block if none is in use, and then
    /// publishes `AllBlocksCleared` in a batch of its own at `now` (after anything the step
    /// in flight recorded), rather than waiting for a step an idle engine may never take.
    /// `false` (and nothing changes) while any request holds blocks.
    pub fn reset_prefix_cache(&mut self, now: Seconds) -> bool {
        if !self.scheduler.reset_prefix_cache() {
            return false;
        }
        let now = self.at_or_after_clock(now);
        self.collect_kv_events(now);
        true
    }

    /// Checks block accounting and queue invariants; `Err` describes the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.scheduler.check()
    }

    /// Starts a step at `at` if anything is schedulable.
    fn start_step(&mut self, at: Seconds) {
        let ready = self.pending.partition_point(|p| p.ready_at <= at);
        for seq in self.pending.drain(..ready) {
            self.scheduler.add(seq);
        }
        let mut chunks = self.scheduler.schedule(at, &mut self.metrics);
        if chunks.is_empty() && self.scheduler.num_waiting() > 0 {
            // A step that preempted its only runner admits nobody; the next one will.
            chunks = self.scheduler.schedule(at, &mut self.metrics);
        }
        if chunks.is_empty() {
            return;
        }
        let tokens: usize = chunks.iter().map(|c| c.len).sum();
        self.metrics.iteration_tokens.observe(tokens as f64);
        let end = at + step_duration(&self.profile, &chunks);
        self.in_flight = Some(InFlightStep { end, chunks });
    }

    /// Moves the pool's recorded events into a batch stamped `ts`, if there are any.
    fn collect_kv_events(&mut self, ts: Seconds) {
        let events = self.scheduler.take_kv_events();
        if !events.is_empty() {
            self.kv_batches.push(KvEventBatch { ts, events });
        }
    }

    fn at_or_after_clock(&self, now: Seconds) -> Seconds {
        if now.is_finite() {
            now.max(self.clock)
        } else {
            self.clock
        }
    }
}

//! The clock-driven engine: admits requests, runs steps back to back, emits tokens.
//! (API skeleton; the scheduler lands next.)

use super::metrics::EngineMetrics;
use super::{AdmissionError, EngineProfile, EngineRequest, RequestId, Seconds, TokenOutput};

/// One simulated vLLM engine. Pure: time is passed in.
#[derive(Debug)]
pub struct EngineModel {
    profile: EngineProfile,
    metrics: EngineMetrics,
    next_id: RequestId,
}

impl EngineModel {
    pub fn new(profile: EngineProfile) -> EngineModel {
        EngineModel {
            profile,
            metrics: EngineMetrics::default(),
            next_id: 0,
        }
    }

    pub fn profile(&self) -> &EngineProfile {
        &self.profile
    }

    /// A request arrives at `now`; it becomes schedulable at `now + frontend_overhead`.
    pub fn submit(
        &mut self,
        request: EngineRequest,
        now: Seconds,
    ) -> Result<RequestId, AdmissionError> {
        let _ = (request, now);
        let id = self.next_id;
        self.next_id += 1;
        Ok(id)
    }

    /// The client went away: finish with reason `abort` and free its blocks.
    pub fn abort(&mut self, id: RequestId, now: Seconds) {
        let _ = (id, now);
    }

    /// Runs every step that ends at or before `now`, returning their tokens in order.
    pub fn advance(&mut self, now: Seconds) -> Vec<TokenOutput> {
        let _ = now;
        Vec::new()
    }

    /// When `advance` next has something to do; `None` when idle.
    pub fn next_wakeup(&self) -> Option<Seconds> {
        None
    }

    pub fn num_running(&self) -> usize {
        0
    }

    pub fn num_waiting(&self) -> usize {
        0
    }

    /// `1 - free/(num_gpu_blocks - 1)`; cached-but-free blocks count as free.
    pub fn kv_usage(&self) -> f64 {
        0.0
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }
}

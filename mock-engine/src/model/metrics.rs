//! vLLM's engine counters and histograms as plain data (reference §2), updated by the engine
//! as events happen. Exposition (names, labels, Prometheus text) belongs to the server; this
//! module only counts, with vLLM's semantics and bucket bounds.

use super::sequence::Sequence;
use super::{FinishReason, Seconds};

/// `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// `vllm:inter_token_latency_seconds` (and the deprecated `time_per_output_token_seconds`).
pub const TOKEN_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// e2e, queue, inference, prefill and decode time histograms.
pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// `vllm:iteration_tokens_total`: tokens (prompt + generation) scheduled per step.
pub const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// A Prometheus-style histogram. `counts` is **non-cumulative** and has one more entry than
/// `bounds`: `counts[i]` holds observations `v` with `bounds[i-1] < v ≤ bounds[i]`, and the
/// last entry holds those above every bound (the `+Inf` bucket). Use [`Histogram::cumulative`]
/// for exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        // `le` semantics: a value equal to a bound belongs to that bound's bucket.
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        if let Some(slot) = self.counts.get_mut(bucket) {
            *slot += 1;
        }
        self.sum += value;
        self.count += 1;
    }

    /// Cumulative counts per bound followed by the `+Inf` total, as Prometheus writes them.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |total, count| {
                *total += count;
                Some(*total)
            })
            .collect()
    }
}

/// `vllm:request_success_total` by `finished_reason`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSuccess {
    pub stop: u64,
    pub length: u64,
    pub abort: u64,
}

impl RequestSuccess {
    pub fn get(&self, reason: FinishReason) -> u64 {
        match reason {
            FinishReason::Stop => self.stop,
            FinishReason::Length => self.length,
            FinishReason::Abort => self.abort,
        }
    }

    pub(crate) fn add(&mut self, reason: FinishReason) {
        match reason {
            FinishReason::Stop => self.stop += 1,
            FinishReason::Length => self.length += 1,
            FinishReason::Abort => self.abort += 1,
        }
    }
}

/// Every counter and histogram the engine keeps. Gauges (running, waiting, KV usage) are read
/// live from [`super::EngineModel`].
#[derive(Clone, Debug, PartialEq)]
pub struct EngineMetrics {
    /// `vllm:prefix_cache_queries_total`: tokens of every new request examined by the
    /// scheduler (again when re-examined after a failed allocation or a preemption).
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total`: cached tokens found for those requests.
    pub prefix_cache_hits: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
    /// `vllm:prompt_tokens_total`: whole prompts (cached included), counted at first token.
    pub prompt_tokens: u64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: u64,
    /// `vllm:request_success_total{finished_reason}`.
    pub request_success: RequestSuccess,
    /// Arrival (submit) → first token.
    pub ttft: Histogram,
    /// One observation per decode step per request: the gap since its previous token.
    pub inter_token_latency: Histogram,
    /// Arrival → finish (aborts included).
    pub e2e_request_latency: Histogram,
    /// Entering the waiting queue → first scheduled.
    pub request_queue_time: Histogram,
    /// First scheduled → first token (preemptions included).
    pub request_prefill_time: Histogram,
    /// First token → last token.
    pub request_decode_time: Histogram,
    /// First scheduled → last token.
    pub request_inference_time: Histogram,
    /// Tokens scheduled per step.
    pub iteration_tokens: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            request_success: RequestSuccess::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(TOKEN_LATENCY_BUCKETS),
            e2e_request_latency: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_queue_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_prefill_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_decode_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            request_inference_time: Histogram::new(REQUEST_LATENCY_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
        }
    }
}

impl EngineMetrics {
    /// A token was just appended to `seq` by the step ending at `at`: TTFT or one
    /// inter-token gap, token counters, and the sequence's token timestamps.
    pub(crate) fn on_token(&mut self, seq: &mut Sequence, at: Seconds) {
        match seq.last_token_at {
            None => {
                self.ttft.observe(at - seq.arrival);
                self.prompt_tokens += seq.num_prompt as u64;
                seq.first_token_at = Some(at);
            }
            Some(previous) => self.inter_token_latency.observe(at - previous),
        }
        seq.last_token_at = Some(at);
        self.generation_tokens += 1;
    }

    /// `seq` finished at `at`: vLLM observes its request-level histograms now.
    pub(crate) fn on_finish(&mut self, seq: &Sequence, reason: FinishReason, at: Seconds) {
        self.request_success.add(reason);
        self.e2e_request_latency.observe(at - seq.arrival);
        if let Some(scheduled) = seq.first_scheduled {
            self.request_queue_time.observe(scheduled - seq.ready_at);
            if let Some(first) = seq.first_token_at {
                self.request_prefill_time.observe(first - scheduled);
            }
            if let Some(last) = seq.last_token_at {
                self.request_inference_time.observe(last - scheduled);
            }
        }
        if let (Some(first), Some(last)) = (seq.first_token_at, seq.last_token_at) {
            self.request_decode_time.observe(last - first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_uses_le_buckets_and_an_inf_bucket() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        h.observe(0.5);
        h.observe(1.0);
        h.observe(1.5);
        h.observe(9.0);
        assert_eq!(h.counts, vec![2, 1, 1]);
        assert_eq!(h.cumulative(), vec![2, 3, 4]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 12.0).abs() < 1e-12);
    }

    #[test]
    fn success_counts_by_reason() {
        let mut s = RequestSuccess::default();
        s.add(FinishReason::Length);
        s.add(FinishReason::Length);
        s.add(FinishReason::Abort);
        assert_eq!(s.get(FinishReason::Length), 2);
        assert_eq!(s.get(FinishReason::Abort), 1);
        assert_eq!(s.get(FinishReason::Stop), 0);
    }
}

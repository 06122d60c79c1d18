//! The engine model: one vLLM replica as a pure state machine advanced by time passed in.
//!
//! It follows vLLM's v1 scheduler where routing can see the difference (continuous batching
//! with a cap on running sequences, chunked prefill within a token budget, a paged KV block
//! pool with prefix caching and lazy LRU eviction, preemption by recompute) and replaces the
//! GPU with a step-time formula from the [`EngineProfile`]. There is no I/O, no clock and no
//! thread here: the HTTP server drives it in scaled real time and the load generator's
//! simulator drives it on a virtual clock, so both see exactly the same engine.
//!
//! The pieces: [`profile`] (coefficients and limits, from `config/engines/*.toml`),
//! [`request`] (what callers submit and get back), [`block_pool`], [`free_queue`] and
//! [`block_hash`] (KV blocks and the prefix cache), [`kv_events`] (what the prefix cache
//! announces to subscribers), [`sequence`] (one request's engine
//! state), [`scheduler`] (what one step computes), [`step_time`] (how long it takes),
//! [`metrics`] (vLLM's counters and histograms) and [`engine`] (the clock-driven loop tying
//! them together).

pub mod block_hash;
pub mod block_pool;
pub mod engine;
pub mod free_queue;
pub mod kv_events;
pub mod metrics;
pub mod profile;
pub mod request;
pub mod scheduler;
pub mod sequence;
pub mod step_time;

pub use engine::EngineModel;
pub use kv_events::{KvEvent, KvEventBatch};
pub use metrics::{
    EngineMetrics, Histogram, ITERATION_TOKENS_BUCKETS, REQUEST_LATENCY_BUCKETS, RequestSuccess,
    TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS,
};
pub use profile::{EngineProfile, ProfileError};
pub use request::{AdmissionError, EngineRequest, FinishReason, TokenOutput};

/// Engine time in seconds. The model never reads a clock: the server passes scaled wall
/// time, the simulator passes virtual time.
pub type Seconds = f64;

/// Identifies a submitted request for the lifetime of one [`EngineModel`] (never reused).
pub type RequestId = u64;

#[cfg(test)]
mod engine_tests;

#[cfg(test)]
mod calibration_tests;

#[cfg(test)]
mod accounting_proptest;

#[cfg(test)]
mod kv_events_tests;

//! mock-engine: a faithful, clocked stand-in for a vLLM replica.
//!
//! Two halves, as in the design: [`model`] is the engine as a state machine advanced by
//! time passed in (continuous batching, paged KV blocks with prefix caching, preemption, the
//! step-time profile, vLLM's counters), with no I/O; [`server`] drives that model in scaled
//! real time behind vLLM's HTTP surface. [`tokenizer`] is the deterministic word tokenizer
//! both sides and the load generator share, [`chat_template`] the chat template they share. [`kv_events`] publishes the model's KV-cache
//! events over ZMQ in vLLM's format.

pub mod chat_template;
pub mod kv_events;
pub mod model;
pub mod server;
pub mod tokenizer;

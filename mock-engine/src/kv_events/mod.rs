//! Publishing the engine model's KV-cache events the way vLLM does, for subscribers such as
//! AIBrix's KV-event sync or llm-d's indexer.
//!
//! The model records the events ([`crate::model::kv_events`]); this module turns them into
//! vLLM's ZMQ messages. [`config`] parses `--kv-events-config` (and carries the
//! `--kv-events-format` choice), [`wire`] encodes the msgpack format, positional or map (the
//! gateway's `router_core::kv_sync` decodes both), [`queue`] is the non-blocking hand-off
//! from the engine's step loop, and [`publisher`] owns the PUB and replay sockets.

pub mod config;
pub mod publisher;
pub mod queue;
pub mod wire;

pub use config::{KvEventsConfig, KvEventsConfigError, PublisherKind};
pub use publisher::{KvEventPublisher, PublisherError};
pub use queue::BatchQueue;
pub use wire::{END_OF_REPLAY, EventFormat, UnknownEventFormat, encode_batch, encode_batch_as};

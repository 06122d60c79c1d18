//! Publishing the engine model's KV-cache events the way vLLM does, for subscribers such as
//! AIBrix's KV-event sync or llm-d's indexer.
//!
//! The model records the events ([`crate::model::kv_events`]); this module turns them into
//! vLLM's ZMQ messages. [`config`] parses `--kv-events-config` (and carries the
//! `--kv-events-format` choice), [`queue`] is the non-blocking hand-off from the engine's
//! step loop, and [`publisher`] owns the PUB and replay sockets. The wire format itself,
//! positional or map, is defined once in `router_core::kv_sync::wire`, which encodes it here
//! and decodes it in the gateway's subscriber.

pub mod config;
pub mod publisher;
pub mod queue;

pub use config::{KvEventsConfig, KvEventsConfigError, PublisherKind};
pub use publisher::{KvEventPublisher, PublisherError};
pub use queue::BatchQueue;
/// The wire form a publisher writes (the format itself is `router_core::kv_sync::wire`).
pub use router_core::kv_sync::wire::EventFormat;

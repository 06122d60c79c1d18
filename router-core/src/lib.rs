//! router-core decides where a request goes, and nothing else.
//!
//! It is a synchronous library with no I/O, no clock and no threads of its own: callers pass
//! in the request's text, a snapshot of the ready pods with their loads, a random source and
//! the current time, and get back a [`Decision`] that says what happened. That is what lets
//! the same policy code run inside the gateway, inside `prefixgate route-replay`, and inside
//! the load generator's simulated matrix on a virtual clock.
//!
//! The pieces, in the order a request meets them:
//! - [`text`]: the message text of a chat or completion body (AIBrix's rules);
//! - [`tokenize`]: text to the byte stream that is hashed (`character`, `tiktoken`, `hf`);
//! - [`hash`]: chained XXH64 block hashes over that byte stream;
//! - [`index`]: the prefix index (block hash → model → pods), LRU by add, TTL since add;
//! - [`load`]: per-pod outstanding counts, each request's lifecycle ([`InFlight`]: decided →
//!   first byte → end, released exactly once), scraped engine stats and learned speeds;
//! - [`families`]: the prompt families each pod serves lately (`prefix-load` places new
//!   families by them);
//! - [`policy`]: `random`, `least-request`, `prefix-cache` (AIBrix v0.7.0), and
//!   prefixgate's `prefix-load`, one file or folder each;
//! - [`decision`]: what a policy chose and why, for headers and metrics;
//! - [`kv_sync`]: engines' KV-cache events decoded and applied to the index (KV-event sync);
//! - [`cluster`]: several gateways, one view: the messages gateways exchange about their
//!   decisions, applied to the index and to each pod's peer load;
//! - [`router`]: the entry point that ties them together under a [`RouterConfig`]
//!   ([`config`]), from which it builds each part's own settings once;
//! - [`strategy`]: the strategies a request can name.

pub mod cluster;
pub mod config;
pub mod decision;
pub mod families;
pub mod hash;
pub mod index;
pub mod kv_sync;
pub mod load;
pub mod policy;
pub mod router;
pub mod strategy;
pub mod text;
pub mod tokenize;

pub use config::{ConfigError, RouterConfig};
pub use decision::{Decision, MatchBucket, Selection};
pub use load::{Candidate, EngineStats, InFlight, PodLoad, Usage};
pub use policy::Session;
pub use router::{RouteError, RouteRequest, Routed, Router};
pub use strategy::Strategy;

/// Milliseconds on the caller's monotonic clock. Pure code never reads a clock; the gateway
/// passes real time, the simulator passes virtual time.
pub type Millis = u64;

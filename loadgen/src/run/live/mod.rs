//! The live runner: planned requests over HTTP against a gateway, each a streamed chat
//! completion timed chunk by chunk, with the replicas' and the gateway's `/metrics` read for
//! the engine deltas, gauge peaks and routing counters.
//!
//! - [`target`]: where to send and what to scrape (`--gateway`, `--replica NAME=URL`);
//! - [`runner`]: the matrix's phases (priming, measured requests, scrapes);
//! - [`replay`]: a trace's planned requests, one route at a time;
//! - [`send`]: planned requests at their times, spread over the gateways; [`converse`]:
//!   conversations, turn by turn;
//! - [`request`]: one streamed request and its record; [`sse`]: the stream's lines;
//! - [`scrape`], [`prom_text`]: reading Prometheus text; [`progress`]: the status line.

pub mod converse;
pub mod progress;
pub mod prom_text;
pub mod replay;
pub mod request;
pub mod runner;
pub mod scrape;
pub mod send;
pub mod sse;
pub mod target;

pub use progress::PhaseProgress;
pub use runner::{LiveError, LiveRunner, RunDescription};
pub use target::{GatewayEndpoint, LiveTarget, ReplicaEndpoint};

//! The simulated runner: router-core's `Router` (the gateway's policies) in front of one
//! mock-engine `EngineModel` per replica, on a virtual clock, with no sockets and no threads.
//! Deterministic for a seed.
//!
//! - `arrival`: what the cluster is given (an arrival and its target) and gives back;
//! - [`cluster`]: the engines, their loads and the router, and the event loop that sends
//!   planned requests and turns tokens into records (the sink every workload feeds);
//! - [`matrix`]: the matrix's phases on fresh clusters (`loadgen simulate`);
//! - `flight`: one request in flight and its lifecycle in the router's load view;
//! - [`converse`]: a conversation scenario's sessions, closed loop;
//! - [`replay`]: a trace's planned requests, route after route, on fresh clusters;
//! - [`gateways`]: G gateways in front of the cluster, and the seam for shared state;
//! - [`sharing`]: the gateways' routing state shared as `[cluster]` does, with a delay;
//! - [`priming`]: the cluster as the one priming routine sees it;
//! - [`kv_sync`]: the engines' KV-cache events applied to the router's index;
//! - [`options`]: what to simulate; [`trace_lines`]: the per-request explanation file.

mod arrival;
pub mod cluster;
pub mod converse;
mod flight;
pub mod gateways;
pub mod kv_sync;
pub mod matrix;
pub mod options;
pub mod priming;
pub mod replay;
pub mod sharing;
pub mod trace_lines;

#[cfg(test)]
mod learning_tests;

pub use crate::run::assignment::GatewayAssignment;
pub use cluster::{Arrival, Served, SimCluster, SimError, Target};
pub use kv_sync::KvSyncStats;
pub use matrix::{
    PartialRun, PhaseRun, simulate_matrix, simulate_matrix_runs, simulate_phase,
    simulate_phase_run, simulate_phase_traced,
};
pub use options::SimOptions;

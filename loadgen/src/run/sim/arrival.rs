//! What the simulated cluster is given and gives back: an arrival (a planned request and
//! where it goes), what became of it, and the simulation's own failures.

use router_core::{Decision, RouteError, Strategy};

use crate::measure::RequestRecord;
use crate::workload::PlannedRequest;

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Straight to one engine, bypassing the router (warm priming).
    Direct(usize),
    /// Through the router with this strategy.
    Routed(Strategy),
    /// Through the router, with every other replica's outstanding count raised above this
    /// one's for the moment of the decision, so that a load-aware route (least-request, or a
    /// prefix route's least-request fallback) picks it. Forces a family's first placement
    /// (`SimOptions::first_owners`) and warm priming's owners (`SimOptions::warm_owners`).
    RoutedOnto(Strategy, usize),
}

/// One request to send: a workload's planned request, whose `at` is a time on the cluster's
/// virtual clock (the caller adds its phase origin), and where it goes.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub request: PlannedRequest,
    pub target: Target,
}

/// What became of one arrival.
#[derive(Debug, Clone)]
pub struct Served {
    pub record: RequestRecord,
    /// The engine it ran on.
    pub engine: usize,
    /// The router's decision, for routed requests.
    pub decision: Option<Decision>,
}

/// The simulation failed (a model or configuration bug, never a measurement outcome).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("routing failed: {0}")]
    Route(#[from] RouteError),
    #[error("direct target {0} is not a replica")]
    NoSuchReplica(usize),
    #[error("{0} requests still in flight but no engine has work (model stalled)")]
    Stalled(usize),
    #[error("simulation exceeded its bounds ({0}); aborted")]
    Runaway(&'static str),
    #[error("no balanced family choice after {0} setup attempts")]
    NoBalancedSetup(u32),
    #[error("simulation settings: {0}")]
    Config(String),
    #[error("priming request failed (status {0:?}); the phase cannot be set up")]
    Priming(Option<u16>),
}

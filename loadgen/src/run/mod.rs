//! How traffic is sent. `sim` drives router-core and mock-engine models on a virtual clock;
//! the live runner (HTTP against a gateway) is not built yet (see `docs/LOADGEN.md`).

pub mod sim;
pub mod sim_cluster;

pub use sim::{PartialRun, SimOptions, simulate_matrix, simulate_phase};
pub use sim_cluster::{Arrival, SimCluster, SimError, Target};

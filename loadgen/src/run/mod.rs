//! How traffic is sent. `sim` drives router-core and mock-engine models on a virtual clock;
//! `live` sends HTTP to a gateway (and `local` starts mock replicas and a gateway in-process
//! for it). Both hand the same records to [`crate::measure`]. `operations` sends the
//! operations phases live (open or closed loop, `operations_drive`).

pub mod live;
pub mod live_request;
pub mod live_scrape;
pub mod local;
pub mod operations;
pub mod operations_drive;
pub mod operations_run;
pub mod progress;
pub mod prom_text;
pub mod setup;
pub mod sim;
pub mod sim_cluster;
pub mod sim_kv_sync;
pub mod sim_trace;
pub mod sse;

pub use live::{LiveError, LiveRunner, LiveTarget, ReplicaEndpoint, RunDescription};
pub use local::{LocalOptions, LocalStack};
pub use operations::{OperationsRunner, StackShape, operations_config};
pub use operations_run::{
    LocalStacks, OperationsTarget, QUANTILE_METHOD, StackDescription, run_operations,
};
pub use progress::PhaseProgress;
pub use sim::{
    PartialRun, PhaseRun, SimOptions, simulate_matrix, simulate_matrix_runs, simulate_phase,
};
pub use sim_cluster::{Arrival, SimCluster, SimError, Target};
pub use sim_kv_sync::KvSyncStats;

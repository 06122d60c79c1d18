//! How traffic is sent: the sinks that workloads' planned requests go to. Each runner writes
//! the same records for [`crate::measure`].
//!
//! - [`sim`]: router-core and mock-engine models on a virtual clock;
//! - [`live`]: HTTP against a gateway and its replicas;
//! - [`local`]: mock replicas and a gateway started in-process, for `live` to run against;
//! - [`operations`]: the operations phases, live (open or closed loop);
//! - [`priming`]: the one priming routine both matrix runners use, over a small cluster
//!   trait; [`setup`]: what priming produced and the phase's `config` block.

pub mod assignment;
pub mod live;
pub mod local;
pub mod operations;
pub mod priming;
pub mod setup;
pub mod sim;

pub use live::{LiveError, LiveRunner, LiveTarget, PhaseProgress, ReplicaEndpoint, RunDescription};
pub use local::{LocalOptions, LocalStack};
pub use operations::stacks::{
    LocalStacks, OperationsTarget, QUANTILE_METHOD, StackDescription, run_operations,
};
pub use operations::{OperationsRunner, StackShape, operations_config};
pub use sim::{
    Arrival, KvSyncStats, PartialRun, PhaseRun, SimCluster, SimError, SimOptions, Target,
    simulate_matrix, simulate_matrix_runs, simulate_phase,
};

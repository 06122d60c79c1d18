//! What happened: per-request records and engine observations → phase results in exactly
//! the seed's schema. Every metric is defined once, here (formulas in
//! `docs/MEASUREMENT.md`); live and simulated runners feed the same records.

pub mod cluster_events;
pub mod counters;
pub mod operations;
pub mod operations_schema;
pub mod phase;
pub mod quantile;
pub mod record;
pub mod replay;
pub mod schema;
pub mod schema_check;

pub use cluster_events::{
    AddedReplica, DrainObserved, DrainRecord, ReplicaSplit, ScaleUpRecord, drain_record,
    replica_split, scale_up_record,
};
pub use counters::RoutingTally;
pub use operations::{OperationsOutcome, TenantRecord, summarize_operations};
pub use operations_schema::{
    OperationsConfig, OperationsPhaseResult, OperationsResult, SloSeconds, StageConfig,
    TenantConfig, TenantResult,
};
pub use phase::{EngineCounters, Peaks, PhaseOutcome, ReplicaObservation, Slo, is_good, summarize};
pub use record::{ErrorClass, RequestRecord, Usage};
pub use replay::{
    ReplayRecord, ReplayReplica, ReplayResult, ReplayRun, SloSummary, Tail, TraceSummary,
    summarize_run,
};
pub use schema::{
    CounterDelta, FamilyResult, MatrixResult, PhaseConfig, PhaseResult, Quantiles, ReplicaResult,
};

//! loadgen: the 24-phase routing matrix, live, local and simulated, in the seed's schema; and
//! the operations phases (waves, closed loops, tenant mixes), live and local, in theirs.
//!
//! Three parts, kept apart so the live and simulated paths share everything but the sending:
//! - [`workload`]: what to send and when (matrix file, prompts, schedule, priming plans);
//! - [`measure`]: what it meant (per-request records → phase results in the seed's schema);
//! - [`run`]: how to send it (the simulated runner on a virtual clock);
//! - [`report`]: tables and charts from result files;
//! - [`result_file`]: writing a result file without replacing a device such as `/dev/null`.

pub mod measure;
pub mod report;
pub mod result_file;
pub mod run;
pub mod workload;

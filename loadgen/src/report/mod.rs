//! Reports from result files: Markdown tables (one run, or ours beside a baseline) and SVG
//! charts for the matrix; tables for operations runs, with their cluster events and a chart
//! of requests per replica over time for each phase that had one; a table and charts for
//! trace replays. Pure text generation;
//! `main` reads and writes the files.

pub mod cluster_events;
pub mod operations;
pub mod replay;
pub mod svg;
pub mod table;

pub use cluster_events::{events_charts, render_events_table};
pub use operations::{render_operations_side_by_side, render_operations_table};
pub use replay::{render_replay_table, replay_charts};
pub use svg::charts;
pub use table::{render_side_by_side, render_table};

//! Reports from result files: Markdown tables (one run, or ours beside a baseline) and SVG
//! charts for the matrix; tables for operations runs (no charts). Pure text generation;
//! `main` reads and writes the files.

pub mod operations;
pub mod svg;
pub mod table;

pub use operations::{render_operations_side_by_side, render_operations_table};
pub use svg::charts;
pub use table::{render_side_by_side, render_table};

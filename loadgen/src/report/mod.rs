//! Reports from result files: Markdown tables (one run, or ours beside a baseline) and SVG
//! charts. Pure text generation; `main` reads and writes the files.

pub mod svg;
pub mod table;

pub use svg::charts;
pub use table::{render_side_by_side, render_table};

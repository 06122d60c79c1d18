//! The `loadgen` binary: command-line parsing and file I/O around the library.
//!
//! `loadgen simulate` runs the matrix on the simulated stack, `loadgen report` renders result
//! files, `loadgen check-schema` holds a result to the seed's schema. Results are written
//! atomically (a temporary file renamed into place), so a failed run never leaves a truncated
//! file; a run that stops early writes what it has with `complete: false`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use loadgen::measure::{MatrixResult, PhaseResult, schema_check};
use loadgen::report;
use loadgen::run::{SimOptions, simulate_matrix};
use loadgen::workload::Matrix;
use mock_engine::model::EngineProfile;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    version,
    about = "prefixgate's load generator: the 24-phase routing matrix, simulated or live, in the seed's schema"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the matrix through router-core and mock-engine models on a virtual clock.
    Simulate {
        /// Matrix definition (default: the built-in config/matrix-24.toml).
        #[arg(long)]
        matrix: Option<PathBuf>,
        /// Replace the matrix's routes, e.g. `random,least-request,prefix-cache`.
        #[arg(long, value_delimiter = ',')]
        routes: Option<Vec<String>>,
        /// Number of simulated replicas.
        #[arg(long, default_value_t = 2)]
        replicas: usize,
        /// Engine profile: a built-in name or a .toml path.
        #[arg(long, default_value = "l20-qwen27b-fp8")]
        engine_profile: String,
        /// Replica names are this prefix plus A, B, C, …
        #[arg(long, default_value = "L20-")]
        replica_prefix: String,
        /// Requests per phase (default: the matrix's count).
        #[arg(long)]
        count: Option<usize>,
        /// Where to write the result JSON.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run the matrix live against a gateway (not built yet).
    Matrix {
        #[arg(long)]
        gateway: Option<String>,
        #[arg(long)]
        local: bool,
    },
    /// Render a result file as a Markdown table (and charts).
    Report {
        /// The result JSON.
        file: PathBuf,
        /// Another result (e.g. the seed) to compare against.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Write SVG charts into this directory.
        #[arg(long, alias = "svg")]
        charts: Option<PathBuf>,
    },
    /// Check a result against the seed's schema (as shared/tools/seed_schema_check.py does).
    CheckSchema { seed: PathBuf, result: PathBuf },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Simulate {
            matrix,
            routes,
            replicas,
            engine_profile,
            replica_prefix,
            count,
            out,
        } => {
            let mut m = match &matrix {
                Some(path) => Matrix::load(path)?,
                None => Matrix::builtin()?,
            };
            if let Some(routes) = routes {
                m = m.with_routes(&routes)?;
            }
            if let Some(count) = count {
                m = m.with_count(count)?;
            }
            let profile = EngineProfile::load(&engine_profile)
                .with_context(|| format!("engine profile {engine_profile:?}"))?;
            let mut options = SimOptions::seed_like(profile);
            options.replicas = replicas;
            options.replica_prefix = replica_prefix;
            simulate(&m, &options, out.as_deref())
        }
        Command::Matrix { .. } => bail!(
            "the live runner (`loadgen matrix`) is not built yet; use `loadgen simulate` (see docs/LOADGEN.md)"
        ),
        Command::Report {
            file,
            baseline,
            charts,
        } => {
            let ours = read_result(&file)?;
            print!("{}", report::render_table(&ours));
            let base = baseline.as_deref().map(read_result).transpose()?;
            if let Some(base) = &base {
                println!();
                print!("{}", report::render_side_by_side(&ours, base));
            }
            if let Some(dir) = charts {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating chart directory {}", dir.display()))?;
                for (name, svg) in report::charts(&ours, base.as_ref()) {
                    let path = dir.join(name);
                    std::fs::write(&path, svg)
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
            }
            Ok(())
        }
        Command::CheckSchema { seed, result } => {
            let seed = read_json(&seed)?;
            let ours = read_json(&result)?;
            let problems = schema_check::check_against_seed(&seed, &ours);
            for p in problems.iter().take(20) {
                println!("{p}");
            }
            println!("schema problems: {}", problems.len());
            if problems.is_empty() {
                Ok(())
            } else {
                bail!("{} does not match the seed's schema", result.display())
            }
        }
    }
}

fn simulate(matrix: &Matrix, options: &SimOptions, out: Option<&Path>) -> Result<()> {
    let started = Instant::now();
    let total = matrix.phases().len();
    let mut done = 0;
    let mut progress = |p: &PhaseResult| {
        done += 1;
        eprintln!(
            "[{done}/{total}] {}: good {}/{} ttft p50 {:.3}s p95 {:.3}s split {}",
            p.phase,
            p.good,
            p.requests,
            p.ttft.p50.unwrap_or(f64::NAN),
            p.ttft.p95.unwrap_or(f64::NAN),
            report::table::replica_split(p)
        );
    };
    let (result, failure) = match simulate_matrix(matrix, options, &mut progress) {
        Ok(result) => (result, None),
        Err(run) => (run.partial, Some(run.error)),
    };
    eprintln!(
        "simulated {} phases in {:.2}s wall",
        result.measured_phases,
        started.elapsed().as_secs_f64()
    );
    match out {
        Some(path) => write_atomically(path, &result)?,
        None => println!("{}", serde_json::to_string_pretty(&result)?),
    }
    if out.is_some() {
        print!("{}", report::render_table(&result));
    }
    match failure {
        Some(e) => bail!(
            "simulation stopped after {} phases: {e}",
            result.measured_phases
        ),
        None => Ok(()),
    }
}

fn write_atomically(path: &Path, result: &MatrixResult) -> Result<()> {
    let text = serde_json::to_string_pretty(result)?;
    let tmp = path.with_extension("json.partial");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn read_result(path: &Path) -> Result<MatrixResult> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a loadgen/seed result file", path.display()))
}

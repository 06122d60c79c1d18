//! `loadgen simulate` and `loadgen matrix`: run the matrix's phases (simulated or live),
//! print each phase's line as it ends, and write the result file (and the simulator's
//! per-request trace) when asked.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use loadgen::measure::PhaseResult;
use loadgen::report;
use loadgen::run::sim::trace_lines::{TraceLine, trace_lines};
use loadgen::run::{LiveRunner, PhaseRun, RunDescription, SimOptions, simulate_matrix_runs};
use loadgen::workload::Matrix;

use super::status_ticker;

pub fn simulate(
    matrix: &Matrix,
    options: &SimOptions,
    out: Option<&Path>,
    trace: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let total = matrix.phases().len();
    let mut trace_file = trace
        .map(|path| {
            std::fs::File::create(path)
                .map(std::io::BufWriter::new)
                .with_context(|| format!("creating the trace file {}", path.display()))
        })
        .transpose()?;
    let mut trace_error = None;
    let mut done = 0;
    let mut sync_errors = 0;
    let mut progress = |run: &PhaseRun| {
        let p = &run.result;
        done += 1;
        progress_line(done, total, p);
        if let Some(stats) = &run.kv_sync {
            eprintln!("  {}", stats.summary());
            sync_errors += stats.error_count();
        }
        if let Some(file) = trace_file.as_mut()
            && trace_error.is_none()
        {
            trace_error = write_trace(file, &trace_lines(p, &run.served, &options.slo)).err();
        }
    };
    let (result, failure) = match simulate_matrix_runs(matrix, options, &mut progress) {
        Ok(result) => (result, None),
        Err(run) => (run.partial, Some(run.error)),
    };
    if let (Some(path), Some(mut file)) = (trace, trace_file) {
        if let Some(e) = trace_error {
            bail!("writing the trace file {}: {e}", path.display());
        }
        std::io::Write::flush(&mut file)
            .with_context(|| format!("writing the trace file {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    eprintln!(
        "simulated {} phases in {:.2}s wall",
        result.measured_phases,
        started.elapsed().as_secs_f64()
    );
    if sync_errors > 0 {
        // Refused events leave the index out of step with the engines; the run still
        // stands, but its figures are not those of a working sync.
        eprintln!("warning: {sync_errors} KV events were refused (see the lines above)");
    }
    match out {
        Some(path) => loadgen::result_file::write_result(path, &result)?,
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

pub async fn live(
    runner: &LiveRunner,
    matrix: &Matrix,
    describe: RunDescription,
    out: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let total = matrix.phases().len();
    let mut done = 0;
    let mut progress = |p: &PhaseResult| {
        done += 1;
        progress_line(done, total, p);
    };
    let interrupt = async {
        // If the signal handler cannot be installed, run uninterruptible rather than stop.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let ticker = status_ticker(runner.progress());
    let (result, stopped) = runner
        .run_matrix(matrix, describe, &mut progress, interrupt)
        .await;
    if let Some(ticker) = ticker {
        ticker.abort();
        eprint!("\r\x1b[2K");
    }
    eprintln!(
        "ran {} phases in {:.1}s wall",
        result.measured_phases,
        started.elapsed().as_secs_f64()
    );
    match out {
        Some(path) => {
            loadgen::result_file::write_result(path, &result)?;
            print!("{}", report::render_table(&result));
        }
        None => println!("{}", serde_json::to_string_pretty(&result)?),
    }
    match stopped {
        Some(why) => bail!("run stopped after {} phases: {why}", result.measured_phases),
        None => Ok(()),
    }
}

fn progress_line(done: usize, total: usize, p: &PhaseResult) {
    if std::io::stderr().is_terminal() {
        // Clears a status line the live ticker may have left.
        eprint!("\r\x1b[2K");
    }
    eprintln!(
        "[{done}/{total}] {}: good {}/{} ttft p50 {:.3}s p95 {:.3}s split {}",
        p.phase,
        p.good,
        p.requests,
        p.ttft.p50.unwrap_or(f64::NAN),
        p.ttft.p95.unwrap_or(f64::NAN),
        report::table::replica_split(p)
    );
}

/// Appends one JSON line per request.
fn write_trace(file: &mut impl std::io::Write, lines: &[TraceLine]) -> std::io::Result<()> {
    for line in lines {
        serde_json::to_writer(&mut *file, line)?;
        file.write_all(b"\n")?;
    }
    Ok(())
}

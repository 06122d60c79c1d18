//! `loadgen operations`: its flags, the phase selection and notes, and the run's file and
//! table output around the library's [`run_operations`].

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use loadgen::measure::{OperationsPhaseResult, Slo};
use loadgen::report;
use loadgen::run::live::request::http_client;
use loadgen::run::{LiveTarget, LocalStacks, OperationsRunner, OperationsTarget, run_operations};
use loadgen::workload::{Operations, OperationsPhase};

use super::{LocalArgs, status_ticker};

/// The flags of `loadgen operations`.
#[derive(Debug, clap::Args)]
pub struct OperationsArgs {
    /// Operations definition (default: the built-in config/operations.toml).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Run only these phases, e.g. `tenants-baseline,tenants-protected` (default: every
    /// phase that is not cluster_only).
    #[arg(long, value_delimiter = ',')]
    phases: Vec<String>,
    /// The gateway's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long, required_unless_present = "local")]
    gateway: Option<String>,
    /// The served model name.
    #[arg(long, default_value = "Qwen3.8-27B-FP8")]
    model: String,
    /// Start mock replicas and a gateway in this process (per phase: its replicas and
    /// admission table) and run against them.
    #[arg(long, conflicts_with = "gateway")]
    local: bool,
    #[command(flatten)]
    stack: LocalArgs,
    /// Wall seconds one request may take (against a gateway).
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Where to write the result JSON (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `loadgen operations`.
pub fn run(args: OperationsArgs) -> Result<()> {
    let OperationsArgs {
        file,
        phases,
        gateway,
        model,
        local,
        stack,
        request_timeout,
        out,
    } = args;
    let ops = match &file {
        Some(path) => Operations::load(path)?,
        None => Operations::builtin()?,
    };
    let selected = ops.select(&phases)?;
    let mut notes = Vec::new();
    for p in ops.phases.iter().filter(|p| !selected.contains(p)) {
        if let Some(why) = &p.def.cluster_only {
            notes.push(format!("{} not run: needs a cluster ({why})", p.def.name));
        }
    }
    for p in &selected {
        if let Some(why) = &p.def.cluster_only {
            notes.push(format!(
                "{} ran without its cluster event ({why})",
                p.def.name
            ));
        }
        if let Some(note) = &p.def.note {
            notes.push(format!("{}: {note}", p.def.name));
        }
        // A real gateway's replicas and admission are its operator's; say the file's are unused.
        if !local && (p.def.replicas.is_some() || p.def.admission.is_some()) {
            let note = format!(
                "{}: replicas and admission apply to --local only; the gateway's own settings were used",
                p.def.name
            );
            eprintln!("note: {note}");
            notes.push(note);
        }
    }
    if !(request_timeout.is_finite() && request_timeout > 0.0) {
        bail!("--request-timeout must be > 0 seconds");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let target = if local {
        let profiles = stack.profiles()?;
        OperationsTarget::Local(Box::new(LocalStacks::new(
            stack.replica_prefix,
            stack.replicas,
            profiles,
            stack.time_scale,
            model,
            crate::routing_from_env()?,
        )))
    } else {
        let gateway = gateway.context("--gateway URL is required without --local")?;
        OperationsTarget::Live(LiveTarget {
            gateways: LiveTarget::one_gateway(gateway.trim_end_matches('/').to_owned(), None),
            assignment: Default::default(),
            replicas: Vec::new(),
            model,
            time_scale: 1.0,
            request_limit: Duration::from_secs_f64(request_timeout),
            slo: Slo::default(),
        })
    };
    runtime.block_on(operations(&ops, &selected, target, notes, out.as_deref()))
}

async fn operations(
    ops: &Operations,
    phases: &[OperationsPhase],
    target: OperationsTarget,
    notes: Vec<String>,
    out: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let runner = OperationsRunner::new(http_client(), ops.tenant_header.clone());
    let ticker = status_ticker(runner.progress());
    let interrupt = async {
        // If the signal handler cannot be installed, run uninterruptible rather than stop.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let total = phases.len();
    let mut progress = |done: usize, p: &OperationsPhaseResult| {
        operations_progress_line(done, total, p);
    };
    let (result, stopped) = run_operations(
        &runner,
        ops,
        phases,
        target,
        notes,
        &mut progress,
        interrupt,
    )
    .await;
    if let Some(ticker) = ticker {
        ticker.abort();
        eprint!("\r\x1b[2K");
    }
    eprintln!(
        "ran {} operations phases in {:.1}s wall",
        result.phases.len(),
        started.elapsed().as_secs_f64()
    );
    match out {
        Some(path) => {
            loadgen::result_file::write_result(path, &result)?;
            print!("{}", report::render_operations_table(&result));
            let events = report::render_events_table(&result);
            if !events.is_empty() {
                print!("\nCluster events (phase seconds):\n\n{events}");
            }
        }
        None => println!("{}", serde_json::to_string_pretty(&result)?),
    }
    match stopped {
        Some(why) => bail!("run stopped after {} phases: {why}", result.phases.len()),
        None => Ok(()),
    }
}

fn operations_progress_line(done: usize, total: usize, p: &OperationsPhaseResult) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
    }
    eprintln!(
        "[{done}/{total}] {}: requests {} dropped {} good {} errors {} ttft p50 {:.3}s p95 {:.3}s",
        p.phase,
        p.requests,
        p.dropped_arrivals,
        p.good,
        p.errors,
        p.ttft.p50.unwrap_or(f64::NAN),
        p.ttft.p95.unwrap_or(f64::NAN),
    );
}

//! The `loadgen` binary: command-line parsing and file I/O around the library.
//!
//! `loadgen simulate` runs the matrix on the simulated stack, `loadgen matrix` runs it live
//! (against a gateway, or `--local` against mock replicas started here), `loadgen operations`
//! runs the operations phases (`config/operations.toml`) the same two ways, `loadgen report`
//! renders result files, `loadgen check-schema` holds a result to the seed's schema. Results are written
//! atomically (a temporary file renamed into place), so a failed run never leaves a truncated
//! file; a run that stops early writes what it has with `complete: false`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use loadgen::measure::{MatrixResult, OperationsResult, ReplayResult, Slo, schema_check};
use loadgen::report;
use loadgen::run::live::request::http_client;
use loadgen::run::sim::GatewayAssignment;
use loadgen::run::{
    LiveRunner, LiveTarget, LocalOptions, LocalStack, PhaseProgress, ReplicaEndpoint,
    RunDescription, SimOptions,
};
use loadgen::workload::Matrix;
use mock_engine::model::EngineProfile;
use router_core::RouterConfig;

mod matrix_command;
mod operations_command;
mod replay_command;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    version,
    about = "prefixgate's load generator: the 24-phase routing matrix, simulated or live, in the seed's schema",
    after_help = "Routing settings (simulate, matrix --local, operations --local): the environment variables \
prefixgate reads, AIBRIX_PREFIX_CACHE_* and PREFIXGATE_PREFIX_LOAD_* (listed by prefixgate --help); \
an invalid value is an error naming the variable."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which phases to run and where the result goes (shared by `simulate` and `matrix`).
#[derive(Debug, clap::Args)]
struct Selection {
    /// Matrix definition (default: the built-in config/matrix-24.toml).
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// Replace the matrix's routes, e.g. `random,least-request,prefix-cache`.
    #[arg(long, value_delimiter = ',')]
    routes: Option<Vec<String>>,
    /// Requests per phase (default: the matrix's count).
    #[arg(long)]
    count: Option<usize>,
    /// Arrival rate per phase in requests per second (default: the matrix's rps).
    #[arg(long)]
    rps: Option<f64>,
    /// Where to write the result JSON (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Selection {
    fn matrix(&self) -> Result<Matrix> {
        let mut m = match &self.matrix {
            Some(path) => Matrix::load(path)?,
            None => Matrix::builtin()?,
        };
        if let Some(routes) = &self.routes {
            m = m.with_routes(routes)?;
        }
        if let Some(rps) = self.rps {
            m = m.with_rps(rps)?;
        }
        if let Some(count) = self.count {
            m = m.with_count(count)?;
        }
        Ok(m)
    }
}

/// The routing settings from the environment variables prefixgate reads
/// (`AIBRIX_PREFIX_CACHE_*`, `PREFIXGATE_PREFIX_LOAD_*`), so that a simulated or local run
/// routes as a gateway started with the same environment would.
fn routing_from_env() -> Result<RouterConfig> {
    let mut routing = RouterConfig::default();
    routing
        .apply_env(|name| std::env::var(name).ok())
        .context("routing settings from the environment")?;
    Ok(routing)
}

/// Several gateways in front of the replicas (`simulate`, `replay`, and the local stacks).
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct GatewayArgs {
    /// Gateways in front of the replicas, each with its own prefix index and load view
    /// (independent gateway replicas behind one Service).
    #[arg(long, default_value_t = 1)]
    gateways: usize,
    /// How requests are spread over the gateways: round-robin or random.
    #[arg(long, default_value = "round-robin")]
    gateway_assignment: GatewayAssignment,
}

/// The stack `--local` starts (shared by `matrix` and `operations`).
#[derive(Debug, clap::Args)]
struct LocalArgs {
    /// Local mode: number of mock replicas (operations: for phases that do not say).
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Engine time runs this many times faster than wall time: local mode starts its mock
    /// replicas so; against --gateway, give the scale the replicas run at (mock-engine
    /// --time-scale) and times are reported in engine seconds (wall × scale).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Local mode: engine profile (a built-in name or a .toml path); a comma-separated list
    /// gives unequal replicas (replica i runs the list's profile i modulo its length).
    #[arg(long, default_value = "l20-qwen27b-fp8")]
    engine_profile: String,
    /// Local mode: replica names are this prefix plus A, B, C, …
    #[arg(long, default_value = "L20-")]
    replica_prefix: String,
}

impl LocalArgs {
    /// The engine profiles (replica i runs profile i modulo their count), once the replica
    /// count and time scale are known to be usable.
    fn profiles(&self) -> Result<Vec<EngineProfile>> {
        Self::checked_profiles(self.replicas, self.time_scale, &self.engine_profile)
    }

    /// [`LocalArgs::profiles`] for any command's local flags.
    fn checked_profiles(replicas: usize, scale: f64, spec: &str) -> Result<Vec<EngineProfile>> {
        if !(1..=64).contains(&replicas) {
            bail!("--replicas must be 1..=64, got {replicas}");
        }
        if !(scale.is_finite() && scale > 0.0) {
            bail!("--time-scale must be > 0, got {scale}");
        }
        load_profiles(spec)
    }
}

/// The profiles of `--engine-profile`: one name or path, or a comma-separated list of them.
fn load_profiles(spec: &str) -> Result<Vec<EngineProfile>> {
    spec.split(',')
        .map(|name| {
            EngineProfile::load(name.trim()).with_context(|| format!("engine profile {name:?}"))
        })
        .collect()
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the matrix through router-core and mock-engine models on a virtual clock.
    Simulate {
        /// Number of simulated replicas.
        #[arg(long, default_value_t = 2)]
        replicas: usize,
        /// Engine profile: a built-in name or a .toml path; a comma-separated list gives
        /// unequal replicas (replica i runs the list's profile i modulo its length).
        #[arg(long, default_value = "l20-qwen27b-fp8")]
        engine_profile: String,
        /// Replica names are this prefix plus A, B, C, …
        #[arg(long, default_value = "L20-")]
        replica_prefix: String,
        /// Also write every measured request as a JSON line here: phase, family, replica,
        /// the router's selection and match, outstanding at selection, TTFT, E2E, good.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// KV-event sync, as the gateway's [kv_sync]: the engines' KV-cache events feed the
        /// router's index after each step, and prompts are routed on engine token ids.
        #[arg(long)]
        kv_sync: bool,
        /// Replay the same arrivals with another of the router's random draws (tie-breaks,
        /// `random`'s picks); 0 is the default draw. Tells a route's luck from its rule.
        #[arg(long, default_value_t = 0)]
        routing_draw: u64,
        #[command(flatten)]
        gateways: GatewayArgs,
        /// The gateways share routing state as prefixgate's [cluster] does (docs/CLUSTER.md):
        /// each decision, first token and end reaches the other gateways this many
        /// milliseconds after it is sent (0 allowed). Without it they share nothing.
        #[arg(long, value_name = "MS")]
        cluster_delay_ms: Option<f64>,
        #[command(flatten)]
        selection: Selection,
    },
    /// Run the matrix live: against a gateway (`--gateway`), or against mock replicas and a
    /// gateway started here on loopback (`--local`).
    Matrix {
        /// The gateway's base URL, e.g. http://127.0.0.1:8080.
        #[arg(long, required_unless_present = "local")]
        gateway: Option<String>,
        /// The gateway's metrics URL (routing counters); without it they are `null`.
        #[arg(long)]
        gateway_metrics: Option<String>,
        /// A replica as NAME=URL (its base URL or its /metrics URL); repeat per replica.
        #[arg(long = "replica")]
        replicas_at: Vec<String>,
        /// The served model name.
        #[arg(long, default_value = "Qwen3.8-27B-FP8")]
        model: String,
        /// Start mock replicas and a gateway in this process and run against them.
        #[arg(long, conflicts_with_all = ["gateway", "replicas_at"])]
        local: bool,
        #[command(flatten)]
        stack: LocalArgs,
        /// Wall seconds one request may take (live mode).
        #[arg(long, default_value_t = 600.0)]
        request_timeout: f64,
        /// Local mode: gateway instances started in front of the replicas.
        #[command(flatten)]
        gateways: GatewayArgs,
        #[command(flatten)]
        selection: Selection,
    },
    /// Run the operations phases (config/operations.toml: waves with an in-flight cap,
    /// closed loops, tenant mixes, shared-prefix cache phases) against a gateway (`--gateway`)
    /// or against mock replicas and a gateway started here per phase (`--local`).
    Operations(operations_command::OperationsArgs),
    /// Replay a request trace (Mooncake FAST'25 JSONL) route by route: simulated (`--sim`),
    /// against mock replicas and gateways started here (`--local`, fresh for every route), or
    /// against a running gateway (`--gateway`).
    Replay(replay_command::ReplayArgs),
    /// Render a result file (matrix or operations) as a Markdown table (and, for the matrix,
    /// charts).
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
    // Our own info lines (dispatch lag); only warnings from the in-process gateway and mocks.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,loadgen=info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Simulate {
            replicas,
            engine_profile,
            replica_prefix,
            trace,
            kv_sync,
            routing_draw,
            gateways,
            cluster_delay_ms,
            selection,
        } => {
            if let Some(ms) = cluster_delay_ms
                && !(ms.is_finite() && ms >= 0.0)
            {
                bail!("--cluster-delay-ms must be a number of milliseconds >= 0, got {ms}");
            }
            let m = selection.matrix()?;
            let profiles = load_profiles(&engine_profile)?;
            let mut options = SimOptions::seed_like(profiles[0].clone());
            if profiles.len() > 1 {
                options.replica_profiles = profiles;
            }
            options.router = routing_from_env()?;
            options.replicas = replicas;
            options.replica_prefix = replica_prefix;
            options.kv_sync = kv_sync;
            options.routing_draw = routing_draw;
            options.gateways = gateways.gateways;
            options.gateway_assignment = gateways.gateway_assignment;
            options.cluster_delay = cluster_delay_ms.map(|ms| ms / 1000.0);
            matrix_command::simulate(&m, &options, selection.out.as_deref(), trace.as_deref())
        }
        Command::Matrix {
            gateway,
            gateway_metrics,
            replicas_at,
            model,
            local,
            stack: local_args,
            request_timeout,
            gateways,
            selection,
        } => {
            let m = selection.matrix()?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async move {
                if local {
                    let profiles = local_args.profiles()?;
                    let time_scale = local_args.time_scale;
                    let mut names = SimOptions::seed_like(profiles[0].clone());
                    names.replicas = local_args.replicas;
                    names.replica_prefix = local_args.replica_prefix;
                    if profiles.len() > 1 {
                        names.replica_profiles.clone_from(&profiles);
                    }
                    let profile_names = names.profile_names();
                    let stack = LocalStack::start(LocalOptions {
                        names: names.replica_names(),
                        profiles,
                        time_scale,
                        model,
                        admission: Default::default(),
                        routing: routing_from_env()?,
                        gateways: gateways.gateways,
                        assignment: gateways.gateway_assignment,
                    })
                    .await
                    .map_err(anyhow::Error::msg)?;
                    let describe = RunDescription {
                        runtime: format!(
                            "prefixgate loadgen {} local: mock-engine {} at time scale {time_scale} (times in engine seconds)",
                            env!("CARGO_PKG_VERSION"),
                            profile_names
                        ),
                        gateway: match gateways.gateways {
                            1 => "prefixgate gateway (router-core, AIBrix v0.7.0 prefix-cache semantics)".into(),
                            g => format!(
                                "{g} prefixgate gateways, {} (router-core, AIBrix v0.7.0 prefix-cache semantics)",
                                gateways.gateway_assignment.as_str()
                            ),
                        },
                        gpu_per_replica: format!("simulated {profile_names}"),
                    };
                    let runner = LiveRunner::new(http_client(), stack.target().clone());
                    let outcome = matrix_command::live(&runner, &m, describe, selection.out.as_deref()).await;
                    stack.shutdown().await;
                    outcome
                } else {
                    let gateway = gateway.context("--gateway URL is required without --local")?;
                    let endpoints = replicas_at
                        .iter()
                        .map(|spec| ReplicaEndpoint::parse(spec))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(anyhow::Error::msg)?;
                    if endpoints.is_empty() {
                        bail!("give every replica as --replica NAME=URL (engine metrics are read from it)");
                    }
                    let scale = local_args.time_scale;
                    if !(scale.is_finite() && scale > 0.0) {
                        bail!("--time-scale must be > 0, got {scale}");
                    }
                    if !(request_timeout.is_finite() && request_timeout > 0.0) {
                        bail!("--request-timeout must be > 0 seconds");
                    }
                    if gateways.gateways != 1 {
                        bail!("--gateways starts gateways with --local; against --gateway URL, run the gateways yourself");
                    }
                    let target = LiveTarget {
                        gateways: LiveTarget::one_gateway(gateway.trim_end_matches('/').to_owned(), gateway_metrics),
                        assignment: Default::default(),
                        replicas: endpoints,
                        model,
                        time_scale: local_args.time_scale,
                        request_limit: Duration::from_secs_f64(request_timeout),
                        slo: Slo::default(),
                    };
                    let describe = RunDescription {
                        runtime: format!("prefixgate loadgen {} live against {}", env!("CARGO_PKG_VERSION"), target.gateway_urls()),
                        gateway: target.gateway_urls(),
                        gpu_per_replica: "unknown".into(),
                    };
                    let runner = LiveRunner::new(http_client(), target);
                    matrix_command::live(&runner, &m, describe, selection.out.as_deref()).await
                }
            })
        }
        Command::Operations(args) => operations_command::run(args),
        Command::Replay(args) => replay_command::run(args),
        Command::Report {
            file,
            baseline,
            charts,
        } => {
            let json = read_json(&file)?;
            if json.get("runs").is_some() && json.get("trace").is_some() {
                let ours: ReplayResult = read_typed(&file)?;
                print!("{}", report::render_replay_table(&ours));
                if baseline.is_some() {
                    eprintln!("a replay is reported alone; --baseline ignored");
                }
                if let Some(dir) = charts {
                    write_charts(&dir, report::replay_charts(&ours))?;
                }
                return Ok(());
            }
            if json.get("slo").is_some() {
                let ours: OperationsResult = read_typed(&file)?;
                print!("{}", report::render_operations_table(&ours));
                if let Some(base) = baseline.as_deref() {
                    let base: OperationsResult = read_typed(base)?;
                    println!();
                    print!("{}", report::render_operations_side_by_side(&ours, &base));
                }
                let events = report::render_events_table(&ours);
                if !events.is_empty() {
                    println!("\nCluster events (phase seconds):\n");
                    print!("{events}");
                }
                if let Some(dir) = charts {
                    write_charts(&dir, report::events_charts(&ours))?;
                }
                return Ok(());
            }
            let ours = read_result(&file)?;
            print!("{}", report::render_table(&ours));
            let base = baseline.as_deref().map(read_result).transpose()?;
            if let Some(base) = &base {
                println!();
                print!("{}", report::render_side_by_side(&ours, base));
            }
            if let Some(dir) = charts {
                write_charts(&dir, report::charts(&ours, base.as_ref()))?;
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

/// On a terminal, one status line rewritten in place (plain lines per phase otherwise); the
/// caller aborts the task when the run ends.
fn status_ticker(live: Arc<PhaseProgress>) -> Option<tokio::task::JoinHandle<()>> {
    std::io::stderr().is_terminal().then(|| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            // Aborted when the run ends; the bound (about six days) only guards against a leak.
            for _ in 0..1_000_000_u32 {
                tick.tick().await;
                eprint!("\r\x1b[2K{}", live.line());
            }
        })
    })
}

/// Writes each `(file name, SVG)` into `dir` (created if missing).
fn write_charts(dir: &std::path::Path, charts: Vec<(String, String)>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating chart directory {}", dir.display()))?;
    if charts.is_empty() {
        eprintln!("no chart to draw for this result");
    }
    for (name, svg) in charts {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn read_result(path: &Path) -> Result<MatrixResult> {
    read_typed(path)
}

/// A result file (matrix or operations) read into its schema's structs.
fn read_typed<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a loadgen/seed result file", path.display()))
}

//! `loadgen replay`: its flags, reading the trace, and the result file and table around the
//! library's replay runners (`--sim` on the virtual clock; `--local` and `--gateway` live).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use loadgen::measure::{ReplayResult, ReplayRun, Slo, SloSummary, TraceSummary};
use loadgen::report;
use loadgen::run::live::replay::replay_route_live;
use loadgen::run::live::request::http_client;
use loadgen::run::sim::replay::simulate_replay;
use loadgen::run::{
    LiveTarget, LocalOptions, LocalStack, PhaseProgress, ReplicaEndpoint, SimOptions,
};
use loadgen::workload::{PlannedRequest, Prompt, Trace, TraceSlice};
use router_core::Strategy;

use super::{GatewayArgs, LocalArgs, load_profiles, routing_from_env};

/// The routes a replay compares when `--routes` is not given.
const DEFAULT_ROUTES: &str = "random,least-request,prefix-cache,prefix-load";

/// The flags of `loadgen replay`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["sim", "local", "gateway"])))]
pub struct ReplayArgs {
    /// The trace: Mooncake FAST'25 JSONL (timestamp ms, input_length, output_length, hash_ids).
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// Replay on the virtual clock: router-core's policies in front of mock-engine models.
    #[arg(long)]
    sim: bool,
    /// Replay against mock replicas and prefixgate gateways started in this process on
    /// loopback, fresh for every route.
    #[arg(long)]
    local: bool,
    /// Local mode: engine time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Replay against a running gateway (base URL); give every replica with --replica.
    /// Its engines keep their caches from one route to the next.
    #[arg(long, value_name = "URL")]
    gateway: Option<String>,
    /// With --gateway: a replica as NAME=URL (its base URL or its /metrics URL); repeat per
    /// replica.
    #[arg(long = "replica", value_name = "NAME=URL", requires = "gateway")]
    replicas_at: Vec<String>,
    /// With --gateway: wall seconds one request may take.
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Replicas.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Engine profile: a built-in name or a .toml path; a comma-separated list gives unequal
    /// replicas (replica i runs the list's profile i modulo its length). The default holds the
    /// Mooncake trace's long prompts (up to 191k tokens); l20-qwen27b-fp8 refuses those over
    /// its 32k context.
    #[arg(long, default_value = "h200-qwen27b-fp8")]
    engine_profile: String,
    /// Replica names are this prefix plus A, B, C, …
    #[arg(long, default_value = "replica-")]
    replica_prefix: String,
    /// Routes to compare, each replaying the same requests on fresh engines.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_ROUTES)]
    routes: Vec<String>,
    /// Divide the trace's inter-arrival times by this.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Skip this many seconds of trace time.
    #[arg(long, default_value_t = 0.0)]
    start: f64,
    /// Replay this many seconds of trace time (default: to the end).
    #[arg(long)]
    duration: Option<f64>,
    /// Replay at most this many requests.
    #[arg(long)]
    limit: Option<usize>,
    /// SLO: time to first token, seconds.
    #[arg(long, default_value_t = 2.0)]
    slo_ttft: f64,
    /// SLO: time per output token, seconds.
    #[arg(long, default_value_t = 0.15)]
    slo_tpot: f64,
    /// SLO: end to end, seconds.
    #[arg(long, default_value_t = 30.0)]
    slo_e2e: f64,
    /// KV-event sync, as the gateway's [kv_sync]: the engines' KV-cache events feed the
    /// router's index (every gateway's).
    #[arg(long)]
    kv_sync: bool,
    #[command(flatten)]
    gateways: GatewayArgs,
    /// The served model name.
    #[arg(long, default_value = "Qwen3.8-27B-FP8")]
    model: String,
    /// Also write every request of every route (time, replica, tokens, TTFT, TPOT, E2E,
    /// good, error) into the result.
    #[arg(long)]
    records: bool,
    /// Where to write the result JSON (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `loadgen replay`.
pub fn run(args: ReplayArgs) -> Result<()> {
    let started = Instant::now();
    let trace = Trace::load(&args.trace)?;
    let slice = TraceSlice {
        start_s: args.start,
        duration_s: args.duration,
        limit: args.limit,
        speedup: args.speedup,
    };
    let plan = slice.plan(&trace)?;
    let routes = parse_routes(&args.routes)?;
    let slo = Slo {
        ttft: positive("--slo-ttft", args.slo_ttft)?,
        tpot: positive("--slo-tpot", args.slo_tpot)?,
        e2e: positive("--slo-e2e", args.slo_e2e)?,
    };
    let mut progress = |run: &ReplayRun| {
        eprintln!(
            "{}: good {}/{} errors {} ttft p50 {} p90 {} hit ratio {:.3} ({:.1}s wall so far)",
            run.route,
            run.good,
            run.requests,
            run.errors,
            fmt_s(run.ttft.p50),
            fmt_s(run.ttft.p90),
            run.cache_hit_ratio,
            started.elapsed().as_secs_f64()
        );
    };
    let (mode, runtime, runs, failure) = if args.sim {
        let (runtime, runs, failure) = simulated(&args, &plan, &routes, slo, &mut progress)?;
        ("sim", runtime, runs, failure)
    } else {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let (runtime, runs, failure) =
            tokio.block_on(live(&args, &plan, &routes, slo, &mut progress))?;
        let mode = if args.local { "local" } else { "live" };
        (mode, runtime, runs, failure)
    };
    let result = ReplayResult {
        trace: summary(&args, &trace, &plan, &slice, mode, runtime, slo),
        complete: failure.is_none(),
        runs,
    };
    eprintln!(
        "replayed {} routes in {:.1}s wall",
        result.runs.len(),
        started.elapsed().as_secs_f64()
    );
    match &args.out {
        Some(path) => {
            loadgen::result_file::write_result(path, &result)?;
            print!("{}", report::render_replay_table(&result));
        }
        None => println!("{}", serde_json::to_string_pretty(&result)?),
    }
    match failure {
        Some(e) => bail!("replay stopped after {} routes: {e}", result.runs.len()),
        None => Ok(()),
    }
}

/// The routes' runs so far, and why the replay stopped early (if it did).
type Outcome = (String, Vec<ReplayRun>, Option<String>);

/// `--sim`: every route on a fresh simulated cluster.
fn simulated(
    args: &ReplayArgs,
    plan: &[PlannedRequest],
    routes: &[Strategy],
    slo: Slo,
    progress: &mut dyn FnMut(&ReplayRun),
) -> Result<Outcome> {
    if !(1..=256).contains(&args.replicas) {
        bail!("--replicas must be 1..=256, got {}", args.replicas);
    }
    let profiles = load_profiles(&args.engine_profile)?;
    let mut options = SimOptions::seed_like(profiles[0].clone());
    if profiles.len() > 1 {
        options.replica_profiles = profiles;
    }
    options.router = routing_from_env()?;
    options.replicas = args.replicas;
    options.replica_prefix.clone_from(&args.replica_prefix);
    options.model.clone_from(&args.model);
    options.kv_sync = args.kv_sync;
    options.slo = slo;
    options.gateways = args.gateways.gateways;
    options.gateway_assignment = args.gateways.gateway_assignment;
    eprintln!(
        "replaying {} requests on {} simulated replicas ({}), {} gateway(s)",
        plan.len(),
        args.replicas,
        options.profile_names(),
        options.gateways
    );
    let runtime = format!(
        "prefixgate loadgen {} replay --sim (mock-engine profile {})",
        env!("CARGO_PKG_VERSION"),
        options.profile_names()
    );
    Ok(
        match simulate_replay(plan, routes, &options, args.records, progress) {
            Ok(runs) => (runtime, runs, None),
            Err((runs, e)) => (runtime, runs, Some(e.to_string())),
        },
    )
}

/// `--local` (a fresh stack per route) or `--gateway` (one running stack for all routes).
async fn live(
    args: &ReplayArgs,
    plan: &[PlannedRequest],
    routes: &[Strategy],
    slo: Slo,
    progress: &mut dyn FnMut(&ReplayRun),
) -> Result<Outcome> {
    if args.kv_sync {
        bail!("--kv-sync is simulated only (--sim); a running gateway has its own [kv_sync]");
    }
    let client = http_client();
    let counts = Arc::new(PhaseProgress::default());
    let mut runs = Vec::new();
    if args.local {
        let profiles =
            LocalArgs::checked_profiles(args.replicas, args.time_scale, &args.engine_profile)?;
        let mut naming = SimOptions::seed_like(profiles[0].clone());
        naming.replicas = args.replicas;
        naming.replica_prefix.clone_from(&args.replica_prefix);
        if profiles.len() > 1 {
            naming.replica_profiles.clone_from(&profiles);
        }
        let runtime = format!(
            "prefixgate loadgen {} replay --local: mock-engine {} at time scale {} behind {} prefixgate gateway(s), {} (times in engine seconds)",
            env!("CARGO_PKG_VERSION"),
            naming.profile_names(),
            args.time_scale,
            args.gateways.gateways,
            args.gateways.gateway_assignment.as_str()
        );
        for &route in routes {
            // Fresh engines for every route: each meets the trace from empty caches.
            let stack = LocalStack::start(LocalOptions {
                names: naming.replica_names(),
                profiles: profiles.clone(),
                time_scale: args.time_scale,
                model: args.model.clone(),
                admission: Default::default(),
                routing: routing_from_env()?,
                gateways: args.gateways.gateways,
                assignment: args.gateways.gateway_assignment,
            })
            .await
            .map_err(anyhow::Error::msg)?;
            let mut target = stack.target().clone();
            target.slo = slo;
            let outcome =
                replay_route_live(&client, &target, plan, route, &slo, args.records, &counts).await;
            stack.shutdown().await;
            match outcome {
                Ok(run) => {
                    progress(&run);
                    runs.push(run);
                }
                Err(e) => return Ok((runtime, runs, Some(format!("{route}: {e}")))),
            }
        }
        return Ok((runtime, runs, None));
    }
    let gateway = args
        .gateway
        .as_deref()
        .context("--gateway URL is required without --sim or --local")?;
    let replicas = args
        .replicas_at
        .iter()
        .map(|spec| ReplicaEndpoint::parse(spec))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    if replicas.is_empty() {
        bail!("give every replica as --replica NAME=URL (engine counters are read from it)");
    }
    if args.gateways.gateways != 1 {
        bail!("--gateways starts gateways with --local; against --gateway URL, run them yourself");
    }
    let request_timeout = positive("--request-timeout", args.request_timeout)?;
    let target = LiveTarget {
        gateways: LiveTarget::one_gateway(gateway.trim_end_matches('/').to_owned(), None),
        assignment: Default::default(),
        replicas,
        model: args.model.clone(),
        time_scale: 1.0,
        request_limit: Duration::from_secs_f64(request_timeout),
        slo,
    };
    let runtime = format!(
        "prefixgate loadgen {} replay live against {} (engines keep their caches between routes)",
        env!("CARGO_PKG_VERSION"),
        target.gateway_urls()
    );
    for &route in routes {
        match replay_route_live(&client, &target, plan, route, &slo, args.records, &counts).await {
            Ok(run) => {
                progress(&run);
                runs.push(run);
            }
            Err(e) => return Ok((runtime, runs, Some(format!("{route}: {e}")))),
        }
    }
    Ok((runtime, runs, None))
}

fn parse_routes(routes: &[String]) -> Result<Vec<Strategy>> {
    if routes.is_empty() {
        bail!("--routes must name at least one route");
    }
    routes
        .iter()
        .map(|r| {
            r.trim()
                .parse::<Strategy>()
                .with_context(|| format!("--routes {r:?}"))
        })
        .collect()
}

fn positive(flag: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        bail!("{flag} must be > 0 seconds, got {value}")
    }
}

fn fmt_s(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.2}s"))
}

/// The result's `trace` block.
fn summary(
    args: &ReplayArgs,
    trace: &Trace,
    plan: &[PlannedRequest],
    slice: &TraceSlice,
    mode: &str,
    runtime: String,
    slo: Slo,
) -> TraceSummary {
    let inputs: Vec<usize> = plan
        .iter()
        .map(|r| match &r.prompt {
            Prompt::Blocks(b) => b.tokens,
            // A trace's prompts are blocks; other prompts are counted as the engine would.
            other => mock_engine::tokenizer::count(&other.text()),
        })
        .collect();
    let n = plan.len().max(1) as f64;
    let last = plan.last().map_or(0.0, |r| r.at);
    TraceSummary {
        file: args.trace.display().to_string(),
        requests: plan.len(),
        file_requests: trace.requests.len(),
        duration_s: last * slice.speedup,
        start_s: slice.start_s,
        speedup: slice.speedup,
        limit: slice.limit,
        input_tokens_mean: inputs.iter().sum::<usize>() as f64 / n,
        input_tokens_max: inputs.iter().copied().max().unwrap_or(0),
        output_tokens_mean: plan.iter().map(|r| f64::from(r.max_tokens)).sum::<f64>() / n,
        mode: mode.to_owned(),
        runtime,
        replicas: args.replicas,
        gateways: args.gateways.gateways,
        gateway_assignment: args.gateways.gateway_assignment.as_str().to_owned(),
        kv_sync: args.kv_sync,
        slo: SloSummary::from(slo),
    }
}

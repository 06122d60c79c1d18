//! The `prefixgate` binary: parse flags, then either serve (start the gateway, drain on
//! SIGTERM/SIGINT) or, with `route-replay`, replay a trace offline through the same router
//! settings.

mod replay;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use gateway::GatewayConfig;
use gateway::config::cli::{Cli, Command, RouteReplayArgs};

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse_with_settings();
    let config = cli
        .resolve(|key| std::env::var(key).ok())
        .context("invalid configuration")?;
    match &cli.command {
        Some(Command::RouteReplay(args)) => route_replay(config, args),
        None => serve(config).map(|()| ExitCode::SUCCESS),
    }
}

/// `prefixgate route-replay`: exit status 1 when any line could not be replayed.
fn route_replay(config: GatewayConfig, args: &RouteReplayArgs) -> anyhow::Result<ExitCode> {
    let default_strategy = config.default_strategy().context("invalid configuration")?;
    let router = router_core::Router::new(config.routing).context("invalid configuration")?;
    let mut replayer =
        replay::replayer::Replayer::new(router, default_strategy, args.seed, args.emit_hashes);
    let source = replay::TraceSource::from_flag(args.trace.as_deref());
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let summary = replay::run(&source, &mut replayer, &mut out).context("route-replay failed")?;
    out.flush().context("cannot write the decisions")?;
    eprintln!(
        "route-replay: {} routed, {} done, {} refused",
        summary.routed, summary.done, summary.errors
    );
    Ok(if summary.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[tokio::main]
async fn serve(config: GatewayConfig) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{Layer as _, filter};
    // Logs go to stderr, coloured only on a terminal, so redirected logs stay plain text.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(gateway::telemetry::logs::filter(
            config.log_level.as_deref(),
        ));
    // Traces take the gateway's own spans and events whatever the log level says (the
    // first byte is a debug event: in every trace, in no log at `info`).
    let traced = gateway::telemetry::otel_layer(&config.tracing)?;
    let (traces, telemetry) = match traced {
        Some((layer, telemetry)) => (Some(layer), Some(telemetry)),
        None => (None, None),
    };
    // Without an exporter the filter takes nothing: an absent layer would otherwise count as
    // wanting every span, and the registry would still open and close the request path's.
    let traced_targets = match traces {
        Some(_) => filter::Targets::new().with_target("gateway", tracing::Level::DEBUG),
        None => filter::Targets::new(),
    };
    let traces = traces.with_filter(traced_targets);
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
    let grace = config.shutdown_grace();
    let mut signals =
        gateway::StopSignals::register().context("cannot register signal handlers")?;
    let handle = gateway::start(config)
        .await
        .context("cannot start prefixgate")?;
    eprintln!(
        "prefixgate listening on {} (metrics on http://{}/metrics)",
        handle.url(),
        handle.metrics_addr()
    );
    if let Some(addr) = handle.ext_proc_addr() {
        eprintln!("prefixgate ext_proc listening on {addr}");
    }
    let signal = signals.recv().await;
    tracing::info!(
        signal,
        grace_secs = grace.as_secs(),
        "stopping: draining in-flight responses"
    );
    if !handle.shutdown().await {
        tracing::warn!("some responses were cut at the end of the grace period");
    }
    if let Some(telemetry) = telemetry {
        // The flush blocks on the exporter, which runs on this runtime: off its workers.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    Ok(())
}

//! The `prefixgate` binary: parse flags, start the gateway, drain on SIGTERM/SIGINT.

use anyhow::Context;
use clap::Parser;
use gateway::cli::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let config = cli
        .resolve(|key| std::env::var(key).ok())
        .context("invalid configuration")?;
    let grace = config.shutdown_grace();
    let mut signals =
        gateway::shutdown::StopSignals::register().context("cannot register signal handlers")?;
    let handle = gateway::start(config)
        .await
        .context("cannot start prefixgate")?;
    eprintln!(
        "prefixgate listening on http://{} (metrics on http://{}/metrics)",
        handle.addr(),
        handle.metrics_addr()
    );
    let signal = signals.recv().await;
    tracing::info!(
        signal,
        grace_secs = grace.as_secs(),
        "stopping: draining in-flight responses"
    );
    if !handle.shutdown().await {
        tracing::warn!("some responses were cut at the end of the grace period");
    }
    Ok(())
}

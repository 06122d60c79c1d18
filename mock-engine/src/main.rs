//! The `mock-engine` binary: one or more simulated vLLM replicas on loopback, each with its
//! own engine model, until SIGINT or SIGTERM.
//!
//! Command-line contract (tests and tools script against it):
//! `mock-engine --listen 127.0.0.1:PORT [--listen …] --profile NAME --time-scale S --model NAME`,
//! each `--listen` one replica, or `--replicas N --port-base P` as a shorthand. Once every
//! replica is listening, one line per replica goes to stdout: `NAME http://IP:PORT` (so a
//! script that asked for port 0 learns the real port). Logs go to stderr (`RUST_LOG`).
//! `--kv-events-config '{json}'` publishes vLLM's KV-cache events (the endpoints are logged;
//! replica i adds i to both ports, as vLLM does per data-parallel rank);
//! `--kv-events-format positional|map` picks vLLM 0.9–0.11's positional events (the default)
//! or newer vLLMs' named-field maps.
//!
//! SIGTERM (or SIGINT) drains as vLLM does: every replica closes its listener (connections
//! are refused), idle connections close, and responses in flight run to their end, without a
//! deadline unless `--shutdown-timeout` gives one; then the process exits 0. A second signal
//! during the drain drops what is left and exits at once.

use std::io::IsTerminal;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use mock_engine::kv_events::{EventFormat, KvEventsConfig};
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, FailureSpec, ReplicaConfig, spawn_replica_with_events};

/// Simulated vLLM 0.32 replicas: the OpenAI HTTP API, /metrics and prefix caching over a
/// clocked engine model, with failure injection for testing gateways.
#[derive(Debug, Parser)]
#[command(name = "mock-engine", version, after_help = AFTER_HELP)]
struct Cli {
    /// Address of one replica (repeat for several). Port 0 picks a free port. Default, when
    /// neither --listen nor --replicas is given: one replica on 127.0.0.1:8000.
    #[arg(long, value_name = "IP:PORT", conflicts_with_all = ["replicas", "port_base"])]
    listen: Vec<SocketAddr>,

    /// Start N replicas on consecutive ports from --port-base (shorthand for N --listen).
    #[arg(long, value_name = "N", requires = "port_base", value_parser = clap::value_parser!(u16).range(1..=1024))]
    replicas: Option<u16>,

    /// First port of --replicas (replica i listens on PORT+i).
    #[arg(long, value_name = "PORT", requires = "replicas")]
    port_base: Option<u16>,

    /// Address --replicas listens on.
    #[arg(long, value_name = "IP", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,

    /// Replica names, in --listen order (repeat, or comma-separated). Unnamed replicas are
    /// mock-0, mock-1, … by position.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    name: Vec<String>,

    /// Engine profile: a builtin name (l20-qwen27b-fp8, fast) or a path to a .toml file.
    #[arg(long, value_name = "NAME|PATH", default_value = "l20-qwen27b-fp8")]
    profile: String,

    /// Engine time = wall time × S: every engine duration runs S times faster.
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    time_scale: f64,

    /// Served model name (the `model` requests must name; /v1/models lists it).
    #[arg(long, value_name = "NAME", default_value = "mock-model")]
    model: String,

    /// Inject this failure into requests (grammar below); a request's x-mock-fail header
    /// overrides it.
    #[arg(long, value_name = "SPEC", value_parser = parse_spec)]
    fail: Option<FailureSpec>,

    /// Fraction of requests (0..=1) that get --fail.
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0, requires = "fail", value_parser = parse_rate)]
    fail_rate: f64,

    /// /health and /ping answer 503 for this many engine seconds after start.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    fail_health_for: Option<f64>,

    /// vLLM's KV-cache events, as vLLM takes them, e.g.
    /// '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'.
    /// Fields: enable_kv_cache_events, publisher (zmq|null), endpoint, replay_endpoint,
    /// topic, buffer_steps, hwm, max_queue_size. Replica i adds i to both ports.
    #[arg(long, value_name = "JSON", value_parser = parse_kv_events)]
    kv_events_config: Option<KvEventsConfig>,

    /// How KV-cache events are encoded: `positional` (vLLM 0.9–0.11's tagged arrays, what
    /// AIBrix v0.7.0 reads) or `map` (newer vLLMs' events as maps with a "type" tag and
    /// named fields, in the same positional batch).
    #[arg(long, value_name = "FORMAT", default_value_t = EventFormat::Positional, value_parser = parse_event_format)]
    kv_events_format: EventFormat,

    /// On SIGTERM, drop the responses still running after this many engine seconds (vLLM
    /// 0.18's --shutdown-timeout; 0 aborts them at once). Without it they run to their end,
    /// as in vLLM 0.11, where only the pod's SIGKILL cuts them.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    shutdown_timeout: Option<f64>,
}

const AFTER_HELP: &str = "\
Failure injection (--fail SPEC, or per request the header `x-mock-fail: SPEC`):
  directives separated by ';', e.g. \"status=503\", \"abort-after=5\", \"slow-start=2.5;abort-after=3\"
    status=CODE          answer HTTP CODE (400..=599) with a vLLM-shaped error body
    abort-after=N        drop the connection after N generated tokens (no [DONE])
    stall-after=N        send nothing after N generated tokens, the connection open (a hung engine)
    hang                 never answer (until the client leaves)
    slow-start=SECONDS   wait SECONDS (engine time) before admitting the request
    none                 no failure (a header can switch off --fail for one request)
  POST /mock/health?fail_for=SECONDS makes /health answer 503 for that long (0 clears).

Output: one line per replica on stdout once listening: `NAME http://IP:PORT`.
Logs: stderr, filtered by RUST_LOG (default info).
SIGTERM or SIGINT drains as vLLM does: listeners close (new connections are refused),
responses in flight finish (up to --shutdown-timeout), then exit 0; a second signal stops
at once.";

fn parse_spec(text: &str) -> Result<FailureSpec, String> {
    FailureSpec::parse(text).map_err(|e| e.to_string())
}

fn parse_kv_events(text: &str) -> Result<KvEventsConfig, String> {
    KvEventsConfig::parse(text).map_err(|e| e.to_string())
}

fn parse_event_format(text: &str) -> Result<EventFormat, String> {
    text.parse::<EventFormat>().map_err(|e| e.to_string())
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("`{text}` is not a fraction within 0..=1")),
    }
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err(format!("`{text}` is not a number of seconds >= 0")),
    }
}

impl Cli {
    /// Every replica's (name, address), checked.
    fn replicas(&self) -> Result<Vec<(String, SocketAddr)>> {
        let addrs: Vec<SocketAddr> = match (self.replicas, self.port_base) {
            (Some(n), Some(base)) => (0..n)
                .map(|i| {
                    base.checked_add(i)
                        .map(|port| SocketAddr::new(self.host, port))
                        .with_context(|| {
                            format!("--port-base {base} + {i} is past the last port (65535)")
                        })
                })
                .collect::<Result<_>>()?,
            _ if self.listen.is_empty() => vec![SocketAddr::new(self.host, 8000)],
            _ => self.listen.clone(),
        };
        if self.name.len() > addrs.len() {
            bail!(
                "{} --name values for {} replicas",
                self.name.len(),
                addrs.len()
            );
        }
        let mut named = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.into_iter().enumerate() {
            let name = self
                .name
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("mock-{i}"));
            if name.is_empty() {
                bail!("--name values must not be empty");
            }
            if named.iter().any(|(other, _)| *other == name) {
                bail!("replica name `{name}` given twice");
            }
            named.push((name, addr));
        }
        Ok(named)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-engine: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the replicas, waits for a signal, stops them.
async fn run(cli: Cli) -> Result<()> {
    if !(cli.time_scale.is_finite() && cli.time_scale > 0.0) {
        bail!(
            "--time-scale must be a finite number > 0, got {}",
            cli.time_scale
        );
    }
    let profile = EngineProfile::load(&cli.profile).context("--profile")?;
    let failures = FailurePlan {
        spec: cli.fail.clone().unwrap_or_default(),
        rate: cli.fail_rate,
        health_fail_for: cli.fail_health_for,
    };

    let mut signals = StopSignals::install()?;
    let mut handles = Vec::new();
    let kv_events = cli
        .kv_events_config
        .clone()
        .unwrap_or_default()
        .with_format(cli.kv_events_format);
    for (index, (name, listen)) in cli.replicas()?.into_iter().enumerate() {
        let index = u16::try_from(index).context("too many replicas")?;
        let kv_events = kv_events.for_replica(index)?;
        let config = ReplicaConfig {
            name,
            listen,
            model: cli.model.clone(),
            profile: profile.clone(),
            time_scale: cli.time_scale,
            failures: failures.clone(),
        };
        match spawn_replica_with_events(config, kv_events).await {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                for handle in handles {
                    handle.shutdown().await;
                }
                return Err(e.into());
            }
        }
    }
    for handle in &handles {
        println!("{} {}", handle.name(), handle.url());
    }

    signals.wait().await?;
    // Engine seconds to wall time, as every other duration of the mock.
    let deadline = cli
        .shutdown_timeout
        .map(|secs| Duration::from_secs_f64(secs / cli.time_scale));
    tracing::info!(?deadline, "signal received, draining");
    let drains: Vec<_> = handles
        .into_iter()
        .map(|handle| handle.drain(deadline).finished())
        .collect();
    let drained = futures_util::future::join_all(drains);
    tokio::select! {
        outcomes = drained => {
            let cut: usize = outcomes.iter().map(|o| o.cut).sum();
            tracing::info!(cut, "drained, exiting");
        }
        second = signals.wait() => {
            second?;
            // Dropping the drains drops every connection (their stop senders go away).
            tracing::warn!("second signal: stopping without waiting");
        }
    }
    Ok(())
}

/// SIGINT and SIGTERM handlers, installed before any replica is announced so that a signal
/// sent right after the `NAME URL` lines still stops the process cleanly.
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(StopSignals {
                interrupt: signal(SignalKind::interrupt())
                    .context("installing the SIGINT handler")?,
                terminate: signal(SignalKind::terminate())
                    .context("installing the SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(StopSignals {})
    }

    /// Waits for SIGINT (Ctrl-C) or SIGTERM.
    async fn wait(&mut self) -> Result<()> {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        tokio::signal::ctrl_c()
            .await
            .context("waiting for Ctrl-C")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("mock-engine").chain(args.iter().copied()))
    }

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn listen_and_names_pair_by_position() {
        let cli = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:9001",
            "--name",
            "L20-A",
        ])
        .unwrap();
        let replicas = cli.replicas().unwrap();
        assert_eq!(replicas[0].0, "L20-A");
        assert_eq!(replicas[1].0, "mock-1");
        assert_eq!(replicas[1].1.port(), 9001);
    }

    #[test]
    fn replicas_shorthand_counts_ports_up() {
        let cli = parse(&["--replicas", "3", "--port-base", "9000"]).unwrap();
        let ports: Vec<u16> = cli.replicas().unwrap().iter().map(|r| r.1.port()).collect();
        assert_eq!(ports, [9000, 9001, 9002]);
        let overflow = parse(&["--replicas", "3", "--port-base", "65534"]).unwrap();
        assert!(
            overflow
                .replicas()
                .unwrap_err()
                .to_string()
                .contains("past the last port")
        );
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        assert!(parse(&["--listen", "nowhere"]).is_err());
        assert!(parse(&["--replicas", "2"]).is_err());
        assert!(
            parse(&[
                "--replicas",
                "2",
                "--port-base",
                "1",
                "--listen",
                "127.0.0.1:1"
            ])
            .is_err()
        );
        let spec = parse(&["--fail", "explode"]).unwrap_err().to_string();
        assert!(spec.contains("unknown failure directive"), "{spec}");
        assert!(parse(&["--fail", "hang", "--fail-rate", "2"]).is_err());
        assert!(parse(&["--fail-rate", "0.5"]).is_err());
        assert!(parse(&["--fail-health-for", "-1"]).is_err());
        let dup = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--name",
            "a,a",
        ])
        .unwrap();
        assert!(dup.replicas().unwrap_err().to_string().contains("twice"));
        let many = parse(&["--name", "a,b"]).unwrap();
        assert!(many.replicas().is_err());
        let kv = parse(&["--kv-events-config", r#"{"publisher":"kafka"}"#])
            .unwrap_err()
            .to_string();
        assert!(kv.contains("`publisher`") && kv.contains("kafka"), "{kv}");
    }

    #[test]
    fn kv_events_config_is_vllms_json() {
        let cli = parse(&[
            "--kv-events-config",
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000"}"#,
        ])
        .unwrap();
        let config = cli.kv_events_config.unwrap();
        assert!(config.publishes());
        assert_eq!(config.endpoint, "tcp://*:6000");
        assert_eq!(cli.kv_events_format, EventFormat::Positional);
    }

    #[test]
    fn kv_events_format_is_positional_or_map() {
        let cli = parse(&["--kv-events-format", "map"]).unwrap();
        assert_eq!(cli.kv_events_format, EventFormat::Map);
        let error = parse(&["--kv-events-format", "maps"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`maps`") && error.contains("positional, map"),
            "{error}"
        );
    }
}

//! The `prefixgate` command line: the file, a few everyday flags, and `--set KEY=VALUE` for
//! any setting.
//!
//! Precedence, lowest first: defaults → `--config FILE` → the environment
//! (`PREFIXGATE_SECTION_KEY`, and the AIBrix names) → the everyday flags → `--set`, in the
//! order given. Every setting is one field of the configuration's structs; `--help` lists
//! them all from those structs ([`super::settings`]), and [`super::layers`] applies the
//! layers. An everyday flag is only a shorter name for one setting.

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use super::layers::{ENV_ALIASES, Layer, Layers};
use super::settings;
use crate::config::{BackendConfig, ConfigFileError, GatewayConfig};
use crate::replicas::static_::parse_backend_flag;

/// The everyday flags that take a value, with the setting each one sets.
pub const VALUE_FLAGS: [(&str, &str); 8] = [
    ("--listen", "listen"),
    ("--metrics-listen", "metrics_listen"),
    ("--tls-cert", "tls.cert_file"),
    ("--tls-key", "tls.key_file"),
    ("--default-strategy", "default_strategy"),
    ("--mock-engines", "embedded.mock_engines"),
    ("--log-level", "log_level"),
    ("--cluster-url", "cluster.url"),
];

/// Every everyday flag with the setting it sets, as `--help` and the docs name them.
pub fn everyday_flags() -> Vec<(&'static str, &'static str)> {
    let mut flags = VALUE_FLAGS.to_vec();
    flags.push(("--backend", "backends"));
    flags.push(("--kv-sync", "kv_sync.enabled"));
    flags
}

/// Shown after `-h`'s flags.
const AFTER_SHORT_HELP: &str = "\
Every setting can be given in the file, as PREFIXGATE_SECTION_KEY in the environment, or as
--set section.key=VALUE; `prefixgate --help` lists them all.";

/// prefixgate: an OpenAI-compatible gateway that routes each request to the vLLM replica
/// that holds its prompt prefix, without overloading it.
///
/// Without a subcommand it serves. The settings also configure `route-replay`'s router; give
/// them before the subcommand (`prefixgate --set routing.block_size=4 route-replay …`).
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "prefixgate", version, about, long_about = None, after_help = AFTER_SHORT_HELP)]
pub struct Cli {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML configuration file (config/gateway.example.toml shows every key).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the OpenAI API listener (setting listen) [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Address of the /metrics listener, always plain HTTP (setting metrics_listen)
    /// [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Serve TLS on the API listener with this PEM certificate chain; needs --tls-key
    /// (setting tls.cert_file).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,
    /// PEM private key of --tls-cert (setting tls.key_file).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,
    /// Strategy for requests without a routing-strategy header: random, least-request,
    /// prefix-cache, prefix-load (setting default_strategy) [default: prefix-load].
    #[arg(long, value_name = "NAME")]
    pub default_strategy: Option<String>,
    /// A static replica, NAME=http://HOST:PORT (repeatable; replaces the file's [[backends]]).
    #[arg(long = "backend", value_name = "NAME=URL", value_parser = parse_backend_flag)]
    pub backends: Vec<BackendConfig>,
    /// Start N simulated vLLM replicas in-process on loopback, mock-0, mock-1, …
    /// (setting embedded.mock_engines).
    #[arg(long, value_name = "N")]
    pub mock_engines: Option<String>,
    /// KV-event sync: follow every replica's vLLM KV-cache events into the prefix index and
    /// tokenize prompts with the engine's /tokenize (setting kv_sync.enabled).
    #[arg(long)]
    pub kv_sync: bool,
    /// Log filter: a level (info, debug, …) or tracing directives (setting log_level)
    /// [default: RUST_LOG, else info].
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Share routing state with the fleet's other gateways through this Redis server,
    /// redis://[user:password@]host:port[/db] (setting cluster.url) [default: none].
    #[arg(long, value_name = "URL")]
    pub cluster_url: Option<String>,
    /// Any setting, e.g. --set routing.block_size=64 (repeatable; later ones win; an empty
    /// value unsets a setting that is unset by default). `--help` lists every key.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Shown after `route-replay --help`: where its router settings come from.
const REPLAY_AFTER_HELP: &str = "\
The router (tokenizer, block size, hash seed, thresholds, default strategy) is configured as
for serving: --config FILE, the environment, and the flags and --set of `prefixgate --help`,
given before the subcommand:
  AIBRIX_PREFIX_CACHE_BLOCK_SIZE=4 prefixgate --set routing.hash_seed=0 route-replay --trace t.jsonl --seed 1
A line that cannot be replayed prints {\"error\":…,\"line\":N} in its place; the exit status is
then 1.";

/// The subcommands; serving is the default when none is given.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Replay a JSONL trace of routing requests offline and print one decision per line
    /// (format: docs/ROUTING.md, "Replaying decisions").
    #[command(after_help = REPLAY_AFTER_HELP)]
    RouteReplay(RouteReplayArgs),
}

/// `prefixgate route-replay`.
#[derive(Debug, Clone, Default, Args)]
pub struct RouteReplayArgs {
    /// The trace, one JSON object per line; `-` or no flag reads stdin.
    #[arg(long, value_name = "FILE.jsonl")]
    pub trace: Option<PathBuf>,
    /// Seed of the random tie-breaks, for reproducible output [default: from the OS].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Add each request's block hashes (`"hashes":["0x…"]`) to its decision.
    #[arg(long)]
    pub emit_hashes: bool,
}

impl Cli {
    /// The command line of the process, with every setting listed in `--help`.
    pub fn parse_with_settings() -> Cli {
        let matches = Cli::command_with_settings().get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
    }

    /// The clap command, `--help` ending with the list of settings.
    pub fn command_with_settings() -> clap::Command {
        Cli::command().after_long_help(format!(
            "{AFTER_SHORT_HELP}\n\nSettings (key = default  (type), what it does, environment \
             names; an everyday flag is named where there is one):\n{}",
            settings::help_text(ENV_ALIASES, &everyday_flags())
        ))
    }

    /// The configuration: the file (if any), then `env`, then the flags, then `--set`;
    /// validated. An error names the setting and the layer it came from.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<GatewayConfig, ConfigFileError> {
        let mut layers = Layers::default();
        if let Some(path) = &self.config {
            layers.file(path)?;
        }
        layers.env(env)?;
        let values = [
            &self.listen,
            &self.metrics_listen,
            &self.tls_cert,
            &self.tls_key,
            &self.default_strategy,
            &self.mock_engines,
            &self.log_level,
            &self.cluster_url,
        ];
        for ((flag, key), value) in VALUE_FLAGS.into_iter().zip(values) {
            if let Some(value) = value {
                layers.set_text(key, value, Layer::Flag(flag))?;
            }
        }
        if !self.backends.is_empty() {
            let backends =
                toml::Value::try_from(&self.backends).map_err(|e| ConfigFileError::Layer {
                    key: "backends".to_owned(),
                    layer: Layer::Flag("--backend").to_string(),
                    reason: e.to_string(),
                })?;
            layers.set_value("backends", Some(backends), Layer::Flag("--backend"));
        }
        if self.kv_sync {
            let on = Some(toml::Value::Boolean(true));
            layers.set_value("kv_sync.enabled", on, Layer::Flag("--kv-sync"));
        }
        for assignment in &self.set {
            layers.set(assignment)?;
        }
        layers.resolve()
    }
}

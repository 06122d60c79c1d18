//! The `prefixgate` command line, and how flags, environment and file combine.
//!
//! Precedence, lowest first: built-in defaults → `--config FILE` → AIBrix environment
//! variables for the prefix-cache settings (`AIBRIX_PREFIX_CACHE_*`, applied by router-core)
//! → flags. Every flag is optional so that an unset flag never overrides the file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{BackendConfig, ConfigFileError, DiscoveryKind, GatewayConfig};
use crate::replicas::static_::parse_backend_flag;

/// Shown after the flags: what `--help` cannot say per flag.
const AFTER_HELP: &str = "\
Precedence: defaults < --config FILE < AIBrix environment < flags.

AIBrix environment variables (the [routing] table):
  AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE          character | tiktoken | hf
  AIBRIX_PREFIX_CACHE_BLOCK_SIZE              block size in bytes
  AIBRIX_PREFIX_CACHE_BLOCK_NUMBER            index capacity in blocks
  AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS
  AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS
  AIBRIX_PREFIX_CACHE_HASH_SEED
  AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT
  AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR
  AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED   true | false (the [kv_sync] table, --kv-sync)

Cluster sharing (the [cluster] table):
  PREFIXGATE_CLUSTER_URL                      redis://host:port (--cluster-url); none: off
  PREFIXGATE_CLUSTER_NAME                     the fleet (--cluster-name) [default: default]
  PREFIXGATE_CLUSTER_GATEWAY_ID               this gateway's id [default: host-xxxxxx]

KV-event sync (the [kv_sync] table):
  PREFIXGATE_KV_SYNC_DATA_PARALLEL_SIZE       engine ranks per replica (vLLM's
                                              --data-parallel-size; events on port + rank)

prefix-load weights (the [routing.prefix_load] table):
  PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT
  PREFIXGATE_PREFIX_LOAD_PENDING_WEIGHT
  PREFIXGATE_PREFIX_LOAD_WAITING_WEIGHT
  PREFIXGATE_PREFIX_LOAD_IDLE_PREFILL_WEIGHT
  PREFIXGATE_PREFIX_LOAD_FAMILY_WEIGHT
  PREFIXGATE_PREFIX_LOAD_FAMILY_WINDOW_SECONDS
  PREFIXGATE_PREFIX_LOAD_COPY_WEIGHT

Every key of the file, with its flag and variable: config/gateway.example.toml.";

/// prefixgate: an OpenAI-compatible gateway that routes each request to the vLLM replica
/// that holds its prompt prefix, without overloading it.
///
/// Without a subcommand it serves. The flags below also configure `route-replay`'s router;
/// give them before the subcommand (`prefixgate --block-size 4 route-replay …`).
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "prefixgate", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TOML configuration file (see config/gateway.example.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the OpenAI API listener [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Address of the /metrics listener (always plain HTTP) [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve TLS (HTTP/2 and HTTP/1.1 by ALPN) on the API listener with this PEM
    /// certificate chain; needs --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Strategy for requests without a routing-strategy header: random, least-request,
    /// prefix-cache, prefix-load [default: prefix-load].
    #[arg(long, value_name = "NAME")]
    pub default_strategy: Option<String>,
    /// A static replica, NAME=http://HOST:PORT (repeatable; replaces the file's [[backends]]).
    #[arg(long = "backend", value_name = "NAME=URL", value_parser = parse_backend_flag)]
    pub backends: Vec<BackendConfig>,
    /// Where replicas come from: static (--backend, [[backends]], --mock-engines) or
    /// kubernetes (pods labelled model.aibrix.ai/name, watched) [default: static].
    #[arg(long, value_name = "KIND")]
    pub discovery: Option<DiscoveryKind>,
    /// Namespace of the pods to discover [default: the gateway pod's own, else default].
    #[arg(long, value_name = "NS")]
    pub k8s_namespace: Option<String>,
    /// Kubernetes API server URL [default: in-cluster, from KUBERNETES_SERVICE_HOST];
    /// http://127.0.0.1:8001 for `kubectl proxy` (plain HTTP, no token).
    #[arg(long, value_name = "URL")]
    pub k8s_api_server: Option<String>,
    /// Discover only pods of this model (the model.aibrix.ai/name value; repeatable,
    /// replaces the file's list) [default: every pod with the label].
    #[arg(long = "k8s-model", value_name = "NAME")]
    pub k8s_models: Vec<String>,
    /// Start N simulated vLLM replicas in-process on loopback (mock-0, mock-1, …).
    #[arg(long, value_name = "N")]
    pub mock_engines: Option<usize>,
    /// Engine profile of the simulated replicas (builtin name or .toml path)
    /// [default: l20-qwen27b-fp8].
    #[arg(long, value_name = "NAME")]
    pub engine_profile: Option<String>,
    /// Simulated engine time runs S times faster than wall time [default: 1].
    #[arg(long, value_name = "S")]
    pub time_scale: Option<f64>,
    /// Model name the simulated replicas serve [default: mock-model].
    #[arg(long, value_name = "NAME")]
    pub served_model: Option<String>,
    /// Largest accepted request body in bytes [default: 8388608].
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Seconds in-flight responses get to finish after SIGTERM/SIGINT [default: 30].
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace: Option<u64>,
    /// Upstream TCP connect timeout in ms [default: 2000].
    #[arg(long, value_name = "MS")]
    pub connect_timeout_ms: Option<u64>,
    /// Upstream response-header timeout in ms, then 504 [default: 120000].
    #[arg(long, value_name = "MS")]
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest upstream silence between body chunks in ms [default: 120000].
    #[arg(long, value_name = "MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Further replicas tried when one fails before any response byte [default: 2].
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// Health probe period in ms [default: 1000].
    #[arg(long, value_name = "MS")]
    pub health_interval_ms: Option<u64>,
    /// A health probe without an answer in this many ms fails [default: 1000].
    #[arg(long, value_name = "MS")]
    pub health_timeout_ms: Option<u64>,
    /// Consecutive failures before a replica is ejected [default: 3].
    #[arg(long, value_name = "N")]
    pub eject_after_failures: Option<u32>,
    /// Consecutive good probes before an ejected replica is re-admitted [default: 1].
    #[arg(long, value_name = "N")]
    pub readmit_after_successes: Option<u32>,
    /// Engine metrics scrape period in ms [default: 250].
    #[arg(long, value_name = "MS")]
    pub engine_scrape_interval_ms: Option<u64>,
    /// Do not scrape replicas' /metrics into the load view.
    #[arg(long)]
    pub no_engine_scrape: bool,
    /// KV-event sync: subscribe to every replica's vLLM KV-cache events (ports from
    /// [kv_sync], default 5557 and replay 5558; embedded mock engines publish on free
    /// loopback ports) and tokenize prompts with the engine's /tokenize
    /// (also AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED=true).
    #[arg(long)]
    pub kv_sync: bool,
    /// Share routing state with the other gateways of the fleet through this Redis server,
    /// redis://[user:password@]host:port[/db] (also PREFIXGATE_CLUSTER_URL) [default: none].
    #[arg(long, value_name = "URL")]
    pub cluster_url: Option<String>,
    /// The fleet: gateways share state with those of the same name (also
    /// PREFIXGATE_CLUSTER_NAME) [default: default].
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// This gateway's id among its peers (also PREFIXGATE_CLUSTER_GATEWAY_ID)
    /// [default: the host name and a random suffix].
    #[arg(long, value_name = "ID")]
    pub cluster_gateway_id: Option<String>,
    /// Accepted API key for `authorization: Bearer KEY` (repeatable, or comma-separated in
    /// PREFIXGATE_API_KEYS; replaces the file's list). Without keys, no authentication.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "PREFIXGATE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// Bearer token the admin API (/admin/replicas on the metrics listener) requires
    /// (replaces the file's admin.token). Without one, the admin API is open.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "PREFIXGATE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Requests in flight through the gateway at most, then 429 (0: no cap) [default: 0].
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<usize>,
    /// Request header naming the tenant [default: x-tenant].
    #[arg(long, value_name = "NAME")]
    pub tenant_header: Option<String>,
    /// Requests in flight per tenant at most, then 429 (0: no cap) [default: 0].
    #[arg(long, value_name = "N")]
    pub tenant_max_in_flight: Option<usize>,
    /// Tokens per second per tenant (prompt + max_tokens, settled to the reply's usage),
    /// then 429 with Retry-After (0: no limit) [default: 0].
    #[arg(long, value_name = "N")]
    pub tenant_tokens_per_second: Option<u64>,
    /// Tokens a tenant may spend at once, and the largest request it may send
    /// (0: 10 s of its rate) [default: 0].
    #[arg(long, value_name = "N")]
    pub tenant_token_burst: Option<u64>,
    /// Completion tokens charged to a tenant's token rate for a request without max_tokens
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    pub default_max_tokens: Option<u64>,
    /// Prompt tokenizer for prefix hashing: character, tiktoken, hf [default: character].
    #[arg(long, value_name = "KIND")]
    pub tokenizer: Option<router_core::tokenize::TokenizerKind>,
    /// Local tokenizer.json for --tokenizer hf.
    #[arg(long, value_name = "FILE")]
    pub hf_tokenizer_path: Option<PathBuf>,
    /// Prefix index sweep period in seconds [default: 1].
    #[arg(long, value_name = "SECS")]
    pub eviction_interval_secs: Option<u64>,
    /// Prefix blocks expire this many minutes after their last add [default: 20].
    #[arg(long, value_name = "MINS")]
    pub eviction_duration_mins: Option<u64>,
    /// prefix-load: cost of one block to prefill [default: 5.0].
    #[arg(long, value_name = "W")]
    pub prefix_load_prefill_weight: Option<f64>,
    /// prefix-load: cost of one block others still prefill [default: 0.5].
    #[arg(long, value_name = "W")]
    pub prefix_load_pending_weight: Option<f64>,
    /// prefix-load: cost of one request waiting in the engine [default: 2.0].
    #[arg(long, value_name = "W")]
    pub prefix_load_waiting_weight: Option<f64>,
    /// prefix-load: cost of one block to prefill on a pod with nothing outstanding
    /// [default: 2.0].
    #[arg(long, value_name = "W")]
    pub prefix_load_idle_prefill_weight: Option<f64>,
    /// prefix-load: cost, in prompts, of all the families lately served, charged to each pod
    /// by its share when a new family is placed [default: 0 (off)].
    #[arg(long, value_name = "W")]
    pub prefix_load_family_weight: Option<f64>,
    /// prefix-load: a family stops counting as served after this long without a request
    /// [default: 60].
    #[arg(long, value_name = "SECS")]
    pub prefix_load_family_window_seconds: Option<f64>,
    /// prefix-load: extra prefills a copy of a prefix pays, divided by 1 + its requests in
    /// flight; for an index fed by KV-event sync [default: 0 (off)].
    #[arg(long, value_name = "W")]
    pub prefix_load_copy_weight: Option<f64>,
    /// Prefix block size in bytes of the tokenizer's stream [default: 128].
    #[arg(long, value_name = "BYTES")]
    pub block_size: Option<usize>,
    /// XXH64 seed of the block hashes [default: 0].
    #[arg(long, value_name = "N")]
    pub hash_seed: Option<u64>,
    /// Prefix index capacity in blocks [default: 200000].
    #[arg(long, value_name = "N")]
    pub block_capacity: Option<usize>,
    /// prefix-cache imbalance gate: max − min outstanding above this [default: 16].
    #[arg(long, value_name = "N")]
    pub imbalance_abs_count: Option<u64>,
    /// prefix-cache load filter factor k in mean + k·σ [default: 2].
    #[arg(long, value_name = "K")]
    pub stddev_factor: Option<u64>,
}

/// Shown after `route-replay --help`: where its router settings come from.
const REPLAY_AFTER_HELP: &str = "\
The router (tokenizer, block size, hash seed, thresholds, default strategy) is configured as
for serving: --config FILE, the AIBrix environment variables, and the flags of
`prefixgate --help`, given before the subcommand:
  AIBRIX_PREFIX_CACHE_BLOCK_SIZE=4 prefixgate --hash-seed 0 route-replay --trace t.jsonl --seed 1
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
    /// The configuration: file (if any), then `env` (AIBrix names), then flags; validated.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<GatewayConfig, ConfigFileError> {
        let mut config = match &self.config {
            Some(path) => GatewayConfig::from_file(path)?,
            None => GatewayConfig::default(),
        };
        config.kv_sync.apply_env(&env)?;
        config.cluster.apply_env(&env);
        config.routing.apply_env(&env)?;
        self.apply_flags(&mut config);
        config.validate()?;
        Ok(config)
    }

    fn apply_flags(&self, config: &mut GatewayConfig) {
        fn set<T: Clone>(target: &mut T, flag: &Option<T>) {
            if let Some(value) = flag {
                *target = value.clone();
            }
        }
        set(&mut config.listen, &self.listen);
        set(&mut config.metrics_listen, &self.metrics_listen);
        config
            .tls
            .apply_flags(self.tls_cert.as_ref(), self.tls_key.as_ref());
        set(&mut config.default_strategy, &self.default_strategy);
        if !self.backends.is_empty() {
            config.backends = self.backends.clone();
        }
        set(&mut config.discovery.kind, &self.discovery);
        if self.k8s_namespace.is_some() {
            config.discovery.namespace.clone_from(&self.k8s_namespace);
        }
        if self.k8s_api_server.is_some() {
            config.discovery.api_server.clone_from(&self.k8s_api_server);
        }
        if !self.k8s_models.is_empty() {
            config.discovery.models = self.k8s_models.clone();
        }
        set(&mut config.embedded.mock_engines, &self.mock_engines);
        set(&mut config.embedded.engine_profile, &self.engine_profile);
        set(&mut config.embedded.time_scale, &self.time_scale);
        set(&mut config.embedded.served_model, &self.served_model);
        set(&mut config.max_body_bytes, &self.max_body_bytes);
        set(&mut config.shutdown_grace_secs, &self.shutdown_grace);
        set(
            &mut config.upstream.connect_timeout_ms,
            &self.connect_timeout_ms,
        );
        set(
            &mut config.upstream.first_byte_timeout_ms,
            &self.first_byte_timeout_ms,
        );
        set(&mut config.upstream.idle_timeout_ms, &self.idle_timeout_ms);
        set(&mut config.upstream.max_retries, &self.max_retries);
        set(&mut config.health.interval_ms, &self.health_interval_ms);
        set(&mut config.health.timeout_ms, &self.health_timeout_ms);
        set(
            &mut config.health.eject_after_failures,
            &self.eject_after_failures,
        );
        set(
            &mut config.health.readmit_after_successes,
            &self.readmit_after_successes,
        );
        set(
            &mut config.engine_scrape.interval_ms,
            &self.engine_scrape_interval_ms,
        );
        if self.no_engine_scrape {
            config.engine_scrape.enabled = false;
        }
        if self.kv_sync {
            config.kv_sync.enabled = true;
        }
        if let Some(token) = &self.admin_token {
            config.admin.token = Some(token.clone());
        }
        if self.cluster_url.is_some() {
            config.cluster.url.clone_from(&self.cluster_url);
        }
        set(&mut config.cluster.name, &self.cluster_name);
        if self.cluster_gateway_id.is_some() {
            config
                .cluster
                .gateway_id
                .clone_from(&self.cluster_gateway_id);
        }
        if !self.api_keys.is_empty() {
            config.admission.api_keys = self.api_keys.clone();
        }
        set(&mut config.admission.max_in_flight, &self.max_in_flight);
        set(&mut config.admission.tenant_header, &self.tenant_header);
        set(
            &mut config.admission.tenant_max_in_flight,
            &self.tenant_max_in_flight,
        );
        set(
            &mut config.admission.tenant_tokens_per_second,
            &self.tenant_tokens_per_second,
        );
        set(
            &mut config.admission.tenant_token_burst,
            &self.tenant_token_burst,
        );
        set(
            &mut config.admission.default_max_tokens,
            &self.default_max_tokens,
        );
        set(&mut config.routing.tokenizer, &self.tokenizer);
        if self.hf_tokenizer_path.is_some() {
            config
                .routing
                .hf_tokenizer_path
                .clone_from(&self.hf_tokenizer_path);
        }
        set(
            &mut config.routing.eviction_interval_secs,
            &self.eviction_interval_secs,
        );
        set(
            &mut config.routing.eviction_duration_mins,
            &self.eviction_duration_mins,
        );
        let weights = &mut config.routing.prefix_load;
        set(
            &mut weights.prefill_weight,
            &self.prefix_load_prefill_weight,
        );
        set(
            &mut weights.pending_weight,
            &self.prefix_load_pending_weight,
        );
        set(
            &mut weights.waiting_weight,
            &self.prefix_load_waiting_weight,
        );
        set(
            &mut weights.idle_prefill_weight,
            &self.prefix_load_idle_prefill_weight,
        );
        set(&mut weights.family_weight, &self.prefix_load_family_weight);
        set(
            &mut weights.family_window_seconds,
            &self.prefix_load_family_window_seconds,
        );
        set(&mut weights.copy_weight, &self.prefix_load_copy_weight);
        set(&mut config.routing.block_size, &self.block_size);
        set(&mut config.routing.hash_seed, &self.hash_seed);
        set(&mut config.routing.block_capacity, &self.block_capacity);
        set(
            &mut config.routing.imbalance_abs_count,
            &self.imbalance_abs_count,
        );
        set(&mut config.routing.stddev_factor, &self.stddev_factor);
    }
}

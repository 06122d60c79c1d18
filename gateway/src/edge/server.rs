//! Starting and stopping a gateway: [`start`] turns a [`GatewayConfig`] into running
//! listeners plus background tasks, and [`GatewayHandle`] stops them gracefully.
//!
//! This is the library entry used by `main`, by the end-to-end tests and by loadgen's local
//! runner. Start-up order: validate → TLS certificate and key (when configured) → router →
//! replicas (embedded, then static; or the Kubernetes watch, waited for up to
//! [`FIRST_POD_LIST_WAIT`]) → one health round (so models are known) → bind the listeners
//! (API, metrics, and Envoy ext_proc when `ext_proc.listen` is set) → background tasks (health, engine scrape, index sweep, and the token bucket sweep when
//! token rates are on). Shutdown: stop accepting, let in-flight responses finish up to the
//! grace period, then cut the rest: streams end with an SSE error event within
//! [`CUT_WRITE_TIME`], then every connection left is aborted (their guards release as the
//! bodies drop).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use router_core::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admit::Admission;
use crate::clock::Clock;
use crate::cluster::{self, ClusterError, ClusterHandles};
use crate::config::{ConfigFileError, DiscoveryKind, GatewayConfig};
use crate::edge::listener;
use crate::edge::tls::TlsError;
use crate::kv_sync::{self, SyncHandles};
use crate::metrics::{Metrics, MetricsError};
use crate::replicas::admin::{self, AdminHandle};
use crate::replicas::embedded::{self, EmbeddedReplicas};
use crate::replicas::health::{self, HealthSettings};
use crate::replicas::{Replicas, engine_scrape, kubernetes, static_};
use crate::request::routes::{app, metrics_app};
use crate::state::{AppState, RequestSettings};
use crate::upstream::upstream_client;

/// How long start-up waits for the first pod list before serving without replicas (the
/// watch keeps trying; `/ready` answers 503 until a pod is routable).
pub const FIRST_POD_LIST_WAIT: Duration = Duration::from_secs(5);

/// How long the responses cut at the drain deadline get to write their error event (and
/// their connections to close) before the connections are aborted.
pub const CUT_WRITE_TIME: Duration = Duration::from_secs(1);

/// How often refilled tenant token buckets are forgotten.
pub const TOKEN_BUCKET_SWEEP: Duration = Duration::from_secs(5);

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigFileError),
    #[error(transparent)]
    Routing(#[from] router_core::ConfigError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("invalid admission settings: {0}")]
    Admission(String),
    #[error("cannot start embedded replicas: {0}")]
    Embedded(String),
    #[error("cannot start cluster sharing: {0}")]
    Cluster(#[from] ClusterError),
    #[error("cannot start Kubernetes discovery: {0}")]
    Discovery(String),
    #[error("invalid backend: {0}")]
    Backend(String),
    #[error(
        "no replicas: give --backend NAME=URL, [[backends]] in the config file, --mock-engines N or discovery.kind = \"kubernetes\""
    )]
    NoReplicas,
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running gateway.
#[derive(Debug)]
pub struct GatewayHandle {
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    /// The Envoy ext_proc listener's address, when it is on.
    ext_proc_addr: Option<SocketAddr>,
    /// Whether the API listener serves TLS.
    tls: bool,
    state: Arc<AppState>,
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    metrics_server: JoinHandle<()>,
    /// The ext_proc listener, drained and cut with the API listener.
    ext_proc_server: Option<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    embedded: EmbeddedReplicas,
    grace: Duration,
}

/// Starts a gateway as configured (the caller has applied environment and flags).
pub async fn start(config: GatewayConfig) -> Result<GatewayHandle, StartError> {
    config.validate()?;
    // Before anything starts: a bad certificate or key stops the start with nothing to undo.
    let tls = config.tls.acceptor()?;
    let ext_proc_tls = config.ext_proc.acceptor()?;
    let default_strategy = config.default_strategy()?;
    let router = Arc::new(Router::new(
        config.routing.clone().for_kv_sync(config.kv_sync.enabled),
    )?);
    let metrics =
        Metrics::with_kv_sync_ranks(config.kv_sync.enabled, config.kv_sync.data_parallel_size)?;
    let admission = Admission::new(config.admission.clone()).map_err(StartError::Admission)?;

    let (mut replicas, embedded) = embedded::spawn(&config.embedded, config.kv_sync.enabled)
        .await
        .map_err(StartError::Embedded)?;
    replicas.extend(static_::replicas(&config.backends).map_err(StartError::Backend)?);
    let kubernetes = config.discovery.kind == DiscoveryKind::Kubernetes;
    if replicas.is_empty() && !kubernetes {
        embedded.shutdown().await;
        return Err(StartError::NoReplicas);
    }
    let replicas = Arc::new(Replicas::new(replicas));
    let mut background = Vec::new();
    if kubernetes {
        let mut discovery = kubernetes::spawn(
            &config.discovery,
            |key| std::env::var(key).ok(),
            std::path::Path::new(kubernetes::client::SERVICE_ACCOUNT_DIR),
            Arc::clone(&replicas),
        )
        .map_err(StartError::Discovery)?;
        if !discovery.first_sync(FIRST_POD_LIST_WAIT).await {
            tracing::warn!(
                wait_secs = FIRST_POD_LIST_WAIT.as_secs(),
                "no pod list yet; serving without replicas while discovery retries"
            );
        }
        background.push(discovery.task);
    }
    let client = upstream_client(
        config.connect_timeout(),
        Duration::from_secs(config.upstream.pool_idle_timeout_secs),
    );
    let health_settings = HealthSettings {
        interval: Duration::from_millis(config.health.interval_ms),
        timeout: Duration::from_millis(config.health.timeout_ms),
        eject_after_failures: config.health.eject_after_failures,
        readmit_after_successes: config.health.readmit_after_successes,
    };
    health::probe_all(&client, &replicas, &health_settings, &metrics).await;

    let clock = Clock::scaled(config.router_time_scale());
    // Cluster sharing connects in the background: a server that is down only delays sharing.
    let cluster = if config.cluster.enabled() {
        let cluster = cluster::spawn(
            &config.cluster,
            ClusterHandles {
                router: Arc::clone(&router),
                replicas: Arc::clone(&replicas),
                clock,
                engine_tokens: config.kv_sync.enabled,
            },
            metrics.registry(),
        );
        match cluster {
            Ok(cluster) => {
                background.extend(cluster.tasks);
                Some(cluster.publisher)
            }
            Err(error) => {
                for task in &background {
                    task.abort();
                }
                embedded.shutdown().await;
                return Err(StartError::Cluster(error));
            }
        }
    } else {
        None
    };
    let state = Arc::new(AppState {
        admission,
        router: Arc::clone(&router),
        replicas: Arc::clone(&replicas),
        metrics: metrics.clone(),
        client: client.clone(),
        settings: RequestSettings {
            default_strategy,
            max_body_bytes: config.max_body_bytes,
            first_byte_timeout: config.first_byte_timeout(),
            idle_timeout: config.idle_timeout(),
            first_token_timeout: config.first_token_timeout(),
            max_retries: config.upstream.max_retries,
            eject_after_failures: config.health.eject_after_failures,
            engine_tokenize_timeout: config
                .kv_sync
                .enabled
                .then(|| config.kv_sync.tokenize_timeout()),
            resume: config.resume.settings(),
        },
        clock,
        cluster,
        cut: CancellationToken::new(),
    });

    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let listeners = async {
        let listener = bind(config.listen).await?;
        let metrics_listener = bind(config.metrics_listen).await?;
        let addr = local_addr(&listener, config.listen)?;
        let metrics_addr = local_addr(&metrics_listener, config.metrics_listen)?;
        let ext_proc = match config.ext_proc.listen {
            Some(wanted) => {
                let bound = bind(wanted).await?;
                let addr = local_addr(&bound, wanted)?;
                Some((bound, addr))
            }
            None => None,
        };
        Ok::<_, StartError>((listener, metrics_listener, addr, metrics_addr, ext_proc))
    };
    let (listener, metrics_listener, addr, metrics_addr, ext_proc) = match listeners.await {
        Ok(bound) => bound,
        Err(error) => {
            // Nothing started so far may outlive the failed start.
            for task in &background {
                task.abort();
            }
            embedded.shutdown().await;
            return Err(error);
        }
    };

    background.push(health::spawn(
        client.clone(),
        Arc::clone(&replicas),
        health_settings,
        metrics.clone(),
    ));
    if config.engine_scrape.enabled {
        background.push(engine_scrape::spawn(
            client,
            Arc::clone(&replicas),
            Duration::from_millis(config.engine_scrape.interval_ms),
            Duration::from_millis(config.engine_scrape.timeout_ms),
        ));
    }
    background.push(spawn_index_sweep(
        Arc::clone(&router),
        clock,
        Duration::from_secs(config.routing.eviction_interval_secs.max(1)),
    ));
    if let Some(kv_metrics) = metrics.kv_sync() {
        background.push(kv_sync::spawn(
            SyncHandles {
                router: Arc::clone(&router),
                replicas: Arc::clone(&replicas),
                clock,
            },
            config.kv_sync.clone(),
            kv_metrics.clone(),
        ));
    }
    if state.admission.has_token_rates() {
        background.push(spawn_token_bucket_sweep(Arc::clone(&state)));
    }

    let (stop, stopped) = watch::channel(false);
    let serves_tls = tls.is_some();
    let server = listener::spawn(listener, app(Arc::clone(&state)), tls, stopped.clone());
    let ext_proc_addr = ext_proc.as_ref().map(|(_, addr)| *addr);
    let ext_proc_server = ext_proc.map(|(bound, _)| {
        crate::ext_proc::spawn(
            bound,
            Arc::clone(&state),
            config.ext_proc.dialect,
            ext_proc_tls,
            stopped.clone(),
        )
    });
    // Plain HTTP always: Prometheus scrapes it from inside the cluster.
    let admin = admin::routes(AdminHandle {
        replicas: Arc::clone(&replicas),
        router: Arc::clone(&router),
        client: state.client.clone(),
        health: health_settings,
        metrics: metrics.clone(),
        token: config.admin.token.as_deref().map(Arc::from),
        kubernetes,
    });
    let metrics_server = listener::spawn(
        metrics_listener,
        metrics_app(Arc::clone(&state)).merge(admin),
        None,
        stopped,
    );
    let replica_count = replicas.snapshot().len();
    tracing::info!(
        %addr,
        %metrics_addr,
        ext_proc = ?ext_proc_addr,
        tls = serves_tls,
        replicas = replica_count,
        "prefixgate serving"
    );
    Ok(GatewayHandle {
        addr,
        metrics_addr,
        ext_proc_addr,
        tls: serves_tls,
        state,
        stop,
        server,
        metrics_server,
        ext_proc_server,
        background,
        embedded,
        grace: config.shutdown_grace(),
    })
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, StartError> {
    listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })
}

/// Removes expired prefix blocks every `interval` (AIBrix's eviction sweep).
fn spawn_index_sweep(router: Arc<Router>, clock: Clock, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let removed = router.sweep(clock.now_ms());
            if removed > 0 {
                tracing::debug!(removed, "prefix index sweep");
            }
        }
    })
}

/// Forgets refilled tenant token buckets every [`TOKEN_BUCKET_SWEEP`], so tenant names
/// sent once cannot pile up.
fn spawn_token_bucket_sweep(state: Arc<AppState>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(TOKEN_BUCKET_SWEEP);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let removed = state.admission.sweep_token_buckets();
            if removed > 0 {
                tracing::debug!(removed, "token bucket sweep");
            }
        }
    })
}

impl GatewayHandle {
    /// The admission state (in-flight counts, tenants tracked, token buckets).
    pub fn admission(&self) -> &Admission {
        &self.state.admission
    }

    /// The OpenAI API listener's bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics listener's bound address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// The Envoy ext_proc listener's bound address (`None` without `ext_proc.listen`).
    pub fn ext_proc_addr(&self) -> Option<SocketAddr> {
        self.ext_proc_addr
    }

    /// `http://ADDR` of the API listener, or `https://ADDR` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Each replica's name and current outstanding count, in set order.
    pub fn outstanding(&self) -> Vec<(String, u64)> {
        self.state
            .replicas
            .snapshot()
            .iter()
            .map(|r| (r.name().to_owned(), r.load().outstanding()))
            .collect()
    }

    /// The sum of every replica's outstanding count.
    pub fn total_outstanding(&self) -> u64 {
        self.outstanding().iter().map(|(_, n)| n).sum()
    }

    /// Each replica's name and its last engine scrape (`None` until one succeeds).
    pub fn engine_stats(&self) -> Vec<(String, Option<router_core::EngineStats>)> {
        self.state
            .replicas
            .snapshot()
            .iter()
            .map(|r| (r.name().to_owned(), r.load().engine_stats()))
            .collect()
    }

    /// Each replica's name, `host:port` and readiness.
    pub fn replicas(&self) -> Vec<(String, String, bool)> {
        self.state
            .replicas
            .snapshot()
            .iter()
            .map(|r| (r.name().to_owned(), r.authority().to_owned(), r.is_ready()))
            .collect()
    }

    /// Stops accepting, lets in-flight responses finish for up to the grace period, cuts
    /// what is left, then stops background tasks and embedded replicas. Returns whether
    /// everything finished within the grace period.
    pub async fn shutdown(self) -> bool {
        let grace = self.grace;
        self.shutdown_within(grace).await
    }

    /// [`Self::shutdown`] with an explicit grace period.
    pub async fn shutdown_within(mut self, grace: Duration) -> bool {
        let _ = self.stop.send(true);
        let mut ext_proc = self.ext_proc_server.take();
        let serving = async {
            let _ = (&mut self.server).await;
            if let Some(ext_proc) = ext_proc.as_mut() {
                let _ = ext_proc.await;
            }
        };
        let drained = tokio::time::timeout(grace, serving).await.is_ok();
        if !drained {
            tracing::warn!(
                grace_ms = grace.as_millis(),
                "grace period over; cutting in-flight responses"
            );
            // Streams end with an error event (as on a replica failure), ext_proc streams
            // with UNAVAILABLE, and their connections close; whatever is still open after
            // that is aborted.
            self.state.cut.cancel();
            let unfinished = std::iter::once(&mut self.server)
                .chain(ext_proc.as_mut())
                .filter(|server| !server.is_finished());
            for server in unfinished {
                if tokio::time::timeout(CUT_WRITE_TIME, &mut *server)
                    .await
                    .is_err()
                {
                    server.abort();
                    let _ = server.await;
                }
            }
        }
        if tokio::time::timeout(grace, &mut self.metrics_server)
            .await
            .is_err()
        {
            self.metrics_server.abort();
        }
        for task in &self.background {
            task.abort();
        }
        self.embedded.shutdown().await;
        drained
    }
}

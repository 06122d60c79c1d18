//! What the handlers share: [`AppState`] and the per-request settings.
//!
//! A leaf above its parts: it holds admission, the router, the replica set, the metrics and
//! the upstream client, and none of them imports it. Background tasks get narrow handles
//! (the router, the replica set, the clock), never the whole state.

use std::sync::Arc;
use std::time::Duration;

use router_core::Strategy;
use tokio_util::sync::CancellationToken;

use crate::admit::Admission;
use crate::clock::Clock;
use crate::cluster::ClusterPublisher;
use crate::metrics::Metrics;
use crate::replicas::Replicas;
use crate::request::resume::config::ResumeSettings;
use crate::upstream::UpstreamClient;

/// Settings the request path reads on every request.
#[derive(Debug, Clone)]
pub struct RequestSettings {
    pub default_strategy: Strategy,
    pub max_body_bytes: usize,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub first_token_timeout: Duration,
    pub max_retries: u32,
    /// Consecutive refused connections before a replica is ejected (passive health).
    pub eject_after_failures: u32,
    /// With KV-event sync on, how long a request waits for the engine's `/tokenize`;
    /// `None` when sync is off (prompts are tokenized by the router's own tokenizer).
    pub engine_tokenize_timeout: Option<Duration>,
    /// Carrying broken streams on on another replica (`[resume]`).
    pub resume: ResumeSettings,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    pub admission: Admission,
    /// Shared with KV sync and the index sweep, which feed and age its index.
    pub router: Arc<router_core::Router>,
    pub replicas: Arc<Replicas>,
    pub metrics: Metrics,
    pub client: UpstreamClient,
    pub settings: RequestSettings,
    pub clock: Clock,
    /// Publishes each decision to the other gateways (cluster sharing); `None` alone.
    pub cluster: Option<ClusterPublisher>,
    /// Cancelled when a shutdown's drain deadline passes: the responses still streaming end
    /// with an error event before their connections are cut.
    pub cut: CancellationToken,
}

#[cfg(test)]
impl AppState {
    /// The state the unit tests share: the given replicas, the default router, `least-request`
    /// by default, 1 s timeouts, a 1 KiB body limit and no retries.
    pub(crate) fn for_tests(replicas: Vec<Arc<crate::replicas::Replica>>) -> AppState {
        AppState {
            admission: crate::admit::Admission::new(Default::default()).unwrap(),
            router: Arc::new(
                router_core::Router::new(router_core::RouterConfig::default()).unwrap(),
            ),
            replicas: Arc::new(Replicas::new(replicas)),
            metrics: Metrics::new().unwrap(),
            client: crate::upstream::upstream_client(
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
            settings: RequestSettings {
                default_strategy: Strategy::LeastRequest,
                max_body_bytes: 1024,
                first_byte_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(1),
                first_token_timeout: Duration::from_secs(1),
                max_retries: 0,
                eject_after_failures: 3,
                engine_tokenize_timeout: None,
                resume: crate::request::resume::config::ResumeConfig::default().settings(),
            },
            clock: Clock::new(),
            cluster: None,
            cut: CancellationToken::new(),
        }
    }
}

//! The [`Router`]: tokenizer, prefix index and policies under one configuration.
//!
//! Every decision goes through [`Router::route`], which does the steps common to all
//! policies: refuse an empty pod set, short-circuit a single pod (as AIBrix does: no policy,
//! no prefix metric, no index update), hash the prompt for prefix-aware policies, ask the
//! policy, count the request against the chosen pod, and record its blocks in the index.

use rand::RngCore;

use crate::Millis;
use crate::config::{ConfigError, RouterConfig};
use crate::decision::Decision;
use crate::hash::block_hashes;
use crate::index::PrefixIndex;
use crate::load::{Candidate, OutstandingGuard};
use crate::policy::{LeastRequest, Policy, PolicyInput, PrefixCache, Random, Strategy};
use crate::tokenize::{self, TokenizeError, Tokenizer};

/// What the router needs to know about one request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// The message text (see [`crate::text`]); empty for requests with no prompt text.
    pub text: &'a str,
}

/// A decision plus the guard that holds the request against the chosen pod.
#[derive(Debug)]
pub struct Routed {
    pub decision: Decision,
    pub guard: OutstandingGuard,
}

/// Why no pod could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No ready pod serves the model (HTTP 503).
    #[error("no ready replica for model {0:?}")]
    NoReadyPod(String),
    /// The tokenizer failed (`aibrix_prefix_cache_routing_errors_total{reason="tokenize_failed"}`).
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
}

/// Routes requests under one configuration. Cheap to share (`Arc<Router>`); every method
/// takes `&self` and is safe to call from many threads at once.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    tokenizer: Box<dyn Tokenizer>,
    index: PrefixIndex,
    random: Random,
    least_request: LeastRequest,
    prefix_cache: PrefixCache,
}

impl Router {
    /// A router with the given settings (validated; the tokenizer is loaded here).
    pub fn new(config: RouterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Router {
            index: PrefixIndex::new(config.block_capacity, config.ttl_millis()),
            tokenizer: tokenize::from_config(&config)?,
            random: Random,
            least_request: LeastRequest,
            prefix_cache: PrefixCache,
            config,
        })
    }

    /// The settings this router runs with.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The prefix index (for sweeping and inspection).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The request's block hashes under this router's tokenizer, block size and seed.
    pub fn hashes(&self, text: &str) -> Result<Vec<u64>, TokenizeError> {
        let bytes = self.tokenizer.bytes(text)?;
        Ok(block_hashes(
            &bytes,
            self.config.block_size,
            self.config.hash_seed,
        ))
    }

    /// Chooses a pod among `pods` (the ready ones) and counts the request against it.
    pub fn route(
        &self,
        strategy: Strategy,
        request: &RouteRequest<'_>,
        pods: &[Candidate<'_>],
        rng: &mut dyn RngCore,
        now: Millis,
    ) -> Result<Routed, RouteError> {
        if pods.is_empty() {
            return Err(RouteError::NoReadyPod(request.model.to_owned()));
        }
        if pods.len() == 1 {
            let guard = pods[0].load.acquire();
            return Ok(Routed {
                decision: Decision {
                    pod: 0,
                    pod_name: pods[0].name.to_owned(),
                    strategy,
                    selection: None,
                    match_percent: None,
                    imbalance: false,
                    outstanding_at_selection: guard.at_selection(),
                    prefix_hashes: Vec::new(),
                },
                guard,
            });
        }
        let hashes = if strategy.uses_prefix_index() {
            self.hashes(request.text)?
        } else {
            Vec::new()
        };
        let policy: &dyn Policy = match strategy {
            Strategy::Random => &self.random,
            Strategy::LeastRequest => &self.least_request,
            Strategy::PrefixCache => &self.prefix_cache,
        };
        let choice = policy.choose(&mut PolicyInput {
            model: request.model,
            pods,
            hashes: &hashes,
            index: &self.index,
            config: &self.config,
            rng,
        });
        let chosen = pods[choice.pod];
        let guard = chosen.load.acquire();
        if strategy.uses_prefix_index() && !hashes.is_empty() {
            self.index.add(request.model, &hashes, chosen.name, now);
        }
        Ok(Routed {
            decision: Decision {
                pod: choice.pod,
                pod_name: chosen.name.to_owned(),
                strategy,
                selection: choice.selection,
                match_percent: choice.match_percent,
                imbalance: choice.imbalance,
                outstanding_at_selection: guard.at_selection(),
                prefix_hashes: hashes,
            },
            guard,
        })
    }
}

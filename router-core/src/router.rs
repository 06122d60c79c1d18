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
use crate::index::{FoundBlocks, PrefixIndex, Recall};
use crate::kv_sync::{
    Applied, DEFAULT_MAX_ENGINE_BLOCKS, KvEvent, PodSync, SyncError, SyncSettings,
};
use crate::load::{Candidate, InFlight, PodLoad, RequestWork};
use crate::policy::prefix_load::uncached_blocks;
use crate::policy::{
    LeastRequest, Policy, PolicyInput, PrefixCache, PrefixLoad, Random, Session, SessionAffinity,
    Strategy,
};
use crate::tokenize::{self, TokenizeError, Tokenizer};

/// What the router needs to know about one request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub model: &'a str,
    /// The message text (see [`crate::text`]); empty for requests with no prompt text.
    pub text: &'a str,
    /// The prompt as the engine tokenized it (KV-event sync): token ids as 4-byte big-endian
    /// bytes ([`crate::kv_sync::token_bytes`]). When given it is hashed instead of `text`, so
    /// the hashes equal those the engine's `BlockStored` events produce.
    pub tokens: Option<&'a [u8]>,
    /// The session the request names (`x-session-id`, `x-aibrix-session-key`).
    pub session: Session<'a>,
    /// The most tokens it may answer (its body's `max_tokens`), when it says: how long it
    /// will hold a batch slot once it answers ([`crate::load::RequestWork::max_tokens`]).
    pub max_tokens: Option<u64>,
}

/// A decision plus the guard that holds the request against the chosen pod.
#[derive(Debug)]
pub struct Routed {
    pub decision: Decision,
    pub guard: InFlight,
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
    /// `prefix-load`'s longer memory of the same placements (`None` when off).
    recall: Option<Recall>,
    random: Random,
    least_request: LeastRequest,
    prefix_cache: PrefixCache,
    prefix_load: PrefixLoad,
    session_affinity: SessionAffinity,
}

impl Router {
    /// A router with the given settings (validated; the tokenizer is loaded here).
    pub fn new(config: RouterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Router {
            index: PrefixIndex::new(config.block_capacity, config.ttl_millis()),
            recall: Recall::new(config.prefix_load.recall_blocks, config.ttl_millis()),
            tokenizer: tokenize::load(config.tokenizer, config.hf_tokenizer_path.as_deref())?,
            random: Random,
            least_request: LeastRequest,
            prefix_cache: PrefixCache::new(config.imbalance_abs_count, config.stddev_factor),
            prefix_load: PrefixLoad::new(config.prefix_load.clone()),
            session_affinity: SessionAffinity,
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

    /// Removes the index's blocks, and the recall's, not added to for longer than the TTL
    /// (AIBrix's eviction sweep); returns how many index blocks went.
    pub fn sweep(&self, now: Millis) -> usize {
        if let Some(recall) = &self.recall {
            recall.sweep(now);
        }
        self.index.sweep(now)
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

    /// The request's block hashes: its engine tokens when given, else its text tokenized.
    pub fn request_hashes(&self, request: &RouteRequest<'_>) -> Result<Vec<u64>, TokenizeError> {
        match request.tokens {
            Some(bytes) => Ok(block_hashes(
                bytes,
                self.config.block_size,
                self.config.hash_seed,
            )),
            None => self.hashes(request.text),
        }
    }

    /// How engine events become router blocks under this router's block size and seed.
    pub fn kv_sync_settings(&self) -> SyncSettings {
        SyncSettings {
            router_block_bytes: self.config.block_size,
            seed: self.config.hash_seed,
            max_engine_blocks: DEFAULT_MAX_ENGINE_BLOCKS,
        }
    }

    /// Applies one engine event from `pod` (serving `models`) to this router's index.
    pub fn apply_kv_event(
        &self,
        sync: &mut PodSync,
        event: &KvEvent,
        pod: &str,
        models: &[String],
        now: Millis,
    ) -> Result<Applied, SyncError> {
        sync.apply(
            event,
            pod,
            models,
            &self.index,
            &self.kv_sync_settings(),
            now,
        )
    }

    /// Records that a request with `hashes` (empty: a strategy that does not hash) went to
    /// `pod`: its blocks in the index and, with `prefix-load`'s family term on, its family on
    /// the pod's `load` when this router routes to that pod. [`route`](Self::route) calls it
    /// for its own decisions, cluster sharing for the other gateways'
    /// ([`crate::cluster::PeerTable`]).
    pub fn record_placement(
        &self,
        model: &str,
        hashes: &[u64],
        pod: &str,
        load: Option<&PodLoad>,
        now: Millis,
    ) {
        self.place(model, hashes, pod, load, now, None);
    }

    /// [`record_placement`](Self::record_placement), for a decision of this router whose
    /// policy noted in `found` where its match found the blocks.
    fn place(
        &self,
        model: &str,
        hashes: &[u64],
        pod: &str,
        load: Option<&PodLoad>,
        now: Millis,
        found: Option<&FoundBlocks>,
    ) {
        let Some(&root) = hashes.first() else {
            return;
        };
        match found {
            Some(found) => self.index.add_after_match(model, hashes, pod, now, found),
            None => self.index.add(model, hashes, pod, now),
        }
        if let Some(recall) = &self.recall {
            recall.add(model, hashes, pod, now);
        }
        // Only `prefix-load`'s family term reads the families; with it off they cost nothing.
        if let Some(window) = self.prefix_load.family_window()
            && let Some(load) = load
        {
            load.families().record(root, now, window);
        }
    }

    /// Undoes the index half of [`record_placement`](Self::record_placement) for a request
    /// that never reached `pod` (its connection was refused): the index no longer says `pod`
    /// holds the request's blocks. A replica that refuses connections has no engine behind
    /// the address (stopped or restarting), so it holds none of them either way; other pods
    /// keep theirs. The pod's recent families (`prefix-load`'s family term) age out.
    pub fn forget_placement(&self, model: &str, hashes: &[u64], pod: &str) {
        for &hash in hashes {
            self.index.remove(model, hash, pod);
        }
        if let Some(recall) = &self.recall {
            recall.forget(model, hashes, pod);
        }
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
        self.route_with_hashes(strategy, request, None, pods, rng, now)
    }

    /// [`route`](Self::route) for a request whose block hashes are already known: `hashes`,
    /// when given, must be [`request_hashes`](Self::request_hashes) of `request` (a retry
    /// takes them back from the failed attempt's [`Decision::prefix_hashes`]) and are used
    /// instead of hashing the prompt again. Strategies that do not hash, and the single-pod
    /// short-circuit, drop them, as `route` hashes nothing there.
    pub fn route_with_hashes(
        &self,
        strategy: Strategy,
        request: &RouteRequest<'_>,
        hashes: Option<Vec<u64>>,
        pods: &[Candidate<'_>],
        rng: &mut dyn RngCore,
        now: Millis,
    ) -> Result<Routed, RouteError> {
        match pods {
            [] => return Err(RouteError::NoReadyPod(request.model.to_owned())),
            [only] => return Ok(single_pod(strategy, only, now)),
            _ => {}
        }
        let hashes = match hashes {
            _ if !strategy.uses_prefix_index() => Vec::new(),
            Some(hashes) => hashes,
            None => self.request_hashes(request)?,
        };
        let policy: &dyn Policy = match strategy {
            Strategy::Random => &self.random,
            Strategy::LeastRequest => &self.least_request,
            Strategy::PrefixCache => &self.prefix_cache,
            Strategy::PrefixLoad => &self.prefix_load,
            Strategy::SessionAffinity => &self.session_affinity,
        };
        let mut input = PolicyInput {
            model: request.model,
            pods,
            hashes: &hashes,
            index: &self.index,
            found: FoundBlocks::default(),
            recall: self.recall.as_ref(),
            session: request.session,
            rng,
            now,
        };
        let choice = policy.choose(&mut input);
        let chosen = pods[choice.pod];
        // The work signals `prefix-load` reads: the prompt's blocks, and those the chosen pod
        // is expected to prefill given its match.
        let blocks = hashes.len() as u64;
        let guard = chosen.load.decide(
            RequestWork {
                blocks,
                prefill_blocks: uncached_blocks(blocks, choice.match_percent.unwrap_or(0)),
                shared_prefix: choice.shared_prefix,
                copies_prefix: choice.selection == Some(crate::decision::Selection::CostModel),
                max_tokens: request.max_tokens,
            },
            now,
        );
        // Only prefix-aware strategies hash: the others leave `hashes` empty.
        self.place(
            request.model,
            &hashes,
            chosen.name,
            Some(&**chosen.load),
            now,
            Some(&input.found),
        );
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

/// AIBrix's single-pod short-circuit: no policy, no prefix metric, no index update.
fn single_pod(strategy: Strategy, only: &Candidate<'_>, now: Millis) -> Routed {
    let guard = only.load.decide(RequestWork::default(), now);
    Routed {
        decision: Decision {
            pod: 0,
            pod_name: only.name.to_owned(),
            strategy,
            selection: None,
            match_percent: None,
            imbalance: false,
            outstanding_at_selection: guard.at_selection(),
            prefix_hashes: Vec::new(),
        },
        guard,
    }
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;

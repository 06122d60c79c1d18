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
use crate::kv_sync::{
    Applied, DEFAULT_MAX_ENGINE_BLOCKS, KvEvent, PodSync, SyncError, SyncSettings,
};
use crate::load::{Candidate, InFlight, PodLoad, RequestWork};
use crate::policy::prefix_load::uncached_blocks;
use crate::policy::{LeastRequest, Policy, PolicyInput, PrefixCache, PrefixLoad, Random, Strategy};
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
    random: Random,
    least_request: LeastRequest,
    prefix_cache: PrefixCache,
    prefix_load: PrefixLoad,
}

impl Router {
    /// A router with the given settings (validated; the tokenizer is loaded here).
    pub fn new(config: RouterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Router {
            index: PrefixIndex::new(config.block_capacity, config.ttl_millis()),
            tokenizer: tokenize::load(config.tokenizer, config.hf_tokenizer_path.as_deref())?,
            random: Random,
            least_request: LeastRequest,
            prefix_cache: PrefixCache::new(config.imbalance_abs_count, config.stddev_factor),
            prefix_load: PrefixLoad::new(config.prefix_load.clone()),
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
        let Some(&root) = hashes.first() else {
            return;
        };
        self.index.add(model, hashes, pod, now);
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
        };
        let choice = policy.choose(&mut PolicyInput {
            model: request.model,
            pods,
            hashes: &hashes,
            index: &self.index,
            rng,
            now,
        });
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
            },
            now,
        );
        // Only prefix-aware strategies hash: the others leave `hashes` empty.
        self.record_placement(
            request.model,
            &hashes,
            chosen.name,
            Some(&**chosen.load),
            now,
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
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::load::PodLoad;
    use crate::tokenize::{TiktokenTokenizer, TokenizerKind};

    fn request(text: &str) -> RouteRequest<'_> {
        RouteRequest {
            model: "m",
            text,
            tokens: None,
        }
    }

    /// Pods "a" and "b" with these loads.
    fn pods_a_and_b<'a>(a: &'a Arc<PodLoad>, b: &'a Arc<PodLoad>) -> [Candidate<'a>; 2] {
        [
            Candidate { name: "a", load: a },
            Candidate { name: "b", load: b },
        ]
    }

    #[test]
    fn engine_tokens_replace_the_text_tokenizer() {
        let router = Router::new(RouterConfig {
            block_size: 8,
            ..RouterConfig::default()
        })
        .unwrap();
        let bytes = crate::kv_sync::token_bytes(&[1, 2, 3, 4]);
        let request = RouteRequest {
            model: "m",
            text: "some other text entirely",
            tokens: Some(&bytes),
        };
        let text_only = RouteRequest {
            tokens: None,
            ..request
        };
        assert_eq!(
            router.request_hashes(&request).unwrap(),
            block_hashes(&bytes, 8, 0)
        );
        assert_ne!(
            router.request_hashes(&request).unwrap(),
            router.request_hashes(&text_only).unwrap()
        );
        let (a, b) = (PodLoad::new(), PodLoad::new());
        let pods = pods_a_and_b(&a, &b);
        let mut rng = StdRng::seed_from_u64(0);
        let routed = router
            .route(Strategy::PrefixCache, &request, &pods, &mut rng, 0)
            .unwrap();
        assert_eq!(routed.decision.prefix_hashes, block_hashes(&bytes, 8, 0));
    }

    #[test]
    fn families_are_recorded_only_for_prefix_load_s_family_term() {
        let (a, b) = (PodLoad::new(), PodLoad::new());
        let pods = pods_a_and_b(&a, &b);
        let served = || {
            let window = 60_000;
            a.families().count(0, window).families + b.families().count(0, window).families
        };
        // Two prompt families of at least one full block (128 bytes) each.
        let text = "first family ".repeat(20);
        let other = "second family ".repeat(20);
        let text = text.as_str();
        let mut rng = StdRng::seed_from_u64(0);
        let off = Router::new(RouterConfig::default()).unwrap();
        let routed = off.route(Strategy::PrefixLoad, &request(text), &pods, &mut rng, 0);
        drop(routed.unwrap());
        assert_eq!(served(), 0, "family term off: nothing recorded");
        let mut config = RouterConfig::default();
        config.prefix_load.family_weight = 16.0;
        let on = Router::new(config).unwrap();
        for strategy in [Strategy::LeastRequest, Strategy::Random] {
            drop(
                on.route(strategy, &request(text), &pods, &mut rng, 0)
                    .unwrap(),
            );
        }
        assert_eq!(served(), 0, "strategies that hash nothing record nothing");
        for strategy in [Strategy::PrefixLoad, Strategy::PrefixCache] {
            drop(
                on.route(strategy, &request(text), &pods, &mut rng, 0)
                    .unwrap(),
            );
            drop(
                on.route(strategy, &request(&other), &pods, &mut rng, 0)
                    .unwrap(),
            );
        }
        // Two families, each counted once per pod it went to.
        assert!((2..=4).contains(&served()), "{}", served());
    }

    #[test]
    fn hashes_given_back_route_as_the_prompt_would() {
        let router = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        let (a, b) = (PodLoad::new(), PodLoad::new());
        let pods = pods_a_and_b(&a, &b);
        let mut rng = StdRng::seed_from_u64(0);
        let first = router
            .route(
                Strategy::PrefixCache,
                &request("abcdefgh"),
                &pods,
                &mut rng,
                0,
            )
            .unwrap();
        let hashes = first.decision.prefix_hashes.clone();
        // The prompt now matches the first pod fully: a retry with the hashes taken back
        // decides as hashing the text again would.
        let again = router
            .route_with_hashes(
                Strategy::PrefixCache,
                &request("ignored, the hashes are given"),
                Some(hashes.clone()),
                &pods,
                &mut rng,
                0,
            )
            .unwrap();
        assert_eq!(again.decision.prefix_hashes, hashes);
        assert_eq!(again.decision.pod, first.decision.pod);
        assert_eq!(again.decision.match_percent, Some(100));
        // Strategies that do not hash drop them.
        let plain = router
            .route_with_hashes(
                Strategy::LeastRequest,
                &request("abcdefgh"),
                Some(hashes),
                &pods,
                &mut rng,
                0,
            )
            .unwrap();
        assert!(plain.decision.prefix_hashes.is_empty());
    }

    #[test]
    fn a_forgotten_placement_leaves_the_index_for_other_pods() {
        let router = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        let hashes = router.hashes("abcdefgh").unwrap();
        router.record_placement("m", &hashes, "a", None, 0);
        router.record_placement("m", &hashes, "b", None, 0);
        router.forget_placement("m", &hashes, "a");
        assert_eq!(
            router.index().match_blocks("m", &hashes, &["a", "b"]),
            [0, 2]
        );
        router.forget_placement("m", &hashes, "b");
        assert!(router.index().is_empty(), "a block no pod holds is dropped");
    }

    #[test]
    fn no_pod_is_an_error_naming_the_model() {
        let router = Router::new(RouterConfig::default()).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        let err = router
            .route(Strategy::PrefixCache, &request("x"), &[], &mut rng, 0)
            .unwrap_err();
        assert_eq!(err, RouteError::NoReadyPod("m".to_owned()));
    }

    #[test]
    fn a_single_pod_is_routed_without_policy_or_index() {
        let router = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        let load = PodLoad::with_outstanding(7);
        let pods = [Candidate {
            name: "only",
            load: &load,
        }];
        let mut rng = StdRng::seed_from_u64(0);
        let routed = router
            .route(
                Strategy::PrefixCache,
                &request("abcdefgh"),
                &pods,
                &mut rng,
                0,
            )
            .unwrap();
        assert_eq!(routed.decision.pod_name, "only");
        assert_eq!(routed.decision.selection, None);
        assert_eq!(routed.decision.bucket(), None);
        assert_eq!(routed.decision.outstanding_at_selection, 7);
        assert_eq!(load.outstanding(), 8);
        assert!(router.index().is_empty());
        drop(routed);
        assert_eq!(load.outstanding(), 7);
    }

    #[test]
    fn only_prefix_aware_strategies_hash_and_add() {
        let router = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        let (a, b) = (PodLoad::new(), PodLoad::new());
        let pods = pods_a_and_b(&a, &b);
        let mut rng = StdRng::seed_from_u64(0);
        for strategy in [Strategy::Random, Strategy::LeastRequest] {
            let routed = router
                .route(strategy, &request("abcdefgh"), &pods, &mut rng, 0)
                .unwrap();
            assert!(routed.decision.prefix_hashes.is_empty());
            assert_eq!(routed.decision.selection, None);
        }
        assert!(router.index().is_empty());
        let routed = router
            .route(
                Strategy::PrefixCache,
                &request("abcdefgh"),
                &pods,
                &mut rng,
                0,
            )
            .unwrap();
        assert_eq!(
            routed.decision.prefix_hashes,
            [0xe47f32a254016b00, 0xd48dd7253a12cb4b]
        );
        assert_eq!(router.index().len(), 2);
    }

    #[test]
    fn the_configured_tokenizer_and_seed_shape_the_hashes() {
        let text = "hello world, the quick brown fox jumps over the lazy dog";
        let tiktoken = Router::new(RouterConfig {
            tokenizer: TokenizerKind::Tiktoken,
            block_size: 16,
            hash_seed: 42,
            ..RouterConfig::default()
        })
        .unwrap();
        let ids = TiktokenTokenizer::cl100k_base().unwrap().ids(text);
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_be_bytes()).collect();
        let expected = block_hashes(&bytes, 16, 42);
        assert!(!expected.is_empty());
        assert_eq!(tiktoken.hashes(text).unwrap(), expected);
        let character = Router::new(RouterConfig::default()).unwrap();
        assert_ne!(character.hashes(text).unwrap(), expected);
    }

    proptest::proptest! {
        /// Every strategy picks one of the candidates, `least-request` a least-loaded one,
        /// and every count returns to its start when the guards drop.
        #[test]
        fn every_strategy_picks_a_candidate(
            counts in proptest::collection::vec(0u64..10, 2..6),
            strategy in proptest::sample::select(Strategy::ALL.to_vec()),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let router = Router::new(RouterConfig { block_size: 4, ..RouterConfig::default() })
                .unwrap();
            let loads: Vec<_> = counts.iter().map(|&c| PodLoad::with_outstanding(c)).collect();
            let names: Vec<String> = (0..counts.len()).map(|i| format!("pod-{i}")).collect();
            let pods: Vec<Candidate<'_>> = names
                .iter()
                .zip(&loads)
                .map(|(name, load)| Candidate { name, load })
                .collect();
            let mut rng = StdRng::seed_from_u64(seed);
            let routed = router
                .route(strategy, &request("abcdefgh"), &pods, &mut rng, 0)
                .unwrap();
            let pod = routed.decision.pod;
            proptest::prop_assert!(pod < counts.len());
            proptest::prop_assert_eq!(&routed.decision.pod_name, &names[pod]);
            if strategy == Strategy::LeastRequest {
                proptest::prop_assert_eq!(counts[pod], *counts.iter().min().unwrap());
            }
            drop(routed);
            let after: Vec<u64> = loads.iter().map(|load| load.outstanding()).collect();
            proptest::prop_assert_eq!(after, counts);
        }
    }

    #[test]
    fn an_invalid_config_is_refused() {
        let err = Router::new(RouterConfig {
            block_size: 0,
            ..RouterConfig::default()
        })
        .unwrap_err();
        assert_eq!(err.key, "block_size");
    }
}

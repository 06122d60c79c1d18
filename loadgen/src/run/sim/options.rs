//! How to simulate: the replicas, their engine profiles, the router's settings, the SLO and
//! the evaluation knobs that force or reveal what the seed's harness left to chance.

use mock_engine::model::EngineProfile;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use router_core::{Router, RouterConfig, cluster};

use super::cluster::{SimCluster, SimError};
use super::gateways::Gateways;
use super::sharing::DelayedSharing;
use crate::measure::Slo;
use crate::run::assignment::GatewayAssignment;

/// How to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub replicas: usize,
    pub profile: EngineProfile,
    /// Unequal replicas: when not empty, replica `i` runs `replica_profiles[i % len]`
    /// instead of `profile` (which still names the run when it is the same list's first).
    pub replica_profiles: Vec<EngineProfile>,
    /// Replica names are this prefix plus A, B, C, … (`L20-` gives the seed's `L20-A`, `L20-B`).
    pub replica_prefix: String,
    /// The served model name (routing keys the prefix index by it).
    pub model: String,
    pub router: RouterConfig,
    pub slo: Slo,
    /// Forces warm priming's routed request of family `f` onto replica `warm_owners[f]`
    /// (index into [`SimOptions::replica_names`]) by raising every other replica's
    /// outstanding count while it is routed ([`Target::RoutedOnto`]), so a load-aware route
    /// picks it. `None` (the default)
    /// leaves the owner to the route, as in the seed (a coin toss per family for
    /// `prefix-cache`). Lets a test reproduce both of the seed's warm-uniform outcomes.
    pub warm_owners: Option<Vec<usize>>,
    /// Records warm priming's direct requests in the router's prefix index too, as if the
    /// engines reported their cached blocks (KV-event sync). Off by default, as in the seed,
    /// where the gateway learns only the one owner per family that its routed priming
    /// request went to. An evaluation knob: it shows what the router's partial view of a
    /// warm cluster costs a cache-aware route.
    ///
    /// It approximates [`SimOptions::kv_sync`] and is kept to compare with it: it adds each
    /// priming prompt's text blocks the moment the prompt is sent, never forgets them (an
    /// engine eviction leaves them listed) and shows the index nothing else the engines
    /// cache. Ignored when `kv_sync` is on, where the engines' events show the priming.
    pub kv_synced_priming: bool,
    /// KV-event sync, as the gateway's `[kv_sync]`: every engine's KV-cache events (blocks
    /// stored, evicted, cleared) are applied to the router's index right after the engine
    /// step that produced them, and routed prompts are hashed on the engine's token ids
    /// (4-byte big-endian) instead of their text. The router's own index update on routing
    /// stays, as in the gateway. Needs the router's `block_size` to be a multiple of 4 × the
    /// engine's block size (the default 128 bytes is 2 blocks of 16 tokens). Off by default;
    /// off, nothing differs from a simulator without it.
    pub kv_sync: bool,
    /// Forces the first measured request of family `f` onto replica `first_owners[f]` in
    /// phases without priming (see [`Target::RoutedOnto`]); later requests are routed freely.
    /// For `prefix-cache` this fixes which replica each family lives on in `cold-uniform`,
    /// the draw that decides that cell (docs/FIDELITY.md). `None` (the default) leaves it to
    /// the route.
    pub first_owners: Option<Vec<usize>>,
    /// Which of the router's random draws a phase uses (tie-breaks, `random`'s picks): 0, the
    /// default, is the one every published figure used; another number replays the same
    /// arrivals with other coin flips, which tells a route's luck from its rule.
    pub routing_draw: u64,
    /// Gateways in front of the replicas (1 by default): each its own router, prefix index
    /// and load view, as independent gateway replicas behind a Service (`super::gateways`).
    pub gateways: usize,
    /// How routed requests are spread over the gateways.
    pub gateway_assignment: GatewayAssignment,
    /// The gateways share routing state as prefixgate's `[cluster]` does, each message
    /// reaching the others this many seconds after it is sent (`super::sharing`); `None`
    /// (the default): they share nothing.
    pub cluster_delay: Option<f64>,
}

impl SimOptions {
    /// The seed's setup: two L20-like replicas named `L20-A`, `L20-B`.
    pub fn seed_like(profile: EngineProfile) -> Self {
        SimOptions {
            replicas: 2,
            profile,
            replica_profiles: Vec::new(),
            replica_prefix: "L20-".into(),
            model: "Qwen3.8-27B-FP8".into(),
            router: RouterConfig::default(),
            slo: Slo::default(),
            warm_owners: None,
            kv_synced_priming: false,
            kv_sync: false,
            first_owners: None,
            routing_draw: 0,
            gateways: 1,
            gateway_assignment: GatewayAssignment::RoundRobin,
            cluster_delay: None,
        }
    }

    /// The engine profile's name, or the replicas' names in turn (`a, b`) when unequal.
    pub fn profile_names(&self) -> String {
        if self.replica_profiles.is_empty() {
            return self.profile.name.clone();
        }
        let names: Vec<&str> = self
            .replica_profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        names.join(", ")
    }

    /// A fresh cluster of these replicas, engines and gateways, routing with `rng`.
    pub fn cluster(&self, rng: StdRng) -> Result<SimCluster, SimError> {
        if !(1..=64).contains(&self.gateways) {
            return Err(SimError::Config(format!(
                "--gateways must be 1..=64, got {}",
                self.gateways
            )));
        }
        let routers = (0..self.gateways)
            .map(|_| Router::new(self.router.clone().for_kv_sync(self.kv_sync)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SimError::Config(format!("router configuration: {e}")))?;
        let profiles = if self.replica_profiles.is_empty() {
            std::slice::from_ref(&self.profile)
        } else {
            &self.replica_profiles
        };
        // The assignment's draws are seeded from the routing draws' generator without
        // consuming it, so one gateway routes exactly as before gateways existed.
        let draw = StdRng::seed_from_u64(rng.clone().next_u64() ^ 0x6761_7465_7761_7973);
        let mut gateways = Gateways::new(routers, self.replicas, self.gateway_assignment, draw);
        if let Some(delay) = self.cluster_delay {
            if !(delay.is_finite() && delay >= 0.0) {
                return Err(SimError::Config(format!(
                    "the cluster's propagation delay must be >= 0 seconds, got {delay}"
                )));
            }
            // Every gateway hashes alike here, on text or (with KV-event sync) engine tokens.
            let hashing = cluster::hashing_digest(&self.router, self.kv_sync);
            gateways.set_peer_sharing(Box::new(DelayedSharing::new(
                self.gateways,
                self.replica_names(),
                &self.model,
                hashing,
                delay,
            )));
        }
        let cluster =
            SimCluster::with_gateways(self.replica_names(), profiles, gateways, rng, &self.model);
        if self.kv_sync {
            cluster.with_kv_sync()
        } else {
            Ok(cluster)
        }
    }

    /// Replica names in index order.
    pub fn replica_names(&self) -> Vec<String> {
        (0..self.replicas)
            .map(|i| {
                let letter = char::from(b'A' + (i % 26) as u8);
                if i < 26 {
                    format!("{}{letter}", self.replica_prefix)
                } else {
                    format!("{}{letter}{}", self.replica_prefix, i / 26)
                }
            })
            .collect()
    }
}

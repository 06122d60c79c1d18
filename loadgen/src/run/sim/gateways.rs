//! G gateways in front of one simulated cluster, as a Kubernetes Service spreads requests over
//! several gateway replicas: each gateway has its own router (prefix index, policies), its own
//! view of every replica's load (the outstanding counts of the requests *it* routed, the
//! engine gauges *it* scraped) and, with KV-event sync, its own subscription to every engine.
//! A routed request goes to the next gateway in turn, or to one drawn at random.
//!
//! Without shared state the gateways are independent, as prefixgate's are today. What one
//! gateway could tell the others is named here ([`GatewayEvent`]: a decision, a first token,
//! an end) and handed, on the virtual clock, to a [`PeerSharing`]: the seam where shared
//! routing state with a propagation delay plugs in. [`Independent`] shares nothing;
//! [`super::sharing::DelayedSharing`] shares as prefixgate's `[cluster]` does, each message
//! reaching the other gateways a fixed delay later.

use std::fmt::Debug;
use std::sync::Arc;

use rand::rngs::StdRng;
use router_core::load::RequestWork;
use router_core::{Decision, PodLoad, Router};

use super::kv_sync::{ClusterSync, KvSyncStats};
use crate::run::assignment::{Assigner, GatewayAssignment};

/// One gateway's routing state.
#[derive(Debug)]
pub struct SimGateway {
    pub router: Router,
    /// Its view of each replica's load, indexed like the cluster's engines.
    pub loads: Vec<Arc<PodLoad>>,
    /// Its KV-event subscriptions, when sync is on.
    pub sync: Option<ClusterSync>,
}

/// What one gateway could tell the others about request `request` (numbered across the
/// cluster) it routed to replica `pod`.
#[derive(Debug, Clone, Copy)]
pub enum GatewayEvent<'a> {
    /// It chose `pod` (the decision holds the prompt's block hashes when the route read the
    /// index), and the request holds `work` there in its own load view.
    Decided {
        request: u64,
        pod: usize,
        decision: &'a Decision,
        work: RequestWork,
    },
    /// The request's first token arrived (its prefill is over).
    FirstToken { request: u64, pod: usize },
    /// The request's stream clock recorded `tokens` streamed.
    Progress { request: u64, tokens: u64 },
    /// The request ended (its outstanding count is released).
    Ended { request: u64, pod: usize },
}

/// Shares gateways' routing state on the virtual clock. The event loop publishes every
/// [`GatewayEvent`] of gateway `from` when it happens, wakes up at [`PeerSharing::next_delivery`],
/// and calls [`PeerSharing::deliver`] there, after the engines' tokens and before arrivals.
pub trait PeerSharing: Debug {
    /// Gateway `from` saw `event` at virtual time `now`.
    fn publish(&mut self, from: usize, event: GatewayEvent<'_>, now: f64);
    /// The earliest time an event published so far is due at another gateway.
    fn next_delivery(&self) -> Option<f64>;
    /// Applies every event due at or before `now` to the gateways it is for.
    fn deliver(&mut self, now: f64, gateways: &mut [SimGateway]);
}

/// Gateways that share nothing (prefixgate without a cluster store).
#[derive(Debug, Default)]
pub struct Independent;

impl PeerSharing for Independent {
    fn publish(&mut self, _from: usize, _event: GatewayEvent<'_>, _now: f64) {}

    fn next_delivery(&self) -> Option<f64> {
        None
    }

    fn deliver(&mut self, _now: f64, _gateways: &mut [SimGateway]) {}
}

/// The G gateways, how requests are spread over them, and what they share.
#[derive(Debug)]
pub struct Gateways {
    list: Vec<SimGateway>,
    assigner: Assigner,
    peers: Box<dyn PeerSharing>,
}

impl Gateways {
    /// One gateway per router, each with its own load view of `replicas` replicas.
    pub fn new(
        routers: Vec<Router>,
        replicas: usize,
        assignment: GatewayAssignment,
        draw: StdRng,
    ) -> Self {
        let assigner = Assigner::new(routers.len(), assignment, draw);
        Gateways {
            list: routers
                .into_iter()
                .map(|router| SimGateway {
                    router,
                    loads: (0..replicas).map(|_| PodLoad::new()).collect(),
                    sync: None,
                })
                .collect(),
            assigner,
            peers: Box::new(Independent),
        }
    }

    /// Replaces what the gateways share (default: [`Independent`]).
    pub fn set_peer_sharing(&mut self, peers: Box<dyn PeerSharing>) {
        self.peers = peers;
    }

    /// The gateway the next routed request goes to.
    pub fn assign(&mut self) -> usize {
        self.assigner.next_gateway()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn get(&self, gateway: usize) -> Option<&SimGateway> {
        self.list.get(gateway)
    }

    pub fn iter(&self) -> impl Iterator<Item = &SimGateway> {
        self.list.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut SimGateway> {
        self.list.iter_mut()
    }

    /// Gateway `from` saw `event` now.
    pub fn publish(&mut self, from: usize, event: GatewayEvent<'_>, now: f64) {
        self.peers.publish(from, event, now);
    }

    /// When shared state is next due somewhere.
    pub fn next_delivery(&self) -> Option<f64> {
        self.peers.next_delivery()
    }

    /// Delivers shared state due by `now`.
    pub fn deliver(&mut self, now: f64) {
        self.peers.deliver(now, &mut self.list);
    }

    /// What KV-event sync applied, over every gateway's subscriptions (`None` when off).
    pub fn kv_sync_stats(&self) -> Option<KvSyncStats> {
        let mut total: Option<KvSyncStats> = None;
        for sync in self.list.iter().filter_map(|g| g.sync.as_ref()) {
            total
                .get_or_insert_with(KvSyncStats::default)
                .absorb(sync.stats());
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// `family`'s prompt of ~600 words, with its own tail word `tail`.
    fn prompt(family: &str, tail: usize) -> String {
        let words: Vec<String> = (0..600).map(|i| format!("{family}{}", i % 7)).collect();
        format!("{} t{tail}", words.join(" "))
    }

    /// Sends `n` requests of one family one after the other through a cluster of `gateways`
    /// gateways and returns each decision's match percentage.
    fn matches(gateways: usize, kv_sync: bool, n: usize) -> Vec<Option<u8>> {
        let profile = mock_engine::model::EngineProfile::builtin("fast").unwrap();
        let mut options = super::super::SimOptions::seed_like(profile);
        options.gateways = gateways;
        options.kv_sync = kv_sync;
        let mut cluster = options.cluster(StdRng::seed_from_u64(3)).unwrap();
        let route = super::super::Target::Routed(router_core::Strategy::PrefixCache);
        let found = (0..n)
            .map(|i| {
                let served = cluster.run_one(prompt("w", i), 2, route).unwrap();
                served.decision.and_then(|d| d.match_percent)
            })
            .collect();
        assert_eq!(cluster.outstanding(), vec![0, 0]);
        found
    }

    #[test]
    fn each_gateway_knows_only_what_it_routed_unless_engines_tell_it() {
        // One gateway: the second request of the family matches what the first placed.
        let one = matches(1, false, 3);
        assert_eq!(one[0], Some(0));
        assert!(
            one[1..].iter().all(|m| m.is_some_and(|p| p >= 90)),
            "{one:?}"
        );
        // Two gateways, round-robin: the second request reaches the other gateway, whose
        // index has never seen the family; the third is back on the first gateway.
        let two = matches(2, false, 3);
        assert_eq!(two[..2], [Some(0), Some(0)]);
        assert!(two[2].is_some_and(|p| p >= 90), "{two:?}");
        // With KV-event sync every gateway subscribes to every engine, so the second
        // gateway learns the engine's blocks too.
        let synced = matches(2, true, 3);
        assert!(synced[1].is_some_and(|p| p >= 90), "{synced:?}");
    }
}

//! Gateways that share routing state as prefixgate's `[cluster]` does (docs/CLUSTER.md), on
//! the virtual clock: every decision, first token, stream-clock point and end a gateway
//! publishes becomes the same [`PeerMessage`] the gateway writes to its Redis stream, and
//! reaches every other gateway a fixed propagation delay later, in publishing order (one
//! ordered stream), where router-core's [`PeerTable`] applies it exactly as the gateway's
//! read task does: the decision's blocks into that gateway's prefix index, its work onto the
//! pod's peer load until its first token and end arrive, its stream clock in between.
//!
//! What the gateway does besides is not simulated because nothing here needs it: messages
//! are never dropped or lost, so heartbeats (which drop requests whose release was lost)
//! and peer expiry (a silent peer's requests forgotten) would change nothing.

use std::collections::VecDeque;

use router_core::cluster::{Decided, PeerEvent, PeerMessage, PeerTable, WIRE_VERSION};

use super::gateways::{GatewayEvent, PeerSharing, SimGateway};

/// A peer silent this long is forgotten (the gateway's `peer_timeout_ms` default); never
/// reached here, where expiry is not run (see the module docs).
const PEER_TIMEOUT_MS: u64 = 5_000;

/// Shared routing state with a fixed propagation delay (see the module docs).
#[derive(Debug)]
pub struct DelayedSharing {
    /// Seconds from publishing to applying.
    delay: f64,
    /// Replica names in index order (messages name pods as the gateway's do).
    names: Vec<String>,
    model: String,
    hashing: u64,
    /// Each gateway's table of its peers' requests, indexed like the gateways.
    tables: Vec<PeerTable>,
    /// Published messages not yet applied, in publishing order, with their sender and the
    /// time they are due.
    in_transit: VecDeque<(f64, usize, PeerMessage)>,
}

/// The gateway id gateway `g` publishes under.
fn gateway_id(g: usize) -> String {
    format!("gw-{g}")
}

impl DelayedSharing {
    /// Sharing among `gateways` gateways routing `model` on replicas `names`, whose prompts
    /// all hash alike (`hashing`, router-core's `cluster::hashing_digest`), each message
    /// applied `delay` seconds after it is published.
    pub fn new(gateways: usize, names: Vec<String>, model: &str, hashing: u64, delay: f64) -> Self {
        DelayedSharing {
            delay,
            names,
            model: model.to_owned(),
            hashing,
            tables: (0..gateways)
                .map(|g| PeerTable::new(&gateway_id(g), hashing, PEER_TIMEOUT_MS))
                .collect(),
            in_transit: VecDeque::new(),
        }
    }

    /// The message gateway `from` writes for `event`.
    fn message(&self, from: usize, event: GatewayEvent<'_>) -> PeerMessage {
        let event = match event {
            GatewayEvent::Decided {
                request,
                pod,
                decision,
                work,
            } => PeerEvent::Decided(Decided::new(
                request,
                &self.model,
                self.names.get(pod).map_or("", String::as_str),
                &decision.prefix_hashes,
                work,
            )),
            GatewayEvent::FirstToken { request, .. } => PeerEvent::FirstByte { id: request },
            GatewayEvent::Progress { request, tokens } => PeerEvent::Progress {
                id: request,
                tokens,
            },
            GatewayEvent::Ended { request, .. } => PeerEvent::Released { id: request },
        };
        PeerMessage {
            v: WIRE_VERSION,
            gateway: gateway_id(from),
            hashing: self.hashing,
            event,
        }
    }
}

impl PeerSharing for DelayedSharing {
    fn publish(&mut self, from: usize, event: GatewayEvent<'_>, now: f64) {
        let message = self.message(from, event);
        // One ordered stream: a message is never due before one published earlier (an
        // engine's first token can be published with a time a little before the decision
        // just published by another engine's step).
        let due = self
            .in_transit
            .back()
            .map_or(now + self.delay, |(last, _, _)| last.max(now + self.delay));
        self.in_transit.push_back((due, from, message));
    }

    fn next_delivery(&self) -> Option<f64> {
        self.in_transit.front().map(|(due, _, _)| *due)
    }

    fn deliver(&mut self, now: f64, gateways: &mut [SimGateway]) {
        let now_ms = (now * 1000.0) as u64;
        while let Some((due, _, _)) = self.in_transit.front()
            && *due <= now
        {
            let Some((_, from, message)) = self.in_transit.pop_front() else {
                break;
            };
            for (g, (table, gateway)) in self.tables.iter_mut().zip(gateways.iter()).enumerate() {
                // The stream delivers a message back to its sender too, which skips it.
                if g == from {
                    continue;
                }
                let pod = |name: &str| {
                    let i = self.names.iter().position(|n| n == name)?;
                    gateway.loads.get(i).cloned()
                };
                table.apply(&message, &gateway.router, &pod, now_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use router_core::Strategy;

    use super::super::{Arrival, Served, SimOptions, Target};
    use crate::workload::{PlannedRequest, Prompt};

    /// `family`'s prompt of ~600 words, with its own tail word `tail`.
    fn prompt(family: &str, tail: usize) -> String {
        let words: Vec<String> = (0..600).map(|i| format!("{family}{}", i % 7)).collect();
        format!("{} t{tail}", words.join(" "))
    }

    /// Sends `prompts` at their times (seconds) through two round-robin gateways sharing
    /// with `delay` (or not at all), with routing draw `draw`; every request is done after.
    fn serve(
        delay: Option<f64>,
        draw: u64,
        strategy: Strategy,
        prompts: Vec<(f64, String)>,
    ) -> Vec<Served> {
        // The seed's engine, whose prefill of these prompts takes longer than 10 ms.
        let profile = mock_engine::model::EngineProfile::builtin("l20-qwen27b-fp8").unwrap();
        let mut options = SimOptions::seed_like(profile);
        options.gateways = 2;
        options.cluster_delay = delay;
        let mut cluster = options.cluster(StdRng::seed_from_u64(draw)).unwrap();
        let arrivals = prompts
            .into_iter()
            .enumerate()
            .map(|(index, (at, text))| Arrival {
                request: PlannedRequest {
                    index,
                    family: 0,
                    at,
                    prompt: Prompt::Text(text),
                    max_tokens: 64,
                },
                target: Target::Routed(strategy),
            })
            .collect();
        let served = cluster.drive(arrivals, None).unwrap();
        assert_eq!(cluster.outstanding(), vec![0, 0]);
        // A request straight to an engine a second later runs the clock past the delivery of
        // the last messages: then no gateway holds any of its peers' requests.
        let later = Arrival {
            request: PlannedRequest {
                index: served.len(),
                family: 0,
                at: cluster.now() + 1.0,
                prompt: Prompt::Text("later".into()),
                max_tokens: 1,
            },
            target: Target::Direct(0),
        };
        cluster.drive(vec![later], None).unwrap();
        for gateway in cluster.gateways().iter() {
            for load in &gateway.loads {
                assert_eq!(load.shared_outstanding(), 0);
            }
        }
        served
    }

    fn pod(served: &Served) -> &str {
        served.record.target_pod.as_deref().unwrap()
    }

    #[test]
    fn a_familys_second_request_follows_the_first_once_its_decision_arrived() {
        // The second request reaches the other gateway 10 ms after the first, long before any
        // engine could report the first's blocks (no KV-event sync here anyway).
        let pair = || vec![(0.0, prompt("w", 0)), (0.010, prompt("w", 1))];
        let matched = |served: &[Served]| served[1].decision.as_ref().unwrap().match_percent;
        // Shared and arrived after 1 ms: it follows the first, matching its prompt.
        let shared = serve(Some(0.001), 3, Strategy::PrefixCache, pair());
        assert_eq!(pod(&shared[1]), pod(&shared[0]));
        assert!(
            matched(&shared).is_some_and(|p| p >= 90),
            "{:?}",
            matched(&shared)
        );
        // Still on its way (100 ms), or not shared: the other gateway has never seen it.
        let late = serve(Some(0.100), 3, Strategy::PrefixCache, pair());
        assert_eq!(matched(&late), Some(0));
        let alone = serve(None, 3, Strategy::PrefixCache, pair());
        assert_eq!(matched(&alone), Some(0));
    }

    #[test]
    fn peers_requests_count_on_their_replica_until_they_end() {
        // Two requests 10 ms apart through the two gateways, least-request: the second's
        // gateway counts the first (its decision arrived after 1 ms) and so picks the other
        // replica, whatever the draw. Alone it sees 0 and 0 and the tie-break decides.
        let pair = || vec![(0.0, prompt("a", 0)), (0.010, prompt("b", 1))];
        let split = |delay| {
            (0..16)
                .filter(|&draw| {
                    let served = serve(delay, draw, Strategy::LeastRequest, pair());
                    pod(&served[0]) != pod(&served[1])
                })
                .count()
        };
        assert_eq!(split(Some(0.001)), 16);
        assert!(split(None) < 16, "the tie-break alone split every pair");
    }
}

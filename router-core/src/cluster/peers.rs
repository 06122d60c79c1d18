//! [`PeerTable`]: the other gateways' requests in flight, as told by their messages.
//!
//! Each peer's routed requests are held as [`InFlight`]s on the pods' peer loads
//! ([`PodLoad::peers_or_init`]), so a peer's request counts exactly as a local one does
//! (outstanding, active blocks, pending prefill until its first byte, the prefix's count
//! and copy mark), and letting go of it is dropping its guard. The rules:
//! - `decided`: its blocks are recorded in the index for its pod (as a local decision's
//!   are), and its work is counted on the pod's peer load until its release;
//! - `first_byte`: its pending prefill and copy mark end (as a local request's do), and its
//!   stream clock starts;
//! - `progress`: its stream clock records the tokens streamed, at arrival;
//! - `released`: its guard drops;
//! - `heartbeat`: the peer is alive, and any of its requests the heartbeat does not list is
//!   dropped (its release was lost on the way: the sender lists a request from before it
//!   publishes the decision until before it publishes the release, so on one ordered
//!   stream a listed request is never one already released);
//! - **expiry**: a peer not heard from (any message) for the table's timeout is forgotten,
//!   with all its requests. A gateway that died, or a server that went away, thus leaves
//!   no load behind: after the timeout every gateway routes on its own view again.
//!
//! Messages from the table's own gateway are skipped (a stream delivers them back), and so
//! are those whose hashing digest differs (their blocks would never match ours, and counting
//! their load under names that may not mean the same replicas is guesswork).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::message::{Decided, PeerEvent, PeerMessage};
use crate::Millis;
use crate::load::{InFlight, PodLoad};
use crate::router::Router;

/// The other gateways' requests in flight (see the module docs).
#[derive(Debug)]
pub struct PeerTable {
    me: String,
    hashing: u64,
    timeout: Millis,
    peers: HashMap<String, Peer>,
}

#[derive(Debug, Default)]
struct Peer {
    last_heard: Millis,
    /// Its requests counted here, by its request id. `None`: the pod is not one of ours
    /// (yet), so only its blocks were recorded.
    in_flight: HashMap<u64, Option<InFlight>>,
}

/// What applying one message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Ignored(Ignored),
}

/// Why a message changed nothing (or less than it names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// This gateway sent it.
    Own,
    /// The sender hashes prompts differently.
    OtherHashing,
    /// A first byte or release of a request not (or no longer) held.
    UnknownRequest,
    /// A decision for a pod this gateway does not route to: its blocks were recorded, its
    /// load not counted.
    UnknownPod,
}

impl Ignored {
    /// A label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::Own => "own",
            Ignored::OtherHashing => "other_hashing",
            Ignored::UnknownRequest => "unknown_request",
            Ignored::UnknownPod => "unknown_pod",
        }
    }
}

impl PeerTable {
    /// The table of gateway `me`, whose hashing digest is `hashing`, forgetting a peer not
    /// heard from for `timeout`.
    pub fn new(me: &str, hashing: u64, timeout: Millis) -> Self {
        PeerTable {
            me: me.to_owned(),
            hashing,
            timeout,
            peers: HashMap::new(),
        }
    }

    /// Applies one message received at `now`. `pod` finds the load of a pod this gateway
    /// routes to, by name.
    pub fn apply(
        &mut self,
        message: &PeerMessage,
        router: &Router,
        pod: &dyn Fn(&str) -> Option<Arc<PodLoad>>,
        now: Millis,
    ) -> Outcome {
        if message.gateway == self.me {
            return Outcome::Ignored(Ignored::Own);
        }
        if message.hashing != self.hashing {
            return Outcome::Ignored(Ignored::OtherHashing);
        }
        let peer = self.peers.entry(message.gateway.clone()).or_default();
        peer.last_heard = peer.last_heard.max(now);
        match &message.event {
            PeerEvent::Decided(decided) => peer.decided(decided, router, pod, now),
            PeerEvent::FirstByte { id } => match peer.in_flight.get_mut(id) {
                Some(Some(guard)) => {
                    guard.first_byte(now);
                    Outcome::Applied
                }
                Some(None) => Outcome::Ignored(Ignored::UnknownPod),
                None => Outcome::Ignored(Ignored::UnknownRequest),
            },
            PeerEvent::Progress { id, tokens } => match peer.in_flight.get_mut(id) {
                Some(Some(guard)) => {
                    guard.advance(*tokens, || now);
                    Outcome::Applied
                }
                Some(None) => Outcome::Ignored(Ignored::UnknownPod),
                None => Outcome::Ignored(Ignored::UnknownRequest),
            },
            PeerEvent::Released { id } => match peer.in_flight.remove(id) {
                Some(_) => Outcome::Applied,
                None => Outcome::Ignored(Ignored::UnknownRequest),
            },
            PeerEvent::Heartbeat { in_flight } => {
                let listed: HashSet<u64> = in_flight.iter().copied().collect();
                peer.in_flight.retain(|id, _| listed.contains(id));
                Outcome::Applied
            }
        }
    }

    /// Forgets the peers not heard from for longer than the timeout, with their requests;
    /// returns their ids.
    pub fn expire(&mut self, now: Millis) -> Vec<String> {
        let timeout = self.timeout;
        let expired: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, peer)| now.saturating_sub(peer.last_heard) > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.peers.remove(id);
        }
        expired
    }

    /// Peers heard from within the timeout (as of the last [`expire`](Self::expire)).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The peers' requests held here.
    pub fn in_flight(&self) -> usize {
        self.peers.values().map(|peer| peer.in_flight.len()).sum()
    }
}

impl Peer {
    fn decided(
        &mut self,
        decided: &Decided,
        router: &Router,
        pod: &dyn Fn(&str) -> Option<Arc<PodLoad>>,
        now: Millis,
    ) -> Outcome {
        let load = pod(&decided.pod);
        router.record_placement(
            &decided.model,
            &decided.hashes,
            &decided.pod,
            load.as_deref(),
            now,
        );
        let guard = load.map(|load| load.peers_or_init().acquire_work(decided.work()));
        let counted = guard.is_some();
        // A repeated id replaces (and so releases) the earlier request: ids are per sender
        // process, and a sender restarted under the same id starts over.
        self.in_flight.insert(decided.id, guard);
        if counted {
            Outcome::Applied
        } else {
            Outcome::Ignored(Ignored::UnknownPod)
        }
    }
}

//! Several gateways, one view: what one gateway tells the others of its cluster, and how a
//! gateway applies what it is told.
//!
//! Production runs several gateway replicas behind one Service. Each has its own prefix
//! index and its own outstanding counts, so a family's second request can reach a gateway
//! that has not seen the first, while the first is still prefilling (before any engine
//! event could tell anyone), and both gateways pay a cold prefill on two replicas. What a
//! gateway lacks is the others' decisions in flight. So each gateway publishes, per
//! request, three [`PeerEvent`]s (decided → first byte → released) and a heartbeat, and
//! every other gateway of the cluster applies them:
//! - a decision's blocks go into the receiver's prefix index for the chosen pod, exactly as
//!   its own decisions do ([`Router::record_placement`](crate::Router::record_placement));
//! - the decision's work (outstanding count, active blocks, pending prefill, the prefix's
//!   count and copy mark) is held against the pod's peer load ([`PodLoad::peers`]) by a
//!   guard the [`PeerTable`] keeps until the peer's first byte and release arrive;
//! - policies read local plus peers' load through the `shared_*` views ([`shared_load`]).
//!
//! **No phantom load.** A peer's requests are dropped when its release arrives, when its
//! heartbeat no longer lists them (a release lost on the way), or, all of them, when nothing
//! has been heard from the peer for the table's timeout (a gateway that died, or a server
//! that is unreachable: then each gateway routes on its own view again).
//!
//! This module is the pure part, used by the gateway (messages from Redis) and by the
//! simulator (messages delivered after a delay on the virtual clock) alike; it never touches
//! a socket or a clock. Wire format: [`message`].

pub mod message;
mod peers;
mod shared_load;

pub use message::{Decided, PeerEvent, PeerMessage, WIRE_VERSION, WireError, decode, encode};
pub use peers::{Ignored, Outcome, PeerTable};

use crate::config::RouterConfig;

/// A digest of the settings that shape block hashes (tokenizer, block size, seed, and
/// whether prompts are hashed on the engine's tokens). Gateways whose digests differ cannot
/// share blocks: a receiver ignores a message whose digest is not its own.
pub fn hashing_digest(config: &RouterConfig, engine_tokens: bool) -> u64 {
    let settings = format!(
        "tokenizer={:?};block_size={};seed={};engine_tokens={engine_tokens}",
        config.tokenizer, config.block_size, config.hash_seed
    );
    xxhash_rust::xxh64::xxh64(settings.as_bytes(), 0)
}

#[cfg(test)]
mod tests;

//! The message a gateway publishes to its cluster, and its wire format.
//!
//! **Wire format, version 1.** One message is one MessagePack map (rmp-serde, fields by
//! name), in a Redis stream entry's `m` field:
//!
//! ```text
//! { "v": 1,                         WIRE_VERSION of the sender
//!   "gateway": "gw-a-3f9c",         the sender's id
//!   "hashing": u64,                 digest of its hashing settings (cluster::hashing_digest)
//!   "event": { "decided": { "id": u64, "model": str, "pod": str, "hashes": [u64, …],
//!                           "prefill_blocks": u64, "shared_prefix": u64 | nil,
//!                           "copies_prefix": bool, "max_tokens": u64 | nil } }
//!          | { "first_byte": { "id": u64 } }
//!          | { "progress": { "id": u64, "tokens": u64 } }
//!          | { "released": { "id": u64 } }
//!          | { "heartbeat": { "in_flight": [u64, …] } } }
//! ```
//!
//! `id` numbers the sender's requests (unique per sender process); `hashes` are the
//! request's full-block hashes as the sender's router computed them (empty for a strategy
//! that does not hash); `heartbeat.in_flight` lists the ids the sender still has in flight.
//!
//! Why MessagePack: a decision carries one 64-bit hash per prompt block (hundreds for a long
//! prompt), which MessagePack writes in 9 bytes each against up to 20 digits in JSON (and
//! JSON readers in other languages round 64-bit integers); it is self-describing, so fields
//! are read by name and a field added later is ignored by older readers; and the
//! implementation (rmp) is already in the build for vLLM's KV events.
//!
//! Compatibility: a field may be added without changing `v` (readers ignore unknown fields
//! and new optional fields have defaults); anything a version-1 reader would misread changes
//! `v`, and a reader refuses a version it does not know ([`WireError::Version`]).
//!
//! **Rolling upgrades.** `max_tokens` and `progress` came later within version 1. A reader
//! from before them ignores `max_tokens` and cannot decode a `progress` event: it counts it
//! as an error (`prefixgate_cluster_errors_total{error="decode"}`) and goes on. So a mixed
//! cluster shares everything else, and only the older gateways lack their peers' stream
//! clocks (their slot waits for those requests fall back to the mean turnover) until every
//! gateway runs the newer build.

use serde::{Deserialize, Serialize};

use crate::load::RequestWork;

/// The wire version this build writes and reads.
pub const WIRE_VERSION: u32 = 1;

/// One message from one gateway to the others of its cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMessage {
    /// The sender's [`WIRE_VERSION`].
    pub v: u32,
    /// The sender's gateway id.
    pub gateway: String,
    /// The sender's [`hashing_digest`](super::hashing_digest).
    pub hashing: u64,
    pub event: PeerEvent,
}

/// What happened at the sender.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerEvent {
    /// A request was routed.
    Decided(Decided),
    /// The request's first response byte arrived: its prefill is done.
    FirstByte { id: u64 },
    /// The request's response had streamed `tokens` tokens (a point of its stream clock).
    Progress { id: u64, tokens: u64 },
    /// The request ended (finished, failed, cancelled or retried elsewhere).
    Released { id: u64 },
    /// The sender is alive; these are its requests in flight.
    Heartbeat { in_flight: Vec<u64> },
}

/// A routed request as its peers need it: where it went and the work it brought there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decided {
    pub id: u64,
    pub model: String,
    /// The chosen pod's name (replica names must agree across the cluster).
    pub pod: String,
    /// The request's full-block hashes; empty when its strategy does not hash.
    pub hashes: Vec<u64>,
    /// Blocks the pod is expected to prefill for it (pending until its first byte).
    pub prefill_blocks: u64,
    /// The prefix it shares with earlier requests (see [`RequestWork::shared_prefix`]).
    pub shared_prefix: Option<u64>,
    /// It copies that prefix to the pod (see [`RequestWork::copies_prefix`]).
    pub copies_prefix: bool,
    /// The most tokens it may answer (see [`RequestWork::max_tokens`]); absent from
    /// senders that predate it.
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

impl Decided {
    /// The request `id` of `model`, routed to `pod` with `hashes` and holding `work`.
    pub fn new(id: u64, model: &str, pod: &str, hashes: &[u64], work: RequestWork) -> Self {
        Decided {
            id,
            model: model.to_owned(),
            pod: pod.to_owned(),
            hashes: hashes.to_vec(),
            prefill_blocks: work.prefill_blocks,
            shared_prefix: work.shared_prefix,
            copies_prefix: work.copies_prefix,
            max_tokens: work.max_tokens,
        }
    }

    /// The work the request holds on its pod, to count it there as the sender does.
    pub fn work(&self) -> RequestWork {
        RequestWork {
            blocks: self.hashes.len() as u64,
            prefill_blocks: self.prefill_blocks,
            shared_prefix: self.shared_prefix,
            copies_prefix: self.copies_prefix,
            max_tokens: self.max_tokens,
        }
    }
}

/// Why bytes are not a message this build can apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not a version-1 message (and no readable version either).
    #[error("not a prefixgate cluster message: {0}")]
    Malformed(String),
    /// A version this build does not read (a newer gateway in the cluster).
    #[error(
        "cluster message version {0} is not understood (this gateway reads version {WIRE_VERSION})"
    )]
    Version(u32),
    /// The message could not be written (not expected for these types).
    #[error("cannot encode a cluster message: {0}")]
    Encode(String),
}

/// The message's bytes (see the module docs).
pub fn encode(message: &PeerMessage) -> Result<Vec<u8>, WireError> {
    rmp_serde::to_vec_named(message).map_err(|error| WireError::Encode(error.to_string()))
}

/// A message from its bytes; another version, or bytes that are no message, are refused.
pub fn decode(bytes: &[u8]) -> Result<PeerMessage, WireError> {
    /// Enough of any version to name it.
    #[derive(Deserialize)]
    struct Versioned {
        v: u32,
    }
    match rmp_serde::from_slice::<PeerMessage>(bytes) {
        Ok(message) if message.v == WIRE_VERSION => Ok(message),
        Ok(message) => Err(WireError::Version(message.v)),
        Err(error) => match rmp_serde::from_slice::<Versioned>(bytes) {
            Ok(Versioned { v }) if v != WIRE_VERSION => Err(WireError::Version(v)),
            _ => Err(WireError::Malformed(error.to_string())),
        },
    }
}

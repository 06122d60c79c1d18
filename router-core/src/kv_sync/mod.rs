//! KV-event sync: the prefix index learns what the engines really cache.
//!
//! Without it the index knows a pod's blocks only from the gateway's own routing, so blocks
//! an engine got another way (warm priming, another gateway, a restart) never match, and
//! blocks it evicted still do. With it, each engine's vLLM KV-cache events (`BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`) are turned into the router's own block hashes and
//! added to or removed from the same [`crate::index::PrefixIndex`] the policies read
//! (AIBrix's `using_kv_sync="true"` mode, with its bugs fixed: see [`pod_sync`]).
//!
//! - [`wire`]: vLLM's wire format, in one place: the msgpack payload of one ZMQ message ↔
//!   [`KvEvent`]s (no sockets here), in vLLM's positional and newer named-field (map)
//!   forms, decoded here and encoded by the mock engine;
//! - [`pod_sync`]: one pod's engine-block → router-block map, applied to the index;
//! - [`rank_holders`]: which data-parallel ranks of a pod hold each router block (a DP pod's
//!   index entry is the union of its ranks).
//!
//! The request side must hash the same bytes the events carry: token ids as 4-byte
//! big-endian, so the gateway tokenizes with the engine (`/tokenize`) and passes the ids in
//! [`crate::RouteRequest::tokens`]. The socket, replay and reconnect logic is the gateway's.

use std::borrow::Cow;

pub mod pod_sync;
pub mod rank_holders;
pub mod wire;

pub use pod_sync::{Applied, DEFAULT_MAX_ENGINE_BLOCKS, PodSync, SyncError, SyncSettings};
pub use rank_holders::MAX_DP_RANKS;
pub use wire::{EventBatch, EventFormat, KvEvent, WireError, decode_batch, encode_batch};

/// The models a `BlockStored` is indexed under: a LoRA adapter's blocks under the adapter's
/// name only, the base model's under every model the pod serves (`served`).
///
/// vLLM hashes a LoRA request's blocks with the adapter's name (its `extra_keys`), so they
/// serve only requests for that adapter, and vLLM's OpenAI server takes the adapter's name
/// as the request's `model`, which is what the index is keyed by. The base model's blocks
/// stay under every served name because a replica's model list does not say which names
/// are adapters.
pub fn index_models<'a>(lora_name: Option<&str>, served: &'a [String]) -> Cow<'a, [String]> {
    match lora_name {
        Some(adapter) => Cow::Owned(vec![adapter.to_owned()]),
        None => Cow::Borrowed(served),
    }
}

/// Token ids as the byte stream the router hashes (4 bytes big-endian each, AIBrix's
/// remote-tokenizer layout).
pub fn token_bytes(ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|id| id.to_be_bytes()).collect()
}

#[cfg(test)]
mod forms_tests;
#[cfg(test)]
mod ranks_tests;
#[cfg(test)]
mod tests;

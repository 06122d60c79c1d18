//! `session-affinity`: AIBrix's session routing, exactly, and the session a request names,
//! which `prefix-load` also weighs ([`super::prefix_load`]).
//!
//! A request names its session by either of two headers, read in this order:
//! 1. `x-session-id`, gateway-issued: base64 of the `ip:port` of the pod that served the
//!    session's last turn ([`session_id`]). When it names a ready pod, that pod is the
//!    session's; a value that does not decode or names no ready pod is ignored (the pod left
//!    or restarted with another address), and the request is routed as if it had none.
//! 2. `x-aibrix-session-key`, caller-owned and opaque: 1 to [`MAX_SESSION_KEY_BYTES`] bytes,
//!    mapped onto the ready pods by rendezvous hashing ([`rendezvous`]), so it needs no state
//!    and every gateway maps it alike. A longer or empty key is ignored, as AIBrix ignores it
//!    (its load generator warns that the gateway "drops session keys longer than this and
//!    silently falls back"): a client of AIBrix gets no error for one, so none gets one here.
//!
//! With neither, `session-affinity` picks a ready pod uniformly at random (AIBrix's
//! fallback). Whatever pod serves the request, the gateway answers with a fresh
//! `x-session-id` naming it. AIBrix can also pin keys in Redis; prefixgate does not: without
//! that, AIBrix too maps a key by rendezvous alone, and rendezvous already agrees across
//! gateways.

use rand::Rng;

use super::{Choice, Policy, PolicyInput};
use crate::load::Candidate;

pub mod rendezvous;
pub mod session_id;

/// The longest `x-aibrix-session-key` honoured, in bytes (AIBrix's `maxSessionKeyLen`).
pub const MAX_SESSION_KEY_BYTES: usize = 256;

/// The session headers of a request, as received (absent when not sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session<'a> {
    /// `x-session-id`.
    pub id: Option<&'a [u8]>,
    /// `x-aibrix-session-key`.
    pub key: Option<&'a [u8]>,
}

impl Session<'_> {
    /// The key, when it is one AIBrix honours (1 to 256 bytes).
    fn valid_key(&self) -> Option<&[u8]> {
        self.key
            .filter(|key| !key.is_empty() && key.len() <= MAX_SESSION_KEY_BYTES)
    }

    /// The index of the session's pod among `pods` (the ready ones), if the request names a
    /// session that lands on one: the pod its `x-session-id` names, else its key's.
    pub fn pod(&self, pods: &[Candidate<'_>]) -> Option<usize> {
        let named = self
            .id
            .and_then(session_id::decode)
            .and_then(|address| pods.iter().position(|pod| pod.address == address));
        named.or_else(|| {
            self.valid_key()
                .and_then(|key| rendezvous::rendezvous(key, pods))
        })
    }
}

/// `session-affinity`: the session's pod, else a uniformly random one.
#[derive(Debug, Default)]
pub struct SessionAffinity;

impl Policy for SessionAffinity {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        let pod = input
            .session
            .pod(input.pods)
            .unwrap_or_else(|| input.rng.random_range(0..input.pods.len()));
        Choice::plain(pod)
    }
}

#[cfg(test)]
pub(crate) mod tests;

//! A pod's decoding requests, and when each is expected to end: the stream clock that tells
//! how soon a full batch frees its next slot.
//!
//! A request that has answered its first byte holds a batch slot until its last token. The
//! gateway knows how many tokens it may stream (`max_tokens`) and counts the ones it has
//! passed on (SSE events, [`InFlight::advance`](super::InFlight::advance)), so each stream
//! has its own clock: its pace so far (time from its first to its latest recorded token over
//! the tokens between) and the tokens it has left. Its end is expected
//! `(max_tokens − tokens) × pace − (now − latest)` from now. Before its pace is known (one
//! token recorded) the pod's learned per-token decode time stands in
//! ([`ReplicaSpeed::decode_ms_per_token`](super::ReplicaSpeed::decode_ms_per_token)).
//!
//! `max_tokens` is a cap, not a promise: a stream that stops early (its end-of-sequence)
//! frees its slot sooner than expected, so the ends are an upper bound. A request without
//! `max_tokens` has no stream here; the slot wait counts it among the requests whose ends are
//! unknown ([`BatchSlots::wait_ms`](super::BatchSlots::wait_ms)).
//!
//! Progress is recorded every [`PROGRESS_EVERY`] tokens, not on each, so a gateway can tell
//! its peers exactly what it recorded (cluster sharing, `PeerEvent::Progress`: 16 messages
//! for a 256-token answer) and every gateway sees the same clocks. Sixteen was measured
//! against 8, 32 and points at each doubling of the count (16, 32, 64, …: fewer messages,
//! but a point that grows stale as the stream goes on): on the held-out workloads the
//! 4-replica unequal fleet made 1883 good requests at 16, 1862 at 8, 1826 at 32 and 1799 at
//! the doublings (docs/POLICY-EVALUATION.md, "Issue 28, v3: a stream clock and the in-time
//! rule").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::Millis;

/// Tokens between two recorded points of a stream's progress.
pub const PROGRESS_EVERY: u64 = 16;

/// One decoding request's clock (see the module docs).
#[derive(Debug)]
pub struct Stream {
    first_byte_at: Millis,
    max_tokens: u64,
    /// Tokens streamed as of the latest recorded point (1 at the first byte).
    tokens: AtomicU64,
    /// When that point was recorded.
    latest_at: AtomicU64,
}

impl Stream {
    /// Records that `tokens` had streamed by `now()`, if that reaches the next recorded point
    /// (a multiple of [`PROGRESS_EVERY`]); returns whether it did. The clock is read only
    /// then: a gateway calls this on every frame of a stream.
    pub fn advance(&self, tokens: u64, now: impl FnOnce() -> Millis) -> bool {
        let recorded = self.tokens.load(Ordering::Relaxed);
        if tokens / PROGRESS_EVERY <= recorded / PROGRESS_EVERY {
            return false;
        }
        self.latest_at.store(now(), Ordering::Relaxed);
        self.tokens.store(tokens, Ordering::Relaxed);
        true
    }

    /// Milliseconds from `now` until its last token is expected, at its own pace or, before
    /// that is known, at `fallback_pace` ms per token; `None` when neither is known.
    fn end_ms(&self, now: Millis, fallback_pace: Option<f64>) -> Option<f64> {
        let tokens = self.tokens.load(Ordering::Relaxed);
        let latest = self.latest_at.load(Ordering::Relaxed);
        let pace = if tokens >= 2 {
            latest.saturating_sub(self.first_byte_at) as f64 / (tokens - 1) as f64
        } else {
            fallback_pace?
        };
        let left = self.max_tokens.saturating_sub(tokens) as f64 * pace;
        Some((left - now.saturating_sub(latest) as f64).max(0.0))
    }
}

/// The streams of one pod's decoding requests (see the module docs). Each is added at its
/// first byte and removed when its request ends, each under the lock for one vector
/// operation; reading the ends takes it once.
#[derive(Debug, Default)]
pub struct Decoding {
    streams: Mutex<Vec<Arc<Stream>>>,
}

impl Decoding {
    /// A stream of at most `max_tokens` tokens whose first came at `now`.
    pub fn start(&self, now: Millis, max_tokens: u64) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            first_byte_at: now,
            max_tokens,
            tokens: AtomicU64::new(1),
            latest_at: AtomicU64::new(now),
        });
        self.streams().push(Arc::clone(&stream));
        stream
    }

    /// Forgets `stream` (its request ended).
    pub fn remove(&self, stream: &Arc<Stream>) {
        let mut streams = self.streams();
        if let Some(at) = streams.iter().position(|s| Arc::ptr_eq(s, stream)) {
            streams.swap_remove(at);
        }
    }

    /// Appends to `ends` each stream's expected end, in milliseconds from `now`, leaving out
    /// those whose pace is not known (`fallback_pace`: the pod's learned decode time).
    pub fn push_ends(&self, now: Millis, fallback_pace: Option<f64>, ends: &mut Vec<f64>) {
        ends.extend(
            self.streams()
                .iter()
                .filter_map(|stream| stream.end_ms(now, fallback_pace)),
        );
    }

    /// Every update is one vector operation, so the list stays whole under a poisoned lock.
    fn streams(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends(decoding: &Decoding, now: Millis, fallback: Option<f64>) -> Vec<f64> {
        let mut ends = Vec::new();
        decoding.push_ends(now, fallback, &mut ends);
        ends
    }

    #[test]
    fn a_stream_ends_at_its_own_pace() {
        let decoding = Decoding::default();
        let stream = decoding.start(1_000, 129);
        // 17 tokens by 1 160 ms: 10 ms each, 112 left.
        assert!(stream.advance(17, || 1_160));
        assert_eq!(ends(&decoding, 1_160, Some(50.0)), vec![1_120.0]);
        // 20 ms later it is 20 ms nearer its end.
        assert_eq!(ends(&decoding, 1_180, Some(50.0)), vec![1_100.0]);
        // Long past it: due now, never negative.
        assert_eq!(ends(&decoding, 9_000, None), vec![0.0]);
    }

    #[test]
    fn progress_is_recorded_every_sixteen_tokens() {
        let decoding = Decoding::default();
        let stream = decoding.start(0, 100);
        assert!(!stream.advance(15, || 150), "not yet a recorded point");
        assert!(stream.advance(16, || 160));
        assert!(!stream.advance(31, || 310));
        assert!(!stream.advance(16, || 400), "never backwards");
        assert!(
            stream.advance(40, || 400),
            "past 32, in one frame of many events"
        );
        assert!(!stream.advance(47, || 470));
        // 39 tokens after the first in 400 ms, as of the latest point.
        let pace = 400.0 / 39.0;
        assert_eq!(ends(&decoding, 400, None), vec![60.0 * pace]);
        assert!(stream.advance(48, || 480));
    }

    #[test]
    fn before_its_pace_is_known_the_pods_decode_time_stands_in() {
        let decoding = Decoding::default();
        let first = decoding.start(0, 11);
        assert_eq!(ends(&decoding, 0, None), Vec::<f64>::new(), "nothing known");
        assert_eq!(ends(&decoding, 0, Some(20.0)), vec![200.0]);
        let second = decoding.start(0, 5);
        decoding.remove(&first);
        assert_eq!(ends(&decoding, 0, Some(20.0)), vec![80.0]);
        decoding.remove(&second);
        assert!(ends(&decoding, 0, Some(20.0)).is_empty());
    }
}

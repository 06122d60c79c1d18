//! How long one engine step takes, from what it computes (reference §5.2):
//!
//! `T = t0 + a_d·decode_seqs + c_kv·Σ decode context + a_p·prefill tokens
//!      + c_att·Σ over prefill chunks L·(s + L/2)`
//!
//! `t0` is streaming the weights once; decode cost grows with sequences and the context their
//! attention reads; prefill cost grows with the uncached tokens computed and with attention
//! over everything before them (a chunk of `L` tokens starting at position `s` attends to
//! `s + L/2` keys on average). The coefficients come from the profile, never from code.

use super::scheduler::ScheduledChunk;
use super::{EngineProfile, Seconds};

/// Duration of a step that computes `chunks`.
pub fn step_duration(profile: &EngineProfile, chunks: &[ScheduledChunk]) -> Seconds {
    let mut decode_seqs = 0.0;
    let mut decode_context = 0.0;
    let mut prefill_tokens = 0.0;
    let mut prefill_attention = 0.0;
    for chunk in chunks {
        let start = chunk.start as f64;
        let len = chunk.len as f64;
        if chunk.decode {
            decode_seqs += 1.0;
            // The decoded token attends to every earlier token and itself.
            decode_context += start + len;
        } else {
            prefill_tokens += len;
            prefill_attention += len * (start + len / 2.0);
        }
    }
    profile.t0
        + profile.a_d * decode_seqs
        + profile.c_kv * decode_context
        + profile.a_p * prefill_tokens
        + profile.c_att * prefill_attention
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l20() -> EngineProfile {
        EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin profile")
    }

    fn chunk(start: usize, len: usize, decode: bool) -> ScheduledChunk {
        ScheduledChunk {
            id: 0,
            start,
            len,
            decode,
            emits: true,
        }
    }

    #[test]
    fn eight_decodes_at_five_thousand_context_take_about_55_ms() {
        let chunks: Vec<_> = (0..8).map(|_| chunk(5119, 1, true)).collect();
        let t = step_duration(&l20(), &chunks);
        // 49 + 8·0.2 + 8·5120·0.1e-3 ms = 54.7 ms (the calibrated profile, docs/FIDELITY.md).
        assert!((t - 0.054696).abs() < 1e-6, "{t}");
    }

    #[test]
    fn a_cold_first_chunk_pays_per_token_and_attention() {
        let t = step_duration(&l20(), &[chunk(0, 2048, false)]);
        // 0.049 + 2048·0.28e-3 + 1.2e-8·2048·1024 s = 0.049 + 0.57344 + 0.02517 s.
        assert!((t - 0.647606).abs() < 1e-5, "{t}");
        let later = step_duration(&l20(), &[chunk(2048, 2048, false)]);
        assert!(later > t, "a later chunk attends to more keys");
    }

    #[test]
    fn an_empty_step_costs_t0() {
        assert_eq!(step_duration(&l20(), &[]), l20().t0);
    }
}

//! Rendezvous (highest-random-weight) hashing of an `x-aibrix-session-key` onto a pod, as
//! AIBrix's `session-affinity` does it: every pod scores FNV-1a-64 over the key's bytes, one
//! 0 byte, then the pod's `ip:port`; the highest score wins, ties going to the lowest address
//! (bytewise), so the choice depends neither on the order of the pods nor on any state. Every
//! gateway that sees the same ready pods maps a key to the same one, and when a pod leaves only
//! the keys it held move.

use crate::load::Candidate;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a-64 of `bytes`, continuing from `state` (the offset basis for a fresh hash).
fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// The score of `address` for `key`. The 0 byte between them keeps two splits of the same
/// bytes apart ("ab" + "c" and "a" + "bc").
pub fn score(key: &[u8], address: &str) -> u64 {
    let state = fnv1a(FNV_OFFSET_BASIS, key);
    let state = fnv1a(state, &[0]);
    fnv1a(state, address.as_bytes())
}

/// The index of the pod `key` lands on among `pods` (`None` for no pods).
pub fn rendezvous(key: &[u8], pods: &[Candidate<'_>]) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (i, pod) in pods.iter().enumerate() {
        let score = score(key, pod.address);
        let wins = match best {
            None => true,
            Some((at, top)) => score > top || (score == top && pod.address < pods[at].address),
        };
        if wins {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::PodLoad;

    #[test]
    fn fnv1a_64_matches_the_published_test_vectors() {
        // From the FNV reference (Fowler, Noll, Vo: "FNV-1a 64-bit" test vectors).
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Scores computed apart from this code, in Python:
    ///
    /// ```text
    /// def fnv(b, h=0xcbf29ce484222325):
    ///     for x in b: h = ((h ^ x) * 0x100000001b3) % 2**64
    ///     return h
    /// [hex(fnv(b"session-42" + b"\0" + a)) for a in (b"10.0.0.1:8000", b"10.0.0.2:8000", b"10.0.0.3:8000")]
    /// ```
    #[test]
    fn scores_match_an_independent_computation() {
        assert_eq!(score(b"session-42", "10.0.0.1:8000"), SCORE_1);
        assert_eq!(score(b"session-42", "10.0.0.2:8000"), SCORE_2);
        assert_eq!(score(b"session-42", "10.0.0.3:8000"), SCORE_3);
        // The separator counts: without it "ab" + "c" and "a" + "bc" would score alike.
        assert_ne!(score(b"ab", "c"), score(b"a", "bc"));
    }

    const SCORE_1: u64 = 0x273b_af7b_a392_b056;
    const SCORE_2: u64 = 0xc904_5a66_faa9_aa11;
    const SCORE_3: u64 = 0xd7ea_597c_964e_3f4c;

    fn pods<'a>(addresses: &'a [&'a str], load: &'a std::sync::Arc<PodLoad>) -> Vec<Candidate<'a>> {
        addresses
            .iter()
            .map(|&address| Candidate {
                name: address,
                address,
                load,
            })
            .collect()
    }

    #[test]
    fn the_highest_score_wins_whatever_the_order() {
        let load = PodLoad::new();
        let addresses = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
        // SCORE_3 is the highest of the three.
        let forward = pods(&addresses, &load);
        assert_eq!(rendezvous(b"session-42", &forward), Some(2));
        let reversed: Vec<&str> = addresses.iter().rev().copied().collect();
        let backward = pods(&reversed, &load);
        assert_eq!(rendezvous(b"session-42", &backward), Some(0));
        assert_eq!(rendezvous(b"session-42", &[]), None);
    }

    #[test]
    fn equal_scores_go_to_the_lowest_address() {
        // Two pods with one address score alike: the tie-break is by address, and the first
        // of two equal addresses stays chosen.
        let load = PodLoad::new();
        let addresses = ["10.0.0.9:8000", "10.0.0.9:8000"];
        assert_eq!(rendezvous(b"k", &pods(&addresses, &load)), Some(0));
    }

    #[test]
    fn a_pod_leaving_moves_only_its_own_keys() {
        let load = PodLoad::new();
        let all = [
            "10.0.0.1:8000",
            "10.0.0.2:8000",
            "10.0.0.3:8000",
            "10.0.0.4:8000",
        ];
        let three = &all[..3];
        for n in 0..200 {
            let key = format!("key-{n}");
            let before = all[rendezvous(key.as_bytes(), &pods(&all, &load)).unwrap()];
            let after = three[rendezvous(key.as_bytes(), &pods(three, &load)).unwrap()];
            if before != all[3] {
                assert_eq!(before, after, "{key} moved though its pod stayed");
            }
        }
    }
}

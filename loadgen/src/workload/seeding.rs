//! Stable seeds derived from names, so every random choice of a phase is reproducible from
//! (round seed, scenario or phase name, purpose) and independent of run order.
//!
//! FNV-1a over the parts (each followed by a 0xff separator, which no UTF-8 text contains)
//! then a SplitMix64 finaliser to spread the bits; `std`'s hasher is not stable across
//! releases, so it cannot be used for seeds that are written down.

use rand::SeedableRng;
use rand::rngs::StdRng;

/// A 64-bit seed for `base` and the named parts.
pub fn derive_seed(base: u64, parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ base;
    for part in parts {
        for &b in part.as_bytes().iter().chain(std::iter::once(&0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    splitmix64(h)
}

/// A random generator for `base` and the named parts.
pub fn rng_for(base: u64, parts: &[&str]) -> StdRng {
    StdRng::seed_from_u64(derive_seed(base, parts))
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_stable_and_separate_parts() {
        assert_eq!(derive_seed(102, &["a", "b"]), derive_seed(102, &["a", "b"]));
        assert_ne!(derive_seed(102, &["a", "b"]), derive_seed(103, &["a", "b"]));
        assert_ne!(derive_seed(102, &["ab"]), derive_seed(102, &["a", "b"]));
        assert_ne!(derive_seed(102, &["a", "b"]), derive_seed(102, &["b", "a"]));
        // Pinned: a change here silently changes every workload.
        assert_eq!(
            derive_seed(102, &["r1-cold-uniform-random", "prefix"]),
            0x2c24_ae1e_bdf4_8a42
        );
    }
}

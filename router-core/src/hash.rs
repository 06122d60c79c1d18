//! Chained XXH64 block hashes, AIBrix's layout.
//!
//! The byte stream is cut into blocks of `block_size` bytes; only full blocks are hashed.
//! Block `i` hashes the previous hash (8 bytes, little-endian) followed by the block's bytes:
//! `h_i = XXH64(seed, LE_u64(h_{i-1}) ‖ block_i)` with `h_{-1} = seed`. Chaining makes a
//! block's hash stand for the whole prefix up to it, so equal hashes mean equal prefixes.

/// The chained hashes of every full block of `bytes`.
///
/// `block_size` must be at least 1 (the config rejects 0).
pub fn block_hashes(bytes: &[u8], block_size: usize, seed: u64) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut hashes = Vec::with_capacity(bytes.len() / block_size);
    let mut parent = seed;
    for block in bytes.chunks_exact(block_size) {
        parent = xxh64_after(parent, block, seed);
        hashes.push(parent);
    }
    hashes
}

const PRIME_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME_5: u64 = 0x27D4_EB2F_1656_67C5;

/// XXH64 (the reference algorithm) of `LE(parent) ‖ block`, read in place rather than copied
/// into one buffer. The parent is the input's first 8-byte word, so it enters only lane 0 of
/// the first stripe (or the first tail word of an input under 32 bytes); everything else
/// reads the block at the same offsets less 8. Lanes 1–3 and the later stripes do not wait
/// for the parent, so the CPU can run them ahead while the previous block's hash is still
/// being computed: the chain's latency, not its work, is what a prompt's hashing costs.
fn xxh64_after(parent: u64, block: &[u8], seed: u64) -> u64 {
    let len = 8 + block.len() as u64;
    let mut rest = block;
    let mut hash;
    if block.len() >= 24 {
        let mut lanes = [
            seed.wrapping_add(PRIME_1).wrapping_add(PRIME_2),
            seed.wrapping_add(PRIME_2),
            seed,
            seed.wrapping_sub(PRIME_1),
        ];
        lanes[0] = round(lanes[0], parent);
        lanes[1] = round(lanes[1], word(rest, 0));
        lanes[2] = round(lanes[2], word(rest, 8));
        lanes[3] = round(lanes[3], word(rest, 16));
        rest = &rest[24..];
        while rest.len() >= 32 {
            for (lane, acc) in lanes.iter_mut().enumerate() {
                *acc = round(*acc, word(rest, lane * 8));
            }
            rest = &rest[32..];
        }
        hash = lanes[0]
            .rotate_left(1)
            .wrapping_add(lanes[1].rotate_left(7))
            .wrapping_add(lanes[2].rotate_left(12))
            .wrapping_add(lanes[3].rotate_left(18));
        for lane in lanes {
            hash = merge_round(hash, lane);
        }
        hash = hash.wrapping_add(len);
    } else {
        hash = seed.wrapping_add(PRIME_5).wrapping_add(len);
        hash = tail_word(hash, parent);
    }
    while rest.len() >= 8 {
        hash = tail_word(hash, word(rest, 0));
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        let half = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        hash ^= u64::from(half).wrapping_mul(PRIME_1);
        hash = hash
            .rotate_left(23)
            .wrapping_mul(PRIME_2)
            .wrapping_add(PRIME_3);
        rest = &rest[4..];
    }
    for &byte in rest {
        hash ^= u64::from(byte).wrapping_mul(PRIME_5);
        hash = hash.rotate_left(11).wrapping_mul(PRIME_1);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(PRIME_2);
    hash ^= hash >> 29;
    hash = hash.wrapping_mul(PRIME_3);
    hash ^ (hash >> 32)
}

/// The little-endian 8-byte word of `bytes` at `at` (which must leave 8 bytes).
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(PRIME_2))
        .rotate_left(31)
        .wrapping_mul(PRIME_1)
}

fn merge_round(hash: u64, lane: u64) -> u64 {
    (hash ^ round(0, lane))
        .wrapping_mul(PRIME_1)
        .wrapping_add(PRIME_4)
}

/// One 8-byte word of the input's tail folded into `hash`.
fn tail_word(hash: u64, input: u64) -> u64 {
    (hash ^ round(0, input))
        .rotate_left(27)
        .wrapping_mul(PRIME_1)
        .wrapping_add(PRIME_4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC §2.2 and the AIBrix reference §6.2, cross-checked in Go and Python.
    #[test]
    fn golden_vectors() {
        assert_eq!(
            block_hashes(b"abcdegfh", 4, 0),
            [0xe47f32a254016b00, 0xc46f313fc4e609b1]
        );
        assert_eq!(
            block_hashes(b"abcdefghijkl", 4, 0),
            [0xe47f32a254016b00, 0xd48dd7253a12cb4b, 0xb9110f3c650e9fe5]
        );
        assert_eq!(block_hashes(b"abcd", 4, 0), [0xe47f32a254016b00]);
        assert!(block_hashes(b"abc", 4, 0).is_empty());
        assert_eq!(
            block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, 0),
            [0xed2904c594e558d1, 0x7d9bd50ec50644c0]
        );
        assert_eq!(
            block_hashes(b"abcdegfh", 4, 42),
            [0xc785304b0ea77c8f, 0x88756255c2ed0ae4]
        );
        let alphabet: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 26) as u8).collect();
        assert_eq!(
            block_hashes(&alphabet, 128, 0),
            [0x0d5de48a1f137d93, 0xb3409a2aa6754a34]
        );
    }

    proptest::proptest! {
        /// The in-place hash is XXH64 of the concatenation, for every length (all stripe
        /// counts and every tail: 8-byte words, a 4-byte half, single bytes), any seed.
        #[test]
        fn in_place_equals_xxh64_of_the_concatenation(
            parent in proptest::prelude::any::<u64>(),
            block in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            seed in proptest::prop_oneof![proptest::prelude::Just(0u64), proptest::prelude::any::<u64>()],
        ) {
            let mut input = parent.to_le_bytes().to_vec();
            input.extend_from_slice(&block);
            proptest::prop_assert_eq!(
                xxh64_after(parent, &block, seed),
                xxhash_rust::xxh64::xxh64(&input, seed)
            );
        }
    }

    /// Every block length from 0 to 100 bytes, exhaustively (the property test samples).
    #[test]
    fn in_place_equals_xxh64_at_every_short_length() {
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..=bytes.len() {
            for seed in [0, 42, u64::MAX] {
                let parent = 0x0123_4567_89ab_cdef_u64.wrapping_mul(len as u64 + 1);
                let mut input = parent.to_le_bytes().to_vec();
                input.extend_from_slice(&bytes[..len]);
                assert_eq!(
                    xxh64_after(parent, &bytes[..len], seed),
                    xxhash_rust::xxh64::xxh64(&input, seed),
                    "{len} bytes, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn token_id_vectors() {
        let be = |ids: &[u32]| {
            ids.iter()
                .flat_map(|id| id.to_be_bytes())
                .collect::<Vec<u8>>()
        };
        assert_eq!(
            block_hashes(&be(&[15339, 1917, 0, 1]), 16, 0),
            [0x11c64cbdaaa0bac9]
        );
        assert_eq!(
            block_hashes(&be(&[1, 2, 3, 4, 5, 6, 7, 8]), 16, 0),
            [0x29ddef837576718e, 0xa89a300f74b73dd6]
        );
    }
}

//! Chained XXH64 block hashes, AIBrix's layout.
//!
//! The byte stream is cut into blocks of `block_size` bytes; only full blocks are hashed.
//! Block `i` hashes the previous hash (8 bytes, little-endian) followed by the block's bytes:
//! `h_i = XXH64(seed, LE_u64(h_{i-1}) ‖ block_i)` with `h_{-1} = seed`. Chaining makes a
//! block's hash stand for the whole prefix up to it, so equal hashes mean equal prefixes.

use xxhash_rust::xxh64::xxh64;

/// The chained hashes of every full block of `bytes`.
///
/// `block_size` must be at least 1 (the config rejects 0).
pub fn block_hashes(bytes: &[u8], block_size: usize, seed: u64) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut hashes = Vec::with_capacity(bytes.len() / block_size);
    // One-shot XXH64 over `parent ‖ block` in a reused buffer: copying a block is cheaper than
    // the streaming hasher's per-call buffering, which dominated for 128-byte blocks.
    let mut input = Vec::with_capacity(8 + block_size);
    let mut parent = seed;
    for block in bytes.chunks_exact(block_size) {
        input.clear();
        input.extend_from_slice(&parent.to_le_bytes());
        input.extend_from_slice(block);
        parent = xxh64(&input, seed);
        hashes.push(parent);
    }
    hashes
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

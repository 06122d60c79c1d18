//! Chained block hashes over token ids: the identity of a KV block in the prefix cache.
//!
//! As in vLLM, a block's hash covers its parent's hash and its own tokens, so equal hashes
//! mean equal prefixes up to and including that block, and a lookup can stop at the first
//! miss. vLLM uses sha256 over pickled tuples; the mock uses XXH64 over
//! `LE_u64(parent) ‖ LE_u32(token)…`, which is equivalent for caching (nobody outside the
//! engine compares these values) and much cheaper.

use xxhash_rust::xxh64::xxh64;

/// The parent of a request's first block (vLLM's `NONE_HASH`, fixed here so runs repeat).
pub const ROOT_HASH: u64 = 0;

/// Hash of one full block given its parent's hash.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // One-shot over a contiguous buffer: the streaming hasher's per-update buffering costs
    // about twice as much for 4-byte pieces, and the simulator hashes every prompt block.
    let mut bytes = Vec::with_capacity(8 + 4 * tokens.len());
    bytes.extend_from_slice(&parent.to_le_bytes());
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    xxh64(&bytes, 0)
}

/// Extends `hashes` so it covers every full block of `tokens` (hashes already there are
/// kept: they depend only on earlier tokens, which never change).
pub fn extend_hashes(hashes: &mut Vec<u64>, tokens: &[u32], block_size: usize) {
    if block_size == 0 {
        return;
    }
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let index = hashes.len();
        let parent = index
            .checked_sub(1)
            .and_then(|p| hashes.get(p).copied())
            .unwrap_or(ROOT_HASH);
        let block = &tokens[index * block_size..(index + 1) * block_size];
        hashes.push(chain_hash(parent, block));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_give_equal_hashes_and_a_difference_propagates() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[20] = 999; // inside the second block of 16
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        extend_hashes(&mut ha, &a, 16);
        extend_hashes(&mut hb, &b, 16);
        assert_eq!(ha.len(), 2); // 40 tokens = 2 full blocks
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // The same block content under a different parent hashes differently.
        assert_ne!(chain_hash(1, &a[..16]), chain_hash(2, &a[..16]));
    }

    #[test]
    fn extending_keeps_earlier_hashes() {
        let tokens: Vec<u32> = (0..64).collect();
        let mut partial = Vec::new();
        extend_hashes(&mut partial, &tokens[..20], 16);
        extend_hashes(&mut partial, &tokens, 16);
        let mut whole = Vec::new();
        extend_hashes(&mut whole, &tokens, 16);
        assert_eq!(partial, whole);
        assert_eq!(whole.len(), 4);
    }
}

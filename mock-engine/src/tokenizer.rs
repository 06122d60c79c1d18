//! The mock's deterministic tokenizer, shared by the engine server and the load generator.
//!
//! Rule (documented in `docs/MOCK_ENGINE.md` so prompts can be sized): text is split on
//! Unicode whitespace; each word of up to [`MAX_WORD_CHARS`] characters is one token, and a
//! longer word is one token per started [`MAX_WORD_CHARS`] characters. A word from the small
//! generation vocabulary ([`GENERATED_WORDS`]) gets its index as id, any other piece gets an
//! XXH64-derived id ≥ that vocabulary's size, so the same text always gives the same ids and
//! generated text re-encodes to the ids that produced it (multi-turn prompts then hit the
//! cache the way they do on vLLM). No vocabulary file, no network.

use xxhash_rust::xxh64::xxh64;

/// Longest piece one token covers, in characters.
pub const MAX_WORD_CHARS: usize = 16;

/// Ids of hashed pieces lie in `GENERATED_WORDS.len() .. VOCAB_SIZE`.
pub const VOCAB_SIZE: u32 = 1 << 20;

/// The words generated tokens are drawn from; id = index.
pub const GENERATED_WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "engine", "token",
    "cache", "block", "prefix", "route", "replica", "queue", "batch", "step", "time", "load",
    "gateway", "request",
];

/// Seed of the piece hash; fixed so ids are stable across processes and versions.
const PIECE_SEED: u64 = 0x7072_6566_6978_6761; // "prefixga"

/// Token ids of `text` (same text → same ids, ≈ one per whitespace-separated word).
pub fn encode(text: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    for word in text.split_whitespace() {
        let chars: Vec<char> = word.chars().collect();
        for piece in chars.chunks(MAX_WORD_CHARS) {
            let piece: String = piece.iter().collect();
            ids.push(piece_id(&piece));
        }
    }
    ids
}

/// Number of tokens [`encode`] gives for `text`, without allocating the ids.
pub fn count(text: &str) -> usize {
    text.split_whitespace()
        .map(|word| word.chars().count().div_ceil(MAX_WORD_CHARS))
        .sum()
}

/// Text of one generated token: a space then the word, e.g. `" cache"`. Ids outside the
/// generation vocabulary (prompt ids echoed back) decode to a stable placeholder word.
pub fn decode(id: u32) -> String {
    match usize::try_from(id)
        .ok()
        .and_then(|i| GENERATED_WORDS.get(i))
    {
        Some(word) => format!(" {word}"),
        None => format!(" t{id}"),
    }
}

/// The `index`-th output token of the request seeded `request_seed` (deterministic).
pub fn generated_token(request_seed: u64, index: u32) -> u32 {
    let mut input = [0u8; 12];
    input[..8].copy_from_slice(&request_seed.to_le_bytes());
    input[8..].copy_from_slice(&index.to_le_bytes());
    let words = GENERATED_WORDS.len() as u64;
    // The modulus keeps the value below the vocabulary size, which fits in u32.
    (xxh64(&input, PIECE_SEED) % words) as u32
}

fn piece_id(piece: &str) -> u32 {
    if let Some(index) = GENERATED_WORDS.iter().position(|word| *word == piece) {
        return index as u32;
    }
    let first = GENERATED_WORDS.len() as u64;
    let span = u64::from(VOCAB_SIZE) - first;
    // first + (h mod span) < VOCAB_SIZE, so it fits in u32.
    (first + xxh64(piece.as_bytes(), PIECE_SEED) % span) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_short_word_and_stable_ids() {
        let text = "alpha beta\tgamma\n delta  alpha";
        let ids = encode(text);
        assert_eq!(ids.len(), 5);
        assert_eq!(ids[0], ids[4]);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(encode(text), ids);
        assert_eq!(count(text), 5);
    }

    #[test]
    fn long_words_split_every_sixteen_characters() {
        let word = "x".repeat(33);
        assert_eq!(encode(&word).len(), 3);
        assert_eq!(count(&word), 3);
        assert_eq!(encode("").len(), 0);
        assert_eq!(encode("   \n").len(), 0);
    }

    #[test]
    fn generated_text_reencodes_to_its_ids() {
        for index in 0..200 {
            let id = generated_token(42, index);
            assert!((id as usize) < GENERATED_WORDS.len());
            assert_eq!(encode(&decode(id)), vec![id]);
        }
        assert_eq!(generated_token(7, 3), generated_token(7, 3));
    }

    #[test]
    fn hashed_ids_stay_in_the_vocabulary_above_generated_words() {
        for word in ["zebra", "Ω", "5040", "family-3-prefix-word"] {
            for id in encode(word) {
                assert!(id >= GENERATED_WORDS.len() as u32 && id < VOCAB_SIZE);
            }
        }
        assert!(decode(VOCAB_SIZE - 1).starts_with(' '));
    }

    proptest::proptest! {
        #[test]
        fn count_agrees_with_encode_and_encoding_repeats(text in "(\\PC|\\s){0,200}") {
            let ids = encode(&text);
            proptest::prop_assert_eq!(count(&text), ids.len());
            proptest::prop_assert!(ids.iter().all(|id| *id < VOCAB_SIZE));
            proptest::prop_assert_eq!(encode(&text), ids);
        }
    }
}

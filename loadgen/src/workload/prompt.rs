//! Prompt text built from words the mock tokenizer counts as one token each.
//!
//! A prompt is a family prefix followed by a per-request tail, joined by one space. Prefixes
//! start with a salt word unique to (phase, seed, setup attempt, candidate), so two families
//! differ from token 0 and no two phases share a cached block. Tails start with a nonce word
//! unique to the request, so requests share only their family prefix. All other words come
//! from a small vocabulary of short lowercase English words (one token each in common BPEs
//! too, see reference/load-generators.md §8).

use rand::Rng;
use rand::rngs::StdRng;

use super::seeding::{derive_seed, rng_for};

/// Short, common, lowercase words: one token each under the mock tokenizer and most BPEs.
pub(crate) const VOCABULARY: [&str; 64] = [
    "the", "time", "water", "light", "house", "river", "stone", "green", "table", "paper", "music",
    "night", "garden", "window", "market", "bread", "horse", "cloud", "field", "story", "north",
    "south", "road", "tree", "bird", "snow", "rain", "fire", "city", "glass", "sound", "color",
    "plant", "train", "metal", "ocean", "hill", "forest", "letter", "money", "school", "sugar",
    "power", "voice", "dream", "apple", "board", "chair", "coast", "dance", "earth", "floor",
    "grass", "heart", "island", "lake", "mountain", "number", "orange", "party", "queen", "salt",
    "summer", "winter",
];

/// 48 bits of salt: 12 hex digits, so salt and nonce words stay within the mock tokenizer's
/// 16-character token (a longer word would count as two tokens).
const SALT_MASK: u64 = 0xffff_ffff_ffff;

/// The text of one prefix: `tokens` words, the first a salt unique to the given identity.
pub fn family_prefix(
    phase: &str,
    seed: u64,
    attempt: u32,
    candidate: usize,
    tokens: usize,
) -> String {
    let attempt = attempt.to_string();
    let candidate = candidate.to_string();
    let parts = [phase, "prefix", attempt.as_str(), candidate.as_str()];
    let salt = format!("f{:012x}", derive_seed(seed, &parts) & SALT_MASK);
    let mut rng = rng_for(seed, &parts);
    words_after(salt, tokens, &mut rng)
}

/// The text of one request tail: `tokens` words, the first a nonce unique to `(phase, tag,
/// index)`. `tag` separates measured requests from priming requests.
pub fn request_tail(phase: &str, seed: u64, tag: &str, index: usize, tokens: usize) -> String {
    let index = index.to_string();
    let parts = [phase, "tail", tag, index.as_str()];
    let nonce = format!("r{:012x}", derive_seed(seed, &parts) & SALT_MASK);
    let mut rng = rng_for(seed, &parts);
    words_after(nonce, tokens, &mut rng)
}

/// A whole prompt: prefix, one space, tail.
pub fn join(prefix: &str, tail: &str) -> String {
    let mut text = String::with_capacity(prefix.len() + 1 + tail.len());
    text.push_str(prefix);
    text.push(' ');
    text.push_str(tail);
    text
}

fn words_after(first: String, tokens: usize, rng: &mut StdRng) -> String {
    let mut text = first;
    for _ in 1..tokens {
        text.push(' ');
        text.push_str(VOCABULARY[rng.random_range(0..VOCABULARY.len())]);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        text.split_whitespace().collect()
    }

    #[test]
    fn prefixes_have_the_asked_length_and_differ_from_the_first_word() {
        let a = family_prefix("r1-hot50-random", 102, 0, 0, 4704);
        let b = family_prefix("r1-hot50-random", 102, 0, 1, 4704);
        let c = family_prefix("r1-hot50-least-request", 102, 0, 0, 4704);
        let d = family_prefix("r1-hot50-random", 102, 1, 0, 4704);
        assert_eq!(words(&a).len(), 4704);
        for other in [&b, &c, &d] {
            assert_ne!(words(&a)[0], words(other)[0]);
        }
        assert_eq!(a, family_prefix("r1-hot50-random", 102, 0, 0, 4704));
    }

    #[test]
    fn tails_start_with_unique_nonces() {
        let t0 = request_tail("p", 1, "measure", 0, 336);
        let t1 = request_tail("p", 1, "measure", 1, 336);
        let w0 = request_tail("p", 1, "warm", 0, 336);
        assert_eq!(words(&t0).len(), 336);
        assert_ne!(words(&t0)[0], words(&t1)[0]);
        assert_ne!(words(&t0)[0], words(&w0)[0]);
        assert!(words(&t0)[0].starts_with('r') && words(&t0)[0].len() == 13);
    }

    #[test]
    fn join_keeps_the_prefix_bytes_intact() {
        let prefix = family_prefix("p", 1, 0, 0, 10);
        let text = join(&prefix, &request_tail("p", 1, "m", 0, 5));
        assert!(text.starts_with(&format!("{prefix} ")));
        assert_eq!(words(&text).len(), 15);
    }
}

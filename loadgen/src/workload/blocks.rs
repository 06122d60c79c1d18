//! Prompts made of numbered 512-token blocks, as a Mooncake trace describes them: block `k`
//! of a request is named by its `k`-th hash id, and equal ids mean equal contents, so a
//! shared run of leading ids is a shared prefix.
//!
//! The text of block `id` is a salt word unique to the id, then words from the matrix
//! prompts' vocabulary drawn from a generator seeded by the id: [`BLOCK_TOKENS`] words, each
//! one token under the mock tokenizer (as the matrix prompts are built). A request's text is
//! its blocks joined by single spaces, the last block cut to the request's length (the
//! first `tokens − 512·(n − 1)` words of that block). So two requests whose first `k` ids
//! are equal share exactly their first `512·k` tokens (and the text bytes up to the next
//! block's salt): the engine's 16-token blocks and the router's byte blocks see exactly the
//! sharing the trace encodes. Built when sent, never stored (a trace holds ~60M tokens).

use rand::Rng;

use super::prompt::VOCABULARY;
use super::seeding::rng_for;

/// Tokens per trace block (Mooncake's hash-id granularity).
pub const BLOCK_TOKENS: usize = 512;

/// The largest block id that fits one token's salt word (`b` + 15 hex digits = 16 characters,
/// the mock tokenizer's longest one-token word).
pub const MAX_BLOCK_ID: u64 = (1 << 60) - 1;

/// Seeds the words of every block; fixed, so a block's text never changes between runs.
const BLOCK_SEED: u64 = 0x6d6f_6f6e_6361_6b65; // "mooncake"

/// The recipe for one prompt: its blocks' ids and its length in tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPrompt {
    /// One id per started block of [`BLOCK_TOKENS`], each at most [`MAX_BLOCK_ID`].
    pub ids: Vec<u64>,
    /// Prompt tokens: more than `512·(ids.len() − 1)`, at most `512·ids.len()`.
    pub tokens: usize,
}

impl BlockPrompt {
    /// The prompt's text, built now.
    pub fn text(&self) -> String {
        // Words average under 6 bytes with their space.
        let mut text = String::with_capacity(self.tokens * 6);
        let mut left = self.tokens;
        for &id in &self.ids {
            if left == 0 {
                break;
            }
            let words = left.min(BLOCK_TOKENS);
            if !text.is_empty() {
                text.push(' ');
            }
            push_block(&mut text, id, words);
            left -= words;
        }
        text
    }
}

/// Appends the first `words` words of block `id`.
fn push_block(text: &mut String, id: u64, words: usize) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = write!(text, "b{:015x}", id & MAX_BLOCK_ID);
    let mut rng = rng_for(BLOCK_SEED, &[&id.to_string()]);
    for _ in 1..words {
        text.push(' ');
        text.push_str(VOCABULARY[rng.random_range(0..VOCABULARY.len())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mock_engine::tokenizer::encode;

    fn prompt(ids: &[u64], tokens: usize) -> BlockPrompt {
        BlockPrompt {
            ids: ids.to_vec(),
            tokens,
        }
    }

    #[test]
    fn every_word_is_one_token_and_the_last_block_is_partial() {
        let p = prompt(&[7, 8, MAX_BLOCK_ID], 2 * BLOCK_TOKENS + 100);
        let tokens = encode(&p.text());
        assert_eq!(tokens.len(), 2 * BLOCK_TOKENS + 100);
        // A partial block is the start of the whole one.
        let whole = encode(&prompt(&[7, 8, MAX_BLOCK_ID], 3 * BLOCK_TOKENS).text());
        assert_eq!(tokens[..], whole[..tokens.len()]);
    }

    #[test]
    fn equal_leading_ids_share_exactly_their_blocks() {
        for k in 0..4 {
            let mut ids_a: Vec<u64> = vec![1, 2, 3, 4];
            let mut ids_b = ids_a.clone();
            for (i, id) in ids_b.iter_mut().enumerate().skip(k) {
                *id = 100 + i as u64;
            }
            ids_a.truncate(4);
            let a = encode(&prompt(&ids_a, 4 * BLOCK_TOKENS - 3).text());
            let b = encode(&prompt(&ids_b, 4 * BLOCK_TOKENS).text());
            let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            assert_eq!(shared, k * BLOCK_TOKENS, "k = {k}");
        }
    }
}

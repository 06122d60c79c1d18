//! Tokenizers turn message text into the byte stream that is cut into blocks and hashed.
//!
//! (Placeholder; tiktoken and hf land with the router-core issue.)

use std::borrow::Cow;

use serde::Deserialize;

/// Which tokenizer to use (`AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// The UTF-8 bytes of the text.
    #[default]
    Character,
    /// `cl100k_base` ids, 4 bytes big-endian each.
    Tiktoken,
    /// A local `tokenizer.json`, ids 4 bytes big-endian each.
    Hf,
}

/// Why text could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tokenizer failed: {0}")]
pub struct TokenizeError(pub String);

/// Text → bytes to hash.
pub trait Tokenizer: Send + Sync + std::fmt::Debug {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError>;
}

/// The default: the text's own UTF-8 bytes.
#[derive(Debug, Default)]
pub struct CharacterTokenizer;

impl Tokenizer for CharacterTokenizer {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError> {
        Ok(Cow::Borrowed(text.as_bytes()))
    }
}

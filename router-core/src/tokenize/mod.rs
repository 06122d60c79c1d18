//! Tokenizers turn message text into the byte stream that is cut into blocks and hashed.
//!
//! The block size is counted in bytes of this stream, as in AIBrix: with `character` a
//! 128-byte block is 128 UTF-8 bytes of text; with `tiktoken` or `hf` every token id is
//! written as 4 bytes big-endian, so a 128-byte block is 32 tokens. One file per tokenizer;
//! [`load`] picks one when the [`Router`](crate::Router) is built, so a bad choice is a
//! start-up error rather than a per-request one.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;

mod character;
#[cfg(feature = "hf")]
mod hf;
mod tiktoken;

pub use character::CharacterTokenizer;
#[cfg(feature = "hf")]
pub use hf::HfTokenizer;
pub use tiktoken::TiktokenTokenizer;

/// Which tokenizer to use (`AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

impl TokenizerKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [TokenizerKind; 3] = [
        TokenizerKind::Character,
        TokenizerKind::Tiktoken,
        TokenizerKind::Hf,
    ];

    /// The config and environment value.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerKind::Character => "character",
            TokenizerKind::Tiktoken => "tiktoken",
            TokenizerKind::Hf => "hf",
        }
    }
}

impl fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tokenizer name that is not one of `character`, `tiktoken`, `hf`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tokenizer {0:?} (known: character, tiktoken, hf)")]
pub struct UnknownTokenizer(pub String);

impl FromStr for TokenizerKind {
    type Err = UnknownTokenizer;

    /// Exact names only. AIBrix maps every unknown value (typos, `remote`) to `character`
    /// silently; we refuse, because a silent fallback changes every hash.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TokenizerKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownTokenizer(s.to_owned()))
    }
}

/// Why text could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tokenizer failed: {0}")]
pub struct TokenizeError(pub String);

/// Text → bytes to hash.
pub trait Tokenizer: Send + Sync + std::fmt::Debug {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError>;
}

/// Writes token ids as 4 bytes big-endian each (AIBrix's `IntToByteArray` layout).
pub(crate) fn ids_to_be_bytes(ids: impl ExactSizeIterator<Item = u32>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(ids.len() * 4);
    for id in ids {
        bytes.extend_from_slice(&id.to_be_bytes());
    }
    bytes
}

/// The tokenizer of `kind`, loaded now (vocabularies and files are read here, once, never
/// per request). `hf_path` is the local `tokenizer.json` the `hf` tokenizer needs.
pub fn load(
    kind: TokenizerKind,
    hf_path: Option<&Path>,
) -> Result<Box<dyn Tokenizer>, ConfigError> {
    match kind {
        TokenizerKind::Character => Ok(Box::new(CharacterTokenizer)),
        TokenizerKind::Tiktoken => Ok(Box::new(TiktokenTokenizer::cl100k_base()?)),
        TokenizerKind::Hf => load_hf(hf_path),
    }
}

#[cfg(feature = "hf")]
fn load_hf(path: Option<&Path>) -> Result<Box<dyn Tokenizer>, ConfigError> {
    let path = path.ok_or_else(|| {
        ConfigError::new(
            "hf_tokenizer_path",
            "",
            "the hf tokenizer needs the path of a local tokenizer.json",
        )
    })?;
    Ok(Box::new(HfTokenizer::from_file(path)?))
}

#[cfg(not(feature = "hf"))]
fn load_hf(_path: Option<&Path>) -> Result<Box<dyn Tokenizer>, ConfigError> {
    Err(ConfigError::new(
        "tokenizer",
        "hf",
        "this build has no hf tokenizer support (rebuild router-core with the `hf` feature)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in TokenizerKind::ALL {
            assert_eq!(kind.as_str().parse::<TokenizerKind>(), Ok(kind));
        }
        assert!("remote".parse::<TokenizerKind>().is_err());
        assert!("Character".parse::<TokenizerKind>().is_err());
    }

    #[test]
    fn ids_are_written_big_endian() {
        assert_eq!(
            ids_to_be_bytes([1u32, 0x0102_0304].into_iter()),
            [0, 0, 0, 1, 1, 2, 3, 4]
        );
    }

    #[test]
    fn the_kind_selects_the_tokenizer() {
        let character = load(TokenizerKind::Character, None).unwrap();
        assert_eq!(&*character.bytes("hé").unwrap(), "hé".as_bytes());
        let tiktoken = load(TokenizerKind::Tiktoken, None).unwrap();
        assert_eq!(tiktoken.bytes("hello world").unwrap().len() % 4, 0);
    }

    #[cfg(not(feature = "hf"))]
    #[test]
    fn hf_without_the_feature_is_a_config_error() {
        let err = load(TokenizerKind::Hf, Some(Path::new("tokenizer.json"))).unwrap_err();
        assert_eq!(err.key, "tokenizer");
        assert!(err.reason.contains("`hf` feature"), "{err}");
    }
}

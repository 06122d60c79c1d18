//! `tiktoken`: OpenAI's `cl100k_base` encoding (AIBrix's `local_tiktoken.go`), offline: the
//! vocabulary ships inside `tiktoken-rs`. Each id is written as 4 bytes big-endian.
//!
//! Building the BPE takes tens of milliseconds and megabytes, so it is built once per process
//! and shared by every router. Text that looks like a special token (`<|endoftext|>`) is
//! encoded as ordinary text: a client cannot inject special tokens, and no request fails
//! (tiktoken-go, as AIBrix calls it, rejects such text instead).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use tiktoken_rs::CoreBPE;

use super::{TokenizeError, Tokenizer, ids_to_be_bytes};
use crate::config::error::ConfigError;

static CL100K_BASE: OnceLock<Arc<CoreBPE>> = OnceLock::new();

/// `cl100k_base` token ids, 4 bytes big-endian each.
#[derive(Clone)]
pub struct TiktokenTokenizer {
    bpe: Arc<CoreBPE>,
}

impl std::fmt::Debug for TiktokenTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiktokenTokenizer")
            .field("encoding", &"cl100k_base")
            .finish()
    }
}

impl TiktokenTokenizer {
    /// The shared `cl100k_base` tokenizer, built on first use.
    pub fn cl100k_base() -> Result<Self, ConfigError> {
        if let Some(bpe) = CL100K_BASE.get() {
            return Ok(TiktokenTokenizer {
                bpe: Arc::clone(bpe),
            });
        }
        // Two threads racing here both build; one result is kept. That is cheaper than a
        // lock held across a slow build, and it happens at most once per process start.
        let built = tiktoken_rs::cl100k_base().map_err(|e| ConfigError {
            key: "tokenizer".to_owned(),
            value: "tiktoken".to_owned(),
            reason: format!("cannot build cl100k_base: {e}"),
        })?;
        let bpe = CL100K_BASE.get_or_init(|| Arc::new(built));
        Ok(TiktokenTokenizer {
            bpe: Arc::clone(bpe),
        })
    }

    /// The token ids of `text`.
    pub fn ids(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }
}

impl Tokenizer for TiktokenTokenizer {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError> {
        Ok(Cow::Owned(ids_to_be_bytes(self.ids(text).into_iter())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_cl100k_ids() {
        let tokenizer = TiktokenTokenizer::cl100k_base().unwrap();
        // Reference ids from OpenAI's cl100k_base ("hello world" → [15339, 1917]).
        assert_eq!(tokenizer.ids("hello world"), [15339, 1917]);
        assert_eq!(
            &*tokenizer.bytes("hello world").unwrap(),
            [0, 0, 0x3b, 0xeb, 0, 0, 0x07, 0x7d]
        );
    }

    #[test]
    fn special_token_text_is_ordinary_text() {
        let tokenizer = TiktokenTokenizer::cl100k_base().unwrap();
        let ids = tokenizer.ids("<|endoftext|>");
        assert!(ids.len() > 1, "{ids:?}");
        assert!(!ids.contains(&100257));
    }

    #[test]
    fn the_bpe_is_shared() {
        let a = TiktokenTokenizer::cl100k_base().unwrap();
        let b = TiktokenTokenizer::cl100k_base().unwrap();
        assert!(Arc::ptr_eq(&a.bpe, &b.bpe));
    }
}

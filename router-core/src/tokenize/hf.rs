//! `hf`: a HuggingFace `tokenizer.json` read from a local file (never the network). Ids are
//! written as 4 bytes big-endian, like AIBrix's remote tokenizer. Special tokens are added
//! (`add_special_tokens = true`), as vLLM's `/tokenize` does by default for prompts, so the
//! stream starts the way the engine's own token stream does.
//!
//! Behind the `hf` crate feature: the `tokenizers` crate costs build time most users do not
//! need.

use std::borrow::Cow;
use std::path::Path;

use super::{TokenizeError, Tokenizer, ids_to_be_bytes};
use crate::config::error::ConfigError;

/// A tokenizer loaded from a local `tokenizer.json`.
#[derive(Debug)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
}

impl HfTokenizer {
    /// Loads `path`; a missing or malformed file is an error naming the path.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| ConfigError {
            key: "hf_tokenizer_path".to_owned(),
            value: path.display().to_string(),
            reason: format!("cannot load tokenizer.json: {e}"),
        })?;
        Ok(HfTokenizer { inner })
    }
}

impl Tokenizer for HfTokenizer {
    fn bytes<'t>(&self, text: &'t str) -> Result<Cow<'t, [u8]>, TokenizeError> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| TokenizeError(e.to_string()))?;
        Ok(Cow::Owned(ids_to_be_bytes(
            encoding.get_ids().iter().copied(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level vocabulary small enough to write inline.
    const TOKENIZER_JSON: &str = r#"{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
        "post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":258},"unk_token":"[UNK]"}}"#;

    #[test]
    fn ids_are_written_big_endian() {
        let path = std::env::temp_dir().join(format!("prefixgate-hf-{}.json", std::process::id()));
        std::fs::write(&path, TOKENIZER_JSON).unwrap();
        let tokenizer = HfTokenizer::from_file(&path);
        std::fs::remove_file(&path).unwrap();
        let bytes = tokenizer.unwrap().bytes("hello world nope").unwrap();
        assert_eq!(&*bytes, [0, 0, 0, 1, 0, 0, 1, 2, 0, 0, 0, 0]);
    }

    #[test]
    fn a_malformed_file_names_the_path() {
        let path =
            std::env::temp_dir().join(format!("prefixgate-hf-bad-{}.json", std::process::id()));
        std::fs::write(&path, "{not json").unwrap();
        let err = HfTokenizer::from_file(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(err.value, path.display().to_string());
    }

    #[test]
    fn a_missing_file_names_the_path() {
        let err = HfTokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert_eq!(err.key, "hf_tokenizer_path");
        assert!(err.value.contains("/nonexistent/tokenizer.json"));
    }
}

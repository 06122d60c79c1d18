//! Router settings, with AIBrix's deployed defaults and environment names.

use std::path::PathBuf;

use serde::Deserialize;

use crate::tokenize::TokenizerKind;

/// A setting that cannot be used. The message names the setting (config key or environment
/// variable) and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

/// Everything that shapes a routing decision. Deserialised from the gateway's `[routing]`
/// table (unknown keys are errors), then overridden by AIBrix environment variables and flags.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// `AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE`: `character` (default), `tiktoken`, `hf`.
    pub tokenizer: TokenizerKind,
    /// Path of a local `tokenizer.json` for the `hf` tokenizer.
    pub hf_tokenizer_path: Option<PathBuf>,
    /// `AIBRIX_PREFIX_CACHE_BLOCK_SIZE`: bytes of the tokenizer's byte stream per block.
    pub block_size: usize,
    /// `AIBRIX_PREFIX_CACHE_HASH_SEED`: XXH64 seed, also the chain's initial parent.
    pub hash_seed: u64,
    /// `AIBRIX_PREFIX_CACHE_BLOCK_NUMBER`: index capacity in blocks (LRU by add).
    pub block_capacity: usize,
    /// `AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS`: TTL sweep period.
    pub eviction_interval_secs: u64,
    /// `AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS`: a block expires this long after its
    /// last add.
    pub eviction_duration_mins: u64,
    /// `AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT`: the imbalance gate
    /// fires when max − min outstanding is strictly greater than this.
    pub imbalance_abs_count: u64,
    /// `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`: the integer k in mean + k·σ.
    pub stddev_factor: u64,
}

impl Default for RouterConfig {
    /// AIBrix v0.7.0 as deployed (Helm values and release overlay), not its code defaults.
    fn default() -> Self {
        RouterConfig {
            tokenizer: TokenizerKind::Character,
            hf_tokenizer_path: None,
            block_size: 128,
            hash_seed: 0,
            block_capacity: 200_000,
            eviction_interval_secs: 1,
            eviction_duration_mins: 20,
            imbalance_abs_count: 16,
            stddev_factor: 2,
        }
    }
}

impl RouterConfig {
    /// Applies the AIBrix environment variables that are set (`lookup` is `std::env::var`
    /// in production, a map in tests). A set but invalid value is an error naming the
    /// variable; AIBrix silently falls back to its default instead, which hides typos.
    pub fn apply_env(
        &mut self,
        _lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Checks values that deserialisation cannot (block size ≥ 1, k ≥ 1, …).
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

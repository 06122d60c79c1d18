//! Router settings, with AIBrix's deployed defaults and environment names.
//!
//! [`RouterConfig`] is the shape of the gateway's `[routing]` table: the one place the
//! settings are read from a file and the environment. [`Router::new`](crate::Router::new)
//! turns it into each part's own settings once (the tokenizer, the index, each policy), so
//! no part reads the whole configuration; [`error`] is the error every part's settings
//! report, a leaf that those parts can name without depending on this hub.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::policy::prefix_load::PrefixLoadConfig;
use crate::tokenize::TokenizerKind;

pub mod error;

pub use error::ConfigError;

/// Everything that shapes a routing decision. Deserialised from the gateway's `[routing]`
/// table (unknown keys are errors), then overridden by AIBrix environment variables and flags.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// `prefix-load`'s cost weights (`[routing.prefix_load]`, `PREFIXGATE_PREFIX_LOAD_*`).
    pub prefix_load: PrefixLoadConfig,
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
            prefix_load: PrefixLoadConfig::default(),
        }
    }
}

/// The prefix of every AIBrix prefix-cache environment variable.
pub const ENV_PREFIX: &str = "AIBRIX_PREFIX_CACHE_";

/// The AIBrix environment variables [`RouterConfig::apply_env`] reads, in `--help` order.
pub const ENV_NAMES: [&str; 8] = [
    "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE",
    "AIBRIX_PREFIX_CACHE_BLOCK_SIZE",
    "AIBRIX_PREFIX_CACHE_BLOCK_NUMBER",
    "AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS",
    "AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS",
    "AIBRIX_PREFIX_CACHE_HASH_SEED",
    "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
    "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR",
];

impl RouterConfig {
    /// Applies the AIBrix environment variables that are set, then prefixgate's own
    /// `PREFIXGATE_PREFIX_LOAD_*` ones (`lookup` is `std::env::var`
    /// in production, a map in tests). A set but invalid value is an error naming the
    /// variable; AIBrix silently falls back to its default instead, which hides typos.
    ///
    /// Integers are plain decimal. Values AIBrix cannot express are accepted where they mean
    /// something (`…_IMBALANCE_ABS_COUNT=0`: any difference is an imbalance) and refused where
    /// they do not (a block size, capacity, factor, interval or duration of 0).
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let [
            tokenizer,
            block_size,
            block_number,
            interval,
            duration,
            seed,
            imbalance,
            factor,
        ] = ENV_NAMES;
        if let Some(value) = lookup(tokenizer) {
            self.tokenizer =
                value
                    .trim()
                    .parse()
                    .map_err(|e: crate::tokenize::UnknownTokenizer| {
                        ConfigError::new(tokenizer, &value, e.to_string())
                    })?;
        }
        if let Some(value) = lookup(block_size) {
            self.block_size = env_integer(block_size, &value, 1)?;
        }
        if let Some(value) = lookup(block_number) {
            self.block_capacity = env_integer(block_number, &value, 1)?;
            if self.block_capacity > MAX_BLOCK_CAPACITY {
                return Err(ConfigError::new(
                    block_number,
                    &value,
                    format!("must be at most {MAX_BLOCK_CAPACITY}"),
                ));
            }
        }
        if let Some(value) = lookup(interval) {
            self.eviction_interval_secs = env_integer(interval, &value, 1)?;
        }
        if let Some(value) = lookup(duration) {
            self.eviction_duration_mins = env_integer(duration, &value, 1)?;
        }
        if let Some(value) = lookup(seed) {
            self.hash_seed = env_integer(seed, &value, 0)?;
        }
        if let Some(value) = lookup(imbalance) {
            self.imbalance_abs_count = env_integer(imbalance, &value, 0)?;
        }
        if let Some(value) = lookup(factor) {
            self.stddev_factor = env_integer(factor, &value, 1)?;
        }
        self.prefix_load.apply_env(&lookup)?;
        Ok(())
    }

    /// Checks values that deserialisation cannot (block size ≥ 1, k ≥ 1, …).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            ("block_size", self.block_size as u64),
            ("block_capacity", self.block_capacity as u64),
            ("eviction_interval_secs", self.eviction_interval_secs),
            ("eviction_duration_mins", self.eviction_duration_mins),
            ("stddev_factor", self.stddev_factor),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(ConfigError::new(
                    key,
                    &value.to_string(),
                    "must be at least 1",
                ));
            }
        }
        // The index addresses a shard's blocks with u32 slots.
        if self.block_capacity > MAX_BLOCK_CAPACITY {
            return Err(ConfigError::new(
                "block_capacity",
                &self.block_capacity.to_string(),
                format!("must be at most {MAX_BLOCK_CAPACITY}"),
            ));
        }
        if self.tokenizer == TokenizerKind::Hf && self.hf_tokenizer_path.is_none() {
            return Err(ConfigError::new(
                "hf_tokenizer_path",
                "",
                "the hf tokenizer needs the path of a local tokenizer.json",
            ));
        }
        self.prefix_load.validate()
    }

    /// These settings for a router whose index is fed by KV-event sync (`kv_sync`) or not:
    /// with sync the index sees the engines' caches, so `prefix-load` does not correct it
    /// with what responses taught (`learn_weight` 0; docs/ROUTING.md, "Learning from
    /// responses"), nor remember placements the index forgot (`recall_blocks` 0): the
    /// index follows the engines' evictions, which that memory would not see. The gateway
    /// and the simulator both build their routers through this.
    pub fn for_kv_sync(mut self, kv_sync: bool) -> Self {
        if kv_sync {
            self.prefix_load.learn_weight = 0.0;
            self.prefix_load.recall_blocks = 0;
        }
        self
    }

    /// The prefix index TTL in milliseconds.
    pub fn ttl_millis(&self) -> crate::Millis {
        self.eviction_duration_mins.saturating_mul(60_000)
    }
}

/// The largest index capacity accepted (about 100 GB of index at ~100 bytes a block, far
/// beyond any sensible setting; the bound keeps slot numbers in `u32`).
pub const MAX_BLOCK_CAPACITY: usize = 1 << 30;

/// A decimal integer of at least `min` from environment variable `name`.
fn env_integer<T>(name: &str, value: &str, min: T) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let parsed: T = value.trim().parse().map_err(|_| {
        ConfigError::new(
            name,
            value,
            format!("must be a whole number ≥ {min} (decimal digits only)"),
        )
    })?;
    if parsed < min {
        return Err(ConfigError::new(
            name,
            value,
            format!("must be at least {min}"),
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with_env(vars: &[(&str, &str)]) -> Result<RouterConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut config = RouterConfig::default();
        config.apply_env(|name| map.get(name).cloned())?;
        Ok(config)
    }

    #[test]
    fn defaults_are_aibrix_as_deployed() {
        let config = RouterConfig::default();
        assert_eq!(config.block_size, 128);
        assert_eq!(config.imbalance_abs_count, 16);
        assert_eq!(config.stddev_factor, 2);
        assert_eq!(config.block_capacity, 200_000);
        assert_eq!(config.ttl_millis(), 20 * 60 * 1000);
        assert_eq!(config.tokenizer, TokenizerKind::Character);
        config.validate().unwrap();
        assert_eq!(with_env(&[]).unwrap(), config);
    }

    #[test]
    fn every_variable_is_applied() {
        let config = with_env(&[
            ("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "tiktoken"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "16"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "1000"),
            ("AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS", "5"),
            ("AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS", "3"),
            ("AIBRIX_PREFIX_CACHE_HASH_SEED", "18446744073709551615"),
            (
                "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
                "0",
            ),
            ("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", " 3 "),
        ])
        .unwrap();
        assert_eq!(
            config,
            RouterConfig {
                tokenizer: TokenizerKind::Tiktoken,
                hf_tokenizer_path: None,
                block_size: 16,
                hash_seed: u64::MAX,
                block_capacity: 1000,
                eviction_interval_secs: 5,
                eviction_duration_mins: 3,
                imbalance_abs_count: 0,
                stddev_factor: 3,
                prefix_load: PrefixLoadConfig::default(),
            }
        );
    }

    #[test]
    fn invalid_values_name_the_variable() {
        let cases = [
            ("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "remote"),
            ("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", ""),
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "0"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "-4"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "12k"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "0"),
            ("AIBRIX_PREFIX_CACHE_BLOCK_NUMBER", "1073741825"),
            ("AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS", "0"),
            ("AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS", "1.5"),
            ("AIBRIX_PREFIX_CACHE_HASH_SEED", "18446744073709551616"),
            ("AIBRIX_PREFIX_CACHE_HASH_SEED", "0x10"),
            (
                "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT",
                "-1",
            ),
            ("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "0"),
            ("AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "1.5"),
        ];
        for (name, value) in cases {
            let err = with_env(&[(name, value)]).unwrap_err();
            assert_eq!(err.key, name, "{name}={value:?}");
            assert_eq!(err.value, value);
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn validate_rejects_unusable_settings() {
        let cases: [(&str, RouterConfig); 7] = [
            (
                "block_size",
                RouterConfig {
                    block_size: 0,
                    ..RouterConfig::default()
                },
            ),
            (
                "block_capacity",
                RouterConfig {
                    block_capacity: 0,
                    ..RouterConfig::default()
                },
            ),
            (
                "block_capacity",
                RouterConfig {
                    block_capacity: MAX_BLOCK_CAPACITY + 1,
                    ..RouterConfig::default()
                },
            ),
            (
                "stddev_factor",
                RouterConfig {
                    stddev_factor: 0,
                    ..RouterConfig::default()
                },
            ),
            (
                "eviction_interval_secs",
                RouterConfig {
                    eviction_interval_secs: 0,
                    ..RouterConfig::default()
                },
            ),
            (
                "eviction_duration_mins",
                RouterConfig {
                    eviction_duration_mins: 0,
                    ..RouterConfig::default()
                },
            ),
            (
                "hf_tokenizer_path",
                RouterConfig {
                    tokenizer: TokenizerKind::Hf,
                    ..RouterConfig::default()
                },
            ),
        ];
        for (key, config) in cases {
            assert_eq!(config.validate().unwrap_err().key, key);
        }
        let zero_gate = RouterConfig {
            imbalance_abs_count: 0,
            ..RouterConfig::default()
        };
        zero_gate.validate().unwrap();
    }

    #[test]
    fn config_file_keys_are_checked() {
        let config: RouterConfig =
            toml_like(r#"{"block_size": 64, "tokenizer": "tiktoken"}"#).unwrap();
        assert_eq!(config.block_size, 64);
        assert_eq!(config.tokenizer, TokenizerKind::Tiktoken);
        assert!(toml_like(r#"{"block_sise": 64}"#).is_err());
        assert!(toml_like(r#"{"tokenizer": "remote"}"#).is_err());
    }

    /// The gateway reads TOML; serde's field rules are the same for any format.
    fn toml_like(json: &str) -> Result<RouterConfig, serde_json::Error> {
        serde_json::from_str(json)
    }
}

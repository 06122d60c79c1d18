//! Engine profiles: the limits and step-time coefficients of one simulated hardware/model
//! pair, read from `config/engines/<name>.toml`.
//!
//! Coefficients live in these files and never in code, because the simulated system sits near
//! a tipping point (SPEC §4.3) and calibration against the seed must be able to move them. The
//! builtin profiles are embedded with `include_str!` so binaries work from any directory.
//! Parsing is strict: unknown keys and nonsensical values are errors naming the key.

use serde::Deserialize;
use std::path::Path;

use super::Seconds;

/// The seed's hardware: a ~27B FP8 model on one NVIDIA L20.
const L20_QWEN27B_FP8: &str = include_str!("../../../config/engines/l20-qwen27b-fp8.toml");
/// Near-zero step time and generous limits, for measuring the gateway's own overhead.
const FAST: &str = include_str!("../../../config/engines/fast.toml");
/// The same model on one NVIDIA H200, with a 256k context: long-context traffic (the
/// Mooncake trace) that an L20's 32k context refuses.
const H200_QWEN27B_FP8: &str = include_str!("../../../config/engines/h200-qwen27b-fp8.toml");

/// The names [`EngineProfile::builtin`] knows, in a stable order (for `--help` texts).
pub const BUILTIN_PROFILES: &[&str] = &["l20-qwen27b-fp8", "fast", "h200-qwen27b-fp8"];

/// Limits and step-time coefficients of one engine. Step duration (reference §5.2):
/// `T = t0 + a_d·decode_seqs + c_kv·Σ decode context + a_p·prefill tokens
///      + c_att·Σ over prefill chunks L·(s + L/2)`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineProfile {
    /// Profile name, reported in logs and `vllm:cache_config_info`.
    pub name: String,
    /// At most this many requests run (hold KV and take part in steps) at once.
    pub max_num_seqs: usize,
    /// Token budget of one step (decode tokens + prefill chunk tokens).
    pub max_num_batched_tokens: usize,
    /// Tokens per KV block (vLLM's default 16).
    pub block_size: usize,
    /// KV blocks including vLLM's reserved null block, so `num_gpu_blocks - 1` are usable.
    pub num_gpu_blocks: usize,
    /// Longest prompt + max_tokens accepted (vLLM answers 400 beyond it).
    pub max_model_len: usize,
    /// Fixed time from arrival (HTTP parsing, tokenization) until the scheduler can see it.
    pub frontend_overhead: Seconds,
    /// Fixed cost of every step (streaming the weights once).
    pub t0: Seconds,
    /// Cost per decoding sequence in a step.
    pub a_d: Seconds,
    /// Cost per context token read by decode attention.
    pub c_kv: Seconds,
    /// Cost per uncached prompt token computed in a step.
    pub a_p: Seconds,
    /// Cost per (query, key) pair of prefill attention.
    pub c_att: Seconds,
}

/// Why a profile could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Not a builtin name and no file at that path.
    #[error("unknown engine profile `{name}` (builtin: {builtin}; or give a path to a .toml file)")]
    Unknown { name: String, builtin: String },
    /// The file exists but could not be read.
    #[error("cannot read engine profile {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, a missing or unknown key, or a value of the wrong type; toml's message
    /// names the key.
    #[error("invalid engine profile: {0}")]
    Parse(#[from] toml::de::Error),
    /// Well-formed but nonsensical (zero sequences, a negative time, KV too small).
    #[error("invalid engine profile: `{key}` {reason}")]
    Invalid { key: &'static str, reason: String },
}

impl EngineProfile {
    /// A profile shipped with the binary, by name (`"l20-qwen27b-fp8"`, `"fast"`).
    pub fn builtin(name: &str) -> Option<EngineProfile> {
        let text = match name {
            "l20-qwen27b-fp8" => L20_QWEN27B_FP8,
            "fast" => FAST,
            "h200-qwen27b-fp8" => H200_QWEN27B_FP8,
            _ => return None,
        };
        // The embedded files are checked by this module's tests, so a failure here means the
        // shipped file was edited into something invalid; report it as "not available".
        EngineProfile::from_toml_str(text).ok()
    }

    /// Parses and validates a profile from TOML text.
    pub fn from_toml_str(text: &str) -> Result<EngineProfile, ProfileError> {
        let profile: EngineProfile = toml::from_str(text)?;
        profile.validate()?;
        Ok(profile)
    }

    /// A builtin name, or else a path to a `.toml` file.
    pub fn load(name_or_path: &str) -> Result<EngineProfile, ProfileError> {
        if let Some(profile) = EngineProfile::builtin(name_or_path) {
            return Ok(profile);
        }
        let path = Path::new(name_or_path);
        if !path.exists() {
            return Err(ProfileError::Unknown {
                name: name_or_path.to_owned(),
                builtin: BUILTIN_PROFILES.join(", "),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: name_or_path.to_owned(),
            source,
        })?;
        EngineProfile::from_toml_str(&text)
    }

    /// KV blocks a request may actually use (vLLM reserves block 0 as its null block).
    pub fn usable_blocks(&self) -> usize {
        self.num_gpu_blocks.saturating_sub(1)
    }

    /// Rejects values the model cannot run with, naming the key.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |key: &'static str, reason: &str| {
            Err(ProfileError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.name.trim().is_empty() {
            return invalid("name", "must not be empty");
        }
        for (key, value) in [
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("block_size", self.block_size),
            ("max_model_len", self.max_model_len),
        ] {
            if value == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        if self.num_gpu_blocks < 2 {
            return invalid(
                "num_gpu_blocks",
                "must be at least 2 (one is vLLM's null block)",
            );
        }
        // vLLM refuses to start when one max-length request cannot fit in the KV cache; the
        // same rule guarantees here that a request running alone always makes progress.
        let capacity = self.usable_blocks().saturating_mul(self.block_size);
        if capacity < self.max_model_len {
            return Err(ProfileError::Invalid {
                key: "num_gpu_blocks",
                reason: format!(
                    "holds {capacity} tokens, fewer than max_model_len = {}",
                    self.max_model_len
                ),
            });
        }
        for (key, value) in [
            ("frontend_overhead", self.frontend_overhead),
            ("t0", self.t0),
            ("a_d", self.a_d),
            ("c_kv", self.c_kv),
            ("a_p", self.a_p),
            ("c_att", self.c_att),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(ProfileError::Invalid {
                    key,
                    reason: format!("must be a finite number of seconds ≥ 0, got {value}"),
                });
            }
        }
        // Every step must take time, or a virtual clock could run an unbounded number of
        // steps at one instant.
        if self.t0 <= 0.0 {
            return invalid("t0", "must be greater than 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        name = "t"
        max_num_seqs = 2
        max_num_batched_tokens = 64
        block_size = 4
        num_gpu_blocks = 17
        max_model_len = 64
        frontend_overhead = 0.0
        t0 = 0.01
        a_d = 0.0
        c_kv = 0.0
        a_p = 0.0
        c_att = 0.0
    "#;

    fn error_of(text: &str) -> String {
        match EngineProfile::from_toml_str(text) {
            Ok(p) => panic!("accepted an invalid profile: {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn builtin_profiles_parse_and_match_the_calibrated_fit() {
        for name in BUILTIN_PROFILES {
            let profile = EngineProfile::builtin(name).expect("every listed builtin parses");
            assert_eq!(&profile.name, name);
        }
        let l20 = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin");
        assert_eq!(l20.max_num_seqs, 8);
        assert_eq!(l20.max_num_batched_tokens, 2048);
        assert_eq!(l20.block_size, 16);
        assert_eq!(l20.num_gpu_blocks * l20.block_size, 140_000);
        assert_eq!(l20.max_model_len, 32768);
        // The fit calibrated against the seed (docs/FIDELITY.md), not SPEC §4.3's starting fit.
        assert_eq!((l20.t0, l20.a_d, l20.a_p), (0.049, 0.0002, 0.00028));
        assert_eq!((l20.c_kv, l20.c_att), (0.1e-6, 1.2e-8));
        assert_eq!(l20.frontend_overhead, 0.100);
        assert!(EngineProfile::builtin("nope").is_none());
    }

    #[test]
    fn unequal_fleet_profiles_are_the_l20_slower_and_faster() {
        // The profiles of docs/POLICY.md's unequal-replica evaluation: the calibrated L20
        // with its fixed step cost ×1.5 and its prefill ×2 (and the inverse), nothing else.
        let l20 = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin");
        let parse = |text: &str| EngineProfile::from_toml_str(text).expect("shipped profile");
        let slow = parse(include_str!(
            "../../../config/engines/l20-qwen27b-fp8-slow.toml"
        ));
        let faster = parse(include_str!(
            "../../../config/engines/l20-qwen27b-fp8-faster.toml"
        ));
        // The files round to a few digits (0.049 / 1.5 is written 0.032667).
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs();
        for (profile, step, prefill) in [(&slow, 1.5, 2.0), (&faster, 1.0 / 1.5, 0.5)] {
            assert!(close(profile.t0, l20.t0 * step), "{}", profile.name);
            assert!(close(profile.a_p, l20.a_p * prefill), "{}", profile.name);
            assert!(
                close(profile.c_att, l20.c_att * prefill),
                "{}",
                profile.name
            );
            let same = EngineProfile {
                name: l20.name.clone(),
                t0: l20.t0,
                a_p: l20.a_p,
                c_att: l20.c_att,
                ..profile.clone()
            };
            assert_eq!(same, l20, "{} differs elsewhere", profile.name);
        }
    }

    #[test]
    fn load_takes_a_builtin_name_or_a_path() {
        assert_eq!(
            EngineProfile::load("fast").expect("builtin").name,
            "fast".to_owned()
        );
        let path = std::env::temp_dir().join(format!("engine-profile-{}.toml", std::process::id()));
        std::fs::write(&path, MINIMAL).expect("temp file");
        let loaded = EngineProfile::load(&path.to_string_lossy());
        std::fs::remove_file(&path).expect("remove temp file");
        assert_eq!(loaded.expect("valid file").name, "t");
        let missing = EngineProfile::load("/nonexistent/profile.toml");
        let message = missing.expect_err("missing file").to_string();
        assert!(message.contains("l20-qwen27b-fp8"), "{message}");
    }

    #[test]
    fn unknown_and_missing_keys_are_named() {
        assert!(EngineProfile::from_toml_str(MINIMAL).is_ok());
        let unknown = format!("{MINIMAL}\njitter_typo = 0.1\n");
        assert!(error_of(&unknown).contains("jitter_typo"));
        let missing = MINIMAL.replace("c_att = 0.0", "");
        assert!(error_of(&missing).contains("c_att"));
        let wrong_type = MINIMAL.replace("max_num_seqs = 2", "max_num_seqs = \"two\"");
        assert!(error_of(&wrong_type).contains("max_num_seqs"));
    }

    #[test]
    fn nonsensical_values_are_named() {
        let cases = [
            ("max_num_seqs = 2", "max_num_seqs = 0", "max_num_seqs"),
            ("block_size = 4", "block_size = 0", "block_size"),
            ("t0 = 0.01", "t0 = -0.01", "t0"),
            ("t0 = 0.01", "t0 = 0.0", "t0"),
            ("a_p = 0.0", "a_p = -1e-4", "a_p"),
            ("c_att = 0.0", "c_att = nan", "c_att"),
            (
                "frontend_overhead = 0.0",
                "frontend_overhead = inf",
                "frontend_overhead",
            ),
            (
                "num_gpu_blocks = 17",
                "num_gpu_blocks = 16",
                "num_gpu_blocks",
            ),
            ("name = \"t\"", "name = \" \"", "name"),
        ];
        for (from, to, key) in cases {
            let message = error_of(&MINIMAL.replace(from, to));
            assert!(message.contains(key), "{to}: {message}");
        }
        // Negative counts are a type error from toml, still naming the key.
        let message = error_of(&MINIMAL.replace("max_num_seqs = 2", "max_num_seqs = -1"));
        assert!(message.contains("max_num_seqs"), "{message}");
    }
}

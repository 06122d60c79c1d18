//! The error a setting that cannot be used produces, wherever it is checked (the router's
//! settings, a policy's weights, a tokenizer that cannot be loaded). A leaf: the parts that
//! check their own settings name it without depending on the configuration hub.

/// A setting that cannot be used. The message names the setting (config key or environment
/// variable) and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl ConfigError {
    /// The error for `key` set to `value`, refused for `reason`.
    pub fn new(key: &str, value: &str, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.into(),
        }
    }
}

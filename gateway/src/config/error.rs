//! Why a configuration cannot be used: [`ConfigFileError`], whose message names the key or
//! the file. A leaf, so every part that owns a settings table (admission, discovery, KV sync,
//! TLS) can refuse its own values without importing the configuration that contains it.

use crate::edge::tls::TlsError;

/// A configuration that cannot be used; the message names the key or file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid {key} = {value:?}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
    /// The `[admission]` table is inconsistent; the message names the keys.
    #[error("invalid admission settings: {0}")]
    Admission(String),
    #[error(transparent)]
    Routing(#[from] router_core::ConfigError),
    /// A value an environment variable, a flag or `--set` gave that its setting cannot take
    /// (or a key that is no setting).
    #[error("invalid {key} from {layer}: {reason}")]
    Layer {
        key: String,
        layer: String,
        reason: String,
    },
    /// An error about settings, with the layer each of them came from.
    #[error("{error} ({sources})")]
    Sourced {
        error: Box<ConfigFileError>,
        sources: String,
    },
    /// Only one of the `[tls]` files is given.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

pub(crate) fn invalid(key: &str, value: String, reason: &str) -> ConfigFileError {
    ConfigFileError::Invalid {
        key: key.to_owned(),
        value,
        reason: reason.to_owned(),
    }
}

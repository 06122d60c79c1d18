//! The `[ext_proc]` table: whether the gateway also serves Envoy's external processing
//! protocol, where, in which dialect, and with which certificate.

use std::net::SocketAddr;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsAcceptor;

use crate::config::error::{ConfigFileError, invalid};
use crate::edge::tls::{self, TlsError};

/// Which endpoint picker the listener stands in for: what it reads from Envoy and what it
/// answers (`ext_proc::dialect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// AIBrix's gateway-plugins: the chosen pod's `ip:port` in the `target-pod` request
    /// header (Envoy's ORIGINAL_DST cluster), with `routing-strategy`; request body
    /// buffered, response body streamed.
    #[default]
    Aibrix,
    /// A Gateway API Inference Extension endpoint picker: `x-gateway-destination-endpoint`
    /// header and `envoy.lb` dynamic metadata, the `envoy.lb.subset_hint` subset honoured;
    /// bodies full-duplex streamed.
    Gie,
}

/// Envoy external processing (`envoy.service.ext_proc.v3.ExternalProcessor`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExtProcConfig {
    /// Address of the Envoy ext_proc gRPC listener (with the gRPC health service); unset:
    /// no ext_proc listener.
    pub listen: Option<SocketAddr>,
    /// `aibrix` (AIBrix gateway-plugins' headers, answers and body modes) or `gie` (a
    /// Gateway API Inference Extension endpoint picker's).
    pub dialect: Dialect,
    /// PEM certificate chain for TLS on the ext_proc listener (gateways of the Inference
    /// Extension dial their endpoint picker over TLS); unset with `tls_key_file`: plaintext.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

impl ExtProcConfig {
    /// Both TLS files or neither; the files themselves are read by [`Self::acceptor`].
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => Err(invalid(
                "ext_proc.tls_key_file",
                String::new(),
                "is missing while ext_proc.tls_cert_file is set; give both or neither",
            )),
            (None, Some(_)) => Err(invalid(
                "ext_proc.tls_cert_file",
                String::new(),
                "is missing while ext_proc.tls_key_file is set; give both or neither",
            )),
            _ => Ok(()),
        }
    }

    /// The TLS acceptor of the listener, `None` for plaintext (or no listener).
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>, TlsError> {
        match (&self.listen, &self.tls_cert_file, &self.tls_key_file) {
            (Some(_), Some(cert), Some(key)) => tls::acceptor(cert, key).map(Some),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GatewayConfig;

    #[test]
    fn the_table_parses_and_half_a_tls_pair_is_named() {
        let config = GatewayConfig::from_toml_str(
            "[ext_proc]\nlisten = \"127.0.0.1:50052\"\ndialect = \"gie\"",
        )
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.ext_proc.dialect, Dialect::Gie);
        assert_eq!(config.ext_proc.listen.unwrap().port(), 50052);
        let error = GatewayConfig::from_toml_str("[ext_proc]\ndialect = \"istio\"").unwrap_err();
        assert!(error.to_string().contains("istio"), "{error}");
        let config =
            GatewayConfig::from_toml_str("[ext_proc]\ntls_cert_file = \"/x.crt\"").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("ext_proc.tls_key_file"), "{error}");
    }
}

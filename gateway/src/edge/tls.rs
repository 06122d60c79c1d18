//! TLS termination on the OpenAI listener: the `[tls]` settings, and the rustls acceptor
//! made from a PEM certificate chain and private key, offering HTTP/2 and HTTP/1.1 by ALPN.
//!
//! Everything that can be wrong with the files is found once, at start-up, and named (the
//! file, and what is wrong with it): a gateway that starts can serve TLS. The handshakes
//! themselves happen per connection in [`crate::edge::listener`]. The provider is ring's, as for
//! the Kubernetes client, so nothing needs cmake or aws-lc. The metrics listener never uses
//! TLS: it is scraped from inside the cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, InconsistentKeys, ServerConfig};

/// The ALPN protocols offered, in the server's order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The `[tls]` table: both files, or neither (plain HTTP).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's certificate first (`--tls-cert`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of that certificate: PKCS#8, PKCS#1 or SEC1 (`--tls-key`).
    pub key_file: Option<PathBuf>,
}

/// Why TLS cannot be served; each message names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// One file was given without the other.
    #[error(
        "incomplete TLS settings: tls.{given} is set but tls.{missing} ({flag}) is missing; give both or neither"
    )]
    Incomplete {
        given: &'static str,
        missing: &'static str,
        flag: &'static str,
    },
    #[error("cannot read TLS {what} file {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("TLS certificate file {path}: {problem}")]
    Certificate { path: String, problem: String },
    #[error("TLS key file {path}: {problem}")]
    Key { path: String, problem: String },
    #[error("TLS key file {key} does not match the certificate in {cert}")]
    Mismatch { cert: String, key: String },
}

impl TlsConfig {
    /// Whether the listener serves TLS.
    pub fn is_enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Both files or neither; the files themselves are read by [`Self::acceptor`].
    pub fn validate(&self) -> Result<(), TlsError> {
        self.files().map(|_| ())
    }

    /// The acceptor for the configured files, or `None` for plain HTTP.
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>, TlsError> {
        match self.files()? {
            Some((cert, key)) => acceptor(cert, key).map(Some),
            None => Ok(None),
        }
    }

    fn files(&self) -> Result<Option<(&Path, &Path)>, TlsError> {
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(TlsError::Incomplete {
                given: "cert_file",
                missing: "key_file",
                flag: "--tls-key",
            }),
            (None, Some(_)) => Err(TlsError::Incomplete {
                given: "key_file",
                missing: "cert_file",
                flag: "--tls-cert",
            }),
        }
    }
}

/// Reads both files and checks that the key is usable and belongs to the certificate.
pub fn acceptor(cert_path: &Path, key_path: &Path) -> Result<TlsAcceptor, TlsError> {
    let cert_name = cert_path.display().to_string();
    let key_name = key_path.display().to_string();
    let certs = certificates(&read(cert_path, "certificate")?, &cert_name)?;
    let key = private_key(&read(key_path, "key")?, &key_name)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Checked here so that a bad key is named as such, not as a certificate problem.
    provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| TlsError::Key {
            path: key_name.clone(),
            problem: format!("not a usable private key: {e}"),
        })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Certificate {
            path: cert_name.clone(),
            problem: format!("no TLS protocol version available: {e}"),
        })?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => TlsError::Mismatch {
                cert: cert_name.clone(),
                key: key_name.clone(),
            },
            other => TlsError::Certificate {
                path: cert_name.clone(),
                problem: format!("not a usable certificate: {other}"),
            },
        })?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// Every `CERTIFICATE` block of a PEM file, in order (the server's certificate first).
fn certificates(pem: &[u8], path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let problem = |problem: String| TlsError::Certificate {
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(problem(
            "no certificate in it (expected a PEM \"BEGIN CERTIFICATE\" block)".to_owned(),
        ));
    }
    Ok(certs)
}

/// The first PKCS#8, PKCS#1 or SEC1 private key block of a PEM file.
fn private_key(pem: &[u8], path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Key {
        path: path.to_owned(),
        problem: match e {
            rustls_pki_types::pem::Error::NoItemsFound => "no private key in it (expected a \
                 PEM PKCS#8 \"BEGIN PRIVATE KEY\", PKCS#1 \"BEGIN RSA PRIVATE KEY\" or SEC1 \
                 \"BEGIN EC PRIVATE KEY\" block; an encrypted key must be decrypted first)"
                .to_owned(),
            other => format!("not valid PEM: {other}"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh self-signed certificate for `localhost` and its PKCS#8 key, as PEM.
    fn self_signed() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A directory of its own per test, so parallel tests do not share files.
    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("prefixgate-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        (cert_path, key_path)
    }

    fn refusal(cert: &Path, key: &Path) -> String {
        match acceptor(cert, key) {
            Ok(_) => panic!("{} and {} were accepted", cert.display(), key.display()),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_matching_pair_makes_an_acceptor_offering_h2_then_http1() {
        let dir = dir("good");
        let (cert, key) = self_signed();
        let (cert_path, key_path) = files(&dir, &cert, &key);
        let acceptor = acceptor(&cert_path, &key_path).unwrap();
        assert_eq!(
            acceptor.config().alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let config = TlsConfig {
            cert_file: Some(cert_path),
            key_file: Some(key_path),
        };
        assert!(config.acceptor().unwrap().is_some());
        assert!(TlsConfig::default().acceptor().unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_file_without_the_other_names_the_missing_one() {
        let cert_only = TlsConfig {
            cert_file: Some("c.pem".into()),
            key_file: None,
        };
        let error = cert_only.validate().unwrap_err().to_string();
        assert!(
            error.contains("tls.key_file") && error.contains("--tls-key"),
            "{error}"
        );
        let key_only = TlsConfig {
            cert_file: None,
            key_file: Some("k.pem".into()),
        };
        let error = key_only.acceptor().err().unwrap().to_string();
        assert!(
            error.contains("tls.cert_file") && error.contains("--tls-cert"),
            "{error}"
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = dir("missing");
        let (cert, key) = self_signed();
        let (cert_path, key_path) = files(&dir, &cert, &key);
        let nowhere = dir.join("nowhere.pem");
        let error = refusal(&cert_path, &nowhere);
        assert!(
            error.starts_with("cannot read TLS key file") && error.contains("nowhere.pem"),
            "{error}"
        );
        let error = refusal(&nowhere, &key_path);
        assert!(
            error.starts_with("cannot read TLS certificate file") && error.contains("nowhere.pem"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_certificate_file_without_a_certificate_is_named() {
        let dir = dir("nocert");
        let (_, key) = self_signed();
        // The key where the certificate should be: valid PEM, but no certificate in it.
        let (cert_path, key_path) = files(&dir, &key, &key);
        let error = refusal(&cert_path, &key_path);
        assert!(
            error.contains(&cert_path.display().to_string()) && error.contains("no certificate"),
            "{error}"
        );
        std::fs::write(&cert_path, "not pem at all").unwrap();
        assert!(refusal(&cert_path, &key_path).contains("no certificate"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_file_without_a_usable_key_is_named() {
        let dir = dir("nokey");
        let (cert, _) = self_signed();
        // The certificate where the key should be.
        let (cert_path, key_path) = files(&dir, &cert, &cert);
        let error = refusal(&cert_path, &key_path);
        assert!(
            error.contains(&key_path.display().to_string())
                && error.contains("no private key")
                && error.contains("PKCS#8"),
            "{error}"
        );
        // A PKCS#8 block whose contents are not a key.
        let garbage = "-----BEGIN PRIVATE KEY-----\nAAECAwQFBgcICQ==\n-----END PRIVATE KEY-----\n";
        std::fs::write(&key_path, garbage).unwrap();
        let error = refusal(&cert_path, &key_path);
        assert!(
            error.contains(&key_path.display().to_string())
                && error.contains("not a usable private key"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_of_another_certificate_is_a_mismatch_naming_both_files() {
        let dir = dir("mismatch");
        let (cert, _) = self_signed();
        let (_, other_key) = self_signed();
        let (cert_path, key_path) = files(&dir, &cert, &other_key);
        let error = refusal(&cert_path, &key_path);
        assert_eq!(
            error,
            format!(
                "TLS key file {} does not match the certificate in {}",
                key_path.display(),
                cert_path.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_table_parses_and_unknown_keys_are_named() {
        let config: TlsConfig =
            toml::from_str("cert_file = \"/c.pem\"\nkey_file = \"/k.pem\"").unwrap();
        assert_eq!(config.cert_file.as_deref(), Some(Path::new("/c.pem")));
        assert!(config.is_enabled());
        let error = toml::from_str::<TlsConfig>("cert = \"/c.pem\"").unwrap_err();
        assert!(error.to_string().contains("cert"), "{error}");
    }

    #[test]
    fn flags_override_the_file_one_by_one_and_one_alone_is_refused() {
        use clap::Parser;
        let cli = |args: &[&str]| {
            crate::config::cli::Cli::try_parse_from(
                std::iter::once("prefixgate").chain(args.iter().copied()),
            )
            .unwrap()
        };
        let dir = dir("flags");
        let file = dir.join("gateway.toml");
        std::fs::write(
            &file,
            "[tls]\ncert_file = \"/file.crt\"\nkey_file = \"/file.key\"\n",
        )
        .unwrap();
        let config = cli(&["--config", file.to_str().unwrap(), "--tls-key", "/flag.key"])
            .resolve(|_| None)
            .unwrap();
        assert_eq!(
            config.tls.cert_file.as_deref(),
            Some(Path::new("/file.crt"))
        );
        assert_eq!(config.tls.key_file.as_deref(), Some(Path::new("/flag.key")));

        let error = cli(&["--tls-cert", "/flag.crt"])
            .resolve(|_| None)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "incomplete TLS settings: tls.cert_file is set but tls.key_file (--tls-key) is \
             missing; give both or neither (tls.cert_file from --tls-cert; tls.key_file from \
             the default)"
        );
        let error = cli(&["--tls-key", "/flag.key"])
            .resolve(|_| None)
            .unwrap_err();
        assert!(
            error.to_string().contains("(--tls-cert) is missing"),
            "{error}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

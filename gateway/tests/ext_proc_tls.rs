//! The ext_proc listener over TLS (`ext_proc.tls_cert_file` / `tls_key_file`), as the
//! Inference Extension's gateways dial their endpoint picker: HTTP/2 by ALPN, gRPC health
//! and an ext_proc stream through it, a certificate made at test time with rcgen; a
//! certificate that cannot be read stops the start naming the file.

#![expect(
    clippy::unwrap_used,
    reason = "this test's helpers run only in tests: a panic is a failed assertion"
)]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use gateway::GatewayConfig;
use gateway::config::Dialect;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const DEADLINE: Duration = Duration::from_secs(60);

/// A self-signed certificate for `localhost` in files, and a client config trusting it.
fn certificate(dir: &std::path::Path) -> (PathBuf, PathBuf, Arc<ClientConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(cert.der().to_vec()))
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    (cert_file, key_file, Arc::new(client))
}

fn config(cert_file: PathBuf, key_file: PathBuf) -> GatewayConfig {
    let mut config = support::embedded_config(1);
    config.ext_proc.listen = Some("127.0.0.1:0".parse().unwrap());
    config.ext_proc.dialect = Dialect::Gie;
    config.ext_proc.tls_cert_file = Some(cert_file);
    config.ext_proc.tls_key_file = Some(key_file);
    config
}

/// A gRPC channel to `addr` over TLS (rustls, ALPN h2), as an Envoy cluster with a TLS
/// transport socket dials it.
async fn tls_channel(addr: std::net::SocketAddr, client: Arc<ClientConfig>) -> Channel {
    let connector = tower::service_fn(move |_| {
        let client = Arc::clone(&client);
        async move {
            let tcp = TcpStream::connect(addr).await?;
            let name = ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(client)
                .connect(name, tcp)
                .await?;
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_ext_proc_listener_serves_grpc_over_tls() {
    let dir = std::env::temp_dir().join(format!("prefixgate-ext-proc-tls-{}", std::process::id()));
    let (cert_file, key_file, client) = certificate(&dir);
    let gateway = gateway::start(config(cert_file, key_file)).await.unwrap();
    let addr = gateway.ext_proc_addr().unwrap();
    let channel = tokio::time::timeout(DEADLINE, tls_channel(addr, client))
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: "envoy.service.ext_proc.v3.ExternalProcessor".into(),
        })
        .await
        .unwrap();
    assert_eq!(status.into_inner().status, 1, "SERVING");
    // An ext_proc stream: GET /v1/models is answered by the gateway itself.
    let headers = |pairs: &[(&str, &str)]| HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).into(),
                raw_value: v.as_bytes().to_vec(),
                ..Default::default()
            })
            .collect(),
    };
    let message = ProcessingRequest {
        request: Some(Message::RequestHeaders(HttpHeaders {
            headers: Some(headers(&[(":method", "GET"), (":path", "/v1/models")])),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    };
    let mut processor = ExternalProcessorClient::new(channel);
    let mut answers = processor
        .process(futures_util::stream::iter([message]))
        .await
        .unwrap()
        .into_inner();
    let answer = tokio::time::timeout(DEADLINE, answers.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(Answer::ImmediateResponse(immediate)) = answer.response else {
        panic!("{answer:?}");
    };
    assert_eq!(immediate.status.unwrap().code, 200);
    assert!(String::from_utf8_lossy(&immediate.body).contains("mock-model"));
    // A plaintext client on the TLS port gets no service.
    let plain = Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let plain = tokio::time::timeout(DEADLINE, async {
        match plain.connect().await {
            Ok(channel) => HealthClient::new(channel)
                .check(HealthCheckRequest::default())
                .await
                .is_err(),
            Err(_) => true,
        }
    })
    .await
    .unwrap();
    assert!(plain, "plaintext gRPC is refused on the TLS port");
    gateway.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_unreadable_ext_proc_certificate_stops_the_start_naming_it() {
    let missing = PathBuf::from("/nonexistent/prefixgate/tls.crt");
    let error = gateway::start(config(missing, PathBuf::from("/nonexistent/tls.key")))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent/prefixgate/tls.crt"), "{error}");
}

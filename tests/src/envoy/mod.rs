//! A stand-in for Envoy's ext_proc HTTP filter, written against Envoy's protos, for the
//! ext_proc tests (no Envoy binary can be installed here).
//!
//! [`Envoy`] holds a gRPC connection to an ext_proc server and plays the data plane:
//! [`Envoy::send`] takes one HTTP request through the filter ([`stream`] has the message
//! order and what Envoy does with each answer), routes it as Envoy's ORIGINAL_DST cluster
//! would (to the `ip:port` in the configured destination header; none: 503), forwards it
//! to that replica over HTTP/1.1, and takes the replica's response back through the filter
//! chunk by chunk. [`Envoy::open`] gives the [`EnvoyStream`] itself, for tests that stop
//! half-way (a client that leaves, an Envoy that goes away). [`FilterConfig::aibrix`] is
//! AIBrix's EnvoyExtensionPolicy, [`FilterConfig::gie`] the Inference Extension's filter.

pub mod mutation;
pub mod stream;

use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use http::{HeaderMap, HeaderValue};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

pub use stream::{EnvoyStream, Forward};

/// Bound on every wait of the stand-in; generous for a loaded CI machine.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The ext_proc filter's configuration (the fields whose behaviour the stand-in plays).
#[derive(Debug, Clone)]
pub struct FilterConfig {
    pub request_body: BodySendMode,
    pub response_body: BodySendMode,
    pub response_headers: bool,
    pub request_trailers: bool,
    pub response_trailers: bool,
    pub allow_mode_override: bool,
    /// Whether the first message carries `protocol_config` (Envoy 1.34 and later).
    pub send_protocol_config: bool,
    /// The per-connection buffer limit (bytes) for buffered bodies.
    pub buffer_limit: usize,
    /// The request header the ORIGINAL_DST cluster takes the upstream address from.
    pub destination_header: &'static str,
}

impl FilterConfig {
    /// AIBrix's EnvoyExtensionPolicy: request body `Buffered`, response body `Streamed`,
    /// ORIGINAL_DST on `target-pod`.
    pub fn aibrix() -> Self {
        FilterConfig {
            request_body: BodySendMode::Buffered,
            response_body: BodySendMode::Streamed,
            response_headers: true,
            request_trailers: false,
            response_trailers: false,
            allow_mode_override: false,
            send_protocol_config: true,
            buffer_limit: 4 * 1024 * 1024,
            destination_header: "target-pod",
        }
    }

    /// The Inference Extension's filter: full duplex both ways, trailers sent, ORIGINAL_DST
    /// on `x-gateway-destination-endpoint`.
    pub fn gie() -> Self {
        FilterConfig {
            request_body: BodySendMode::FullDuplexStreamed,
            response_body: BodySendMode::FullDuplexStreamed,
            response_headers: true,
            request_trailers: true,
            response_trailers: true,
            allow_mode_override: false,
            send_protocol_config: true,
            buffer_limit: 4 * 1024 * 1024,
            destination_header: "x-gateway-destination-endpoint",
        }
    }

    /// The processing mode the filter starts each stream with.
    pub fn mode(&self) -> ProcessingMode {
        let send = |on: bool| {
            if on {
                HeaderSendMode::Send as i32
            } else {
                HeaderSendMode::Skip as i32
            }
        };
        ProcessingMode {
            request_header_mode: HeaderSendMode::Send as i32,
            response_header_mode: send(self.response_headers),
            request_body_mode: self.request_body as i32,
            response_body_mode: self.response_body as i32,
            request_trailer_mode: send(self.request_trailers),
            response_trailer_mode: send(self.response_trailers),
        }
    }
}

/// One client request as it reaches Envoy.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    /// The body as the client sends it, chunk by chunk.
    pub body: Vec<Bytes>,
    pub trailers: Option<HeaderMap>,
    /// The filter metadata Envoy passes along (the subset hint).
    pub metadata: Option<Metadata>,
}

impl Request {
    /// `POST path` with a JSON body in `chunks` pieces, and Envoy's own `x-request-id`.
    pub fn post(path: &str, body: &str, chunks: usize) -> Self {
        let bytes = Bytes::from(body.to_owned());
        let size = bytes.len().div_ceil(chunks.max(1)).max(1);
        let body = (0..bytes.len())
            .step_by(size)
            .map(|at| bytes.slice(at..bytes.len().min(at + size)))
            .collect();
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("content-length", HeaderValue::from(bytes.len()));
        headers.insert(
            "x-request-id",
            HeaderValue::from_static("envoy-request-id-1"),
        );
        Request {
            method: "POST".into(),
            path: path.into(),
            headers,
            body,
            trailers: None,
            metadata: None,
        }
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers
            .insert(name, HeaderValue::from_str(value).unwrap());
        self
    }
}

/// What the client receives.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Answered by Envoy itself (an immediate response, a 413, a broken stream, no host).
    pub local: bool,
    /// Where Envoy sent the request (`ip:port`), when it did.
    pub upstream: Option<String>,
    /// The request as it left Envoy, when it did.
    pub forwarded: Option<Forward>,
}

impl Reply {
    pub fn local(status: u16, headers: HeaderMap, body: Bytes) -> Self {
        Reply {
            status,
            headers,
            body,
            local: true,
            upstream: None,
            forwarded: None,
        }
    }

    /// Envoy's answer when the ext_proc stream fails (no `failure_mode_allow`).
    pub fn ext_proc_error(reason: &str) -> Self {
        Reply::local(500, HeaderMap::new(), Bytes::from(reason.to_owned()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The dynamic metadata string `namespace.key`.
    pub fn metadata(&self, namespace: &str, key: &str) -> Option<String> {
        let metadata = self.forwarded.as_ref()?.metadata.as_ref();
        mutation::metadata_strings(metadata)
            .get(namespace)?
            .get(key)
            .cloned()
    }
}

/// The data plane: a gRPC connection to the ext_proc server and an HTTP client to the
/// replicas.
#[derive(Debug, Clone)]
pub struct Envoy {
    ext_proc: ExternalProcessorClient<Channel>,
    health: HealthClient<Channel>,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    pub config: FilterConfig,
}

impl Envoy {
    /// Connects to the ext_proc server at `addr` (`ip:port`, plaintext HTTP/2).
    pub async fn connect(addr: &str, config: FilterConfig) -> Envoy {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Envoy {
            ext_proc: ExternalProcessorClient::new(channel.clone()),
            health: HealthClient::new(channel),
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
            config,
        }
    }

    /// The same connections with another filter configuration.
    pub fn with_config(&self, config: FilterConfig) -> Envoy {
        Envoy {
            config,
            ..self.clone()
        }
    }

    /// The gRPC health status of `service` (as Envoy's health checker or the kubelet asks).
    pub async fn health(&self, service: &str) -> Result<i32, tonic::Status> {
        let mut health = self.health.clone();
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        Ok(health.check(request).await?.into_inner().status)
    }

    /// Opens one ext_proc stream, as the filter does for each HTTP request.
    pub async fn open(&self) -> EnvoyStream {
        let (sender, receiver) = mpsc::channel(16);
        let outbound = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|message| (message, receiver))
        });
        let mut client = self.ext_proc.clone();
        let answers = client.process(outbound).await.unwrap().into_inner();
        EnvoyStream::new(sender, answers, self.config.clone())
    }

    /// One HTTP request through the filter, the ORIGINAL_DST cluster and the replica.
    pub async fn send(&self, request: &Request) -> Reply {
        tokio::time::timeout(DEADLINE, self.exchange(request))
            .await
            .expect("the request through the stand-in Envoy did not finish")
    }

    async fn exchange(&self, request: &Request) -> Reply {
        let mut stream = self.open().await;
        let forward = match stream.request(request).await {
            Ok(forward) => forward,
            Err(reply) => {
                stream.finish().await.ok();
                return reply;
            }
        };
        let Some(upstream) = forward
            .headers
            .get(self.config.destination_header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            stream.finish().await.ok();
            let mut reply = Reply::local(503, HeaderMap::new(), "no healthy upstream".into());
            reply.forwarded = Some(forward);
            return reply;
        };
        let mut outgoing = http::Request::builder()
            .method(request.method.as_str())
            .uri(format!("http://{upstream}{}", request.path))
            .body(Full::new(forward.body.clone()))
            .unwrap();
        *outgoing.headers_mut() = forward.headers.clone();
        outgoing.headers_mut().remove("content-length");
        let response = self.http.request(outgoing).await.unwrap();
        let (parts, mut body) = response.into_parts();
        let mut reply = Reply {
            status: parts.status.as_u16(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            local: false,
            upstream: Some(upstream),
            forwarded: Some(forward),
        };
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            frames.push(frame.unwrap());
        }
        let chunks: Vec<Bytes> = frames
            .into_iter()
            .filter_map(|f| f.into_data().ok())
            .collect();
        let headers = stream
            .response_headers(reply.status, parts.headers, chunks.is_empty())
            .await;
        match headers {
            Ok(headers) => reply.headers = headers,
            Err(local) => return local,
        }
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            match stream
                .response_chunk(chunk.clone(), i + 1 == chunks.len())
                .await
            {
                Ok(sent) => out.extend_from_slice(&sent),
                Err(local) => return local,
            }
        }
        reply.body = out.into();
        stream
            .finish()
            .await
            .expect("the ext_proc server ended its stream badly");
        reply
    }
}

//! A recording HTTP proxy put between the gateway and one real replica, so a test can
//! compare what vLLM sent with what the gateway's client received, byte for byte. It
//! forwards every request unchanged and keeps, per `x-request-id`, the response status and
//! body exactly as the replica sent them (the HTTP framing aside).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use futures_util::StreamExt;
use gateway::config::BackendConfig;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// One response as the replica sent it.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub status: u16,
    pub body: Vec<u8>,
    /// The replica's `content-length`, if it sent one.
    length: Option<usize>,
    /// The replica's stream of chunks ended (not cut).
    ended: bool,
}

impl Recorded {
    /// Whether the replica's whole body passed (a server stops polling a body whose
    /// declared length is met, so that case is read from the length).
    pub fn complete(&self) -> bool {
        self.ended || self.length == Some(self.body.len())
    }
}

#[derive(Debug)]
struct Shared {
    upstream: String,
    /// A metric name `/metrics` answers with another (`from`, `to`): an engine version that
    /// renamed a gauge.
    rename: Option<(String, String)>,
    client: HyperClient<HttpConnector, Body>,
    seen: Mutex<HashMap<String, Recorded>>,
}

/// The proxy; stops serving when dropped.
#[derive(Debug)]
pub struct Tap {
    shared: Arc<Shared>,
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Tap {
    /// A tap in front of `replica`'s URL.
    pub async fn start(replica: &BackendConfig) -> Tap {
        Tap::serve(replica, None).await
    }

    /// A tap whose `/metrics` calls the metric `from` by the name `to`.
    pub async fn renaming(replica: &BackendConfig, from: &str, to: &str) -> Tap {
        Tap::serve(replica, Some((from.to_owned(), to.to_owned()))).await
    }

    async fn serve(replica: &BackendConfig, rename: Option<(String, String)>) -> Tap {
        let shared = Arc::new(Shared {
            upstream: replica.url.clone(),
            rename,
            client: HyperClient::builder(TokioExecutor::new()).build(HttpConnector::new()),
            seen: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Tap { shared, addr, task }
    }

    /// `replica` as the gateway should see it: the same name, model and KV-event
    /// endpoints, the HTTP URL the tap's.
    pub fn backend(&self, replica: &BackendConfig) -> BackendConfig {
        BackendConfig {
            url: format!("http://{}", self.addr),
            ..replica.clone()
        }
    }

    /// What the replica answered to the request with `x-request-id: id`.
    pub fn recorded(&self, id: &str) -> Option<Recorded> {
        self.shared.seen.lock().unwrap().get(id).cloned()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (mut parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = format!("{}{path}", shared.upstream).parse().unwrap();
    parts.headers.remove(http::header::HOST);
    let response = match shared
        .client
        .request(http::Request::from_parts(parts, body))
        .await
    {
        Ok(response) => response,
        Err(error) => {
            return Response::builder()
                .status(502)
                .body(Body::from(format!("tap: {error}")))
                .unwrap();
        }
    };
    let (parts, body) = response.into_parts();
    if let (Some((from, to)), "/metrics") = (&shared.rename, path.as_str()) {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let renamed = String::from_utf8_lossy(&text).replace(from.as_str(), to);
        let mut parts = parts;
        parts.headers.remove(http::header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(renamed));
    }
    let Some(id) = id else {
        return Response::from_parts(parts, Body::new(body));
    };
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    shared.seen.lock().unwrap().insert(
        id.clone(),
        Recorded {
            status: parts.status.as_u16(),
            length,
            ..Recorded::default()
        },
    );
    let recorder = Arc::clone(&shared);
    let done = Arc::clone(&shared);
    let done_id = id.clone();
    let stream = body
        .into_data_stream()
        .inspect(move |chunk| {
            if let Ok(chunk) = chunk {
                if let Some(r) = recorder.seen.lock().unwrap().get_mut(&id) {
                    r.body.extend_from_slice(chunk);
                }
            }
        })
        .chain(futures_util::stream::once(async move {
            if let Some(r) = done.seen.lock().unwrap().get_mut(&done_id) {
                r.ended = true;
            }
            Ok::<Bytes, hyper::Error>(Bytes::new())
        }))
        .filter(|chunk| std::future::ready(chunk.as_ref().map_or(true, |c| !c.is_empty())));
    Response::from_parts(parts, Body::from_stream(stream))
}

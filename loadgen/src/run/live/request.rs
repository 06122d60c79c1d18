//! One streamed request against an OpenAI-compatible endpoint, timestamped chunk by chunk.
//!
//! The client is hyper's pooled HTTP/1.1 client with TCP_NODELAY. A request is a chat
//! completion with `stream`, `stream_options.include_usage` and `ignore_eos`. Its record
//! gets the phase clock's time when each body piece arrives: the first piece with content,
//! the last one with content, `[DONE]`, the usage chunk, and the `target-pod` and
//! `x-prefixgate-outstanding` headers. Nothing here panics on a bad server: every failure
//! becomes an [`ErrorClass`] in the record.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::sse::{Chunk, SseLines, classify};
use crate::measure::{ErrorClass, RequestRecord, Usage};
use crate::workload::chat::{ChatMessage, Role};

/// The pooled client every live request shares.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with TCP_NODELAY (a token is a few bytes; Nagle would delay it).
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Engine time of a phase: wall time since `origin`, times the time scale.
#[derive(Debug, Clone, Copy)]
pub struct PhaseClock {
    pub origin: Instant,
    pub scale: f64,
}

impl PhaseClock {
    /// Engine seconds since the origin.
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * self.scale
    }

    /// The wall instant of engine time `at`.
    pub fn instant(&self, at: f64) -> Instant {
        self.origin + Duration::from_secs_f64((at / self.scale).max(0.0))
    }
}

/// The JSON body of a streamed chat completion of `text` as one user message.
pub fn chat_body(model: &str, text: &str, max_tokens: u32) -> Bytes {
    chat_messages_body(model, &[ChatMessage::new(Role::User, text)], max_tokens)
}

/// The JSON body of a streamed chat completion of `messages`.
pub fn chat_messages_body(model: &str, messages: &[ChatMessage], max_tokens: u32) -> Bytes {
    let body = serde_json::json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    Bytes::from(body.to_string())
}

/// Sends `body` to `url` (a full `/v1/chat/completions` URL), with a `routing-strategy`
/// header when given, and fills `record`. `limit` bounds the whole exchange (wall time).
pub async fn stream_request(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    strategy: Option<&str>,
    clock: PhaseClock,
    record: RequestRecord,
    limit: Duration,
) -> RequestRecord {
    let headers: &[(&str, &str)] = match strategy {
        Some(strategy) => &[("routing-strategy", strategy)],
        None => &[],
    };
    stream_request_with_headers(client, url, body, headers, clock, record, limit).await
}

/// [`stream_request`] with any extra request headers (`routing-strategy`, a tenant header);
/// a header that cannot be sent is recorded as a connect error.
pub async fn stream_request_with_headers(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    headers: &[(&str, &str)],
    clock: PhaseClock,
    mut record: RequestRecord,
    limit: Duration,
) -> RequestRecord {
    stream_exchange(client, url, body, headers, clock, &mut record, None, limit).await;
    record
}

/// [`stream_request`] that also returns the answer's text (every chunk's content,
/// concatenated): a conversation's next turn carries it.
pub async fn stream_request_answer(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    strategy: Option<&str>,
    clock: PhaseClock,
    mut record: RequestRecord,
    limit: Duration,
) -> (RequestRecord, String) {
    let headers: &[(&str, &str)] = match strategy {
        Some(strategy) => &[("routing-strategy", strategy)],
        None => &[],
    };
    let mut answer = String::new();
    stream_exchange(
        client,
        url,
        body,
        headers,
        clock,
        &mut record,
        Some(&mut answer),
        limit,
    )
    .await;
    (record, answer)
}

#[expect(
    clippy::too_many_arguments,
    reason = "private; the two public callers name them"
)]
async fn stream_exchange(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    headers: &[(&str, &str)],
    clock: PhaseClock,
    record: &mut RequestRecord,
    answer: Option<&mut String>,
    limit: Duration,
) {
    record.dispatched = clock.now();
    let outcome = tokio::time::timeout(
        limit,
        exchange(client, url, body, headers, clock, record, answer),
    )
    .await;
    match outcome {
        Err(_) => record.error = Some(ErrorClass::Timeout),
        Ok(Err(class)) => record.error = Some(class),
        Ok(Ok(())) => {}
    }
    if record.error.is_none() && (record.first_content.is_none() || record.usage.is_none()) {
        record.error = Some(ErrorClass::Incomplete);
    }
}

async fn exchange(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    headers: &[(&str, &str)],
    clock: PhaseClock,
    record: &mut RequestRecord,
    mut answer: Option<&mut String>,
) -> Result<(), ErrorClass> {
    let mut request = http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(body))
        .map_err(|_| ErrorClass::Connect)?;
    let response = client
        .request(request)
        .await
        .map_err(|_| ErrorClass::Connect)?;
    record.status = Some(response.status().as_u16());
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    record.target_pod = header("target-pod");
    record.outstanding_at_selection =
        header("x-prefixgate-outstanding").and_then(|v| v.trim().parse().ok());
    if !response.status().is_success() {
        return Err(ErrorClass::Status);
    }
    let mut body = response.into_body();
    let mut lines = SseLines::default();
    // The first chunk that carried a token, for an answer whose every token decoded to no
    // text (a short answer of a byte-level tokenizer): its TTFT is that chunk's.
    let mut first_token = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ErrorClass::StreamBroken)?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let t = clock.now();
        for payload in lines.feed(data).map_err(|_| ErrorClass::StreamBroken)? {
            match classify(&payload) {
                Chunk::Done => {
                    record.stream_end = Some(t);
                    if record.first_content.is_none() {
                        record.first_content = first_token;
                        record.last_token = record.last_token.or(first_token);
                    }
                    return Ok(());
                }
                Chunk::Data {
                    content,
                    token,
                    finished: _,
                    usage,
                } => {
                    if token {
                        first_token.get_or_insert(t);
                    }
                    if !content.is_empty() {
                        record.first_content.get_or_insert(t);
                        record.last_token = Some(t);
                        if let Some(answer) = answer.as_deref_mut() {
                            answer.push_str(&content);
                        }
                    }
                    if let Some((prompt_tokens, completion_tokens, cached_tokens)) = usage {
                        record.usage = Some(Usage {
                            prompt_tokens,
                            completion_tokens,
                            cached_tokens,
                        });
                    }
                }
                Chunk::Error(_) | Chunk::Malformed(_) => return Err(ErrorClass::StreamBroken),
            }
        }
    }
    // The body ended without `[DONE]`.
    record.stream_end = Some(clock.now());
    Err(ErrorClass::StreamBroken)
}

/// GETs `url` and returns its body as text (`limit` bounds the whole exchange).
pub async fn get_text(client: &HttpClient, url: &str, limit: Duration) -> Result<String, String> {
    let fetch = async {
        let request = http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("bad URL {url}: {e}"))?;
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: status {}", response.status()));
        }
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .to_bytes();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    tokio::time::timeout(limit, fetch)
        .await
        .map_err(|_| format!("GET {url}: no answer within {limit:?}"))?
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server that answers one request with `events` as an SSE body, then closes.
    async fn serve_once(events: &'static [&'static str]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/v1/chat/completions",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut request = vec![0u8; 4096];
            let _ = tcp.read(&mut request).await;
            let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            tcp.write_all(head.as_bytes()).await.unwrap();
            tcp.write_all(body.as_bytes()).await.unwrap();
        });
        url
    }

    async fn record_of(events: &'static [&'static str]) -> RequestRecord {
        let url = serve_once(events).await;
        let clock = PhaseClock {
            origin: Instant::now(),
            scale: 1.0,
        };
        let record = RequestRecord::sent(0, 0, 0.0, 0.0);
        stream_request(
            &http_client(),
            &url,
            Bytes::from_static(b"{}"),
            None,
            clock,
            record,
            Duration::from_secs(10),
        )
        .await
    }

    const ROLE: &str = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
    const USAGE: &str =
        r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;

    #[tokio::test]
    async fn an_answer_whose_tokens_decode_to_no_text_is_complete_from_its_first_token() {
        // vLLM with a byte-level tokenizer: both tokens end inside a UTF-8 character.
        let record = record_of(&[
            ROLE,
            r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}"#,
            USAGE,
            "[DONE]",
        ])
        .await;
        assert_eq!(record.error, None, "{record:?}");
        assert!(
            record.first_content.is_some() && record.usage.is_some(),
            "{record:?}"
        );
    }

    #[tokio::test]
    async fn an_answer_without_any_token_or_usage_is_incomplete() {
        let no_token = record_of(&[ROLE, USAGE, "[DONE]"]).await;
        assert_eq!(no_token.error, Some(ErrorClass::Incomplete), "{no_token:?}");
        let no_usage = record_of(&[
            ROLE,
            r#"{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}]}"#,
            "[DONE]",
        ])
        .await;
        assert_eq!(no_usage.error, Some(ErrorClass::Incomplete), "{no_usage:?}");
    }
}

//! The prompt's token ids from the engine itself (`POST /tokenize`, AIBrix's remote
//! tokenizer), so the request side hashes exactly the ids the engine's `BlockStored` events
//! carry.
//!
//! The body sent (vLLM's `TokenizeRequest`): completions `{"model", "prompt",
//! "add_special_tokens": true}`; chat `{"model", "messages", "add_generation_prompt": true,
//! "add_special_tokens": false}` (AIBrix's chat defaults in KV-sync mode: the template adds
//! the special tokens). The answer's `tokens` become 4-byte big-endian bytes. It asks the
//! first ready replica serving the model (every replica of a model shares its tokenizer).
//! Any failure (no replica, refused, timeout, not JSON, no `tokens`) is `None`: the caller
//! routes on the text tokenizer and counts `tokenize_failed`.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use router_core::text::Endpoint;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::replicas::Replicas;
use crate::upstream::UpstreamClient;

/// Largest `/tokenize` answer read (a 128k-token prompt is about 1 MB of ids).
const MAX_TOKENIZE_BODY: usize = 8 * 1024 * 1024;

/// The parts of a request body `/tokenize` needs, passed through unparsed.
#[derive(Deserialize)]
struct PromptParts<'a> {
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct TokenizeAnswer {
    tokens: Vec<u32>,
}

/// The `/tokenize` body for a chat or completion request body; `None` for anything else.
pub fn tokenize_body(endpoint: Endpoint, model: &str, body: &[u8]) -> Option<Vec<u8>> {
    let parts: PromptParts<'_> = serde_json::from_slice(body).ok()?;
    let model = serde_json::to_string(model).ok()?;
    let text = match endpoint {
        Endpoint::ChatCompletions => format!(
            r#"{{"model":{model},"messages":{},"add_generation_prompt":true,"add_special_tokens":false}}"#,
            parts.messages?.get()
        ),
        Endpoint::Completions => format!(
            r#"{{"model":{model},"prompt":{},"add_special_tokens":true}}"#,
            parts.prompt?.get()
        ),
        Endpoint::Embeddings => return None,
    };
    Some(text.into_bytes())
}

/// The prompt's ids as the router's byte stream, or `None` on any failure.
pub async fn engine_tokens(
    replicas: &Replicas,
    client: &UpstreamClient,
    endpoint: Endpoint,
    model: &str,
    body: &[u8],
    timeout: Duration,
) -> Option<Vec<u8>> {
    let request_body = tokenize_body(endpoint, model, body)?;
    let replica = replicas
        .snapshot()
        .iter()
        .find(|r| r.is_ready() && r.serves(model))
        .cloned()?;
    let request = Request::post(format!("{}/tokenize", replica.base_url()))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(request_body)))
        .ok()?;
    let exchange = async {
        let response = client.request(request).await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body = Limited::new(response.into_body(), MAX_TOKENIZE_BODY)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let answer: TokenizeAnswer = serde_json::from_slice(&body).ok()?;
        Some(router_core::kv_sync::token_bytes(&answer.tokens))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_follow_aibrix_defaults() {
        let chat = tokenize_body(
            Endpoint::ChatCompletions,
            "m",
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        )
        .unwrap();
        let chat: serde_json::Value = serde_json::from_slice(&chat).unwrap();
        assert_eq!(
            chat,
            serde_json::json!({"model":"m","messages":[{"role":"user","content":"hi"}],
                "add_generation_prompt":true,"add_special_tokens":false})
        );
        let completion =
            tokenize_body(Endpoint::Completions, "m\"x", br#"{"prompt":"a b"}"#).unwrap();
        let completion: serde_json::Value = serde_json::from_slice(&completion).unwrap();
        assert_eq!(
            completion,
            serde_json::json!({"model":"m\"x","prompt":"a b","add_special_tokens":true})
        );
        assert!(tokenize_body(Endpoint::Embeddings, "m", br#"{"input":"x"}"#).is_none());
        assert!(tokenize_body(Endpoint::Completions, "m", br#"{"messages":[]}"#).is_none());
        assert!(tokenize_body(Endpoint::Completions, "m", b"not json").is_none());
    }
}

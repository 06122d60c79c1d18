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
//!
//! The `messages` or `prompt` value goes to the engine exactly as the client sent it: the
//! bytes the request's one parse located ([`router_core::text::RoutingFields::prompt_span`]),
//! so the body is not parsed a second time.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use router_core::text::Endpoint;
use serde::Deserialize;

use crate::replicas::Replicas;
use crate::upstream::UpstreamClient;

/// Largest `/tokenize` answer read (a 128k-token prompt is about 1 MB of ids).
const MAX_TOKENIZE_BODY: usize = 8 * 1024 * 1024;

#[derive(Deserialize)]
struct TokenizeAnswer {
    tokens: Vec<u32>,
}

/// The `/tokenize` body for a chat or completion request whose `messages` (chat) or
/// `prompt` (completions) value is `prompt`, raw JSON as sent; `None` for embeddings.
pub fn tokenize_body(endpoint: Endpoint, model: &str, prompt: &[u8]) -> Option<Vec<u8>> {
    let (field, tail): (&[u8], &[u8]) = match endpoint {
        Endpoint::ChatCompletions => (
            b"messages",
            br#","add_generation_prompt":true,"add_special_tokens":false}"#,
        ),
        Endpoint::Completions => (b"prompt", br#","add_special_tokens":true}"#),
        Endpoint::Embeddings => return None,
    };
    let model = serde_json::to_vec(model).ok()?;
    Some(
        [
            br#"{"model":"#,
            &model[..],
            b",\"",
            field,
            b"\":",
            prompt,
            tail,
        ]
        .concat(),
    )
}

/// The prompt's ids as the router's byte stream, or `None` on any failure.
pub async fn engine_tokens(
    replicas: &Replicas,
    client: &UpstreamClient,
    endpoint: Endpoint,
    model: &str,
    prompt: &[u8],
    timeout: Duration,
) -> Option<Vec<u8>> {
    let request_body = tokenize_body(endpoint, model, prompt)?;
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

    /// The `/tokenize` body of a request body, through its one parse.
    fn body_for(endpoint: Endpoint, model: &str, request: &str) -> Option<serde_json::Value> {
        let fields = router_core::text::routing_fields(endpoint, request.as_bytes()).ok()?;
        let prompt = &request.as_bytes()[fields.prompt_span?];
        let body = tokenize_body(endpoint, model, prompt)?;
        Some(serde_json::from_slice(&body).expect("a JSON body"))
    }

    #[test]
    fn bodies_follow_aibrix_defaults() {
        let chat = body_for(
            Endpoint::ChatCompletions,
            "m",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        );
        assert_eq!(
            chat.unwrap(),
            serde_json::json!({"model":"m","messages":[{"role":"user","content":"hi"}],
                "add_generation_prompt":true,"add_special_tokens":false})
        );
        let completion = body_for(
            Endpoint::Completions,
            "m\"x",
            r#"{"model":"m\"x","prompt":"a b"}"#,
        );
        assert_eq!(
            completion.unwrap(),
            serde_json::json!({"model":"m\"x","prompt":"a b","add_special_tokens":true})
        );
        let batch = body_for(
            Endpoint::Completions,
            "m",
            r#"{"model":"m","prompt":["a","b"]}"#,
        );
        assert_eq!(
            batch.unwrap(),
            serde_json::json!({"model":"m","prompt":["a","b"],"add_special_tokens":true})
        );
        assert!(tokenize_body(Endpoint::Embeddings, "m", b"\"x\"").is_none());
    }

    #[test]
    fn the_prompt_goes_to_the_engine_byte_for_byte() {
        // Escapes and spacing as the client wrote them: the engine's template sees the same
        // JSON, not a re-serialisation.
        let messages = r#"[ {"role":"user","content":"a\u0041\n"} ]"#;
        let request = format!(r#"{{"model":"m","messages":{messages}}}"#);
        let fields =
            router_core::text::routing_fields(Endpoint::ChatCompletions, request.as_bytes())
                .unwrap();
        let prompt = &request.as_bytes()[fields.prompt_span.unwrap()];
        let body = tokenize_body(Endpoint::ChatCompletions, "m", prompt).unwrap();
        let expected = format!(
            r#"{{"model":"m","messages":{messages},"add_generation_prompt":true,"add_special_tokens":false}}"#
        );
        assert_eq!(String::from_utf8(body).unwrap(), expected);
    }
}

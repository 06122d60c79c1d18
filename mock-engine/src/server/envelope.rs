//! The parts every OpenAI response of a replica shares: the id, `created` and `model` fields,
//! and the `usage` block in its two spellings (full dump in bodies, nulls left out in the
//! streamed usage chunk), in vLLM's field order.
//!
//! `usage.prompt_tokens_details` carries `cached_tokens` only when the request hit the prefix
//! cache: the mock behaves as a vLLM started with `--enable-prompt-tokens-details`.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;

/// The identity of one response, shared by all its chunks.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// `prefix` is `chatcmpl` or `cmpl`; the base id is the client's `X-Request-Id` when it
    /// sent one (as vLLM does), else 32 random hex digits.
    pub fn new(prefix: &str, request_id: Option<&str>, model: &str) -> Self {
        let base = match request_id {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => random_hex32(),
        };
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        ResponseMeta {
            id: format!("{prefix}-{base}"),
            created,
            model: model.to_owned(),
        }
    }
}

fn random_hex32() -> String {
    let value: u128 = rand::rng().random();
    format!("{value:032x}")
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageCounts {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

#[derive(Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

/// `usage` as a non-streamed body writes it: every field, `prompt_tokens_details` null when
/// nothing was cached.
#[derive(Debug, Serialize)]
pub struct FullUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage` as the streamed usage chunk writes it (`exclude_none`).
#[derive(Debug, Serialize)]
pub struct StreamUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl UsageCounts {
    fn details(&self) -> Option<PromptTokensDetails> {
        (self.cached_tokens > 0).then_some(PromptTokensDetails {
            cached_tokens: self.cached_tokens,
        })
    }

    pub fn full(&self) -> FullUsage {
        FullUsage {
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            completion_tokens: self.completion_tokens,
            prompt_tokens_details: self.details(),
        }
    }

    pub fn streamed(&self) -> StreamUsage {
        StreamUsage {
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            completion_tokens: self.completion_tokens,
            prompt_tokens_details: self.details(),
        }
    }
}

/// The usage-only chunk that closes a stream with `include_usage` (same for both endpoints).
#[derive(Serialize)]
struct UsageChunk<'a> {
    id: &'a str,
    object: &'a str,
    created: u64,
    model: &'a str,
    choices: [(); 0],
    usage: StreamUsage,
}

/// Writes the usage chunk; `object` is the endpoint's chunk object name.
pub fn usage_chunk(meta: &ResponseMeta, object: &str, usage: &UsageCounts) -> String {
    to_json(&UsageChunk {
        id: &meta.id,
        object,
        created: meta.created,
        model: &meta.model,
        choices: [],
        usage: usage.streamed(),
    })
}

/// Serializes a response shape. The shapes are plain structs of strings and numbers, which
/// cannot fail to serialize; the fallback keeps that promise without a panic.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| String::from("{}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_vllm() {
        let given = ResponseMeta::new("chatcmpl", Some("abc"), "m");
        assert_eq!(given.id, "chatcmpl-abc");
        let fresh = ResponseMeta::new("cmpl", None, "m");
        let hex = fresh.id.strip_prefix("cmpl-").unwrap();
        assert_eq!(hex.len(), 32);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn usage_field_order_and_cached_tokens() {
        let cold = UsageCounts {
            prompt_tokens: 10,
            completion_tokens: 3,
            cached_tokens: 0,
        };
        assert_eq!(
            to_json(&cold.full()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":null}"#
        );
        assert_eq!(
            to_json(&cold.streamed()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3}"#
        );
        let warm = UsageCounts {
            cached_tokens: 8,
            ..cold
        };
        assert_eq!(
            to_json(&warm.streamed()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}"#
        );
        let meta = ResponseMeta {
            id: "cmpl-1".into(),
            created: 5,
            model: "m".into(),
        };
        assert_eq!(
            usage_chunk(&meta, "text_completion", &warm),
            r#"{"id":"cmpl-1","object":"text_completion","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#
        );
    }
}

//! The parts every OpenAI response of a replica shares: the id, `created` and `model` fields,
//! the server's `system_fingerprint`, and the `usage` block in its two spellings (full dump
//! in bodies, nulls left out in the streamed usage chunk), in vLLM 0.32's field order.
//!
//! The mock behaves as a vLLM started with `--enable-prompt-tokens-details`: every usage has
//! `prompt_tokens_details` with `cached_tokens` (0 included). Chat also reports
//! `created_cache_tokens`, the prompt's full blocks this request wrote to the cache; vLLM's
//! completions leave it null (and out of the streamed chunk), and so does the mock.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;

/// The `system_fingerprint` vLLM writes: its version and a build hash (here "mock").
pub const SYSTEM_FINGERPRINT: &str = "vllm-0.32.0-6d6f636b";

/// The identity of one response, shared by all its chunks.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// `prefix` is `chatcmpl` or `cmpl`; the base id is the client's `X-Request-Id` when it
    /// sent one (as vLLM does), else 16 random hex digits (vLLM 0.32's length).
    pub fn new(prefix: &str, request_id: Option<&str>, model: &str) -> Self {
        let base = match request_id {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => random_hex16(),
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

fn random_hex16() -> String {
    let value: u64 = rand::rng().random();
    format!("{value:016x}")
}

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageCounts {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// The prompt's tokens this request newly cached (chat only; `None` for completions).
    pub created_cache_tokens: Option<u32>,
}

/// `usage.prompt_tokens_details` of a non-streamed body (every field).
#[derive(Debug, Serialize)]
pub struct FullDetails {
    pub cached_tokens: u32,
    pub created_cache_tokens: Option<u32>,
    pub multimodal_tokens: Option<()>,
}

/// `usage.prompt_tokens_details` of the streamed usage chunk (`exclude_none`).
#[derive(Debug, Serialize)]
pub struct StreamDetails {
    pub cached_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_cache_tokens: Option<u32>,
}

/// `usage` as a non-streamed body writes it: every field.
#[derive(Debug, Serialize)]
pub struct FullUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_details: FullDetails,
    pub completion_tokens_details: Option<()>,
}

/// `usage` as the streamed usage chunk writes it (`exclude_none`).
#[derive(Debug, Serialize)]
pub struct StreamUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_details: StreamDetails,
}

/// `usage` in every chunk of a stream with `continuous_usage_stats`: the counts so far,
/// without details; chat writes `"completion_tokens_details":null` after them,
/// completions nothing.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunningUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<Option<()>>,
}

impl RunningUsage {
    /// The counts after `completion_tokens` tokens of a `prompt_tokens`-token prompt.
    pub fn after(prompt_tokens: u32, completion_tokens: u32) -> Self {
        RunningUsage {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            completion_tokens_details: None,
        }
    }

    /// As chat writes it.
    pub fn for_chat(self) -> Self {
        RunningUsage {
            completion_tokens_details: Some(None),
            ..self
        }
    }
}

impl UsageCounts {
    pub fn full(&self) -> FullUsage {
        FullUsage {
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            completion_tokens: self.completion_tokens,
            prompt_tokens_details: FullDetails {
                cached_tokens: self.cached_tokens,
                created_cache_tokens: self.created_cache_tokens,
                multimodal_tokens: None,
            },
            completion_tokens_details: None,
        }
    }

    pub fn streamed(&self) -> StreamUsage {
        StreamUsage {
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            completion_tokens: self.completion_tokens,
            prompt_tokens_details: StreamDetails {
                cached_tokens: self.cached_tokens,
                created_cache_tokens: self.created_cache_tokens,
            },
        }
    }
}

/// The usage-only chunk that closes a stream with `include_usage` (same for both endpoints),
/// the stream's last, so it carries the fingerprint.
#[derive(Serialize)]
struct UsageChunk<'a> {
    id: &'a str,
    object: &'a str,
    created: u64,
    model: &'a str,
    choices: [(); 0],
    usage: StreamUsage,
    system_fingerprint: &'static str,
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
        system_fingerprint: SYSTEM_FINGERPRINT,
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
        assert_eq!(hex.len(), 16);
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn usage_field_order_and_cached_tokens() {
        let cold = UsageCounts {
            prompt_tokens: 10,
            completion_tokens: 3,
            cached_tokens: 0,
            created_cache_tokens: Some(0),
        };
        assert_eq!(
            to_json(&cold.full()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":0,"multimodal_tokens":null},"completion_tokens_details":null}"#
        );
        assert_eq!(
            to_json(&cold.streamed()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":0}}"#
        );
        let completion = UsageCounts {
            cached_tokens: 8,
            created_cache_tokens: None,
            ..cold
        };
        assert_eq!(
            to_json(&completion.full()),
            r#"{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8,"created_cache_tokens":null,"multimodal_tokens":null},"completion_tokens_details":null}"#
        );
        let meta = ResponseMeta {
            id: "cmpl-1".into(),
            created: 5,
            model: "m".into(),
        };
        assert_eq!(
            usage_chunk(&meta, "text_completion", &completion),
            r#"{"id":"cmpl-1","object":"text_completion","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}},"system_fingerprint":"vllm-0.32.0-6d6f636b"}"#
        );
    }
}

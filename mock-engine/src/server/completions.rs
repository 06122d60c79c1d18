//! `/v1/completions` response shapes, as vLLM 0.32 writes them.
//!
//! Streamed chunks carry every choice field (`stop_reason`, `prompt_token_ids` and
//! `token_ids` as null) and no `usage` unless `continuous_usage_stats` asks for the running
//! count after the choice; there is no role chunk, and the stream's last chunk
//! before `[DONE]` (the finishing one, or the usage chunk) carries the
//! `system_fingerprint`. The non-streamed body is a full dump.

use serde::Serialize;

use super::envelope::{
    FullUsage, ResponseMeta, RunningUsage, SYSTEM_FINGERPRINT, UsageCounts, to_json,
};
use super::single_choice::SingleChoice;

/// `object` of completion bodies and chunks.
pub const OBJECT: &str = "text_completion";

/// What follows a chunk's choice: the fingerprint, on the stream's last chunk only.
#[derive(Serialize)]
struct ChunkTail {
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<RunningUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<&'static str>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
    stop_reason: Option<()>,
    prompt_token_ids: Option<()>,
    token_ids: Option<()>,
}

/// One token's chunk; `finish` is set on the last token, `last` when no usage chunk
/// follows it, and `usage` (the running count) with `continuous_usage_stats`.
pub fn token_chunk(
    meta: &ResponseMeta,
    text: &str,
    finish: Option<&str>,
    last: bool,
    usage: Option<RunningUsage>,
) -> String {
    let choice = ChunkChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
        prompt_token_ids: None,
        token_ids: None,
    };
    let tail = ChunkTail {
        usage,
        system_fingerprint: last.then_some(SYSTEM_FINGERPRINT),
    };
    to_json(&SingleChoice::new(meta, OBJECT, choice, tail))
}

/// What follows the choice in the non-streamed body.
#[derive(Serialize)]
struct BodyTail {
    service_tier: Option<()>,
    system_fingerprint: &'static str,
    usage: FullUsage,
    kv_transfer_params: Option<()>,
    ec_transfer_params: Option<()>,
    metrics: Option<()>,
}

#[derive(Serialize)]
struct BodyChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: &'a str,
    stop_reason: Option<()>,
    token_ids: Option<()>,
    prompt_logprobs: Option<()>,
    prompt_token_ids: Option<()>,
    routed_experts: Option<()>,
}

/// The non-streamed response body.
pub fn full_body(meta: &ResponseMeta, text: &str, finish: &str, usage: &UsageCounts) -> String {
    let choice = BodyChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
        token_ids: None,
        prompt_logprobs: None,
        prompt_token_ids: None,
        routed_experts: None,
    };
    let tail = BodyTail {
        service_tier: None,
        system_fingerprint: SYSTEM_FINGERPRINT,
        usage: usage.full(),
        kv_transfer_params: None,
        ec_transfer_params: None,
        metrics: None,
    };
    to_json(&SingleChoice::new(meta, OBJECT, choice, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "cmpl-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    #[test]
    fn chunk_matches_vllm() {
        assert_eq!(
            token_chunk(&meta(), " x", None, false, None),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}"#
        );
        assert_eq!(
            token_chunk(&meta(), " y", Some("length"), true, None),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" y","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"system_fingerprint":"vllm-0.32.0-6d6f636b"}"#
        );
    }

    /// As vLLM 0.32 wrote it with `continuous_usage_stats` (a live replica's stream).
    #[test]
    fn chunk_with_the_running_count_matches_vllm() {
        assert_eq!(
            token_chunk(&meta(), "le", None, false, Some(RunningUsage::after(2, 2))),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"le","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2}}"#
        );
    }

    #[test]
    fn body_matches_vllm() {
        let usage = UsageCounts {
            prompt_tokens: 5,
            completion_tokens: 1,
            cached_tokens: 4,
            created_cache_tokens: None,
        };
        assert_eq!(
            full_body(&meta(), " x", "length", &usage),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-6d6f636b","usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4,"created_cache_tokens":null,"multimodal_tokens":null},"completion_tokens_details":null},"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}"#
        );
    }
}

//! `/v1/chat/completions` response shapes, as vLLM 0.32 writes them.
//!
//! Streamed chunks are `model_dump_json(exclude_unset=True)`: the role chunk carries
//! `{"role":"assistant","content":""}` and, after its choice, `"prompt_token_ids":null,
//! "prompt_text":null`; token chunks carry `content` and `"token_ids":null`; with
//! `continuous_usage_stats` every chunk has the running `usage` right after its choice; only the last
//! token's chunk has `stop_reason` (set with `finish_reason`), and the stream's last chunk
//! before `[DONE]` (that one, or the usage chunk) the `system_fingerprint`. The non-streamed
//! body is a full dump, so every optional field is present as `null`.

use serde::Serialize;

use super::envelope::{
    FullUsage, ResponseMeta, RunningUsage, SYSTEM_FINGERPRINT, UsageCounts, to_json,
};
use super::single_choice::SingleChoice;

/// `object` of a streamed chat chunk.
pub const CHUNK_OBJECT: &str = "chat.completion.chunk";

#[derive(Serialize)]
struct RoleChoice {
    index: u32,
    delta: RoleDelta,
    logprobs: Option<()>,
    finish_reason: Option<()>,
}

#[derive(Serialize)]
struct RoleDelta {
    role: &'static str,
    content: &'static str,
}

/// What follows the role chunk's choice.
#[derive(Serialize)]
struct RoleTail {
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<RunningUsage>,
    prompt_token_ids: Option<()>,
    prompt_text: Option<()>,
}

#[derive(Serialize)]
struct TokenChoice<'a> {
    index: u32,
    delta: TokenDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<()>>,
    token_ids: Option<()>,
}

#[derive(Serialize)]
struct TokenDelta<'a> {
    content: &'a str,
}

/// What follows a token chunk's choice: the fingerprint, on the stream's last chunk only.
#[derive(Serialize)]
struct TokenTail {
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<RunningUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<&'static str>,
}

/// The first chunk of a stream, sent together with the first token.
/// `usage`: the running count (none yet), with `continuous_usage_stats`.
pub fn role_chunk(meta: &ResponseMeta, usage: Option<RunningUsage>) -> String {
    let choice = RoleChoice {
        index: 0,
        delta: RoleDelta {
            role: "assistant",
            content: "",
        },
        logprobs: None,
        finish_reason: None,
    };
    let tail = RoleTail {
        usage: usage.map(RunningUsage::for_chat),
        prompt_token_ids: None,
        prompt_text: None,
    };
    to_json(&SingleChoice::new(meta, CHUNK_OBJECT, choice, tail))
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
    let choice = TokenChoice {
        index: 0,
        delta: TokenDelta { content: text },
        logprobs: None,
        finish_reason: finish,
        // `Some(None)` writes `"stop_reason":null`; only the finishing chunk sets it.
        stop_reason: finish.map(|_| None),
        token_ids: None,
    };
    let tail = TokenTail {
        usage: usage.map(RunningUsage::for_chat),
        system_fingerprint: last.then_some(SYSTEM_FINGERPRINT),
    };
    to_json(&SingleChoice::new(meta, CHUNK_OBJECT, choice, tail))
}

/// What follows the choice in the non-streamed body.
#[derive(Serialize)]
struct BodyTail {
    service_tier: Option<()>,
    system_fingerprint: &'static str,
    usage: FullUsage,
    prompt_logprobs: Option<()>,
    prompt_token_ids: Option<()>,
    prompt_text: Option<()>,
    kv_transfer_params: Option<()>,
    ec_transfer_params: Option<()>,
    metrics: Option<()>,
}

#[derive(Serialize)]
struct BodyChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'a str,
    stop_reason: Option<()>,
    token_ids: Option<()>,
    routed_experts: Option<()>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<()>,
    annotations: Option<()>,
    audio: Option<()>,
    function_call: Option<()>,
    reasoning: Option<()>,
}

/// The non-streamed response body.
pub fn full_body(meta: &ResponseMeta, text: &str, finish: &str, usage: &UsageCounts) -> String {
    let choice = BodyChoice {
        index: 0,
        message: Message {
            role: "assistant",
            content: text,
            refusal: None,
            annotations: None,
            audio: None,
            function_call: None,
            reasoning: None,
        },
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
        token_ids: None,
        routed_experts: None,
    };
    let tail = BodyTail {
        service_tier: None,
        system_fingerprint: SYSTEM_FINGERPRINT,
        usage: usage.full(),
        prompt_logprobs: None,
        prompt_token_ids: None,
        prompt_text: None,
        kv_transfer_params: None,
        ec_transfer_params: None,
        metrics: None,
    };
    to_json(&SingleChoice::new(meta, "chat.completion", choice, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    #[test]
    fn chunks_match_vllm() {
        assert_eq!(
            role_chunk(&meta(), None),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}"#
        );
        assert_eq!(
            token_chunk(&meta(), " foo", None, false, None),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" foo"},"logprobs":null,"finish_reason":null,"token_ids":null}]}"#
        );
        assert_eq!(
            token_chunk(&meta(), " end", Some("length"), true, None),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" end"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"system_fingerprint":"vllm-0.32.0-6d6f636b"}"#
        );
    }

    /// As vLLM 0.32 wrote them with `continuous_usage_stats` (a live replica's stream).
    #[test]
    fn chunks_with_the_running_count_match_vllm() {
        assert_eq!(
            role_chunk(&meta(), Some(RunningUsage::after(10, 0))),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":10,"total_tokens":10,"completion_tokens":0,"completion_tokens_details":null},"prompt_token_ids":null,"prompt_text":null}"#
        );
        assert_eq!(
            token_chunk(&meta(), "ay", None, false, Some(RunningUsage::after(10, 1))),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"ay"},"logprobs":null,"finish_reason":null,"token_ids":null}],"usage":{"prompt_tokens":10,"total_tokens":11,"completion_tokens":1,"completion_tokens_details":null}}"#
        );
    }

    #[test]
    fn body_matches_vllm() {
        let usage = UsageCounts {
            prompt_tokens: 5,
            completion_tokens: 2,
            cached_tokens: 0,
            created_cache_tokens: Some(0),
        };
        assert_eq!(
            full_body(&meta(), " a b", "length", &usage),
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":" a b","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-6d6f636b","usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":0,"multimodal_tokens":null},"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}"#
        );
    }
}

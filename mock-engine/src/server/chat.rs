//! `/v1/chat/completions` response shapes, as vLLM 0.11 writes them.
//!
//! Streamed chunks are `model_dump_json(exclude_unset=True)`: the role chunk carries
//! `{"role":"assistant","content":""}`, token chunks carry only `content`, and only the last
//! token's chunk has `stop_reason` (set with `finish_reason`). The non-streamed body is a full
//! dump, so every optional field is present as `null`.

use serde::Serialize;

use super::envelope::{FullUsage, ResponseMeta, UsageCounts, to_json};
use super::single_choice::SingleChoice;

/// `object` of a streamed chat chunk.
pub const CHUNK_OBJECT: &str = "chat.completion.chunk";

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<()>>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

fn chunk(meta: &ResponseMeta, delta: Delta<'_>, finish: Option<&str>) -> String {
    let choice = ChunkChoice {
        index: 0,
        delta,
        logprobs: None,
        finish_reason: finish,
        // `Some(None)` writes `"stop_reason":null`; only the finishing chunk sets it.
        stop_reason: finish.map(|_| None),
    };
    // A streamed chat chunk has nothing after its choice.
    to_json(&SingleChoice::new(meta, CHUNK_OBJECT, choice, ()))
}

/// The first chunk of a stream, sent together with the first token.
pub fn role_chunk(meta: &ResponseMeta) -> String {
    chunk(
        meta,
        Delta {
            role: Some("assistant"),
            content: "",
        },
        None,
    )
}

/// One token's chunk; `finish` is set on the last token.
pub fn token_chunk(meta: &ResponseMeta, text: &str, finish: Option<&str>) -> String {
    chunk(
        meta,
        Delta {
            role: None,
            content: text,
        },
        finish,
    )
}

/// What follows the choice in the non-streamed body.
#[derive(Serialize)]
struct BodyTail {
    service_tier: Option<()>,
    system_fingerprint: Option<()>,
    usage: FullUsage,
    prompt_logprobs: Option<()>,
    kv_transfer_params: Option<()>,
}

#[derive(Serialize)]
struct BodyChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'a str,
    stop_reason: Option<()>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
    refusal: Option<()>,
    annotations: Option<()>,
    audio: Option<()>,
    function_call: Option<()>,
    tool_calls: [(); 0],
    reasoning_content: Option<()>,
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
            tool_calls: [],
            reasoning_content: None,
        },
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
    };
    let tail = BodyTail {
        service_tier: None,
        system_fingerprint: None,
        usage: usage.full(),
        prompt_logprobs: None,
        kv_transfer_params: None,
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
            role_chunk(&meta()),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#
        );
        assert_eq!(
            token_chunk(&meta(), " foo", None),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" foo"},"logprobs":null,"finish_reason":null}]}"#
        );
        assert_eq!(
            token_chunk(&meta(), " end", Some("length")),
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" end"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}"#
        );
    }

    #[test]
    fn body_matches_vllm() {
        let usage = UsageCounts {
            prompt_tokens: 5,
            completion_tokens: 2,
            cached_tokens: 0,
        };
        assert_eq!(
            full_body(&meta(), " a b", "length", &usage),
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":" a b","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"length","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#
        );
    }
}

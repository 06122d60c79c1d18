//! `/v1/completions` response shapes, as vLLM 0.11 writes them.
//!
//! Streamed chunks are full dumps (`exclude_unset=False`): every chunk has `stop_reason` and
//! `"usage":null`, and there is no role chunk. The non-streamed body is a full dump too.

use serde::Serialize;

use super::envelope::{FullUsage, ResponseMeta, UsageCounts, to_json};
use super::single_choice::SingleChoice;

/// `object` of completion bodies and chunks.
pub const OBJECT: &str = "text_completion";

/// What follows the choice in a streamed chunk.
#[derive(Serialize)]
struct ChunkTail {
    usage: Option<()>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
    stop_reason: Option<()>,
}

/// One token's chunk; `finish` is set on the last token.
pub fn token_chunk(meta: &ResponseMeta, text: &str, finish: Option<&str>) -> String {
    let choice = ChunkChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
    };
    to_json(&SingleChoice::new(
        meta,
        OBJECT,
        choice,
        ChunkTail { usage: None },
    ))
}

/// What follows the choice in the non-streamed body.
#[derive(Serialize)]
struct BodyTail {
    service_tier: Option<()>,
    system_fingerprint: Option<()>,
    usage: FullUsage,
    kv_transfer_params: Option<()>,
}

#[derive(Serialize)]
struct BodyChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: &'a str,
    stop_reason: Option<()>,
    prompt_logprobs: Option<()>,
}

/// The non-streamed response body.
pub fn full_body(meta: &ResponseMeta, text: &str, finish: &str, usage: &UsageCounts) -> String {
    let choice = BodyChoice {
        index: 0,
        text,
        logprobs: None,
        finish_reason: finish,
        stop_reason: None,
        prompt_logprobs: None,
    };
    let tail = BodyTail {
        service_tier: None,
        system_fingerprint: None,
        usage: usage.full(),
        kv_transfer_params: None,
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
            token_chunk(&meta(), " x", Some("stop")),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":null}"#
        );
    }

    #[test]
    fn body_matches_vllm() {
        let usage = UsageCounts {
            prompt_tokens: 5,
            completion_tokens: 1,
            cached_tokens: 4,
        };
        assert_eq!(
            full_body(&meta(), " x", "length", &usage),
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}},"kv_transfer_params":null}"#
        );
    }
}

//! What callers hand the engine and what they get back: requests, admission errors, finish
//! reasons and generated tokens. Plain data; the engine's own per-request state is in
//! [`super::sequence`].

use super::{RequestId, Seconds};

/// One generation request, already tokenized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRequest {
    /// Prompt token ids (from [`crate::tokenizer::encode`]).
    pub prompt: Vec<u32>,
    /// Generation stops after this many tokens with finish reason `length`.
    pub max_tokens: u32,
    /// Kept for fidelity with vLLM's request; the mock never samples EOS, so every request
    /// runs to `max_tokens` either way (deterministic output lengths).
    pub ignore_eos: bool,
}

/// Why a request finished, as in `vllm:request_success_total{finished_reason}`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum FinishReason {
    /// EOS or a stop string (never produced by the model today; see [`EngineRequest`]).
    Stop,
    /// Reached `max_tokens`.
    Length,
    /// The client went away ([`super::EngineModel::abort`]).
    Abort,
}

impl FinishReason {
    /// The label value vLLM uses (`"stop"`, `"length"`, `"abort"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// One generated token, stamped with the engine time of the step that produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    pub id: RequestId,
    /// Token id; its text is [`crate::tokenizer::decode`].
    pub token: u32,
    /// 0 for the first generated token.
    pub index: u32,
    /// `Some` on the request's last token.
    pub finish: Option<FinishReason>,
    /// End time of the step that produced the token.
    pub at: Seconds,
    pub prompt_tokens: u32,
    /// This request's prefix-cache hit when first scheduled: block-aligned, ≤ prompt − 1.
    pub cached_tokens: u32,
}

/// Why [`super::EngineModel::submit`] refused a request. The messages are vLLM's 400 texts,
/// so the server can put them in the error body as they are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("The prompt is empty. Please provide at least one token.")]
    EmptyPrompt,
    #[error("'max_tokens' must be at least 1, got 0.")]
    ZeroMaxTokens,
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt} input tokens. Please reduce the length of the input messages."
    )]
    PromptTooLong { prompt: usize, max_model_len: usize },
    #[error(
        "'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context length is {max_model_len} tokens and your request has {prompt} input tokens ({max_tokens} > {max_model_len} - {prompt})."
    )]
    MaxTokensTooLarge {
        max_tokens: u32,
        prompt: usize,
        max_model_len: usize,
    },
}

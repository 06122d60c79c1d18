//! The planned request: what every workload produces and every runner sends.
//!
//! A workload (the matrix's scenarios, a replayed trace, a synthetic shape) is a *source* of
//! planned requests: when to send, what prompt, how many tokens to generate. A runner (the
//! simulator, a live gateway, a local stack) is a *sink*: it sends them, at their times,
//! through its router or gateway, and writes one [`crate::measure::RequestRecord`] for each.
//! Nothing here knows how a request is sent or routed.
//!
//! Prompts may be large (a replayed trace averages 15k tokens over 4,000 requests), so a
//! prompt can be kept as the recipe for its text ([`Prompt::Blocks`]) and built only when the
//! request is sent, then dropped.

use std::borrow::Cow;

use super::chat::{ChatMessage, Role, engine_prompt, routing_text};

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRequest {
    /// Position in the workload's arrival order (0-based); records are keyed by it.
    pub index: usize,
    /// The group the request is reported under: a matrix family (per-family results), or 0
    /// for a workload without families.
    pub family: usize,
    /// Scheduled send time, in seconds after the workload starts (engine time).
    pub at: f64,
    pub prompt: Prompt,
    /// `max_tokens`, sent with `ignore_eos`: exactly the output length.
    pub max_tokens: u32,
}

/// A prompt, or the recipe for one.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// The whole text, known when the request was planned.
    Text(String),
    /// Built when the request is sent ([`Prompt::text`]): a trace request's blocks.
    Blocks(super::blocks::BlockPrompt),
    /// A conversation's messages so far (a multi-turn request): sent as they are, so the
    /// engine's chat template keeps the previous answer where the previous turn left it.
    Chat(Vec<ChatMessage>),
}

impl Prompt {
    /// The prompt's text (built now for [`Prompt::Blocks`]); for a chat, the text the
    /// gateway routes on (every message's content, joined with a space).
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Prompt::Text(text) => Cow::Borrowed(text),
            Prompt::Blocks(blocks) => Cow::Owned(blocks.text()),
            Prompt::Chat(messages) => Cow::Owned(routing_text(messages)),
        }
    }

    /// What a simulated engine tokenizes: the text as it is (the seed's matrix is simulated
    /// without a chat template), or a chat through the mock's template, as its server renders
    /// the messages a live request sends.
    pub fn engine_text(&self) -> Cow<'_, str> {
        match self {
            Prompt::Chat(messages) => Cow::Owned(engine_prompt(messages)),
            other => other.text(),
        }
    }

    /// The request's messages: a chat's own, or the text as one user message.
    pub fn messages(&self) -> Vec<ChatMessage> {
        match self {
            Prompt::Chat(messages) => messages.clone(),
            other => vec![ChatMessage::new(Role::User, other.text())],
        }
    }
}

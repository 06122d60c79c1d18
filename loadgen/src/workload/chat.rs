//! A chat request's messages, and the two ways the path reads them: the gateway's routing
//! text and the engine's prompt.
//!
//! A multi-turn request must be sent as messages, not as one flattened text: the engine
//! renders each message through its chat template, so the next turn's prompt extends the
//! previous prompt *and its answer* token for token only when the answer comes back as an
//! `assistant` message after the previous `<|assistant|>` marker. A runner that talks HTTP
//! sends [`ChatMessage`]s as they are; the simulator, which has no HTTP, hashes
//! [`routing_text`] in the router (what the gateway extracts) and feeds [`engine_prompt`]
//! to the engine model (what the mock's server renders).

use serde::Serialize;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The OpenAI role name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message, serialised as OpenAI's `{"role", "content"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
        }
    }
}

/// The text the gateway routes on: every message's content joined with one space
/// (router-core's `text` module, after AIBrix's `parseChatMessages`).
pub fn routing_text(messages: &[ChatMessage]) -> String {
    let mut text = String::new();
    for (i, message) in messages.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(&message.content);
    }
    text
}

/// The prompt the mock engine tokenizes: its chat template over the messages.
pub fn engine_prompt(messages: &[ChatMessage]) -> String {
    mock_engine::chat_template::render(
        messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str())),
    )
}

#[cfg(test)]
mod tests {
    use router_core::text::{Endpoint, routing_fields};

    use super::*;

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new(Role::System, "you are brief"),
            ChatMessage::new(Role::User, "hello there"),
            ChatMessage::new(Role::Assistant, " the cache block"),
            ChatMessage::new(Role::User, "and then"),
        ]
    }

    #[test]
    fn routing_text_is_what_the_gateway_extracts() {
        let messages = conversation();
        let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
        let fields = routing_fields(Endpoint::ChatCompletions, body.as_bytes()).unwrap();
        assert_eq!(routing_text(&messages), fields.text);
    }

    #[test]
    fn engine_prompt_is_the_template() {
        assert_eq!(
            engine_prompt(&conversation()),
            "<|system|> you are brief <|user|> hello there <|assistant|>  the cache block \
             <|user|> and then <|assistant|>"
        );
    }
}

//! The mock's chat template: how a list of chat messages becomes the prompt text the engine
//! tokenizes. Shared by the engine server (`/v1/chat/completions`) and the load generator's
//! simulator, so a simulated chat request costs exactly the tokens a served one does, and a
//! conversation's next turn extends the previous prompt and answer token for token.
//!
//! Rule: `<|role|> content ` per message, in order, then a trailing `<|assistant|>` (a real
//! template adds a few tokens around each message the same way). Under the mock tokenizer
//! every marker is one token.

/// Renders `(role, content)` pairs through the template.
pub fn render<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|> ");
        text.push_str(content);
        text.push(' ');
    }
    text.push_str("<|assistant|>");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_each_message_then_the_assistant_marker() {
        assert_eq!(
            render([("system", "be brief"), ("user", "hi\nthere")]),
            "<|system|> be brief <|user|> hi\nthere <|assistant|>"
        );
        assert_eq!(render([]), "<|assistant|>");
    }
}

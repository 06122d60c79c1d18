//! The mock's chat template: how a list of chat messages becomes the prompt text the engine
//! tokenizes. Shared by the engine server (`/v1/chat/completions`) and the load generator's
//! simulator, so a simulated chat request costs exactly the tokens a served one does, and a
//! conversation's next turn extends the previous prompt and answer token for token.
//!
//! Rule: `<|role|> content ` per message, in order, then a trailing `<|assistant|>` (a real
//! template adds a few tokens around each message the same way). Under the mock tokenizer
//! every marker is one token.
//!
//! vLLM's `add_generation_prompt: false` leaves the trailing marker out, and
//! `continue_final_message: true` leaves the final message open (its content ends the
//! prompt, with no separator after it), so the model writes on inside that turn: a
//! continued answer's prompt is the original prompt plus the answer so far, token for token.

/// How the rendered conversation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The assistant's marker follows (vLLM's default `add_generation_prompt: true`).
    GenerationPrompt,
    /// Nothing follows the last message (`add_generation_prompt: false`).
    Closed,
    /// The final message is left open (`continue_final_message: true`).
    ContinueFinal,
}

/// Renders `(role, content)` pairs through the template, ending with the assistant marker.
pub fn render<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    render_ending(messages, Ending::GenerationPrompt)
}

/// Renders `(role, content)` pairs through the template, ending as `ending` says.
pub fn render_ending<'a>(
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
    ending: Ending,
) -> String {
    let mut text = String::new();
    for (role, content) in messages {
        text.push_str("<|");
        text.push_str(role);
        text.push_str("|> ");
        text.push_str(content);
        text.push(' ');
    }
    match ending {
        Ending::GenerationPrompt => text.push_str("<|assistant|>"),
        Ending::Closed => {}
        Ending::ContinueFinal => {
            text.pop();
        }
    }
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

    #[test]
    fn a_continued_final_message_is_left_open() {
        let open = render_ending(
            [("user", "hi"), ("assistant", "the cache")],
            Ending::ContinueFinal,
        );
        assert_eq!(open, "<|user|> hi <|assistant|> the cache");
        let first = render([("user", "hi")]);
        assert_eq!(
            crate::tokenizer::count(&open),
            crate::tokenizer::count(&first) + 2,
            "the original prompt plus the answer so far"
        );
        assert_eq!(
            render_ending([("user", "hi")], Ending::Closed),
            "<|user|> hi "
        );
    }
}

//! The body of a continuation: the original request carried on from what the client has.
//!
//! Completions: the generated text is appended to the prompt. Chat: it becomes a final
//! assistant message, sent with vLLM's `continue_final_message: true` and
//! `add_generation_prompt: false`, so the chat template leaves that turn open and the model
//! writes on inside it. `max_tokens` and `max_completion_tokens` (and `min_tokens`) are
//! reduced by the tokens already sent, so the whole answer has the length asked for.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::request::resume::plan::Plan;
use crate::request::resume::transcript::{Shape, Transcript};

/// The continuation's body; `None` when nothing is left to generate.
pub fn continuation(plan: &Plan, transcript: &Transcript) -> Option<Bytes> {
    let mut body = plan.body.clone();
    let produced = transcript.produced();
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(limit) = body.get(key).and_then(Value::as_u64) {
            let left = limit.checked_sub(produced).filter(|left| *left > 0)?;
            body.insert(key.to_owned(), Value::from(left));
        }
    }
    if let Some(min) = body.get("min_tokens").and_then(Value::as_u64) {
        body.insert(
            "min_tokens".to_owned(),
            Value::from(min.saturating_sub(produced)),
        );
    }
    let text = transcript.text();
    match plan.shape {
        Shape::Completions => extend_prompt(&mut body, text)?,
        Shape::Chat => {
            let Some(Value::Array(messages)) = body.get_mut("messages") else {
                return None;
            };
            let mut message = Map::new();
            message.insert("role".to_owned(), Value::from("assistant"));
            message.insert("content".to_owned(), Value::from(text));
            messages.push(Value::Object(message));
            body.insert("continue_final_message".to_owned(), Value::Bool(true));
            body.insert("add_generation_prompt".to_owned(), Value::Bool(false));
        }
    }
    serde_json::to_vec(&body).ok().map(Bytes::from)
}

/// Appends `text` to a completion's text prompt (a string, or an array of one).
fn extend_prompt(body: &mut Map<String, Value>, text: &str) -> Option<()> {
    let prompt = match body.get_mut("prompt")? {
        Value::Array(items) if items.len() == 1 => items.first_mut()?,
        prompt => prompt,
    };
    let Value::String(prompt) = prompt else {
        return None;
    };
    prompt.push_str(text);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(shape: Shape, body: Value) -> Plan {
        let Value::Object(body) = body else { panic!() };
        Plan {
            shape,
            body,
            asked: Default::default(),
        }
    }

    fn sent(shape: Shape, words: &[&str]) -> Transcript {
        let mut t = Transcript::new(shape, Default::default());
        for word in words {
            let choice = match shape {
                Shape::Chat => format!("{{\"delta\":{{\"content\":\"{word}\"}}}}"),
                Shape::Completions => format!("{{\"text\":\"{word}\"}}"),
            };
            t.pass(format!("data: {{\"id\":\"x\",\"choices\":[{choice}]}}\n\n").as_bytes());
        }
        t
    }

    fn json(bytes: Option<Bytes>) -> Value {
        serde_json::from_slice(&bytes.unwrap()).unwrap()
    }

    #[test]
    fn chat_continues_the_final_assistant_message() {
        let plan = plan(
            Shape::Chat,
            serde_json::json!({"messages":[{"role":"user","content":"hi"}],
                "max_tokens":10,"max_completion_tokens":8,"min_tokens":2,"stream":true}),
        );
        let body = json(continuation(&plan, &sent(Shape::Chat, &[" a", " b", " c"])));
        assert_eq!(
            body["messages"][1],
            serde_json::json!({"role":"assistant","content":" a b c"})
        );
        assert_eq!(body["continue_final_message"], true);
        assert_eq!(body["add_generation_prompt"], false);
        assert_eq!(
            (
                &body["max_tokens"],
                &body["max_completion_tokens"],
                &body["min_tokens"]
            ),
            (&Value::from(7), &Value::from(5), &Value::from(0))
        );
    }

    #[test]
    fn completions_extend_the_prompt_and_nothing_left_is_no_continuation() {
        let plan = plan(
            Shape::Completions,
            serde_json::json!({"prompt":["once"],"max_tokens":3,"stream":true}),
        );
        let body = json(continuation(&plan, &sent(Shape::Completions, &[" upon"])));
        assert_eq!(body["prompt"], serde_json::json!(["once upon"]));
        assert_eq!(body["max_tokens"], 2);
        let all = sent(Shape::Completions, &[" a", " b", " c"]);
        assert!(continuation(&plan, &all).is_none());
    }
}

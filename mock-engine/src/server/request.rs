//! Parsing the body of `/v1/chat/completions` and `/v1/completions` into what the engine
//! needs: the served model name, the prompt, the generation limits and the streaming options.
//!
//! Only the fields that change what the mock does are read; other OpenAI fields
//! (`temperature`, `top_p`, …) are accepted and ignored, as vLLM accepts extra fields. Every
//! wrong input is a 400 whose message names the field and what was expected.
//!
//! Chat prompts are rendered with the mock's fixed template ([`crate::chat_template`]),
//! `<|role|> content` per message and a trailing `<|assistant|>`, so a chat request costs a few
//! more tokens than its bare text, as a real chat template does.

use serde_json::{Map, Value};

use super::api_error::ApiError;

/// Which OpenAI endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// The prompt as the client gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text, tokenized by `mock_engine::tokenizer::encode`.
    Text(String),
    /// Token ids given directly (completions only).
    Tokens(Vec<u32>),
}

/// What a generation request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    pub model: String,
    pub prompt: PromptInput,
    /// `max_tokens` (or chat's `max_completion_tokens`); `None` means "up to the context".
    pub max_tokens: Option<u32>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    pub ignore_eos: bool,
}

/// Parses a request body for `endpoint`.
pub fn parse_generation(endpoint: Endpoint, body: &[u8]) -> Result<GenerationParams, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request(
            "Invalid request body: expected a JSON object",
        ));
    };
    let model = match fields.get("model") {
        Some(Value::String(model)) => model.clone(),
        Some(_) => return Err(wrong_type("model", "a string")),
        None => return Err(missing("model")),
    };
    let prompt = match endpoint {
        Endpoint::Chat => PromptInput::Text(chat_prompt(&fields)?),
        Endpoint::Completions => completion_prompt(&fields)?,
    };
    let mut max_tokens = optional_count(&fields, "max_tokens")?;
    if endpoint == Endpoint::Chat {
        // vLLM prefers max_completion_tokens when both are set.
        if let Some(n) = optional_count(&fields, "max_completion_tokens")? {
            max_tokens = Some(n);
        }
    }
    if let Some(n) = optional_u64(&fields, "n")?
        && n != 1
    {
        return Err(ApiError::bad_request(format!(
            "`n` = {n} is not supported by mock-engine (only n = 1)"
        )));
    }
    let stream = optional_bool(&fields, "stream")?.unwrap_or(false);
    let include_usage = match fields.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => {
            optional_bool(options, "include_usage")?.unwrap_or(true) && stream
        }
        Some(_) => return Err(wrong_type("stream_options", "an object")),
    };
    let ignore_eos = optional_bool(&fields, "ignore_eos")?.unwrap_or(false);
    Ok(GenerationParams {
        model,
        prompt,
        max_tokens,
        stream,
        include_usage,
        ignore_eos,
    })
}

/// Renders `messages` through the mock's chat template.
fn chat_prompt(fields: &Map<String, Value>) -> Result<String, ApiError> {
    let messages = match fields.get("messages") {
        Some(Value::Array(messages)) => messages,
        Some(_) => return Err(wrong_type("messages", "an array of messages")),
        None => return Err(missing("messages")),
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty"));
    }
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err(wrong_type(&format!("messages[{i}]"), "an object"));
        };
        let role = match message.get("role") {
            Some(Value::String(role)) => role.as_str(),
            Some(_) => return Err(wrong_type(&format!("messages[{i}].role"), "a string")),
            None => return Err(missing(&format!("messages[{i}].role"))),
        };
        rendered.push((role, message_content(i, message.get("content"))?));
    }
    Ok(crate::chat_template::render(
        rendered
            .iter()
            .map(|(role, content)| (*role, content.as_str())),
    ))
}

/// A message's content: a string, null, or an array of `{"type":"text","text":…}` parts
/// (joined with newlines, as vLLM does).
fn message_content(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let field = format!("messages[{i}].content[{j}]");
                let Some(Value::String(kind)) = part.get("type") else {
                    return Err(missing(&format!("{field}.type")));
                };
                if kind != "text" {
                    return Err(ApiError::bad_request(format!(
                        "`{field}` has type `{kind}`; mock-engine serves text parts only"
                    )));
                }
                match part.get("text") {
                    Some(Value::String(text)) => texts.push(text.as_str()),
                    _ => return Err(wrong_type(&format!("{field}.text"), "a string")),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(wrong_type(
            &format!("messages[{i}].content"),
            "a string or an array of text parts",
        )),
    }
}

/// `prompt`: a string, an array holding one string, or token ids.
fn completion_prompt(fields: &Map<String, Value>) -> Result<PromptInput, ApiError> {
    let batched = || {
        ApiError::bad_request("batched prompts are not supported by mock-engine (one prompt only)")
    };
    match fields.get("prompt") {
        None => Err(missing("prompt")),
        Some(Value::String(text)) => Ok(PromptInput::Text(text.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(ApiError::bad_request("`prompt` must not be empty")),
            [Value::String(text)] => Ok(PromptInput::Text(text.clone())),
            [Value::Array(ids)] => token_ids(ids).map(PromptInput::Tokens),
            [Value::Number(_), ..] => token_ids(items).map(PromptInput::Tokens),
            [_] => Err(wrong_type("prompt", "a string or token ids")),
            _ => Err(batched()),
        },
        Some(_) => Err(wrong_type("prompt", "a string or token ids")),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| wrong_type("prompt", "token ids (integers in 0..2^32)"))
        })
        .collect()
}

fn optional_bool(fields: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong_type(name, "a boolean")),
    }
}

fn optional_u64(fields: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| wrong_type(name, "a non-negative integer")),
    }
}

/// A token count: an integer ≥ 1 (vLLM rejects `max_tokens` below 1).
fn optional_count(fields: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    match optional_u64(fields, name)? {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
        Some(n) => Err(ApiError::bad_request(format!(
            "`{name}` must be at least 1, got {n}"
        ))),
    }
}

fn missing(name: &str) -> ApiError {
    ApiError::bad_request(format!("Field required: `{name}`"))
}

fn wrong_type(name: &str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("Invalid type for `{name}`: expected {expected}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<GenerationParams, ApiError> {
        parse_generation(Endpoint::Chat, body.as_bytes())
    }

    fn completion(body: &str) -> Result<GenerationParams, ApiError> {
        parse_generation(Endpoint::Completions, body.as_bytes())
    }

    #[test]
    fn chat_renders_the_template_and_reads_options() {
        let params = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}],
                "max_tokens":5,"max_completion_tokens":7,"stream":true,
                "stream_options":{"include_usage":true},"ignore_eos":true,"temperature":0.2}"#,
        )
        .unwrap();
        assert_eq!(params.model, "m");
        assert_eq!(
            params.prompt,
            PromptInput::Text("<|system|> be brief <|user|> hi\nthere <|assistant|>".into())
        );
        assert_eq!(params.max_tokens, Some(7));
        assert!(params.stream && params.include_usage && params.ignore_eos);
    }

    #[test]
    fn completions_accept_text_and_token_ids() {
        let text = completion(r#"{"model":"m","prompt":["hello world"]}"#).unwrap();
        assert_eq!(text.prompt, PromptInput::Text("hello world".into()));
        assert_eq!(text.max_tokens, None);
        assert!(!text.stream && !text.include_usage);
        let ids = completion(r#"{"model":"m","prompt":[1,2,3],"max_tokens":2}"#).unwrap();
        assert_eq!(ids.prompt, PromptInput::Tokens(vec![1, 2, 3]));
        let nested = completion(r#"{"model":"m","prompt":[[4,5]]}"#).unwrap();
        assert_eq!(nested.prompt, PromptInput::Tokens(vec![4, 5]));
    }

    #[test]
    fn usage_only_when_streaming() {
        let params =
            completion(r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#)
                .unwrap();
        assert!(!params.include_usage);
    }

    #[test]
    fn bad_input_is_a_400_naming_the_field() {
        let cases = [
            (chat("{"), "Invalid JSON body"),
            (chat("[1]"), "expected a JSON object"),
            (chat(r#"{"messages":[]}"#), "`model`"),
            (chat(r#"{"model":1,"messages":[]}"#), "`model`"),
            (chat(r#"{"model":"m"}"#), "`messages`"),
            (chat(r#"{"model":"m","messages":[]}"#), "must not be empty"),
            (
                chat(r#"{"model":"m","messages":[{"content":"x"}]}"#),
                "messages[0].role",
            ),
            (
                chat(r#"{"model":"m","messages":[{"role":"user","content":5}]}"#),
                "messages[0].content",
            ),
            (
                chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#),
                "`max_tokens` must be at least 1",
            ),
            (
                chat(
                    r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"9"}"#,
                ),
                "`max_tokens`",
            ),
            (
                chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#),
                "`stream`",
            ),
            (
                chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":2}"#),
                "`n` = 2",
            ),
            (completion(r#"{"model":"m"}"#), "`prompt`"),
            (
                completion(r#"{"model":"m","prompt":["a","b"]}"#),
                "batched prompts",
            ),
            (completion(r#"{"model":"m","prompt":[-1]}"#), "token ids"),
            (completion(r#"{"model":"m","prompt":{}}"#), "`prompt`"),
        ];
        for (result, needle) in cases {
            let err = result.unwrap_err();
            assert_eq!(err.status.as_u16(), 400);
            assert!(err.message.contains(needle), "{needle}: {}", err.message);
        }
    }
}

//! Parsing the body of `/v1/chat/completions` and `/v1/completions` into what the engine
//! needs: the served model name, the prompt, the generation limits and the streaming options.
//!
//! Only the fields that change what the mock does are read; other OpenAI fields
//! (`temperature`, `top_p`, …) are accepted and ignored, as vLLM accepts extra fields. Every
//! wrong input is a 400 in vLLM 0.32's shape: a body its request models refuse (not JSON,
//! not an object, a missing or mistyped field) is a validation error located at the field
//! (`param: "body.messages"`; the offset for JSON that does not parse), the rest name the
//! parameter as vLLM's serving code does. `model` may be left out: vLLM then serves its one
//! model.
//!
//! Chat prompts are rendered with the mock's fixed template ([`crate::chat_template`]),
//! `<|role|> content` per message and a trailing `<|assistant|>`, so a chat request costs a few
//! more tokens than its bare text, as a real chat template does.

use serde_json::{Map, Value};

use super::api_error::ApiError;
use crate::chat_template::Ending;

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
    /// `None` when the request names no model (the served one answers).
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// `max_tokens` (or chat's `max_completion_tokens`); `None` means "up to the context".
    pub max_tokens: Option<u32>,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`, counted only with `include_usage` (vLLM's
    /// rule).
    pub continuous_usage: bool,
    pub ignore_eos: bool,
}

/// Parses a request body for `endpoint`.
pub fn parse_generation(endpoint: Endpoint, body: &[u8]) -> Result<GenerationParams, ApiError> {
    let fields = json_object(body)?;
    let model = match fields.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(model)) => Some(model.clone()),
        Some(other) => return Err(wrong_type("model", other, "string_type", "a valid string")),
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
    let (include_usage, continuous_usage) = match fields.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(options)) => {
            let include = optional_bool(options, "include_usage")?.unwrap_or(true) && stream;
            let continuous = optional_bool(options, "continuous_usage_stats")?.unwrap_or(false);
            (include, include && continuous)
        }
        Some(other) => {
            return Err(wrong_type(
                "stream_options",
                other,
                "model_type",
                "a valid dictionary or instance of StreamOptions",
            ));
        }
    };
    let ignore_eos = optional_bool(&fields, "ignore_eos")?.unwrap_or(false);
    Ok(GenerationParams {
        model,
        prompt,
        max_tokens,
        stream,
        include_usage,
        continuous_usage,
        ignore_eos,
    })
}

/// Renders `messages` through the mock's chat template.
fn chat_prompt(fields: &Map<String, Value>) -> Result<String, ApiError> {
    let messages = match fields.get("messages") {
        Some(Value::Array(messages)) => messages,
        Some(other) => return Err(wrong_type("messages", other, "list_type", "a valid list")),
        None => return Err(missing("messages", fields)),
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
        ));
    }
    let mut rendered = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let Value::Object(message) = message else {
            return Err(wrong_type(
                &format!("messages.{i}"),
                message,
                "dict_type",
                "a valid dictionary",
            ));
        };
        let role = match message.get("role") {
            Some(Value::String(role)) => role.as_str(),
            Some(other) => {
                return Err(wrong_type(
                    &format!("messages.{i}.role"),
                    other,
                    "string_type",
                    "a valid string",
                ));
            }
            None => return Err(missing(&format!("messages.{i}.role"), message)),
        };
        rendered.push((role, message_content(i, message.get("content"))?));
    }
    let ending = chat_ending(fields, rendered.last().map(|(role, _)| *role))?;
    Ok(crate::chat_template::render_ending(
        rendered
            .iter()
            .map(|(role, content)| (*role, content.as_str())),
        ending,
    ))
}

/// How the chat template ends the prompt: vLLM's `add_generation_prompt` (default true) and
/// `continue_final_message` (default false), refused together as vLLM refuses them, and the
/// latter only with a final assistant message to continue.
fn chat_ending(fields: &Map<String, Value>, last_role: Option<&str>) -> Result<Ending, ApiError> {
    let generation_prompt = optional_bool(fields, "add_generation_prompt")?.unwrap_or(true);
    let continue_final = optional_bool(fields, "continue_final_message")?.unwrap_or(false);
    match (continue_final, generation_prompt) {
        (true, true) => Err(ApiError::bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        )),
        (true, false) if last_role != Some("assistant") => Err(ApiError::bad_request(
            "`continue_final_message` needs the final message to be an assistant message.",
        )),
        (true, false) => Ok(Ending::ContinueFinal),
        (false, true) => Ok(Ending::GenerationPrompt),
        (false, false) => Ok(Ending::Closed),
    }
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
                let field = format!("messages.{i}.content.{j}");
                let Some(Value::String(kind)) = part.get("type") else {
                    return Err(ApiError::validation(
                        "missing",
                        &format!("{field}.type"),
                        "Field required",
                        &python_repr(part),
                    ));
                };
                if kind != "text" {
                    return Err(ApiError::bad_request(format!(
                        "`{field}` has type `{kind}`; mock-engine serves text parts only"
                    )));
                }
                match part.get("text") {
                    Some(Value::String(text)) => texts.push(text.as_str()),
                    other => {
                        let other = other.unwrap_or(&Value::Null);
                        return Err(wrong_type(
                            &format!("{field}.text"),
                            other,
                            "string_type",
                            "a valid string",
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(other) => Err(wrong_type(
            &format!("messages.{i}.content"),
            other,
            "string_type",
            "a valid string",
        )),
    }
}

/// `prompt`: a string, an array holding one string, or token ids.
fn completion_prompt(fields: &Map<String, Value>) -> Result<PromptInput, ApiError> {
    let batched = || {
        ApiError::bad_request("batched prompts are not supported by mock-engine (one prompt only)")
    };
    let empty = || {
        ApiError::bad_param(
            "prompt",
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        )
    };
    let not_a_prompt = |value: &Value| wrong_type("prompt", value, "string_type", "a valid string");
    match fields.get("prompt") {
        None | Some(Value::Null) => Err(empty()),
        Some(Value::String(text)) if text.is_empty() => Err(empty()),
        Some(Value::String(text)) => Ok(PromptInput::Text(text.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(empty()),
            [Value::String(text)] => Ok(PromptInput::Text(text.clone())),
            [Value::Array(ids)] => token_ids(ids).map(PromptInput::Tokens),
            [Value::Number(_), ..] => token_ids(items).map(PromptInput::Tokens),
            [other] => Err(not_a_prompt(other)),
            _ => Err(batched()),
        },
        Some(other) => Err(not_a_prompt(other)),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| wrong_type("prompt", item, "int_type", "a valid integer"))
        })
        .collect()
}

fn optional_bool(fields: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(name, other, "bool_type", "a valid boolean")),
    }
}

fn optional_u64(fields: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) if value.is_i64() && !value.is_u64() => Ok(Some(0)),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| wrong_type(name, value, "int_type", "a valid integer")),
    }
}

/// A token count: an integer ≥ 1 (vLLM rejects `max_tokens` below 1; a negative one reads
/// as 0 here, which it rejects the same way).
fn optional_count(fields: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    match optional_u64(fields, name)? {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
        Some(n) => Err(ApiError::bad_param(
            name,
            format!("{name} must be at least 1, got {n}. (parameter={name}, value={n})"),
        )),
    }
}

/// The body as a JSON object, or vLLM's validation error: at the offset where the JSON
/// stops parsing, or at the body when it is not an object.
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(other) => Err(ApiError::validation(
            "model_attributes_type",
            "",
            "Input should be a valid dictionary or object to extract fields from",
            &python_repr(&other),
        )),
        Err(error) => {
            let offset = json_error_offset(body, &error);
            Err(ApiError::validation(
                "json_invalid",
                &offset.to_string(),
                "JSON decode error",
                "'<dict of 0 items>'",
            ))
        }
    }
}

/// Where in `body` (in characters, as Python counts) parsing failed: at the offending
/// character, or at the end for JSON that stops short.
fn json_error_offset(body: &[u8], error: &serde_json::Error) -> usize {
    let text = String::from_utf8_lossy(body);
    let before: usize = text
        .split_inclusive('\n')
        .take(error.line().saturating_sub(1))
        .map(|line| line.chars().count())
        .sum();
    let column = if error.is_eof() {
        error.column()
    } else {
        error.column().saturating_sub(1)
    };
    before + column
}

fn missing(loc: &str, fields: &Map<String, Value>) -> ApiError {
    let input = format!("'<dict of {} items>'", fields.len());
    ApiError::validation("missing", loc, "Field required", &input)
}

fn wrong_type(loc: &str, input: &Value, kind: &str, expected: &str) -> ApiError {
    ApiError::validation(
        kind,
        loc,
        &format!("Input should be {expected}"),
        &python_repr(input),
    )
}

/// An input as pydantic's errors print it (containers by their size).
fn python_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{s}'"),
        Value::Array(items) => format!("'<list of {} items>'", items.len()),
        Value::Object(fields) => format!("'<dict of {} items>'", fields.len()),
    }
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
        assert_eq!(params.model.as_deref(), Some("m"));
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
    fn bad_input_is_a_400_in_vllms_shape_naming_the_field() {
        let ok = r#""messages":[{"role":"user","content":"x"}]"#;
        let cases = [
            // (answer, type, param)
            (chat("{"), "Bad Request", Some("body.1")),
            (chat(r#"{"model": x}"#), "Bad Request", Some("body.10")),
            (chat("[1]"), "Bad Request", Some("body")),
            (
                chat(r#"{"model":1,"messages":[]}"#),
                "Bad Request",
                Some("body.model"),
            ),
            (
                chat(r#"{"model":"m"}"#),
                "Bad Request",
                Some("body.messages"),
            ),
            (
                chat(r#"{"model":"m","messages":"hi"}"#),
                "Bad Request",
                Some("body.messages"),
            ),
            (
                chat(r#"{"model":"m","messages":[]}"#),
                "BadRequestError",
                None,
            ),
            (
                chat(r#"{"model":"m","messages":[{"content":"x"}]}"#),
                "Bad Request",
                Some("body.messages.0.role"),
            ),
            (
                chat(r#"{"model":"m","messages":[{"role":"user","content":5}]}"#),
                "Bad Request",
                Some("body.messages.0.content"),
            ),
            (
                chat(&format!(r#"{{"model":"m",{ok},"max_tokens":0}}"#)),
                "BadRequestError",
                Some("max_tokens"),
            ),
            (
                chat(&format!(r#"{{"model":"m",{ok},"max_tokens":-3}}"#)),
                "BadRequestError",
                Some("max_tokens"),
            ),
            (
                chat(&format!(r#"{{"model":"m",{ok},"max_tokens":"9"}}"#)),
                "Bad Request",
                Some("body.max_tokens"),
            ),
            (
                chat(&format!(r#"{{"model":"m",{ok},"stream":"yes"}}"#)),
                "Bad Request",
                Some("body.stream"),
            ),
            (
                chat(&format!(r#"{{"model":"m",{ok},"n":2}}"#)),
                "BadRequestError",
                None,
            ),
            (
                completion(r#"{"model":"m"}"#),
                "BadRequestError",
                Some("prompt"),
            ),
            (
                completion(r#"{"model":"m","prompt":""}"#),
                "BadRequestError",
                Some("prompt"),
            ),
            (
                completion(r#"{"model":"m","prompt":["a","b"]}"#),
                "BadRequestError",
                None,
            ),
            (
                completion(r#"{"model":"m","prompt":[-1]}"#),
                "Bad Request",
                Some("body.prompt"),
            ),
            (
                completion(r#"{"model":"m","prompt":{}}"#),
                "Bad Request",
                Some("body.prompt"),
            ),
        ];
        for (i, (result, kind, param)) in cases.into_iter().enumerate() {
            let err = result.unwrap_err();
            assert_eq!(err.status.as_u16(), 400, "case {i}");
            assert_eq!(
                (err.kind(), err.param.as_deref()),
                (kind, param),
                "case {i}: {}",
                err.message
            );
        }
    }

    #[test]
    fn chat_continues_a_final_assistant_message_as_vllm_does() {
        let continued = chat(
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"the"}],
                "continue_final_message":true,"add_generation_prompt":false}"#,
        )
        .unwrap();
        assert_eq!(
            continued.prompt,
            PromptInput::Text("<|user|> hi <|assistant|> the".into())
        );
        let both = chat(
            r#"{"messages":[{"role":"assistant","content":"x"}],"continue_final_message":true}"#,
        );
        assert_eq!(both.unwrap_err().status.as_u16(), 400);
        let not_assistant = chat(
            r#"{"messages":[{"role":"user","content":"x"}],"continue_final_message":true,
                "add_generation_prompt":false}"#,
        );
        assert_eq!(not_assistant.unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn a_request_may_leave_the_model_out() {
        let params = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(params.model, None);
    }
}

//! The routing fields of an OpenAI request body: model, stream flag, message text.
//!
//! Only what routing needs is read, and the body is never re-serialised: the gateway forwards
//! the original bytes. The message text follows AIBrix v0.7.0 (`validateChatRequest`,
//! `parseChatMessages`) so that both gateways hash the same bytes:
//! - `/v1/chat/completions`: every message's `content`, joined with one ASCII space. A JSON
//!   string is unescaped; any other JSON value (array of parts, object, `null`) contributes its
//!   raw JSON bytes exactly as the client sent them. A message without `content` contributes
//!   the empty string (it still takes its place in the join). Roles, names and tools are not
//!   part of the text. A missing, `null` or empty `messages` is [`BodyError::NoMessages`]
//!   (AIBrix's 400 "no messages in the request body"), before any model or replica check.
//! - `/v1/completions`: `prompt`, in any of the forms OpenAI and vLLM accept: a string; an
//!   array of strings (a batch); an array of token ids; an array of token-id arrays. A batch
//!   is routed by its first prompt, the one whose blocks the engine is sure to hold as
//!   sent (joining them would index blocks that span two prompts, which no engine holds).
//!   Token ids are routed by their values ([`RoutingFields::tokens`], hashed as
//!   KV-event sync hashes the engine's tokens). AIBrix refuses arrays; vLLM serves them.
//! - `/v1/embeddings`: no text (the request is routed by load only).
//!
//! Every other field is ignored; a field routing reads with the wrong type is an error that
//! names the field.

use std::borrow::Cow;
use std::ops::Range;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// Which OpenAI endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
}

/// What routing needs from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingFields {
    pub model: String,
    pub stream: bool,
    /// The message text the prefix is computed from (empty for embeddings and token-id
    /// prompts, and when the parse was asked for no text: [`Text::LengthOnly`]).
    pub text: String,
    /// The message text's length in bytes, whether or not it was built.
    pub text_len: usize,
    /// The completion's bound, read in the same parse: `max_completion_tokens`, else
    /// `max_tokens` (vLLM's precedence); `None` when neither is given. A value that is not a
    /// non-negative integer is an error naming its field, reported by whoever needs the
    /// number (token admission), so that a request no one bounds is not refused for it.
    pub max_tokens: Result<Option<u64>, BodyError>,
    /// A token-id prompt's ids (its first prompt's, for a batch) as 4-byte big-endian bytes
    /// ([`crate::kv_sync::token_bytes`]), for [`crate::RouteRequest::tokens`].
    pub tokens: Option<Vec<u8>>,
    /// Where the prompt lies in the body, as sent: the bytes of the `messages` array (chat)
    /// or of the `prompt` value (completions, any form); `None` for embeddings. The gateway
    /// passes them verbatim to the engine's `/tokenize` (KV-event sync) without parsing
    /// the body again.
    pub prompt_span: Option<Range<usize>>,
}

/// Why a body cannot be routed. Every variant is a client error (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body has no `model`")]
    MissingModel,
    /// A chat body whose `messages` is missing, `null` or empty (AIBrix's wording).
    #[error("no messages in the request body")]
    NoMessages,
    #[error("`{field}` is invalid: {reason}")]
    InvalidField { field: &'static str, reason: String },
}

impl BodyError {
    fn field(field: &'static str, reason: impl Into<String>) -> Self {
        BodyError::InvalidField {
            field,
            reason: reason.into(),
        }
    }
}

/// The top-level fields routing reads, each kept as raw JSON so that its type can be checked
/// with an error naming the field, and so that `null` is told apart from absence.
#[derive(Deserialize)]
struct TopLevel<'a> {
    #[serde(default, borrow)]
    max_tokens: Option<&'a RawValue>,
    #[serde(default, borrow)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    model: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    stream: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    messages: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    prompt: Option<&'a RawValue>,
}

/// `Some` for any present value, `null` included (plain `Option` would turn `null` into
/// `None`, and a `null` content must contribute the bytes `null` to the text).
fn present<'de, D: Deserializer<'de>>(de: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(de).map(Some)
}

/// Whether a parse builds the message text or only measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text {
    /// Build it (prefix-aware strategies hash it).
    Build,
    /// Validate the messages and count the text's bytes, but build no string: for strategies
    /// that never read it.
    LengthOnly,
}

/// Parses just what routing needs from `body`, the message text included.
pub fn routing_fields(endpoint: Endpoint, body: &[u8]) -> Result<RoutingFields, BodyError> {
    routing_fields_with(endpoint, body, Text::Build)
}

/// [`routing_fields`], building the message text only when `text` asks for it. The body is
/// parsed once: the completion bound ([`RoutingFields::max_tokens`]) is read in the same pass.
pub fn routing_fields_with(
    endpoint: Endpoint,
    body: &[u8],
    text: Text,
) -> Result<RoutingFields, BodyError> {
    // serde would also build the struct from a JSON array; a body must be an object.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(BodyError::InvalidJson("expected a JSON object".to_owned()));
    }
    let top: TopLevel<'_> =
        serde_json::from_slice(body).map_err(|e| BodyError::InvalidJson(e.to_string()))?;
    let model = model(top.model)?;
    let stream = stream(top.stream)?;
    let mut joined = Joined::new(text);
    let prompt_raw = match endpoint {
        Endpoint::ChatCompletions => top.messages,
        Endpoint::Completions => top.prompt,
        Endpoint::Embeddings => None,
    };
    let tokens = match endpoint {
        Endpoint::ChatCompletions => {
            chat_text(top.messages, &mut joined)?;
            None
        }
        Endpoint::Completions => match prompt(top.prompt)? {
            Prompt::Text(text) => {
                joined.push(&text);
                None
            }
            Prompt::Tokens(ids) => Some(crate::kv_sync::token_bytes(&ids)),
        },
        Endpoint::Embeddings => None,
    };
    let max_tokens = bound("max_completion_tokens", top.max_completion_tokens)
        .and_then(|completion| Ok(completion.or(bound("max_tokens", top.max_tokens)?)));
    Ok(RoutingFields {
        model,
        stream,
        text: joined.text.unwrap_or_default(),
        text_len: joined.len,
        tokens,
        max_tokens,
        prompt_span: prompt_raw.and_then(|raw| span_in(body, raw)),
    })
}

/// Where `raw`, a value borrowed from `body` by the parse, lies in it (`None` cannot happen
/// for a borrowed value, and is only the safe answer if it ever did).
fn span_in(body: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    let part = raw.get().as_bytes();
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    // The same memory, not merely equal bytes: compared by address, not byte by byte.
    std::ptr::eq(body.get(start..end)?, part).then_some(start..end)
}

/// The message text as it is joined: built, or only measured.
struct Joined {
    text: Option<String>,
    len: usize,
}

impl Joined {
    fn new(text: Text) -> Self {
        Joined {
            text: (text == Text::Build).then(String::new),
            len: 0,
        }
    }

    fn push(&mut self, part: &str) {
        self.len += part.len();
        if let Some(text) = self.text.as_mut() {
            text.push_str(part);
        }
    }
}

/// A completion-bound field's value: absent and `null` are `None`.
fn bound(field: &'static str, raw: Option<&RawValue>) -> Result<Option<u64>, BodyError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    serde_json::from_str::<Option<u64>>(raw.get()).map_err(|_| BodyError::InvalidField {
        field,
        reason: format!("must be a non-negative integer, not {}", raw.get()),
    })
}

fn model(raw: Option<&RawValue>) -> Result<String, BodyError> {
    let raw = raw.ok_or(BodyError::MissingModel)?;
    let model =
        json_string(raw.get()).ok_or_else(|| BodyError::field("model", "must be a string"))?;
    if model.is_empty() {
        return Err(BodyError::field("model", "must not be empty"));
    }
    Ok(model.into_owned())
}

/// `stream` may be absent or `null` (both mean `false`, as in the OpenAI API) or a boolean.
fn stream(raw: Option<&RawValue>) -> Result<bool, BodyError> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(false),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(_) => Err(BodyError::field("stream", "must be a boolean")),
    }
}

fn chat_text(raw: Option<&RawValue>, text: &mut Joined) -> Result<(), BodyError> {
    let raw = raw.ok_or(BodyError::NoMessages)?;
    // `null` reads as no messages, as in AIBrix (a nil slice has length 0).
    if raw.get() == "null" {
        return Err(BodyError::NoMessages);
    }
    if !raw.get().starts_with('[') {
        return Err(BodyError::field("messages", "must be an array"));
    }
    if let Some(text) = text.text.as_mut() {
        text.reserve(raw.get().len());
    }
    let count = messages::contents(raw.get(), |i, content| {
        if i > 0 {
            text.push(" ");
        }
        if let Some(content) = content {
            match json_string(content) {
                Some(s) => text.push(&s),
                // Non-string content is hashed as sent, so no re-serialisation can change it.
                None => text.push(content),
            }
        }
    })?;
    if count == 0 {
        return Err(BodyError::NoMessages);
    }
    Ok(())
}

/// What a completion is routed by: its (first) prompt's text or token ids.
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

const PROMPT_FORMS: &str =
    "must be a string, an array of strings, an array of token ids or an array of token-id arrays";

fn prompt(raw: Option<&RawValue>) -> Result<Prompt, BodyError> {
    let raw = raw.ok_or_else(|| BodyError::field("prompt", "is required"))?;
    if let Some(text) = json_string(raw.get()) {
        return Ok(Prompt::Text(text.into_owned()));
    }
    let items: Vec<&RawValue> =
        serde_json::from_str(raw.get()).map_err(|_| BodyError::field("prompt", PROMPT_FORMS))?;
    let Some(first) = items.first() else {
        return Err(BodyError::field("prompt", "must not be an empty array"));
    };
    let first = first.get();
    if first.starts_with('"') {
        let mut texts = items.iter().map(|item| json_string(item.get()));
        let Some(Some(text)) = texts.next() else {
            return Err(BodyError::field("prompt", PROMPT_FORMS));
        };
        if texts.any(|t| t.is_none()) {
            return Err(BodyError::field(
                "prompt",
                "an array of strings holds a non-string",
            ));
        }
        return Ok(Prompt::Text(text.into_owned()));
    }
    let token_error = |e: serde_json::Error| {
        BodyError::field(
            "prompt",
            format!("token ids must be integers from 0 to 2^32 - 1: {e}"),
        )
    };
    if first.starts_with('[') {
        let batch: Vec<Vec<u32>> = serde_json::from_str(raw.get()).map_err(token_error)?;
        if batch.iter().any(Vec::is_empty) {
            return Err(BodyError::field("prompt", "a token-id array is empty"));
        }
        return Ok(Prompt::Tokens(batch.into_iter().next().unwrap_or_default()));
    }
    if !first.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        return Err(BodyError::field("prompt", PROMPT_FORMS));
    }
    let ids: Vec<u32> = serde_json::from_str(raw.get()).map_err(token_error)?;
    Ok(Prompt::Tokens(ids))
}

/// The unescaped string when `json` (validated JSON) is a JSON string, borrowed when it has no escapes.
fn json_string(json: &str) -> Option<Cow<'_, str>> {
    if !json.starts_with('"') {
        return None;
    }
    // A raw value is JSON the parser has validated: a string with no backslash has no
    // escapes, so its text is what lies between the quotes, found without a second parse
    // of it; the backslash is looked for with memchr's vectorised search, not core's
    // word-at-a-time one (the prompt is most of the body).
    if memchr::memchr(b'\\', json.as_bytes()).is_none() {
        return json.get(1..json.len() - 1).map(Cow::Borrowed);
    }
    serde_json::from_str::<String>(json).ok().map(Cow::Owned)
}

#[path = "text_messages.rs"]
mod messages;

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;

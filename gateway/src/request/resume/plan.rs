//! Whether a request may be resumed, decided once from its headers and body before it is
//! forwarded.
//!
//! Resume is on when the `x-prefixgate-resume` header says `on`, or the header is absent and
//! `resume.enabled` is set; `off` turns it off for the request. Any other value is a 400
//! naming the header. Only streamed chat and completion requests are resumed, and not those
//! whose answer a continuation could not carry on unchanged:
//! - `logprobs` / `top_logprobs` / `prompt_logprobs`: the continuation's prompt would be
//!   scored again and its token choices would start from other logprobs;
//! - `n` or `best_of` above 1: several answers share one stream and each would need its own
//!   continuation;
//! - tools (`tools`, `tool_choice`, `functions`): a partial tool call cannot be extended as
//!   text;
//! - structured output (`response_format` other than text, `guided_*`,
//!   `structured_outputs`): the grammar's state at the break is not known, and restarting it
//!   over the partial answer would not accept it;
//! - completions with `echo`, a `suffix`, or a prompt of token ids (the generated text has
//!   no ids to append), and chat requests that already ask for `continue_final_message`.

use http::{HeaderMap, HeaderName};
use router_core::text::Endpoint;
use serde_json::{Map, Value};

use bytes::Bytes;

use crate::request::error::GatewayError;
use crate::request::resume::counting::{self, UsageAsked};
use crate::request::resume::transcript::Shape;

/// The per-request switch.
pub const RESUME_HEADER: HeaderName = HeaderName::from_static("x-prefixgate-resume");

/// A resumable request: its body as sent upstream (asking the engine for its running token
/// count, [`counting`]), to build continuations from, and the usage its client asked for.
#[derive(Debug, Clone)]
pub struct Plan {
    pub shape: Shape,
    pub body: Map<String, Value>,
    pub asked: UsageAsked,
}

impl Plan {
    /// The body to send upstream in place of the client's.
    pub fn upstream_body(&self) -> Option<Bytes> {
        serde_json::to_vec(&self.body).ok().map(Bytes::from)
    }
}

/// The request's resume plan: `None` when resume is off for it or it cannot be resumed;
/// an error for a header that is neither `on` nor `off`.
pub fn plan(
    enabled: bool,
    endpoint: Endpoint,
    headers: &HeaderMap,
    streamed: bool,
    body: &[u8],
) -> Result<Option<Plan>, GatewayError> {
    let wanted = match headers.get(&RESUME_HEADER) {
        None => enabled,
        Some(value) => match value.to_str().map(str::trim) {
            Ok(word) if word.eq_ignore_ascii_case("on") => true,
            Ok(word) if word.eq_ignore_ascii_case("off") => false,
            _ => {
                return Err(GatewayError::BadHeader {
                    header: RESUME_HEADER.as_str().to_owned(),
                    reason: format!(
                        "must be `on` or `off`, got {:?}",
                        String::from_utf8_lossy(value.as_bytes())
                    ),
                });
            }
        },
    };
    // The routing parse already read `stream`: an answer that is not streamed cannot be
    // resumed, and its body need not be parsed again.
    if !wanted || !streamed {
        return Ok(None);
    }
    let shape = match endpoint {
        Endpoint::ChatCompletions => Shape::Chat,
        Endpoint::Completions => Shape::Completions,
        Endpoint::Embeddings => return Ok(None),
    };
    let Ok(mut body) = serde_json::from_slice::<Map<String, Value>>(body) else {
        return Ok(None);
    };
    if let Some(reason) = not_resumable(shape, &body) {
        tracing::debug!(reason, "request not resumable");
        return Ok(None);
    }
    let asked = UsageAsked::of(&body);
    counting::ask_running_count(&mut body);
    Ok(Some(Plan { shape, body, asked }))
}

/// Why `body` cannot be resumed, if it cannot.
fn not_resumable(shape: Shape, body: &Map<String, Value>) -> Option<&'static str> {
    let set = |key: &str| body.get(key).is_some_and(|v| !v.is_null() && *v != false);
    if ["logprobs", "top_logprobs", "prompt_logprobs"]
        .iter()
        .any(|key| set(key))
    {
        return Some("logprobs");
    }
    let above_one = |key: &str| body.get(key).and_then(Value::as_u64).is_some_and(|n| n > 1);
    if above_one("n") || above_one("best_of") {
        return Some("several choices");
    }
    if ["tools", "tool_choice", "functions", "function_call"]
        .iter()
        .any(|key| set(key))
    {
        return Some("tools");
    }
    let text_format = body
        .get("response_format")
        .is_none_or(|f| f.is_null() || f.get("type") == Some(&Value::from("text")));
    let guided = body
        .keys()
        .any(|key| key.starts_with("guided_") || key == "structured_outputs");
    if !text_format || guided {
        return Some("structured output");
    }
    match shape {
        Shape::Completions => {
            if set("echo") || set("suffix") {
                return Some("echo or suffix");
            }
            let text_prompt = match body.get("prompt") {
                Some(Value::String(_)) => true,
                Some(Value::Array(items)) => matches!(items.as_slice(), [Value::String(_)]),
                _ => false,
            };
            if !text_prompt {
                return Some("not a single text prompt");
            }
        }
        Shape::Chat => {
            if set("continue_final_message") {
                return Some("already continues a final message");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::text::Text;

    fn planned(endpoint: Endpoint, header: Option<&str>, body: &str) -> Option<Plan> {
        let mut headers = HeaderMap::new();
        if let Some(value) = header {
            headers.insert(RESUME_HEADER, value.parse().unwrap());
        }
        // `stream` as the routing parse reads it, which the gateway hands the plan.
        let streamed = crate::request::parse::fields(endpoint, body.as_bytes(), Text::Build)
            .is_ok_and(|fields| fields.stream);
        plan(false, endpoint, &headers, streamed, body.as_bytes()).unwrap()
    }

    const CHAT: &str = r#""model":"m","messages":[{"role":"user","content":"hi"}],"stream":true"#;

    #[test]
    fn the_header_turns_resume_on_and_off() {
        let body = format!("{{{CHAT}}}");
        assert!(planned(Endpoint::ChatCompletions, None, &body).is_none());
        assert!(planned(Endpoint::ChatCompletions, Some("on"), &body).is_some());
        let mut headers = HeaderMap::new();
        headers.insert(RESUME_HEADER, "off".parse().unwrap());
        let off = plan(
            true,
            Endpoint::ChatCompletions,
            &headers,
            true,
            body.as_bytes(),
        )
        .unwrap();
        assert!(off.is_none());
        headers.insert(RESUME_HEADER, "maybe".parse().unwrap());
        let error = plan(
            true,
            Endpoint::ChatCompletions,
            &headers,
            true,
            body.as_bytes(),
        )
        .unwrap_err();
        assert_eq!(error.status(), http::StatusCode::BAD_REQUEST);
        assert!(error.to_string().contains("x-prefixgate-resume"), "{error}");
    }

    #[test]
    fn requests_a_continuation_would_change_are_not_resumed() {
        for extra in [
            r#""logprobs":true"#,
            r#""n":2"#,
            r#""tools":[{"type":"function","function":{"name":"f"}}]"#,
            r#""response_format":{"type":"json_object"}"#,
            r#""guided_regex":"a+""#,
            r#""continue_final_message":true"#,
        ] {
            let body = format!("{{{CHAT},{extra}}}");
            assert!(
                planned(Endpoint::ChatCompletions, Some("on"), &body).is_none(),
                "{extra}"
            );
        }
        let plain = format!(r#"{{{CHAT},"n":1,"response_format":{{"type":"text"}}}}"#);
        assert!(planned(Endpoint::ChatCompletions, Some("on"), &plain).is_some());
        let unstreamed = r#"{"model":"m","messages":[]}"#;
        assert!(planned(Endpoint::ChatCompletions, Some("on"), unstreamed).is_none());
        for prompt in [r#"[1,2]"#, r#"["a","b"]"#] {
            let body = format!(r#"{{"model":"m","prompt":{prompt},"stream":true}}"#);
            assert!(planned(Endpoint::Completions, Some("on"), &body).is_none());
        }
        let echo = r#"{"model":"m","prompt":"a","stream":true,"echo":true}"#;
        assert!(planned(Endpoint::Completions, Some("on"), echo).is_none());
        let text = r#"{"model":"m","prompt":["a"],"stream":true,"logprobs":null}"#;
        assert!(planned(Endpoint::Completions, Some("on"), text).is_some());
    }
}

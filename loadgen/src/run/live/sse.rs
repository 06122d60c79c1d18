//! Server-sent events as OpenAI-compatible servers stream them: `data: <payload>` lines,
//! events separated by blank lines, `data: [DONE]` at the end.
//!
//! [`SseLines`] accepts the body in whatever pieces the network delivers (a line may be split
//! across reads, several events may come in one read) and yields each complete `data:`
//! payload. [`classify`] reads one payload as a chat or completions chunk. Pure.

use serde_json::Value;

/// Reassembles `data:` payloads from body pieces.
#[derive(Debug, Default)]
pub struct SseLines {
    pending: Vec<u8>,
}

/// Upper bound on one buffered line, so a server that never sends a newline cannot make the
/// client buffer without limit.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

impl SseLines {
    /// Feeds one piece of the body; returns the payloads it completed, or `Err` when a line
    /// grows past [`MAX_LINE_BYTES`].
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let line = &self.pending[start..start + pos];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(data) = line.strip_prefix(b"data:") {
                let text = String::from_utf8_lossy(data);
                out.push(text.trim_start().to_owned());
            }
            start += pos + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_LINE_BYTES {
            return Err(format!("SSE line longer than {MAX_LINE_BYTES} bytes"));
        }
        Ok(out)
    }
}

/// What one payload says.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// `[DONE]`.
    Done,
    /// An error event (`{"error": …}`), with its message.
    Error(String),
    /// A chunk: its content (every choice's, concatenated; empty when it carried none),
    /// whether it carried a generated token at all (a chat delta without `role`, or a
    /// completion's `text`, even empty: vLLM sends `""` for a token that ends inside a UTF-8
    /// character), whether a choice finished, and usage if present (`prompt_tokens`,
    /// `completion_tokens`, `cached_tokens`).
    Data {
        content: String,
        token: bool,
        finished: bool,
        usage: Option<(u32, u32, Option<u32>)>,
    },
    /// Not JSON, or JSON of an unexpected shape.
    Malformed(String),
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// Reads one `data:` payload.
pub fn classify(payload: &str) -> Chunk {
    if payload == "[DONE]" {
        return Chunk::Done;
    }
    let value: Value = match serde_json::from_str(payload) {
        Ok(v) => v,
        Err(e) => return Chunk::Malformed(format!("invalid JSON in SSE event: {e}")),
    };
    if let Some(error) = value.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        return Chunk::Error(message);
    }
    let Some(choices) = value.get("choices").and_then(Value::as_array) else {
        return Chunk::Malformed("SSE event without choices".into());
    };
    let mut content = String::new();
    let mut token = false;
    let mut finished = false;
    for choice in choices {
        token |= match choice.get("delta") {
            Some(delta) => delta.get("role").is_none() && delta.get("content").is_some(),
            None => choice.get("text").is_some(),
        };
        let text = choice
            .get("delta")
            .and_then(|d| d.get("content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str);
        content.push_str(text.unwrap_or_default());
        finished |= choice.get("finish_reason").is_some_and(|f| !f.is_null());
    }
    let usage = value.get("usage").filter(|u| !u.is_null()).and_then(|u| {
        Some((
            as_u32(u.get("prompt_tokens")?)?,
            as_u32(u.get("completion_tokens")?)?,
            u.get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(as_u32),
        ))
    });
    Chunk::Data {
        content,
        token,
        finished,
        usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_survive_arbitrary_splits() {
        let body = "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\ndata: [DONE]\n\n";
        for split in 0..body.len() {
            let mut lines = SseLines::default();
            let mut got = lines.feed(&body.as_bytes()[..split]).unwrap();
            got.extend(lines.feed(&body.as_bytes()[split..]).unwrap());
            assert_eq!(
                got,
                ["{\"a\":1}", "{\"b\":2}", "[DONE]"],
                "split at {split}"
            );
        }
    }

    #[test]
    fn endless_lines_are_refused() {
        let mut lines = SseLines::default();
        let big = vec![b'x'; MAX_LINE_BYTES + 1];
        assert!(lines.feed(&big).is_err());
    }

    #[test]
    fn classifies_vllm_chat_and_completion_chunks() {
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        assert_eq!(
            classify(role),
            Chunk::Data {
                content: String::new(),
                token: false,
                finished: false,
                usage: None
            }
        );
        // vLLM's chunk for a token that ends inside a UTF-8 character: a token, no text.
        let partial = r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null,"token_ids":null}]}"#;
        assert!(
            matches!(classify(partial), Chunk::Data { token: true, ref content, .. } if content.is_empty())
        );
        let empty_text = r#"{"choices":[{"index":0,"text":"","finish_reason":null}]}"#;
        assert!(matches!(
            classify(empty_text),
            Chunk::Data { token: true, .. }
        ));
        let last = r#"{"choices":[{"index":0,"delta":{"content":" cache"},"finish_reason":"length"}],"usage":null}"#;
        assert_eq!(
            classify(last),
            Chunk::Data {
                content: " cache".into(),
                token: true,
                finished: true,
                usage: None
            }
        );
        let text = r#"{"choices":[{"index":0,"text":" word","finish_reason":null}]}"#;
        assert!(matches!(classify(text), Chunk::Data { content, .. } if content == " word"));
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":5040,"completion_tokens":128,"total_tokens":5168,"prompt_tokens_details":{"cached_tokens":4704}}}"#;
        assert_eq!(
            classify(usage),
            Chunk::Data {
                content: String::new(),
                token: false,
                finished: false,
                usage: Some((5040, 128, Some(4704)))
            }
        );
        assert_eq!(classify("[DONE]"), Chunk::Done);
        assert_eq!(
            classify(r#"{"error":{"message":"upstream reset","type":"x"}}"#),
            Chunk::Error("upstream reset".into())
        );
        assert!(matches!(classify("{not json"), Chunk::Malformed(_)));
        assert!(matches!(classify("{}"), Chunk::Malformed(_)));
    }
}

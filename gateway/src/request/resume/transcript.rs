//! What the client of a resumable stream has been sent, event by event, and the rewriting
//! that makes a continuation's events read as the rest of the first stream.
//!
//! Wire format (vLLM's OpenAI server): each SSE event is one `data: <json>` line ended by a
//! blank line (`\n\n`); the stream ends with `data: [DONE]`. A chat chunk is
//! `{"id","object","created","model","choices":[{"index","delta":{"content"|"role"},
//! "finish_reason",…}],…}`, a completion chunk carries `choices[0].text` instead of a
//! delta; with `stream_options.include_usage` the last chunk before `[DONE]` has empty
//! `choices` and a `usage` object, and with `continuous_usage_stats` too every chunk has a
//! `usage` whose `completion_tokens` counts the tokens generated so far. A chat stream opens
//! with a role chunk (`delta.role`, empty content) that carries no token.
//!
//! The tokens the client has are the engine's running count where the chunks carry it (a
//! resumable request asks for it, [`super::counting`]) and else the chunks that carried
//! generated text, which is a token each on an engine that sends one chunk per token.
//!
//! Only whole events pass: a frame's trailing partial event waits for the rest, so when the
//! upstream breaks the client stands at an event boundary and the continuation's events
//! follow cleanly. In a continuation every event's `id` and `created` are replaced by the
//! first stream's (spliced into the event's text, so every other byte stays the engine's),
//! its role chunk is dropped (the client has had one), and its usage block is rewritten to
//! count the whole answer (see [`Transcript::rewrite_usage`]). In every stream, usage the
//! client did not ask for ([`UsageAsked`]) is taken out.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::counting::UsageAsked;

/// Which OpenAI stream shape the transcript reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Completions,
}

/// The client's view of a resumable stream so far.
#[derive(Debug)]
pub struct Transcript {
    shape: Shape,
    /// The usage the client asked to see.
    asked: UsageAsked,
    /// The bytes of an event not yet ended.
    partial: BytesMut,
    /// The first stream's `id` and `created`, as JSON text.
    id: Option<String>,
    created: Option<String>,
    /// The generated text the client has.
    text: String,
    /// Chunks of generated text the current attempt sent.
    chunks: u64,
    /// The current attempt's running token count, when its chunks carry one.
    reported: Option<u64>,
    /// Tokens sent before the current attempt (0 on the first stream).
    produced_before: u64,
    /// A chunk with a `finish_reason` was sent: the answer is whole.
    finished: bool,
    /// A chunk carried something a continuation cannot carry on (reasoning, tool calls).
    unresumable: bool,
    /// The current upstream is a continuation: its events are rewritten.
    continuation: bool,
}

/// The parts of a chunk the transcript reads, borrowed from the event's text so their
/// places can be spliced.
#[derive(Deserialize)]
struct ChunkView<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    created: Option<&'a RawValue>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(default)]
    choices: Vec<ChoiceView>,
}

#[derive(Deserialize)]
struct ChoiceView {
    #[serde(default)]
    delta: Option<DeltaView>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaView {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct UsageView<'a> {
    #[serde(borrow, default)]
    prompt_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    total_tokens: Option<&'a RawValue>,
}

/// What one event is, for the transcript.
enum Seen {
    /// Pass as it is (or rewritten, in a continuation).
    Pass,
    /// A continuation's role chunk: dropped.
    Drop,
}

impl Transcript {
    pub fn new(shape: Shape, asked: UsageAsked) -> Self {
        Transcript {
            shape,
            asked,
            partial: BytesMut::new(),
            id: None,
            created: None,
            text: String::new(),
            chunks: 0,
            reported: None,
            produced_before: 0,
            finished: false,
            unresumable: false,
            continuation: false,
        }
    }

    /// The generated text the client has.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Tokens the client has, over every attempt.
    pub fn produced(&self) -> u64 {
        self.produced_before + self.reported.unwrap_or(self.chunks)
    }

    /// Whether a continuation can carry the answer on: something was generated, the answer
    /// is not whole, and nothing was sent that a continuation cannot extend.
    pub fn resumable(&self) -> bool {
        self.produced() > 0 && !self.finished && !self.unresumable
    }

    /// The upstream changed to a continuation: its bytes start afresh, its count too, and
    /// its events are rewritten from now on.
    pub fn begin_continuation(&mut self) {
        self.partial.clear();
        self.produced_before = self.produced();
        self.chunks = 0;
        self.reported = None;
        self.continuation = true;
    }

    /// Takes one upstream frame; returns the whole events it completes, as the client is
    /// to see them (possibly nothing).
    pub fn pass(&mut self, data: &[u8]) -> Bytes {
        self.partial.extend_from_slice(data);
        let mut out = BytesMut::new();
        while let Some(end) = find_event_end(&self.partial) {
            let event = self.partial.split_to(end + 2).freeze();
            self.event(&event, &mut out);
        }
        out.freeze()
    }

    /// The upstream ended: what is left of an unended event passes as it is.
    pub fn flush(&mut self) -> Bytes {
        self.partial.split().freeze()
    }

    /// Notes one whole event (its `\n\n` included) and appends what the client gets of it.
    fn event(&mut self, event: &Bytes, out: &mut BytesMut) {
        let Some(payload) = std::str::from_utf8(event)
            .ok()
            .and_then(|text| text.strip_prefix("data:"))
            .map(str::trim)
        else {
            out.extend_from_slice(event);
            return;
        };
        let Ok(chunk) = serde_json::from_str::<ChunkView<'_>>(payload) else {
            // `[DONE]`, an error event, anything not a chunk: the client's as it is.
            out.extend_from_slice(event);
            return;
        };
        let seen = self.note(&chunk);
        // The closing usage-only chunk, and a running count in the others, only if asked.
        let closing = chunk.choices.is_empty();
        let unasked = chunk.usage.is_some()
            && if closing {
                !self.asked.closing
            } else {
                !self.asked.every_chunk
            };
        match seen {
            Seen::Drop => {}
            Seen::Pass if unasked && closing => {}
            Seen::Pass if !self.continuation && !unasked => out.extend_from_slice(event),
            Seen::Pass => {
                let rewritten = self.rewrite(payload, &chunk, unasked);
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(rewritten.as_bytes());
                out.extend_from_slice(b"\n\n");
            }
        }
    }

    /// Reads a chunk into the transcript.
    fn note(&mut self, chunk: &ChunkView<'_>) -> Seen {
        if !self.continuation {
            if self.id.is_none() {
                self.id = chunk.id.map(|raw| raw.get().to_owned());
            }
            if self.created.is_none() {
                self.created = chunk.created.map(|raw| raw.get().to_owned());
            }
        }
        let mut seen = Seen::Pass;
        for choice in &chunk.choices {
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
            let generated = match (self.shape, &choice.delta) {
                (Shape::Completions, _) => choice.text.as_deref(),
                (Shape::Chat, Some(delta)) => {
                    if delta.reasoning_content.is_some()
                        || delta.reasoning.is_some()
                        || delta.tool_calls.is_some()
                    {
                        self.unresumable = true;
                    }
                    if delta.role.is_some() {
                        if self.continuation && delta.content.as_deref().is_none_or(str::is_empty) {
                            seen = Seen::Drop;
                        }
                        None
                    } else {
                        delta.content.as_deref()
                    }
                }
                (Shape::Chat, None) => None,
            };
            if let Some(text) = generated {
                self.text.push_str(text);
                self.chunks += 1;
            }
        }
        if let Some(count) = chunk.usage.and_then(completion_tokens) {
            self.reported = Some(count);
        }
        seen
    }

    /// A chunk as the client is to see it: without its `usage` if `unasked`; in a
    /// continuation, with the first stream's `id` and `created` and usage counting the whole
    /// answer.
    fn rewrite(&self, payload: &str, chunk: &ChunkView<'_>, unasked: bool) -> String {
        let mut splices = Vec::with_capacity(3);
        let mut replace = |raw: &RawValue, value: String| {
            splices.extend(span(payload, raw).map(|at| (at, value)));
        };
        if self.continuation {
            if let (Some(raw), Some(id)) = (chunk.id, &self.id) {
                replace(raw, id.clone());
            }
            if let (Some(raw), Some(created)) = (chunk.created, &self.created) {
                replace(raw, created.clone());
            }
        }
        if let Some(raw) = chunk.usage {
            if unasked {
                let cut = span(payload, raw).and_then(|at| member(payload, "usage", at));
                splices.extend(cut.map(|at| (at, String::new())));
            } else if self.continuation
                && let Some(usage) = self.rewrite_usage(raw.get())
            {
                replace(raw, usage);
            }
        }
        splice(payload, splices)
    }

    /// The continuation's usage block counting the whole answer:
    /// - `completion_tokens`: the tokens sent before the continuation plus the
    ///   continuation's own;
    /// - `prompt_tokens`: the client's prompt, which is the continuation's prompt less the
    ///   generated text it carried (the tokens counted before it); the client asked for
    ///   that prompt, and `total_tokens` then means what it means without a break (its
    ///   prompt plus its answer). The prompt of the broken attempt is not known (a stream
    ///   reports usage only at its end);
    /// - `total_tokens`: their sum.
    ///
    /// Other fields (`prompt_tokens_details.cached_tokens`) are the continuation's.
    fn rewrite_usage(&self, usage: &str) -> Option<String> {
        let view: UsageView<'_> = serde_json::from_str(usage).ok()?;
        let number = |raw: Option<&RawValue>| raw.and_then(|r| r.get().parse::<u64>().ok());
        let carried = self.produced_before;
        let prompt = number(view.prompt_tokens)?.saturating_sub(carried);
        let completion = number(view.completion_tokens)?.saturating_add(carried);
        let total = prompt.saturating_add(completion);
        let splices = [
            (view.prompt_tokens, prompt),
            (view.completion_tokens, completion),
            (view.total_tokens, total),
        ]
        .into_iter()
        .filter_map(|(raw, value)| Some((span(usage, raw?)?, value.to_string())))
        .collect();
        Some(splice(usage, splices))
    }
}

/// A usage object's `completion_tokens`.
fn completion_tokens(usage: &RawValue) -> Option<u64> {
    let view: UsageView<'_> = serde_json::from_str(usage.get()).ok()?;
    view.completion_tokens?.get().parse().ok()
}

/// Where the first event of `bytes` ends (the index of its `\n\n`).
fn find_event_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|pair| pair == b"\n\n")
}

/// Where in `text` a value serde borrowed from it lies (`None` for one that is not a slice
/// of it).
fn span(text: &str, raw: &RawValue) -> Option<Range<usize>> {
    let start = (raw.get().as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let end = start.checked_add(raw.get().len())?;
    (end <= text.len()).then_some(start..end)
}

/// The whole member `"key": value` of the object around `value` in `text`, with the comma
/// that parts it from a neighbour: what to cut to take the member out and keep the object
/// well-formed.
fn member(text: &str, key: &str, value: Range<usize>) -> Option<Range<usize>> {
    let quoted = format!("\"{key}\"");
    let before = text
        .get(..value.start)?
        .trim_end()
        .strip_suffix(':')?
        .trim_end();
    let before = before.strip_suffix(quoted.as_str())?;
    let key_start = before.len();
    let before = before.trim_end();
    if let Some(comma) = before.strip_suffix(',') {
        return Some(comma.len()..value.end);
    }
    // The first member: cut through the comma after it, if any.
    before.ends_with('{').then_some(())?;
    let after = text.get(value.end..)?;
    let rest = after.trim_start();
    let end = match rest.strip_prefix(',') {
        Some(tail) => text.len() - tail.trim_start().len(),
        None => value.end,
    };
    Some(key_start..end)
}

/// `text` with each span replaced, in order; spans that overlap an earlier one are skipped.
fn splice(text: &str, mut splices: Vec<(Range<usize>, String)>) -> String {
    splices.sort_by_key(|(span, _)| span.start);
    let mut out = String::with_capacity(text.len() + 16);
    let mut at = 0;
    for (span, value) in &splices {
        if span.start < at || span.end > text.len() {
            continue;
        }
        out.push_str(&text[at..span.start]);
        out.push_str(value);
        at = span.end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
#[path = "transcript_tests.rs"]
mod tests;

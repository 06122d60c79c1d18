//! Requests for the tiny model: prompt families whose shared prefix spans several 32-token
//! blocks, unique to each run (a nonce leads them), so a suite run against replicas whose
//! caches are already warm from an earlier run still starts cold.

use std::sync::atomic::{AtomicU64, Ordering};

use super::fleet::MODEL;

const WORDS: &[&str] = &[
    "model", "replica", "cache", "prefix", "block", "token", "request", "route", "gateway",
    "engine", "stream", "latency", "prompt", "family", "session", "answer", "system", "user",
    "question", "document", "summary", "table", "data", "value", "result", "queue", "batch",
];

/// A new family's shared prefix: about 320 tokens (ten full blocks of the tiny model).
pub fn family(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 40)
        ^ NEXT.fetch_add(1, Ordering::Relaxed);
    let mut text = format!("Family {name} {nonce:x}:");
    let mut state = nonce | 1;
    for _ in 0..260 {
        // xorshift: a different sentence per family, the same for every request of it.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push(' ');
        text.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
    }
    text
}

/// A chat request of `family` with its own `turn`.
pub fn chat(family: &str, turn: &str, max_tokens: u32, stream: bool) -> String {
    request(serde_json::json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": family},
            {"role": "user", "content": turn},
        ],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "stream": stream,
    }))
}

/// A completion request: `family` then `turn`.
pub fn completion(family: &str, turn: &str, max_tokens: u32, stream: bool) -> String {
    request(serde_json::json!({
        "model": MODEL,
        "prompt": format!("{family} {turn}"),
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "stream": stream,
    }))
}

/// `body` as sent: greedy, exactly `max_tokens` (random weights emit EOS at random), and a
/// usage block on every stream.
fn request(mut body: serde_json::Value) -> String {
    if body["stream"] == true {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

/// A stream long enough to act on while it runs (seconds on a CPU engine): the context
/// minus room for the prompt.
pub const LONG: u32 = 1500;

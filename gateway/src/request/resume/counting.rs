//! How a resumable stream's tokens are counted exactly: the engine is asked for its running
//! count, and the client is shown only the usage it asked for.
//!
//! vLLM's chunks are not tokens: it holds back a token that ends inside a UTF-8 character
//! and sends it with the next, and when its output loop runs behind it puts several tokens in
//! one chunk (1067 chunks for 1500 tokens on a loaded CPU). A continuation sized by chunks
//! would get more `max_tokens` than are left, and the answer would run longer than asked.
//! So a resumable request goes upstream with `stream_options.include_usage` and vLLM's
//! `continuous_usage_stats` on: every chunk then carries `usage.completion_tokens`, the
//! tokens generated so far, which is the count of the text sent with it (a held-back token
//! is sent, and counted, with a later chunk). The transcript takes that count where a chunk
//! has it and counts chunks where none has (an engine that ignores the option).
//!
//! What the client did not ask for is taken out again: a chunk's usage without
//! `continuous_usage_stats`, the closing usage-only chunk without `include_usage`.

use serde_json::{Map, Value};

/// The usage the client asked to see (vLLM's semantics: `continuous_usage_stats` counts only
/// with `include_usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageAsked {
    /// `include_usage`: the closing usage-only chunk.
    pub closing: bool,
    /// `continuous_usage_stats` too: a usage object in every chunk.
    pub every_chunk: bool,
}

impl UsageAsked {
    /// What `body`'s `stream_options` ask for.
    pub fn of(body: &Map<String, Value>) -> Self {
        let options = body.get("stream_options").and_then(Value::as_object);
        let on = |key: &str| {
            options
                .and_then(|options| options.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let closing = on("include_usage");
        UsageAsked {
            closing,
            every_chunk: closing && on("continuous_usage_stats"),
        }
    }
}

/// Turns on the engine's running count in `body` (see the module docs). A `stream_options`
/// the engine would refuse (not an object, a switch that is not a boolean) is left as it is,
/// so the client gets the engine's error rather than an answer to a request it did not make.
pub fn ask_running_count(body: &mut Map<String, Value>) {
    const SWITCHES: [&str; 2] = ["include_usage", "continuous_usage_stats"];
    let options = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if options.is_null() {
        *options = Value::Object(Map::new());
    }
    let Value::Object(options) = options else {
        return;
    };
    let refusable = SWITCHES.iter().any(|key| {
        options
            .get(*key)
            .is_some_and(|v| !v.is_boolean() && !v.is_null())
    });
    if refusable {
        return;
    }
    for key in SWITCHES {
        options.insert(key.to_owned(), Value::Bool(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        let Value::Object(map) = value else { panic!() };
        map
    }

    #[test]
    fn what_the_client_asked_is_read_with_vllms_dependency() {
        let asked = |options: Value| UsageAsked::of(&object(json!({"stream_options": options})));
        assert_eq!(asked(Value::Null), UsageAsked::default());
        assert_eq!(
            asked(json!({"include_usage": true})),
            UsageAsked {
                closing: true,
                every_chunk: false
            }
        );
        assert_eq!(
            asked(json!({"include_usage": true, "continuous_usage_stats": true})),
            UsageAsked {
                closing: true,
                every_chunk: true
            }
        );
        assert_eq!(
            asked(json!({"continuous_usage_stats": true})),
            UsageAsked::default(),
            "a running count needs include_usage"
        );
        assert_eq!(UsageAsked::of(&Map::new()), UsageAsked::default());
    }

    #[test]
    fn the_running_count_is_asked_for_unless_the_engine_would_refuse_the_options() {
        let asked = |body: Value| {
            let mut body = object(body);
            ask_running_count(&mut body);
            Value::Object(body)
        };
        let on = json!({"include_usage": true, "continuous_usage_stats": true});
        assert_eq!(asked(json!({}))["stream_options"], on);
        assert_eq!(asked(json!({"stream_options": null}))["stream_options"], on);
        assert_eq!(
            asked(json!({"stream_options": {"include_usage": false}}))["stream_options"],
            on
        );
        for refused in [
            json!({"stream_options": "yes"}),
            json!({"stream_options": {"include_usage": "yes"}}),
            json!({"stream_options": {"continuous_usage_stats": 1}}),
        ] {
            assert_eq!(asked(refused.clone()), refused);
        }
    }
}

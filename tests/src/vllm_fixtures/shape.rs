//! Comparing two answers by shape: the same keys, values of the same JSON type, and the same
//! value where the value is protocol; a stream's runs of token chunks compare as one chunk.

use serde_json::Value;

/// Keys whose values are part of the protocol, compared exactly; every other value is
/// compared by JSON type only.
const EXACT: &[&str] = &[
    "object",
    "finish_reason",
    "role",
    "type",
    "code",
    "param",
    "owned_by",
    "status",
    "content_type",
    "stop_reason",
    "labels",
    "finished_reasons",
    "block_size",
    "medium",
];

/// Where `actual` differs in shape from `expected` (vLLM's), one line per difference:
/// `PATH: what`.
pub fn differences(expected: &Value, actual: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff("", None, expected, actual, &mut out);
    out
}

fn diff(path: &str, key: Option<&str>, expected: &Value, actual: &Value, out: &mut Vec<String>) {
    if key.is_some_and(|k| EXACT.contains(&k)) {
        if expected != actual {
            out.push(format!("{path}: {expected} in vLLM, {actual} in the mock"));
        }
        return;
    }
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let here = format!("{path}.{k}");
                match a.get(k) {
                    Some(w) => diff(&here, Some(k), v, w, out),
                    None => out.push(format!("{here}: only in vLLM")),
                }
            }
            for k in a.keys().filter(|k| !e.contains_key(*k)) {
                out.push(format!("{path}.{k}: only in the mock"));
            }
        }
        (Value::Array(e), Value::Array(a)) if key == Some("events") => {
            // How many chunks carry the generated text is the sampler's and the detokenizer's
            // business (vLLM holds back a token that ends inside a UTF-8 character and sends it
            // with the next), so a run of token chunks compares as its first one.
            let (e, a) = (token_runs_collapsed(e), token_runs_collapsed(a));
            diff_elements(path, key, &e, &a, out);
        }
        (Value::Array(e), Value::Array(a)) => diff_elements(path, key, e, a, out),
        (e, a) => {
            if kind(e) != kind(a) {
                out.push(format!(
                    "{path}: {} in vLLM, {} in the mock",
                    kind(e),
                    kind(a)
                ));
            }
        }
    }
}

fn diff_elements(
    path: &str,
    key: Option<&str>,
    expected: &[Value],
    actual: &[Value],
    out: &mut Vec<String>,
) {
    // A token list's length is the tokenizer's business, and a block list's too.
    if expected.len() != actual.len()
        && !matches!(
            key,
            Some("tokens" | "token_ids" | "block_hashes" | "extra_keys")
        )
    {
        out.push(format!(
            "{path}: {} elements in vLLM, {} in the mock",
            expected.len(),
            actual.len()
        ));
    }
    for (i, (v, w)) in expected.iter().zip(actual).enumerate() {
        diff(&format!("{path}[{i}]"), key, v, w, out);
    }
}

/// `events` with each run of consecutive token chunks (a first choice still unfinished and no
/// `role`, which only the opening chat chunk carries) cut to its first chunk.
fn token_runs_collapsed(events: &[Value]) -> Vec<Value> {
    let is_token_chunk = |event: &Value| {
        event.pointer("/choices/0").is_some_and(|choice| {
            choice.get("finish_reason").is_some_and(Value::is_null)
                && choice.pointer("/delta/role").is_none()
        })
    };
    let mut out: Vec<Value> = Vec::with_capacity(events.len());
    for event in events {
        if is_token_chunk(event) && out.last().is_some_and(is_token_chunk) {
            continue;
        }
        out.push(event.clone());
    }
    out
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_differ_by_keys_types_and_protocol_values_only() {
        let vllm = json!({"id": "chatcmpl-1", "object": "chat.completion", "n": 3, "x": null});
        assert!(
            differences(
                &vllm,
                &json!({"id": "chatcmpl-2", "object": "chat.completion", "n": 9, "x": null})
            )
            .is_empty()
        );
        assert_eq!(
            differences(
                &vllm,
                &json!({"id": 1, "object": "text_completion", "n": 3, "y": 1})
            ),
            [
                ".id: a string in vLLM, a number in the mock",
                ".object: \"chat.completion\" in vLLM, \"text_completion\" in the mock",
                ".x: only in vLLM",
                ".y: only in the mock",
            ]
        );
    }

    #[test]
    fn streams_compare_by_their_runs_of_token_chunks_not_their_count() {
        let chunk = |delta: Value, finish: Value| {
            json!({"object": "chat.completion.chunk",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let opening = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        let token = |text: &str| chunk(json!({"content": text}), Value::Null);
        let last = chunk(json!({"content": ""}), json!("length"));
        let usage = json!({"object": "chat.completion.chunk", "choices": [], "usage": {}});
        let stream = |tokens: &[&str]| {
            let mut events = vec![opening.clone()];
            events.extend(tokens.iter().map(|t| token(t)));
            events.extend([last.clone(), usage.clone(), json!("[DONE]")]);
            json!({ "events": events })
        };
        assert!(differences(&stream(&["a", "b", "c"]), &stream(&["ab", "c"])).is_empty());
        // A stream without its opening chunk, or its usage, still differs.
        let mut headless = stream(&["a", "b"]);
        headless["events"].as_array_mut().unwrap().remove(0);
        assert!(!differences(&stream(&["a", "b"]), &headless).is_empty());
        let mut no_usage = stream(&["a"]);
        no_usage["events"].as_array_mut().unwrap().remove(3);
        assert_eq!(
            differences(&stream(&["a"]), &no_usage),
            [
                ".events: 5 elements in vLLM, 4 in the mock",
                ".events[3]: an object in vLLM, a string in the mock"
            ]
        );
    }
}

//! What a real vLLM answers, kept as fixtures (`tests/real-vllm/fixtures/`), and how an
//! answer is compared with them: the contract mock-engine must keep to stand in for vLLM.
//!
//! - [`exchanges`]: the requests, from chat and completions (streamed or not, a cached
//!   repeat) to errors, `/v1/models`, `/tokenize`, `/health` and `/version`;
//! - [`observe`]: one exchange's answer as a fixture holds it (status, content type, body
//!   as JSON, SSE events as JSON, or text);
//! - [`metric_shapes`]: the type and label names of the `vllm:*` families the gateway,
//!   loadgen and peer routers read, from a Prometheus exposition;
//! - [`differences`]: where two fixtures' shapes differ. Shape is what a client relies on:
//!   the same keys everywhere, values of the same JSON type, and the same value where the
//!   value is part of the protocol (`object`, `finish_reason`, an error's `type`, …). Text,
//!   ids, timestamps and token counts differ between any two engines and are compared by
//!   type only.
//!
//! The real-vLLM suite records the fixtures (`PREFIXGATE_RECORD_FIXTURES=1`) or checks vLLM
//! still answers as they say; `tests/tests/vllm_fidelity.rs` checks mock-engine against them,
//! with the differences docs/REAL_VLLM.md lists as not mattering.

use serde_json::{Map, Value, json};

use crate::Client;

mod shape;

pub use shape::differences;

/// One request of the contract.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub name: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub body: Option<Value>,
}

/// The prompt of the chat exchanges: long enough for a few full 32-token blocks, so the
/// cached repeat has cached tokens to report.
const CHAT_TEXT: &str = "The gateway routes each request to the replica that holds its prefix in cache, \
    weighing the blocks it would prefill there against the work already queued on it. \
    A family of prompts shares a long system text and differs in the last question.";

/// The exchanges, for a server serving `model`; `nonce` leads the prompts so that they
/// start cold on a replica that served them before.
pub fn exchanges(model: &str, nonce: &str) -> Vec<Exchange> {
    let text = format!("{nonce} {CHAT_TEXT}");
    // A stream's usage: the closing block, and with `counted` the running count in every
    // chunk (what the gateway asks of a resumable stream).
    let usage = |body: &mut Value, stream: bool, counted: bool| {
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if counted {
            body["stream_options"]["continuous_usage_stats"] = json!(true);
        }
    };
    let chat = |stream: bool, counted: bool| {
        let mut body = json!({
            "model": model,
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Why?"}],
            "max_tokens": 4, "ignore_eos": true, "temperature": 0, "stream": stream,
        });
        usage(&mut body, stream, counted);
        body
    };
    let completion = |stream: bool, counted: bool| {
        let mut body = json!({
            "model": model, "prompt": text, "max_tokens": 4, "ignore_eos": true,
            "temperature": 0, "stream": stream,
        });
        usage(&mut body, stream, counted);
        body
    };
    let post = |name, path, body| Exchange {
        name,
        method: "POST",
        path,
        body: Some(body),
    };
    let get = |name, path| Exchange {
        name,
        method: "GET",
        path,
        body: None,
    };
    vec![
        post("chat", "/v1/chat/completions", chat(false, false)),
        // The same prompt again: its blocks are cached now.
        post("chat_cached", "/v1/chat/completions", chat(false, false)),
        post("chat_stream", "/v1/chat/completions", chat(true, false)),
        post(
            "chat_stream_counted",
            "/v1/chat/completions",
            chat(true, true),
        ),
        post("completion", "/v1/completions", completion(false, false)),
        post(
            "completion_stream",
            "/v1/completions",
            completion(true, false),
        ),
        post(
            "completion_stream_counted",
            "/v1/completions",
            completion(true, true),
        ),
        post(
            "error_unknown_model",
            "/v1/chat/completions",
            json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        post(
            "error_max_tokens_over_context",
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1_000_000}),
        ),
        post(
            "error_messages_not_a_list",
            "/v1/chat/completions",
            json!({"model": model, "messages": "hi"}),
        ),
        post(
            "tokenize_chat",
            "/tokenize",
            json!({"model": model, "messages": [{"role": "user", "content": "Why?"}],
                "add_generation_prompt": true, "add_special_tokens": false}),
        ),
        post(
            "tokenize_completion",
            "/tokenize",
            json!({"model": model, "prompt": "Why?"}),
        ),
        get("models", "/v1/models"),
        get("version", "/version"),
        get("health", "/health"),
    ]
}

/// The malformed-JSON exchange's body (not JSON, so not an [`Exchange`] body).
pub const MALFORMED_JSON: &str = r#"{"model": "m", "messages": [{"role": "user""#;

/// One exchange's answer, as a fixture holds it.
pub async fn observe(client: &Client, base_url: &str, exchange: &Exchange) -> Value {
    let body = exchange
        .body
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_default();
    let headers: &[(&str, &str)] = if exchange.body.is_some() {
        &[("content-type", "application/json")]
    } else {
        &[]
    };
    let url = format!("{base_url}{}", exchange.path);
    let answer = client.call(exchange.method, &url, headers, body).await;
    fixture(exchange.name, &exchange.body, answer)
}

/// The malformed-JSON exchange's answer, as a fixture holds it.
pub async fn observe_malformed_json(client: &Client, base_url: &str) -> Value {
    let url = format!("{base_url}/v1/chat/completions");
    let answer = client
        .call(
            "POST",
            &url,
            &[("content-type", "application/json")],
            MALFORMED_JSON,
        )
        .await;
    fixture(
        "error_malformed_json",
        &Some(Value::String(MALFORMED_JSON.into())),
        answer,
    )
}

fn fixture(name: &str, request: &Option<Value>, answer: crate::Answer) -> Value {
    let content_type = answer
        .header("content-type")
        .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned());
    let text = answer.text();
    let body = match content_type.as_deref() {
        Some("text/event-stream") => json!({"events": sse_payloads(text)}),
        Some("application/json") => {
            json!({"json": serde_json::from_str::<Value>(text).unwrap_or(Value::Null)})
        }
        _ => json!({"text": text}),
    };
    json!({
        "exchange": name,
        "request": request,
        "status": answer.status.as_u16(),
        "content_type": content_type,
        "body": body,
    })
}

/// The `data:` payloads of an SSE body, JSON where they are JSON (`"[DONE]"` as a string).
fn sse_payloads(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_owned())))
        .collect()
}

/// Every fixture of the contract, by name, as the server at `base_url` answers (its KV
/// events read from `events`, a `tcp://HOST:PORT` PUB endpoint): the exchanges, the
/// malformed-JSON one, `metrics` ([`metric_shapes`] after them) and `kv_event` (the batch
/// that stored the first exchange's prompt).
pub async fn record_all(
    client: &Client,
    base_url: &str,
    model: &str,
    events: &str,
) -> std::collections::BTreeMap<String, Value> {
    use zeromq::{Socket, SocketRecv};
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut sub = zeromq::SubSocket::new();
    sub.connect(events)
        .await
        .expect("the KV-event endpoint takes a subscriber");
    sub.subscribe("").await.expect("subscribed");
    // A SUB misses what is published before its subscription reaches the publisher: warm
    // up (other prompts) until an event arrives.
    let mut heard = false;
    for attempt in 0..40 {
        let body = json!({"model": model, "prompt": format!("warm-up {nonce} {attempt} {CHAT_TEXT}"), "max_tokens": 1});
        let url = format!("{base_url}/v1/completions");
        client
            .call(
                "POST",
                &url,
                &[("content-type", "application/json")],
                body.to_string(),
            )
            .await;
        if tokio::time::timeout(std::time::Duration::from_millis(500), sub.recv())
            .await
            .is_ok()
        {
            heard = true;
            break;
        }
    }
    assert!(heard, "no KV event from {events} after 40 warm-up requests");
    // Whatever the warm-ups published since.
    while tokio::time::timeout(std::time::Duration::from_millis(300), sub.recv())
        .await
        .is_ok()
    {}

    let mut out = std::collections::BTreeMap::new();
    for exchange in exchanges(model, &nonce) {
        let observed = observe(client, base_url, &exchange).await;
        if exchange.name == "chat" {
            let message = tokio::time::timeout(std::time::Duration::from_secs(10), sub.recv())
                .await
                .expect("the chat prompt's blocks were published within 10 s")
                .expect("a message");
            let frames = message.into_vec();
            assert_eq!(frames.len(), 3, "[topic, seq, payload]");
            out.insert(
                "kv_event".to_owned(),
                json!({
                    "exchange": "kv_event",
                    "topic": String::from_utf8_lossy(&frames[0]),
                    "seq_bytes": frames[1].len(),
                    "payload": kv_payload_json(&frames[2]),
                }),
            );
        }
        out.insert(exchange.name.to_owned(), observed);
    }
    out.insert(
        "error_malformed_json".to_owned(),
        observe_malformed_json(client, base_url).await,
    );
    let exposition = client
        .call("GET", &format!("{base_url}/metrics"), &[], "")
        .await;
    out.insert(
        "metrics".to_owned(),
        json!({"exchange": "metrics", "families": metric_shapes(exposition.text())}),
    );
    out
}

/// The fixture files' directory.
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("real-vllm/fixtures")
}

/// The committed fixtures, by name.
pub fn load_fixtures() -> std::collections::BTreeMap<String, Value> {
    let dir = fixtures_dir();
    let mut out = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.insert(
                path.file_stem().unwrap().to_string_lossy().into_owned(),
                value,
            );
        }
    }
    out
}

/// Every difference between `actual` fixtures and the `expected` ones, as
/// `NAME PATH: what` (the request sent, which carries a nonce, aside).
pub fn all_differences(
    expected: &std::collections::BTreeMap<String, Value>,
    actual: &std::collections::BTreeMap<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, fixture) in expected {
        let Some(observed) = actual.get(name) else {
            out.push(format!("{name}: not observed"));
            continue;
        };
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Some(map) = v.as_object_mut() {
                map.remove("request");
            }
            v
        };
        out.extend(
            differences(&strip(fixture), &strip(observed))
                .into_iter()
                .map(|d| format!("{name} {d}")),
        );
    }
    out
}

/// A KV-event payload's shape: the msgpack batch as JSON (binary as `"<bytes>"`).
pub fn kv_payload_json(payload: &[u8]) -> Value {
    let value = rmpv::decode::read_value(&mut &payload[..]).expect("a msgpack payload");
    msgpack_json(&value)
}

fn msgpack_json(value: &rmpv::Value) -> Value {
    use rmpv::Value as M;
    match value {
        M::Nil => Value::Null,
        M::Boolean(b) => json!(b),
        M::Integer(i) => i
            .as_u64()
            .map(Value::from)
            .or_else(|| i.as_i64().map(Value::from))
            .unwrap_or(Value::Null),
        M::F32(f) => json!(f),
        M::F64(f) => json!(f),
        M::String(s) => json!(s.as_str().unwrap_or("<not utf-8>")),
        M::Binary(_) | M::Ext(..) => json!("<bytes>"),
        M::Array(items) => Value::Array(items.iter().map(msgpack_json).collect()),
        M::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                        msgpack_json(v),
                    )
                })
                .collect(),
        ),
    }
}

/// The metric families whose shape is part of the contract: what the gateway's engine
/// scrape, loadgen's measurement and the peer routers read.
pub const METRIC_FAMILIES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:cache_config_info",
];

/// For each of [`METRIC_FAMILIES`]: its `# TYPE` and the label names of its samples (and,
/// for `vllm:request_success`, the `finished_reason` values it pre-creates).
pub fn metric_shapes(exposition: &str) -> Value {
    let mut out = Map::new();
    for family in METRIC_FAMILIES {
        // prometheus_client names a counter's TYPE line after its `_total` sample.
        let kind = exposition
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("# TYPE {family} "))
                    .or_else(|| l.strip_prefix(&format!("# TYPE {family}_total ")))
            })
            .map(str::to_owned);
        let mut labels = std::collections::BTreeSet::new();
        let mut reasons = std::collections::BTreeSet::new();
        for line in exposition.lines().filter(|l| !l.starts_with('#')) {
            let Some(rest) = line.strip_prefix(family) else {
                continue;
            };
            // The family's own samples: `_total`, `_bucket`, `_sum`, `_count` or none.
            let rest = ["_total", "_bucket", "_sum", "_count", ""]
                .iter()
                .find_map(|suffix| {
                    rest.strip_prefix(suffix)
                        .filter(|r| r.starts_with(['{', ' ']))
                });
            let Some(rest) = rest else { continue };
            let Some(inner) = rest
                .strip_prefix('{')
                .and_then(|r| r.split_once('}'))
                .map(|(i, _)| i)
            else {
                continue;
            };
            for pair in split_labels(inner) {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                if name != "le" {
                    labels.insert(name.to_owned());
                }
                if name == "finished_reason" {
                    reasons.insert(value.trim_matches('"').to_owned());
                }
            }
        }
        let mut shape = json!({"type": kind, "labels": labels});
        if !reasons.is_empty() {
            shape["finished_reasons"] = json!(reasons);
        }
        out.insert((*family).to_owned(), shape);
    }
    Value::Object(out)
}

/// `a="x",b="y,z"` into its pairs (commas inside quoted values kept).
fn split_labels(inner: &str) -> Vec<&str> {
    let (mut pairs, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                pairs.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        pairs.push(&inner[start..]);
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_shapes_read_types_and_label_names() {
        let text = "# TYPE vllm:request_success_total counter\n\
            vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"m\"} 0.0\n\
            vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"m\"} 1.0\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m,x\"} 0.0\n\
            vllm:num_requests_running_other{z=\"1\"} 2\n";
        let shapes = metric_shapes(text);
        assert_eq!(
            shapes["vllm:request_success"]["labels"],
            json!(["engine", "finished_reason", "model_name"])
        );
        assert_eq!(
            shapes["vllm:request_success"]["finished_reasons"],
            json!(["length", "stop"])
        );
        assert_eq!(
            shapes["vllm:num_requests_running"],
            json!({"type": "gauge", "labels": ["engine", "model_name"]})
        );
        assert_eq!(
            shapes["vllm:kv_cache_usage_perc"],
            json!({"type": null, "labels": []})
        );
    }
}

//! Tests of `text.rs`: the one parse of a request body into its routing fields.

use super::*;

fn chat(body: &str) -> Result<RoutingFields, BodyError> {
    routing_fields(Endpoint::ChatCompletions, body.as_bytes())
}

fn completion(body: &str) -> Result<RoutingFields, BodyError> {
    routing_fields(Endpoint::Completions, body.as_bytes())
}

#[test]
fn chat_contents_are_joined_with_one_space() {
    let fields = chat(
        r#"{"model":"m","stream":true,"messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"hello\nworld \"q\" \u00e9"}]}"#,
    )
    .unwrap();
    assert_eq!(fields.model, "m");
    assert!(fields.stream);
    assert_eq!(fields.text, "be brief hello\nworld \"q\" é");
}

#[test]
fn non_string_content_is_kept_as_raw_json_bytes() {
    let fields = chat(
        r#"{"model":"m","messages":[{"role":"user","content":[ {"type":"text", "text":"a\u0041"} ]},{"role":"assistant","content":null},{"role":"user","content":{"k":1}}]}"#,
    )
    .unwrap();
    assert_eq!(
        fields.text,
        r#"[ {"type":"text", "text":"a\u0041"} ] null {"k":1}"#
    );
    assert!(!fields.stream);
}

#[test]
fn message_without_content_contributes_an_empty_string() {
    let fields = chat(r#"{"model":"m","messages":[{"role":"user"},{"content":"x"}]}"#).unwrap();
    assert_eq!(fields.text, " x");
}

#[test]
fn missing_null_or_empty_messages_are_no_messages() {
    for body in [
        r#"{"model":"m"}"#,
        r#"{"model":"m","messages":null}"#,
        r#"{"model":"m","messages":[]}"#,
        r#"{"model":"m","messages": [ ] }"#,
    ] {
        assert_eq!(chat(body).unwrap_err(), BodyError::NoMessages, "{body}");
    }
    assert_eq!(
        BodyError::NoMessages.to_string(),
        "no messages in the request body"
    );
    // The model is read first: a body with neither names the model.
    assert_eq!(
        chat(r#"{"messages":[]}"#).unwrap_err(),
        BodyError::MissingModel
    );
}

#[test]
fn completion_prompts_take_every_form_openai_and_vllm_accept() {
    let fields = completion(r#"{"model":"m","prompt":"tab\there","stream":false}"#).unwrap();
    assert_eq!((fields.text.as_str(), fields.tokens), ("tab\there", None));
    // A batch is routed by its first prompt.
    let fields = completion(r#"{"model":"m","prompt":["a b","c"]}"#).unwrap();
    assert_eq!((fields.text.as_str(), fields.tokens), ("a b", None));
    // Token ids by their values, as KV-event sync hashes an engine's tokens.
    let fields = completion(r#"{"model":"m","prompt":[1,2,70000]}"#).unwrap();
    assert_eq!(fields.text, "");
    assert_eq!(
        fields.tokens,
        Some(crate::kv_sync::token_bytes(&[1, 2, 70000]))
    );
    let fields = completion(r#"{"model":"m","prompt":[[5,6],[7]]}"#).unwrap();
    assert_eq!(fields.tokens, Some(crate::kv_sync::token_bytes(&[5, 6])));
    let refused = [
        (r#"{"model":"m","prompt":7}"#, "must be a string"),
        (r#"{"model":"m","prompt":[]}"#, "empty array"),
        (r#"{"model":"m","prompt":["a",1]}"#, "non-string"),
        (r#"{"model":"m","prompt":[1,-2]}"#, "token ids"),
        (r#"{"model":"m","prompt":[1,"a"]}"#, "token ids"),
        (r#"{"model":"m","prompt":[1.5]}"#, "token ids"),
        (r#"{"model":"m","prompt":[4294967296]}"#, "token ids"),
        (
            r#"{"model":"m","prompt":[[1],[]]}"#,
            "token-id array is empty",
        ),
        (r#"{"model":"m","prompt":[{"a":1}]}"#, "must be a string"),
        (r#"{"model":"m"}"#, "is required"),
    ];
    for (body, words) in refused {
        let err = completion(body).unwrap_err();
        assert!(
            matches!(err, BodyError::InvalidField { field: "prompt", ref reason } if reason.contains(words)),
            "{body}: {err:?}"
        );
    }
}

#[test]
fn embeddings_have_no_text() {
    let fields =
        routing_fields(Endpoint::Embeddings, br#"{"model":"e","input":["a","b"]}"#).unwrap();
    assert_eq!(fields.text, "");
    assert_eq!(fields.model, "e");
}

#[test]
fn model_must_be_a_non_empty_string() {
    assert_eq!(
        chat(r#"{"messages":[]}"#).unwrap_err(),
        BodyError::MissingModel
    );
    for body in [
        r#"{"model":"","messages":[]}"#,
        r#"{"model":3,"messages":[]}"#,
        r#"{"model":null,"messages":[]}"#,
    ] {
        let err = chat(body).unwrap_err();
        assert!(
            matches!(err, BodyError::InvalidField { field: "model", .. }),
            "{body}: {err:?}"
        );
    }
}

#[test]
fn messages_must_be_an_array_of_objects() {
    for body in [
        r#"{"model":"m","messages":"hi"}"#,
        r#"{"model":"m","messages":{}}"#,
        r#"{"model":"m","messages":["hi"]}"#,
        r#"{"model":"m","messages":[{"content":"x"},7]}"#,
    ] {
        let err = chat(body).unwrap_err();
        assert!(
            matches!(
                err,
                BodyError::InvalidField {
                    field: "messages",
                    ..
                }
            ),
            "{body}: {err:?}"
        );
    }
}

#[test]
fn stream_must_be_a_boolean_or_null() {
    assert!(
        !completion(r#"{"model":"m","prompt":"p","stream":null}"#)
            .unwrap()
            .stream
    );
    let err = completion(r#"{"model":"m","prompt":"p","stream":"yes"}"#).unwrap_err();
    assert!(matches!(
        err,
        BodyError::InvalidField {
            field: "stream",
            ..
        }
    ));
}

#[test]
fn malformed_bodies_are_invalid_json() {
    for body in ["", "{", "[1,2]", "\"model\"", "{\"model\":\"m\"} trailing"] {
        assert!(
            matches!(chat(body), Err(BodyError::InvalidJson(_))),
            "{body:?}"
        );
    }
    let invalid_utf8 = routing_fields(
        Endpoint::Completions,
        b"{\"model\":\"\xff\",\"prompt\":\"p\"}",
    );
    assert!(matches!(invalid_utf8, Err(BodyError::InvalidJson(_))));
}

#[test]
fn strings_without_escapes_are_borrowed() {
    assert!(matches!(
        json_string(r#""plain""#),
        Some(Cow::Borrowed("plain"))
    ));
    assert_eq!(json_string(r#""a\nb""#).as_deref(), Some("a\nb"));
    assert_eq!(json_string("12"), None);
}

/// The messages are walked over the validated bytes, not parsed again: the walk must read
/// them as serde did (escaped keys, nested values holding brackets and quotes in strings,
/// whitespace anywhere, a second `content` refused).
#[test]
fn the_messages_walk_reads_what_serde_reads() {
    let text = |body: &str| chat(body).map(|fields| fields.text);
    assert_eq!(
        text(
            r#"{"model":"m","messages":[ {"con\u0074ent" : "a" , "role":"user"} ,
            {"tool_calls":[{"f":"}]\"{["}],"content":{"k":[1,"]}"]}},
            {"name":"x\\","content":"b\"c"},{},{"content":null},{"content":-1.5e3}]}"#
        ),
        Ok(r#"a {"k":[1,"]}"]} b"c  null -1.5e3"#.to_owned())
    );
    for body in [
        r#"{"model":"m","messages":[{"content":"a","content":"b"}]}"#,
        r#"{"model":"m","messages":[{"content":"a","con\u0074ent":"b"}]}"#,
        r#"{"model":"m","messages":[{"content":"a"},[]]}"#,
        r#"{"model":"m","messages":[null]}"#,
    ] {
        assert!(
            matches!(
                chat(body),
                Err(BodyError::InvalidField {
                    field: "messages",
                    ..
                })
            ),
            "{body}"
        );
    }
}

#[test]
fn the_completion_bound_is_read_in_the_same_parse() {
    let bound = |body: &str| completion(body).unwrap().max_tokens;
    assert_eq!(bound(r#"{"model":"m","prompt":"p"}"#), Ok(None));
    assert_eq!(
        bound(r#"{"model":"m","prompt":"p","max_tokens":5}"#),
        Ok(Some(5))
    );
    assert_eq!(
        bound(r#"{"model":"m","prompt":"p","max_tokens":5,"max_completion_tokens":9}"#),
        Ok(Some(9))
    );
    assert_eq!(
        bound(r#"{"model":"m","prompt":"p","max_tokens":7,"max_completion_tokens":null}"#),
        Ok(Some(7))
    );
    // A bad bound is kept as an error naming its field; the body still routes.
    let fields = completion(r#"{"model":"m","prompt":"p","max_tokens":"9"}"#).unwrap();
    assert!(matches!(
        fields.max_tokens,
        Err(BodyError::InvalidField {
            field: "max_tokens",
            ..
        })
    ));
}

#[test]
fn a_parse_without_text_measures_it_and_validates_the_same() {
    let body = r#"{"model":"m","messages":[{"content":"a\u0041"},{"content":[1]}]}"#;
    let built =
        routing_fields_with(Endpoint::ChatCompletions, body.as_bytes(), Text::Build).unwrap();
    let measured =
        routing_fields_with(Endpoint::ChatCompletions, body.as_bytes(), Text::LengthOnly).unwrap();
    assert_eq!(built.text, "aA [1]");
    assert_eq!((built.text_len, measured.text_len), (6, 6));
    assert_eq!(measured.text, "");
    assert_eq!(
        RoutingFields {
            text: built.text.clone(),
            ..measured
        },
        built
    );
    let bad = r#"{"model":"m","messages":[{"content":"x"},7]}"#;
    assert_eq!(
        routing_fields_with(Endpoint::ChatCompletions, bad.as_bytes(), Text::LengthOnly),
        chat(bad)
    );
}

#[test]
fn the_prompt_span_is_the_raw_messages_or_prompt_as_sent() {
    let span = |endpoint, body: &'static str| {
        let fields = routing_fields(endpoint, body.as_bytes()).unwrap();
        fields.prompt_span.map(|span| &body[span])
    };
    let chat =
        r#"{"model":"m", "messages" : [ {"role":"user","content":"a\u0041"} ] ,"stream":true}"#;
    assert_eq!(
        span(Endpoint::ChatCompletions, chat),
        Some(r#"[ {"role":"user","content":"a\u0041"} ]"#)
    );
    let batch = r#"{"prompt":["x", "y"],"model":"m"}"#;
    assert_eq!(span(Endpoint::Completions, batch), Some(r#"["x", "y"]"#));
    let ids = r#"{"model":"m","prompt":[1,2]}"#;
    assert_eq!(span(Endpoint::Completions, ids), Some("[1,2]"));
    let embedding = r#"{"model":"m","input":"x","prompt":"p"}"#;
    assert_eq!(span(Endpoint::Embeddings, embedding), None);
}

#[test]
fn unknown_fields_are_ignored() {
    let fields =
        completion(r#"{"model":"m","prompt":"p","max_tokens":5,"extra":{"deep":[1,{"x":null}]}}"#)
            .unwrap();
    assert_eq!(fields.text, "p");
}

/// Strings drawn from the bytes the walk treats specially (quotes, backslashes, brackets,
/// commas, colons, whitespace) and non-ASCII.
fn json_text() -> proptest::strategy::BoxedStrategy<String> {
    use proptest::strategy::Strategy;
    proptest::string::string_regex(r#"[a-c"\\\[\]{},: \n\té]{0,6}"#)
        .unwrap_or_else(|e| panic!("{e}"))
        .boxed()
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i32>().prop_map(serde_json::Value::from),
        (-1e6f64..1e6).prop_map(serde_json::Value::from),
        json_text().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(json_text(), inner, 0..4)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The walk over the validated bytes joins exactly what serde_json reads in the same
    /// messages: each `content` unescaped when a string, else its JSON as written.
    #[test]
    fn the_messages_walk_joins_what_serde_json_reads(
        messages in proptest::collection::vec(
            proptest::collection::btree_map(
                proptest::sample::select(vec!["content", "role", "name", "tool_calls"]),
                json_value(),
                0..4,
            ),
            1..4,
        ),
    ) {
        let messages: Vec<serde_json::Value> = messages
            .into_iter()
            .map(|m| serde_json::Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
            .collect();
        let expected: Vec<String> = messages
            .iter()
            .map(|m| match m.get("content") {
                None => String::new(),
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            })
            .collect();
        let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
        let fields = chat(&body).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}")))?;
        proptest::prop_assert_eq!(fields.text, expected.join(" "));
    }
}

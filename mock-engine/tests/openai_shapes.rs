//! vLLM 0.32 response shapes over real sockets: streamed and whole chat and completions,
//! usage with cached tokens, errors, and the small endpoints.

mod support;

use http::{Method, StatusCode};
use serde_json::Value;
use support::*;

#[tokio::test]
async fn streamed_chat_sends_role_tokens_finish_usage_done_in_order() {
    bounded(async {
        let replica = start(fast()).await;
        let answer = send(
            &replica,
            Method::POST,
            "/v1/chat/completions",
            &[("x-request-id", "req-42")],
            &chat_body("hello there", 4, true, true),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(
            answer.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let events = sse_events(&answer.body);
        // role, 4 tokens, usage, [DONE]
        assert_eq!(events.len(), 7, "{events:?}");
        assert_eq!(events.last().unwrap(), "[DONE]");
        let chunks: Vec<Value> = events[..6]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        for chunk in &chunks {
            assert_eq!(chunk["id"], "chatcmpl-req-42");
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["model"], MODEL);
            assert!(chunk["created"].as_u64().unwrap() > 0);
        }
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            serde_json::json!({"role":"assistant","content":""})
        );
        let mut text = String::new();
        for (i, chunk) in chunks[1..5].iter().enumerate() {
            let choice = &chunk["choices"][0];
            assert!(choice["delta"].get("role").is_none());
            let content = choice["delta"]["content"].as_str().unwrap();
            assert!(content.starts_with(' ') && content.len() > 1, "{content:?}");
            text.push_str(content);
            if i < 3 {
                assert_eq!(choice["finish_reason"], Value::Null);
                assert!(choice.get("stop_reason").is_none());
            } else {
                assert_eq!(choice["finish_reason"], "length");
                assert_eq!(choice["stop_reason"], Value::Null);
            }
        }
        assert_eq!(mock_engine::tokenizer::encode(&text).len(), 4);
        let usage_chunk = &chunks[5];
        assert_eq!(usage_chunk["choices"], serde_json::json!([]));
        let prompt_tokens = usage_chunk["usage"]["prompt_tokens"].as_u64().unwrap();
        // "hello there" plus the chat template's role markers.
        assert!(prompt_tokens > 2, "{prompt_tokens}");
        assert_eq!(usage_chunk["usage"]["completion_tokens"], 4);
        assert_eq!(usage_chunk["usage"]["total_tokens"], prompt_tokens + 4);
        // The raw usage keeps vLLM's field order.
        assert!(events[5].contains(r#""usage":{"prompt_tokens":"#));
        assert!(events[5].contains(r#","total_tokens":"#));
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn streamed_completion_has_no_role_chunk_and_no_usage_per_chunk() {
    bounded(async {
        let replica = start(fast()).await;
        let with_usage = post_completion(&replica, &completion_body("a b c", 3, true, true)).await;
        let events = sse_events(&with_usage.body);
        assert_eq!(events.len(), 5, "{events:?}"); // 3 tokens, usage, [DONE]
        for (i, event) in events[..3].iter().enumerate() {
            let chunk: Value = serde_json::from_str(event).unwrap();
            assert!(chunk["id"].as_str().unwrap().starts_with("cmpl-"));
            assert_eq!(chunk["object"], "text_completion");
            // vLLM 0.32 writes no `usage` on token chunks (0.11 wrote null).
            assert!(chunk.get("usage").is_none(), "{event}");
            let choice = &chunk["choices"][0];
            assert!(choice["text"].as_str().unwrap().starts_with(' '));
            assert_eq!(choice["stop_reason"], Value::Null);
            let expected = if i == 2 {
                Value::from("length")
            } else {
                Value::Null
            };
            assert_eq!(choice["finish_reason"], expected);
        }
        let usage: Value = serde_json::from_str(&events[3]).unwrap();
        assert_eq!(usage["usage"]["prompt_tokens"], 3);
        assert_eq!(usage["usage"]["completion_tokens"], 3);
        // Completions report no created_cache_tokens; cached_tokens is there even at 0.
        assert_eq!(
            usage["usage"]["prompt_tokens_details"],
            serde_json::json!({"cached_tokens": 0})
        );
        assert!(usage["system_fingerprint"].is_string());
        assert_eq!(events[4], "[DONE]");

        let without = post_completion(&replica, &completion_body("a b c", 2, true, false)).await;
        let events = sse_events(&without.body);
        assert_eq!(
            events.len(),
            3,
            "no usage chunk without include_usage: {events:?}"
        );
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn whole_bodies_are_full_dumps() {
    bounded(async {
        let replica = start(fast()).await;
        let chat = post_chat(&replica, &chat_body("hi", 5, false, false)).await;
        assert_eq!(chat.status, StatusCode::OK);
        let body = chat.json();
        let id = body["id"].as_str().unwrap();
        let hex = id.strip_prefix("chatcmpl-").unwrap();
        assert_eq!(hex.len(), 16);
        assert_eq!(body["object"], "chat.completion");
        let message = &body["choices"][0]["message"];
        assert_eq!(message["role"], "assistant");
        assert_eq!(
            mock_engine::tokenizer::encode(message["content"].as_str().unwrap()).len(),
            5
        );
        assert!(message.get("tool_calls").is_none(), "vLLM 0.32 leaves tool_calls out");
        for null in ["refusal", "annotations", "audio", "function_call", "reasoning"] {
            assert_eq!(message[null], Value::Null, "{null}");
            assert!(message.get(null).is_some(), "{null} present");
        }
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        for null in [
            "service_tier",
            "prompt_logprobs",
            "prompt_token_ids",
            "prompt_text",
            "kv_transfer_params",
            "ec_transfer_params",
            "metrics",
        ] {
            assert!(body.get(null).is_some_and(Value::is_null), "{null}");
        }
        assert!(body["system_fingerprint"].as_str().unwrap().starts_with("vllm-0.32.0-"));
        assert_eq!(body["usage"]["completion_tokens"], 5);
        // Chat counts what it cached: the prompt's full 16-token blocks, none found cached.
        let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            body["usage"]["prompt_tokens_details"],
            serde_json::json!({"cached_tokens": 0, "created_cache_tokens": prompt / 16 * 16, "multimodal_tokens": null})
        );

        let completion = post_completion(&replica, &completion_body("x y", 2, false, false)).await;
        let body = completion.json();
        assert_eq!(body["object"], "text_completion");
        assert!(body["choices"][0].get("prompt_logprobs").is_some());
        assert_eq!(body["usage"]["total_tokens"], 4);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    bounded(async {
        let replica = start(fast()).await;
        let prompt = prompt_of(100, "w");
        let first = post_completion(&replica, &completion_body(&prompt, 2, false, false)).await;
        assert_eq!(
            first.json()["usage"]["prompt_tokens_details"],
            serde_json::json!({"cached_tokens": 0, "created_cache_tokens": null, "multimodal_tokens": null})
        );
        let second = post_completion(&replica, &completion_body(&prompt, 2, true, true)).await;
        let events = sse_events(&second.body);
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        // 100 tokens with 16-token blocks: 96 cached (block-aligned, ≤ prompt − 1).
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 96);
        let third = post_completion(&replica, &completion_body(&prompt, 2, false, false)).await;
        assert_eq!(
            third.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
            96
        );
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn errors_use_vllm_status_and_shape() {
    bounded(async {
        let replica = start(fast()).await;
        let unknown = post_chat(&replica, &chat_body("x", 1, false, false).replace(MODEL, "other"))
        .await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
        assert_eq!(
            unknown.json(),
            serde_json::json!({"error":{"message":format!("The model `other` does not exist. Valid aliases: {MODEL}."),"type":"NotFoundError","param":"model","code":404}})
        );

        let max_model_len = fast().max_model_len;
        let too_long = prompt_of(max_model_len + 10, "p");
        let context = post_completion(&replica, &completion_body(&too_long, 1, false, false)).await;
        assert_eq!(context.status, StatusCode::BAD_REQUEST);
        let message = context.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.starts_with(&format!("This model's maximum context length is {max_model_len} tokens.")), "{message}");
        assert_eq!(context.json()["error"]["type"], "BadRequestError");
        assert_eq!(context.json()["error"]["param"], "input_tokens");
        assert_eq!(context.json()["error"]["code"], 400);

        let over = u32::try_from(max_model_len + 1).unwrap();
        let max_tokens = post_completion(&replica, &completion_body("a b", over, false, false)).await;
        assert_eq!(max_tokens.status, StatusCode::BAD_REQUEST);
        assert!(max_tokens.body.contains("cannot be greater than max_model_len"), "{}", max_tokens.body);
        assert_eq!(max_tokens.json()["error"]["param"], "max_tokens");

        for (path, body, needle) in [
            ("/v1/chat/completions", "{not json", "JSON decode error"),
            ("/v1/chat/completions", r#"{"model":"test-model"}"#, "'loc': 'body.messages', 'msg': 'Field required'"),
            ("/v1/completions", r#"{"model":"test-model","prompt":"a","stream":1}"#, "valid boolean"),
            ("/v1/completions", r#"{"model":"test-model","prompt":""}"#, "non-empty"),
        ] {
            let answer = post(&replica, path, body).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
            let message = answer.json()["error"]["message"].as_str().unwrap().to_owned();
            assert!(message.contains(needle), "{body}: {message}");
        }
        let missing = get(&replica, "/v2/nothing").await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert_eq!(missing.json()["detail"], "Not Found");
        let wrong_method = get(&replica, "/v1/completions").await;
        assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(wrong_method.json()["detail"], "Method Not Allowed");
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn small_endpoints_answer_like_vllm() {
    bounded(async {
        let replica = start(fast()).await;
        let health = get(&replica, "/health").await;
        assert_eq!((health.status, health.body.as_str()), (StatusCode::OK, ""));
        assert_eq!(get(&replica, "/ping").await.status, StatusCode::OK);
        assert_eq!(post(&replica, "/ping", "").await.status, StatusCode::OK);
        assert_eq!(
            get(&replica, "/version").await.json(),
            serde_json::json!({"version":"0.32.0"})
        );

        let models = get(&replica, "/v1/models").await.json();
        assert_eq!(models["object"], "list");
        let card = &models["data"][0];
        assert_eq!(card["id"], MODEL);
        assert_eq!(card["owned_by"], "vllm");
        assert_eq!(card["max_model_len"], fast().max_model_len);
        assert_eq!(card["permission"][0]["object"], "model_permission");

        let tokenized = post(&replica, "/tokenize", r#"{"prompt":"one two three"}"#)
            .await
            .json();
        assert_eq!(tokenized["count"], 3);
        assert_eq!(tokenized["tokens"].as_array().unwrap().len(), 3);
        assert_eq!(tokenized["max_model_len"], fast().max_model_len);
        let chat = post(
            &replica,
            "/tokenize",
            r#"{"model":"test-model","messages":[{"role":"user","content":"one two three"}]}"#,
        )
        .await
        .json();
        assert!(
            chat["count"].as_u64().unwrap() > 3,
            "the chat template adds tokens"
        );
        let wrong = post(&replica, "/tokenize", r#"{"model":"nope","prompt":"x"}"#).await;
        assert_eq!(wrong.status, StatusCode::NOT_FOUND);
        let bad = post(&replica, "/tokenize", r#"{"prompt":5}"#).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        // vLLM's flags: without the generation prompt the assistant marker is left out.
        let bare = post(
            &replica,
            "/tokenize",
            r#"{"messages":[{"role":"user","content":"one two three"}],"add_generation_prompt":false,"add_special_tokens":true}"#,
        )
        .await
        .json();
        assert_eq!(bare["count"].as_u64(), chat["count"].as_u64().map(|n| n - 1));
        let (bare_ids, chat_ids) = (
            bare["tokens"].as_array().unwrap(),
            chat["tokens"].as_array().unwrap(),
        );
        assert_eq!(bare_ids[..], chat_ids[..bare_ids.len()]);
        let flag = post(&replica, "/tokenize", r#"{"prompt":"x","add_special_tokens":"yes"}"#).await;
        assert_eq!(flag.status, StatusCode::BAD_REQUEST);
        assert!(flag.json()["error"]["message"].as_str().unwrap().contains("add_special_tokens"));
        replica.shutdown().await;
    })
    .await;
}

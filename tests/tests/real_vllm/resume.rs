//! Resume on real vLLM: a replica killed with SIGKILL mid-stream, and the client's stream
//! carried on on the other replica (a chat continuation with `continue_final_message`) to
//! every one of its `max_tokens` (`ignore_eos`), with one id, one usage block counting the
//! whole answer and one `[DONE]`. The client asks for vLLM's `return_token_ids`, so the
//! tokens it was sent can be counted apart from the gateway's count: exactly `max_tokens`.

use super::drain_and_kill::Leaving;
use super::fleet::Fleet;
use super::prompts;
use super::stream::{payloads, stream_usage};

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_replica_killed_mid_stream_is_resumed_on_the_other_to_the_last_token() {
    let fleet = Fleet::from_env();
    let Leaving {
        replica,
        gateway,
        client,
        stream,
    } = Leaving::start_with(
        &fleet,
        "resume",
        "[resume]\nenabled = true\n",
        &with_token_ids(&Leaving::long_chat("resume")),
    )
    .await;
    replica.kill();

    let text = stream.finish().await;
    let events = payloads(&text);
    let tail: Vec<_> = events.iter().rev().take(3).collect();
    assert!(text.ends_with("data: [DONE]\n\n"), "{tail:?}");
    assert_eq!(text.matches("data: [DONE]").count(), 1, "one [DONE]");
    assert!(
        events.iter().all(|e| e["error"].is_null()),
        "no error event: {tail:?}"
    );
    let ids: std::collections::BTreeSet<String> =
        events.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one id: {ids:?}");
    let roles = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"].is_string())
        .count();
    assert_eq!(roles, 1, "one role chunk");
    // Content chunks are not tokens on vLLM 0.32 (it holds a token that ends inside a UTF-8
    // character back, and puts several tokens in one chunk when its output loop runs
    // behind), so the tokens are counted by their ids: the continuation was given exactly
    // the `max_tokens` left, whatever the chunks before the break held.
    let contents: Vec<_> = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"].is_null())
        .filter(|e| e["choices"][0]["delta"]["content"].is_string())
        .collect();
    let tokens: usize = contents
        .iter()
        .map(|e| {
            e["choices"][0]["token_ids"]
                .as_array()
                .unwrap_or_else(|| panic!("token_ids in every content chunk: {e}"))
                .len()
        })
        .sum();
    assert_eq!(
        tokens,
        prompts::LONG as usize,
        "{} chunks: {tail:?}",
        contents.len()
    );
    let usages = events.iter().filter(|e| e["usage"].is_object()).count();
    assert_eq!(usages, 1, "one usage block");
    let usage = stream_usage(&text).expect("the usage block");
    assert_eq!(usage["completion_tokens"], prompts::LONG, "{usage}");
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 0, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(prompt + u64::from(prompts::LONG)),
        "{usage}"
    );
    gateway.wait_outstanding_zero(&client).await;
}

/// `body` asking vLLM for each chunk's token ids.
fn with_token_ids(body: &str) -> String {
    let mut body: serde_json::Value = serde_json::from_str(body).expect("a JSON request");
    body["return_token_ids"] = serde_json::Value::Bool(true);
    body.to_string()
}

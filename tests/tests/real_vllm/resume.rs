//! Resume on real vLLM: a replica killed with SIGKILL mid-stream, and the client's stream
//! carried on on the other replica (a chat continuation with `continue_final_message`) to
//! every one of its `max_tokens` (`ignore_eos`), with one id, one usage block counting the
//! whole answer and one `[DONE]`.

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
    } = Leaving::start(&fleet, "resume", "[resume]\nenabled = true\n").await;
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
    // Content chunks are not tokens on vLLM 0.32: it holds a token that ends inside a UTF-8
    // character back and may put several tokens in one chunk (the first run of this test:
    // 1067 chunks for the 1500 tokens its usage counted), so the chunks are at most the
    // tokens. The gateway counts chunks to size the continuation, so the answer may run
    // longer than `max_tokens` by what vLLM merged before the break (docs/GATEWAY.md,
    // "Resume").
    let chunks = events
        .iter()
        .filter(|e| {
            let delta = &e["choices"][0]["delta"];
            delta["content"].is_string() && delta["role"].is_null()
        })
        .count();
    assert!(
        chunks > 0 && chunks <= prompts::LONG as usize,
        "{chunks} chunks: {tail:?}"
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

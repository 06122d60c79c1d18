//! End to end: the engines' `usage.prompt_tokens_details.cached_tokens` teach the gateway how
//! far its prefix index's view of each replica holds (docs/ROUTING.md, "Learning from
//! responses"), from plain bodies and from a stream's usage chunk, without changing what the
//! client receives.

use prefixgate_tests::{
    Client, MOCK_MODEL, assert_ends_with_done, chat_body_for, mock_gateway_config, sample_value,
    shutdown_once_released, wait_outstanding_zero,
};

#[tokio::test]
async fn a_replica_that_lost_its_cache_is_trusted_less() {
    let gateway = gateway::start(mock_gateway_config(2)).await.unwrap();
    let client = Client::new();
    let family = "the quick brown fox jumps over the lazy dog ".repeat(40);
    let route = [("routing-strategy", "prefix-load")];
    let first = client
        .chat(&gateway, &route, chat_body_for(MOCK_MODEL, &family, false))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let owner = first.header("target-pod").unwrap().to_owned();
    // The same prompt again: the index says the owner holds it, and its engine agrees.
    let second = client
        .chat(&gateway, &route, chat_body_for(MOCK_MODEL, &family, false))
        .await;
    assert_eq!(second.header("target-pod"), Some(owner.as_str()));
    let cached = &second.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64().unwrap() > 0, "{}", second.text());
    wait_outstanding_zero(&gateway).await;
    let metrics = client.metrics(&gateway).await;
    let count = |text: &str, verdict: &str| {
        sample_value(
            text,
            &format!(r#"prefixgate_cache_reports_total{{pod="{owner}",verdict="{verdict}"}}"#),
        )
    };
    // vLLM 0.32 (and the mock after it) reports `cached_tokens: 0` for the first response
    // (0.11 left it null, which taught nothing): the index believed nothing there, the
    // engine held nothing, so both responses confirm the index.
    assert_eq!(count(&metrics, "unreported"), 0.0, "{metrics}");
    assert_eq!(count(&metrics, "confirmed"), 2.0, "{metrics}");
    let trust = |text: &str| {
        sample_value(
            text,
            &format!(r#"prefixgate_cache_trust{{pod="{owner}",share="held"}}"#),
        )
    };
    assert_eq!(trust(&metrics), 1.0, "{metrics}");

    // The owner's engine drops its whole prefix cache (a restart would too).
    let (_, authority, _) = gateway
        .replicas()
        .into_iter()
        .find(|(name, _, _)| *name == owner)
        .unwrap();
    let reset = client
        .call(
            "POST",
            &format!("http://{authority}/reset_prefix_cache"),
            &[],
            "",
        )
        .await;
    assert_eq!(reset.status, 200, "{}", reset.text());

    // A stream that asks for its usage: the index still sends it to the owner, whose usage
    // chunk now reports no cached token.
    let body = serde_json::json!({
        "model": MOCK_MODEL,
        "messages": [{"role": "user", "content": family}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": 4,
    })
    .to_string();
    let third = client.chat(&gateway, &route, body).await;
    assert_eq!(third.status, 200, "{}", third.text());
    assert_eq!(third.header("target-pod"), Some(owner.as_str()));
    assert_ends_with_done(&third);
    assert!(
        third.text().contains(r#""usage":{"prompt_tokens""#),
        "{}",
        third.text()
    );
    assert!(
        third
            .text()
            .contains(r#""prompt_tokens_details":{"cached_tokens":0"#),
        "{}",
        third.text()
    );
    wait_outstanding_zero(&gateway).await;
    let metrics = client.metrics(&gateway).await;
    assert_eq!(count(&metrics, "missed"), 1.0, "{metrics}");
    let held = trust(&metrics);
    assert!(
        held < 0.6,
        "half the believed blocks were lost: {held}\n{metrics}"
    );
    // The index itself is not edited: the owner has just prefilled the prompt again.
    shutdown_once_released(gateway).await;
}

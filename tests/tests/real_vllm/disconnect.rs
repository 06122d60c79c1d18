//! A client that leaves mid-stream: the gateway closes the upstream request, and vLLM
//! aborts it (its running count returns to 0, its abort counter moves).

use std::time::Duration;

use prefixgate_tests::Client;

use super::fleet::{Fleet, engine_gauge};
use super::gateway::Gateway;
use super::prompts;
use super::stream::Stream;

/// Requests vLLM ran to `max_tokens`; an aborted one is not among them.
const RAN_TO_LENGTH: &str =
    "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"tiny\"}";
const GENERATED: &str = "vllm:generation_tokens_total";

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_client_that_leaves_mid_stream_makes_vllm_abort_the_request() {
    let fleet = Fleet::from_env();
    let replica = fleet.a();
    let gateway = Gateway::start(&fleet, "disconnect", &[replica], "").await;
    let client = Client::new();
    // vLLM updates its counters a moment after a response ends: start from settled ones, so
    // an earlier test's last request is not counted as this one's.
    let (finished_before, generated_before) = settled(&client, &replica.url).await;
    let body = prompts::chat(&prompts::family("leaver"), "Go on.", prompts::LONG, true);
    let mut stream = Stream::new(
        gateway
            .post_streaming(&client, "/v1/chat/completions", &[], &body)
            .await,
    );
    assert!(stream.read_events(3).await);
    assert_eq!(
        engine_gauge(&client, &replica.url, "vllm:num_requests_running").await,
        1.0
    );
    drop(stream);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while engine_gauge(&client, &replica.url, "vllm:num_requests_running").await != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "vLLM still runs the request 20 s after the client left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ended by the abort, not by running out its tokens.
    let (finished, _) = settled(&client, &replica.url).await;
    assert_eq!(
        finished, finished_before,
        "the request did not run to max_tokens"
    );
    let generated = engine_gauge(&client, &replica.url, GENERATED).await - generated_before;
    assert!(
        generated < f64::from(prompts::LONG) / 2.0,
        "vLLM stopped generating soon after the client left: {generated} of {} tokens",
        prompts::LONG
    );
    gateway.wait_outstanding_zero(&client).await;
}

/// Reads in a row, 250 ms apart, that must agree before the counters count as settled. The
/// running gauge comes from vLLM's engine process and the finished count from its API
/// server's output processing, so under load the count can still move after the gauge reads
/// 0: with two reads, a CI run counted an earlier test's last request as this one's.
const SETTLED_READS: usize = 5;

/// The replica's finished-at-length and generated-token counters once they stop moving with
/// nothing running (bounded: 20 s).
async fn settled(client: &Client, url: &str) -> (f64, f64) {
    let read = || async {
        (
            engine_gauge(client, url, "vllm:num_requests_running").await,
            engine_gauge(client, url, RAN_TO_LENGTH).await,
            engine_gauge(client, url, GENERATED).await,
        )
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last = read().await;
    let mut agreeing = 1;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = read().await;
        agreeing = if now == last && now.0 == 0.0 {
            agreeing + 1
        } else {
            1
        };
        if agreeing == SETTLED_READS {
            return (now.1, now.2);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url}'s counters never settled: {now:?}"
        );
        last = now;
    }
}

//! A replica leaving: drained through the admin API, it finishes its streams and takes no
//! new one; killed with SIGKILL mid-stream, the client gets a clean SSE error and the next
//! requests go to the replica that is left.

use std::time::Duration;

use prefixgate_tests::Client;

use super::fleet::{Fleet, OwnReplica};
use super::gateway::Gateway;
use super::prompts;
use super::stream::{Stream, payloads, stream_usage};

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_drained_replica_finishes_its_streams_and_gets_no_new_ones() {
    let fleet = Fleet::from_env();
    let gateway = Gateway::start(&fleet, "drain", &[fleet.a(), fleet.b()], "").await;
    let client = Client::new();
    let body = prompts::chat(&prompts::family("drained"), "Go on.", prompts::LONG, true);
    let mut stream = Stream::new(
        gateway
            .post_streaming(&client, "/v1/chat/completions", &[], &body)
            .await,
    );
    assert!(stream.read_events(3).await);
    let drained = stream.target_pod.clone();
    let drain = client
        .call(
            "POST",
            &format!("{}/admin/replicas/{drained}/drain", gateway.admin),
            &[],
            "",
        )
        .await;
    assert_eq!(drain.status, 202, "{}", drain.text());
    assert_eq!(drain.json()["state"], "draining");

    let other = if drained == fleet.a().name {
        &fleet.b().name
    } else {
        &fleet.a().name
    };
    for turn in 0..4 {
        let body = prompts::chat(
            &prompts::family("after-drain"),
            &format!("Turn {turn}."),
            4,
            false,
        );
        let answer = gateway
            .post(&client, "/v1/chat/completions", &[], &body)
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("target-pod"),
            Some(other.as_str()),
            "nothing new on the draining replica"
        );
    }
    let text = stream.finish().await;
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the drained replica's stream ran to its end"
    );
    let usage = stream_usage(&text).expect("its usage block");
    assert_eq!(
        usage["completion_tokens"],
        prompts::LONG,
        "every token: {usage}"
    );
    // Its last request ended, so it left the set.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed = gateway.replicas(&client).await;
        if !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == drained.as_str())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{drained} never left: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gateway.wait_outstanding_zero(&client).await;
}

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_replica_killed_mid_stream_ends_the_stream_cleanly_and_traffic_moves_on() {
    let fleet = Fleet::from_env();
    // A replica of this test's own, started like the others: the one to kill.
    let victim = OwnReplica::start(&fleet, "vllm-victim").await;
    let gateway = Gateway::start(&fleet, "sigkill", &[&victim.backend], "").await;
    let client = Client::new();
    let body = prompts::chat(&prompts::family("killed"), "Go on.", prompts::LONG, true);
    let mut stream = Stream::new(
        gateway
            .post_streaming(&client, "/v1/chat/completions", &[], &body)
            .await,
    );
    assert_eq!(stream.target_pod, victim.backend.name);
    assert!(stream.read_events(3).await);

    // The survivor joins, then the victim dies with the stream half sent.
    let survivor = fleet.a();
    let add =
        serde_json::json!({"name": survivor.name, "url": survivor.url, "model": survivor.model})
            .to_string();
    let added = client
        .call(
            "POST",
            &format!("{}/admin/replicas", gateway.admin),
            &[("content-type", "application/json")],
            add,
        )
        .await;
    assert_eq!(added.status, 201, "{}", added.text());
    victim.kill();

    let text = stream.finish().await;
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream ends with [DONE]: {text}"
    );
    let last = payloads(&text).pop().expect("events");
    assert!(
        last["error"]["message"].is_string(),
        "an SSE error event before [DONE]: {last}"
    );
    assert!(
        stream_usage(&text).is_none(),
        "no usage from a stream that was cut"
    );

    for turn in 0..3 {
        let body = prompts::chat(
            &prompts::family("after-kill"),
            &format!("Turn {turn}."),
            4,
            false,
        );
        let answer = gateway
            .post(&client, "/v1/chat/completions", &[], &body)
            .await;
        assert_eq!(answer.status, 200, "turn {turn}: {}", answer.text());
        assert_eq!(answer.header("target-pod"), Some(survivor.name.as_str()));
    }
    gateway.wait_outstanding_zero(&client).await;
}

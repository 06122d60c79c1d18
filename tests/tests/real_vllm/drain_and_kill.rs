//! A replica leaving: drained through the admin API, it finishes its streams and takes no
//! new one; stopped with SIGTERM (a pod's end), vLLM refuses new connections at once and
//! aborts its streams, and the gateway sends new requests elsewhere; killed with SIGKILL
//! mid-stream, the client gets a clean SSE error and the next requests go to the replica that
//! is left.

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
    new_requests_go_to(&gateway, &client, "after-drain", other).await;
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
    let Leaving {
        replica,
        gateway,
        client,
        stream,
    } = Leaving::start(&fleet, "sigkill", "").await;
    replica.kill();

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

    new_requests_go_to(&gateway, &client, "after-kill", &fleet.a().name).await;
    gateway.wait_outstanding_zero(&client).await;
}

/// vLLM 0.32 on SIGTERM (its default `--shutdown-timeout 0`): new connections are refused
/// at once and the requests in flight are aborted in the engine. The stream in flight then
/// either ends with what was generated (seen: a usage block with 4 of 1500 tokens, then
/// `[DONE]`) or is left open with nothing more sent (seen too), which the gateway's idle limit
/// ends with an SSE error; either way the client's stream ends cleanly, cut short. (vLLM 0.11
/// ran such streams to their end; a deployment that wants that drains through the gateway
/// first and gives vLLM `--shutdown-timeout`, DEPLOY.md.)
#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_replica_stopped_with_sigterm_cuts_its_stream_cleanly_and_new_requests_go_elsewhere() {
    let fleet = Fleet::from_env();
    let idle = "[upstream]\nidle_timeout_ms = 3000\n";
    let Leaving {
        replica,
        gateway,
        client,
        stream,
    } = Leaving::start(&fleet, "sigterm", idle).await;
    replica.terminate();

    let text = stream.finish().await;
    let tail: Vec<_> = super::stream::events(&text)
        .into_iter()
        .rev()
        .take(3)
        .collect();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream ends cleanly: {tail:?}"
    );
    let contents = payloads(&text)
        .iter()
        .filter(|p| p["choices"][0]["delta"]["content"].is_string())
        .count();
    assert!(
        contents < prompts::LONG as usize,
        "cut short, not run to its end: {tail:?}"
    );
    let ended_by_vllm = stream_usage(&text).is_some();
    let ended_by_gateway = payloads(&text)
        .last()
        .is_some_and(|p| p["error"]["message"].is_string());
    assert!(
        ended_by_vllm || ended_by_gateway,
        "vLLM's own end or the gateway's SSE error: {tail:?}"
    );
    // New requests: once the gateway's probes see the replica go (it is ejected), each goes to
    // the other one. Before that there is a window (seen: one request) in which vLLM, its
    // engine already stopped, still answers on a kept-alive connection with its own 500
    // ("EngineCore encountered an issue"), which the gateway passes through as it does every
    // 500 (docs/REAL_VLLM.md, "SIGTERM").
    let leaving_name = replica.backend.name.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let state = gateway.replica(&client, &leaving_name).await["state"].clone();
        if state != "ready" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{leaving_name} still ready 15 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    new_requests_go_to(&gateway, &client, "after-sigterm", &fleet.a().name).await;
    gateway.wait_outstanding_zero(&client).await;
}

/// A replica of the test's own (started like the fleet's, so it can be stopped) serving a long
/// stream through a gateway that had only it, with the fleet's first replica added once the
/// stream is under way: the one the traffic must move to when the own replica goes.
pub(super) struct Leaving {
    pub(super) replica: OwnReplica,
    pub(super) gateway: Gateway,
    pub(super) client: Client,
    pub(super) stream: Stream,
}

impl Leaving {
    /// `case` names the replica, the gateway and the prompt family; `extra` is TOML appended
    /// to the gateway's configuration.
    pub(super) async fn start(fleet: &Fleet, case: &str, extra: &str) -> Leaving {
        Self::start_with(fleet, case, extra, &Self::long_chat(case)).await
    }

    /// The request `start` streams: a chat of [`prompts::LONG`] tokens in `case`'s family.
    pub(super) fn long_chat(case: &str) -> String {
        prompts::chat(&prompts::family(case), "Go on.", prompts::LONG, true)
    }

    /// As `start`, streaming `body`.
    pub(super) async fn start_with(fleet: &Fleet, case: &str, extra: &str, body: &str) -> Leaving {
        let replica = OwnReplica::start(fleet, &format!("vllm-{case}")).await;
        let gateway = Gateway::start(fleet, case, &[&replica.backend], extra).await;
        let client = Client::new();
        let mut stream = Stream::new(
            gateway
                .post_streaming(&client, "/v1/chat/completions", &[], body)
                .await,
        );
        assert_eq!(stream.target_pod, replica.backend.name);
        assert!(stream.read_events(3).await);
        gateway.add_replica(&client, fleet.a()).await;
        Leaving {
            replica,
            gateway,
            client,
            stream,
        }
    }
}

/// Short requests of a new family, each of which must be answered by `pod`.
async fn new_requests_go_to(gateway: &Gateway, client: &Client, family: &str, pod: &str) {
    for turn in 0..3 {
        let body = prompts::chat(&prompts::family(family), &format!("Turn {turn}."), 4, false);
        let answer = gateway
            .post(client, "/v1/chat/completions", &[], &body)
            .await;
        assert_eq!(answer.status, 200, "turn {turn}: {}", answer.text());
        assert_eq!(answer.header("target-pod"), Some(pod), "turn {turn}");
    }
}

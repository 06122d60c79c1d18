//! Routing that uses the cache: a family's second request goes where its first went, and
//! vLLM reports the prefix it found there; a second family, sent while the first runs, goes
//! to the other replica.

use prefixgate_tests::Client;

use super::fleet::Fleet;
use super::gateway::Gateway;
use super::prompts;
use super::stream::Stream;

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_familys_second_request_finds_its_prefix_cached_where_the_first_went() {
    let fleet = Fleet::from_env();
    let gateway = Gateway::start(&fleet, "cache-routing", &[fleet.a(), fleet.b()], "").await;
    let client = Client::new();
    let (first, second) = (prompts::family("first"), prompts::family("second"));

    // The first family's opening request, kept running so the other replica is the less
    // loaded one when the second family arrives.
    let path = "/v1/chat/completions";
    let body = prompts::chat(&first, "Turn one.", prompts::LONG, true);
    let mut running = Stream::new(gateway.post_streaming(&client, path, &[], &body).await);
    assert!(running.read_events(2).await, "the long stream started");
    let opening = gateway
        .post(
            &client,
            path,
            &[],
            &prompts::chat(&second, "Turn one.", 8, false),
        )
        .await;
    assert_eq!(opening.status, 200, "{}", opening.text());
    let second_pod = opening.header("target-pod").unwrap().to_owned();
    assert_ne!(
        second_pod, running.target_pod,
        "a new family goes to the replica that is not busy"
    );
    let first_pod = running.target_pod.clone();
    running.finish().await;

    for (family, pod) in [(&first, &first_pod), (&second, &second_pod)] {
        let answer = gateway
            .post(
                &client,
                path,
                &[],
                &prompts::chat(family, "Turn two, another question.", 8, false),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("target-pod"),
            Some(pod.as_str()),
            "the family's replica"
        );
        let match_percent: u32 = answer
            .header("x-prefixgate-match-percent")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            match_percent > 50,
            "the gateway saw the shared prefix: {match_percent} %"
        );
        let usage = &answer.json()["usage"];
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        assert!(
            cached >= prompt / 2,
            "vLLM found the family's prefix (most of the prompt) cached: {usage}"
        );
    }
    gateway.wait_outstanding_zero(&client).await;
}

//! Chat and completions, streamed and not, pass through the gateway byte for byte, with the
//! engine's usage block.

use prefixgate_tests::Client;

use super::fleet::Fleet;
use super::gateway::Gateway;
use super::prompts;
use super::stream::stream_usage;
use super::tap::Tap;

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn chat_and_completions_pass_through_byte_for_byte_with_usage() {
    let fleet = Fleet::from_env();
    let tap = Tap::start(fleet.a()).await;
    let backend = tap.backend(fleet.a());
    let gateway = Gateway::start(&fleet, "passthrough", &[&backend], "").await;
    let client = Client::new();
    let family = prompts::family("passthrough");
    for (path, stream) in [
        ("/v1/chat/completions", false),
        ("/v1/chat/completions", true),
        ("/v1/completions", false),
        ("/v1/completions", true),
    ] {
        let body = if path.contains("chat") {
            prompts::chat(&family, "Say something.", 16, stream)
        } else {
            prompts::completion(&family, "Say something.", 16, stream)
        };
        let id = format!("passthrough-{}-{stream}", path.replace('/', "-"));
        let answer = gateway
            .post(&client, path, &[("x-request-id", &id)], &body)
            .await;
        assert_eq!(
            answer.status,
            200,
            "{path} stream={stream}: {}",
            answer.text()
        );
        let recorded = tap
            .recorded(&id)
            .expect("the request reached the replica with its id");
        assert_eq!(recorded.status, 200);
        assert!(
            recorded.complete(),
            "{path} stream={stream}: the replica's body ended"
        );
        assert_eq!(
            answer.body.as_ref(),
            recorded.body.as_slice(),
            "{path} stream={stream}: the client's bytes differ from vLLM's"
        );
        let usage = if stream {
            assert!(
                answer.text().ends_with("data: [DONE]\n\n"),
                "{}",
                answer.text()
            );
            stream_usage(answer.text()).expect("a usage chunk (stream_options.include_usage)")
        } else {
            answer.json()["usage"].clone()
        };
        assert_eq!(
            usage["completion_tokens"], 16,
            "{path} stream={stream}: {usage}"
        );
        assert!(
            usage["prompt_tokens"].as_u64().unwrap() >= 200,
            "the family prompt: {usage}"
        );
        assert!(usage["prompt_tokens_details"].is_object(), "{usage}");
    }
}

//! Bad input gets the status and error shape a client of plain vLLM gets: malformed JSON,
//! an unknown model, `max_tokens` over the context.

use prefixgate_tests::{Answer, Client};

use super::fleet::{Fleet, MAX_MODEL_LEN, MODEL};
use super::gateway::Gateway;

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn bad_input_gets_vllms_status_and_error_shape() {
    let fleet = Fleet::from_env();
    let gateway = Gateway::start(&fleet, "bad-input", &[fleet.a(), fleet.b()], "").await;
    let client = Client::new();
    let chat = "/v1/chat/completions";
    let over = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{}}}"#,
        MAX_MODEL_LEN + 1
    );
    let cases = [
        (
            "malformed JSON",
            chat,
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user""#),
        ),
        (
            "unknown model",
            chat,
            r#"{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}"#.to_owned(),
        ),
        ("max_tokens over the context", chat, over.clone()),
        (
            "max_tokens over the context (completions)",
            "/v1/completions",
            over.replace(
                r#""messages":[{"role":"user","content":"hi"}]"#,
                r#""prompt":"hi""#,
            ),
        ),
    ];
    for (case, path, body) in cases {
        let direct = post(&client, &format!("{}{path}", fleet.a().url), &body).await;
        let through = gateway.post(&client, path, &[], &body).await;
        assert_eq!(
            through.status,
            direct.status,
            "{case}: {} against vLLM's {}",
            through.text(),
            direct.text()
        );
        let (ours, theirs) = (through.json(), direct.json());
        for answer in [&ours, &theirs] {
            let error = answer["error"]
                .as_object()
                .unwrap_or_else(|| panic!("{case}: {answer}"));
            let mut keys: Vec<_> = error.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                ["code", "message", "param", "type"],
                "{case}: {answer}"
            );
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{case}: {answer}"
            );
        }
        if case.starts_with("max_tokens") {
            // Only the engine knows its context: its answer passes through unchanged.
            assert_eq!(through.body, direct.body, "{case}");
        }
    }
}

async fn post(client: &Client, url: &str, body: &str) -> Answer {
    client
        .call(
            "POST",
            url,
            &[("content-type", "application/json")],
            body.to_owned(),
        )
        .await
}

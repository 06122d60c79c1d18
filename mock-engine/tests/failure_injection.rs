//! Failure injection over real sockets, by header and by plan: error status, abort after N
//! tokens, hang, slow start, health flapping, and invalid specs.

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use mock_engine::server::{FailurePlan, FailureSpec};
use support::*;

async fn chat_with(replica: &mock_engine::server::ReplicaHandle, fail: &str, body: &str) -> Answer {
    send(
        replica,
        Method::POST,
        "/v1/chat/completions",
        &[("x-mock-fail", fail)],
        body,
    )
    .await
}

#[tokio::test]
async fn status_failure_answers_a_vllm_error_and_never_reaches_the_engine() {
    bounded(async {
        let replica = start(fast()).await;
        let answer = chat_with(&replica, "status=503", &chat_body("x", 2, true, false)).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        let error = &answer.json()["error"];
        assert_eq!(error["code"], 503);
        assert_eq!(error["type"], "ServiceUnavailableError");
        assert!(error["message"].as_str().unwrap().contains("status=503"));
        let teapot = chat_with(&replica, "status=429", &chat_body("x", 2, false, false)).await;
        assert_eq!(teapot.status, StatusCode::TOO_MANY_REQUESTS);
        // An invalid request is a 400 whatever the failure asks for.
        let too_long = prompt_of(fast().max_model_len + 1, "t");
        let invalid = chat_with(
            &replica,
            "status=503",
            &chat_body(&too_long, 1, false, false),
        )
        .await;
        assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
        let text = metrics(&replica).await;
        assert_eq!(
            sample(&text, &series("vllm:prefix_cache_queries_total")),
            0.0
        );
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn abort_after_drops_the_connection_without_done() {
    bounded(async {
        let replica = start(slow(0.005)).await;
        let mut stream = raw_request(
            replica.addr(),
            "/v1/chat/completions",
            &[("x-mock-fail", "abort-after=3")],
            &chat_body("x y z", 50, true, true),
        )
        .await;
        let seen = read_to_close(&mut stream).await;
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
        // role chunk + 3 token chunks, then nothing.
        assert_eq!(seen.matches("data: ").count(), 4, "{seen}");
        assert!(!seen.contains("[DONE]"), "{seen}");
        assert!(!seen.contains("finish_reason\":\"length"), "{seen}");
        // The chunked body never got its terminating zero-length chunk.
        assert!(!seen.ends_with("0\r\n\r\n"), "{seen}");
        let after = wait_for_metrics(&replica, |text| {
            sample(text, &success_series("abort")) == 1.0
        })
        .await;
        assert_eq!(sample(&after, &series("vllm:num_requests_running")), 0.0);

        // Whole-body requests get the head and then a dropped connection.
        let mut whole = raw_request(
            replica.addr(),
            "/v1/completions",
            &[("x-mock-fail", "abort-after=2")],
            &completion_body("x y z", 50, false, false),
        )
        .await;
        let seen = read_to_close(&mut whole).await;
        assert!(!seen.contains("\"choices\""), "{seen}");
        wait_for_metrics(&replica, |text| {
            sample(text, &success_series("abort")) == 2.0
        })
        .await;
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn hang_sends_nothing_until_the_client_leaves() {
    bounded(async {
        let replica = start(fast()).await;
        let hung = raw_request(
            replica.addr(),
            "/v1/chat/completions",
            &[("x-mock-fail", "hang")],
            &chat_body("x", 2, true, false),
        )
        .await;
        // A normal request on another connection completes meanwhile...
        let normal = post_chat(&replica, &chat_body("y", 2, false, false)).await;
        assert_eq!(normal.status, StatusCode::OK);
        let text = wait_for_metrics(&replica, |text| {
            sample(text, &success_series("length")) == 1.0
        })
        .await;
        // ...while the hung one has not been answered, nor reached the engine.
        let mut buf = [0u8; 64];
        match hung.try_read(&mut buf) {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
            Ok(n) => panic!(
                "hung request got {n} bytes: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
        }
        assert_eq!(
            sample(&text, &series("vllm:prompt_tokens_total")),
            sample(&text, &series("vllm:prefix_cache_queries_total"))
        );
        assert_eq!(sample(&text, &series("vllm:num_requests_running")), 0.0);
        drop(hung);
        // Shutdown must not wait for the hung handler.
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn slow_start_delays_the_answer_by_engine_time() {
    bounded(async {
        let replica = start(fast()).await;
        let started = std::time::Instant::now();
        let answer = chat_with(&replica, "slow-start=0.3", &chat_body("x", 2, false, false)).await;
        assert_eq!(answer.status, StatusCode::OK);
        // A lower bound only: a loaded machine makes it later, never earlier.
        assert!(started.elapsed() >= Duration::from_millis(300));
        let combined = chat_with(
            &replica,
            "slow-start=0.01;status=500",
            &chat_body("x", 2, false, false),
        )
        .await;
        assert_eq!(combined.status, StatusCode::INTERNAL_SERVER_ERROR);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn invalid_specs_are_a_400_naming_the_problem() {
    bounded(async {
        let replica = start(fast()).await;
        for (spec, needle) in [
            ("explode", "unknown failure directive `explode`"),
            ("status=200", "400..=599"),
            ("abort-after=x", "`abort-after`"),
        ] {
            let answer = chat_with(&replica, spec, &chat_body("x", 2, false, false)).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{spec}");
            let message = answer.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(
                message.contains("x-mock-fail") && message.contains(needle),
                "{message}"
            );
        }
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_plan_fails_every_request_unless_the_header_says_none() {
    bounded(async {
        let plan = FailurePlan {
            spec: FailureSpec::parse("status=500").unwrap(),
            rate: 1.0,
            health_fail_for: None,
        };
        let replica = start_with(config(fast(), plan)).await;
        let failed = post_completion(&replica, &completion_body("x", 1, false, false)).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.json()["error"]["type"], "InternalServerError");
        let spared = send(
            &replica,
            Method::POST,
            "/v1/completions",
            &[("x-mock-fail", "none")],
            &completion_body("x", 1, false, false),
        )
        .await;
        assert_eq!(spared.status, StatusCode::OK);
        replica.shutdown().await;

        let never = FailurePlan {
            spec: FailureSpec::parse("status=500").unwrap(),
            rate: 0.0,
            health_fail_for: None,
        };
        let replica = start_with(config(fast(), never)).await;
        let fine = post_completion(&replica, &completion_body("x", 1, false, false)).await;
        assert_eq!(fine.status, StatusCode::OK);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn health_fails_for_a_period_and_can_be_switched() {
    bounded(async {
        let plan = FailurePlan {
            health_fail_for: Some(1.0e6),
            ..FailurePlan::default()
        };
        let replica = start_with(config(fast(), plan)).await;
        assert_eq!(
            get(&replica, "/health").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            get(&replica, "/ping").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let cleared = post(&replica, "/mock/health?fail_for=0", "").await;
        assert_eq!(cleared.status, StatusCode::NO_CONTENT);
        assert_eq!(get(&replica, "/health").await.status, StatusCode::OK);
        assert_eq!(
            post(&replica, "/mock/health?fail_for=1000", "")
                .await
                .status,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            get(&replica, "/health").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        for bad in [
            "/mock/health",
            "/mock/health?fail_for=-1",
            "/mock/health?fail_for=abc",
        ] {
            assert_eq!(
                post(&replica, bad, "").await.status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        replica.shutdown().await;
    })
    .await;
}

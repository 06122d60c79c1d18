//! Many requests at once on one replica: every stream completes whole, the L20 profile's
//! `max_num_seqs` shows as queueing in `/metrics`, and dropping every client leaves nothing
//! running.

mod support;

use futures_util::future::join_all;
use http::StatusCode;
use mock_engine::model::EngineProfile;
use support::*;

#[tokio::test]
async fn fifty_concurrent_streams_all_complete() {
    bounded(async {
        let replica = start(fast()).await;
        let requests = (0..50).map(|i| {
            let replica = &replica;
            async move {
                let body = chat_body(&prompt_of(30 + i, "c"), 20, true, true);
                post_chat(replica, &body).await
            }
        });
        for answer in join_all(requests).await {
            assert_eq!(answer.status, StatusCode::OK);
            let events = sse_events(&answer.body);
            // role, 20 tokens, usage, [DONE]
            assert_eq!(events.len(), 23);
            assert_eq!(events.last().unwrap(), "[DONE]");
        }
        let text =
            wait_for_metrics(&replica, |t| sample(t, &success_series("length")) == 50.0).await;
        assert_eq!(
            sample(&text, &series("vllm:generation_tokens_total")),
            1000.0
        );
        assert_eq!(sample(&text, &series("vllm:num_requests_running")), 0.0);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_ninth_request_waits_on_the_l20_profile() {
    bounded(async {
        let profile = EngineProfile::builtin("l20-qwen27b-fp8").unwrap();
        assert_eq!(profile.max_num_seqs, 8);
        let replica = start(profile).await;
        let mut clients = Vec::new();
        for i in 0..9 {
            let body = completion_body(&prompt_of(50, &format!("q{i}x")), 5000, true, false);
            clients.push(raw_request(replica.addr(), "/v1/completions", &[], &body).await);
        }
        let text = wait_for_metrics(&replica, |t| {
            sample(t, &series("vllm:num_requests_running")) == 8.0
                && sample(t, &series("vllm:num_requests_waiting")) == 1.0
        })
        .await;
        assert!(sample(&text, &series("vllm:kv_cache_usage_perc")) > 0.0);
        drop(clients);
        let text = wait_for_metrics(&replica, |t| sample(t, &success_series("abort")) == 9.0).await;
        assert_eq!(sample(&text, &series("vllm:num_requests_running")), 0.0);
        assert_eq!(sample(&text, &series("vllm:num_requests_waiting")), 0.0);
        assert_eq!(sample(&text, &series("vllm:kv_cache_usage_perc")), 0.0);
        replica.shutdown().await;
    })
    .await;
}

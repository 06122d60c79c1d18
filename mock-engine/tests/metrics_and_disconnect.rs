//! `/metrics` over a real socket: it parses, its counters move with traffic (prefix-cache
//! hits on a repeated prompt), and a client that disconnects mid-stream is aborted in the
//! model (`finished_reason="abort"`, nothing left running).

mod support;

use std::collections::HashSet;

use http::StatusCode;
use support::*;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn metrics_parse_and_counters_move() {
    bounded(async {
        let replica = start(fast()).await;
        let before = metrics(&replica).await;
        assert_eq!(sample(&before, &success_series("length")), 0.0);
        assert_eq!(sample(&before, &success_series("abort")), 0.0);
        assert_eq!(sample(&before, &success_series("stop")), 0.0);

        let prompt = prompt_of(64, "m");
        for _ in 0..2 {
            let answer =
                post_completion(&replica, &completion_body(&prompt, 3, false, false)).await;
            assert_eq!(answer.status, StatusCode::OK);
        }
        let after = wait_for_metrics(&replica, |text| {
            sample(text, &success_series("length")) == 2.0
        })
        .await;
        assert_eq!(
            sample(&after, &series("vllm:prefix_cache_queries_total")),
            128.0
        );
        // The second request hits the first's blocks: 64 tokens, capped at 63, block-aligned.
        assert_eq!(
            sample(&after, &series("vllm:prefix_cache_hits_total")),
            48.0
        );
        assert_eq!(sample(&after, &series("vllm:prompt_tokens_total")), 128.0);
        assert_eq!(sample(&after, &series("vllm:generation_tokens_total")), 6.0);
        assert_eq!(sample(&after, &series("vllm:num_requests_running")), 0.0);
        assert_eq!(sample(&after, &series("vllm:num_requests_waiting")), 0.0);
        assert_eq!(
            sample(&after, &series("vllm:time_to_first_token_seconds_count")),
            2.0
        );
        assert_eq!(
            sample(&after, &series("vllm:e2e_request_latency_seconds_count")),
            2.0
        );

        // Every sample line is `name{labels} value`, every family has HELP and TYPE, and
        // no series appears twice.
        let mut seen = HashSet::new();
        let mut typed = HashSet::new();
        for line in after.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["gauge", "counter", "histogram"].contains(&kind), "{line}");
                typed.insert(name.to_owned());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
            assert!(seen.insert(series.to_owned()), "duplicate {series}");
            let name = series.split('{').next().unwrap();
            let family = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|f| typed.contains(*f)))
                .unwrap_or(name);
            assert!(typed.contains(family), "{series} has no TYPE");
        }
        for family in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:num_preemptions",
            "vllm:request_success",
            "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:cache_config_info",
        ] {
            assert!(typed.contains(family), "missing {family}");
        }
        assert_eq!(get(&replica, "/metrics/").await.status, StatusCode::OK);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_is_aborted() {
    bounded(async {
        // 20 ms per step: 10 000 tokens would take minutes, so the request is surely still
        // running when the client leaves.
        let replica = start(slow(0.02)).await;
        let mut stream = raw_request(
            replica.addr(),
            "/v1/chat/completions",
            &[],
            &chat_body("tell me everything", 10_000, true, false),
        )
        .await;
        let head = read_until(&mut stream, "\"content\":\" ").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let running = metrics(&replica).await;
        assert_eq!(sample(&running, &series("vllm:num_requests_running")), 1.0);
        assert!(sample(&running, &series("vllm:kv_cache_usage_perc")) > 0.0);

        stream.shutdown().await.unwrap();
        drop(stream);
        let after = wait_for_metrics(&replica, |text| {
            sample(text, &success_series("abort")) == 1.0
        })
        .await;
        assert_eq!(sample(&after, &series("vllm:num_requests_running")), 0.0);
        assert_eq!(sample(&after, &series("vllm:num_requests_waiting")), 0.0);
        assert_eq!(sample(&after, &series("vllm:kv_cache_usage_perc")), 0.0);
        assert_eq!(sample(&after, &success_series("length")), 0.0);
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_client_that_leaves_a_whole_body_request_is_aborted() {
    bounded(async {
        let replica = start(slow(0.02)).await;
        let stream = raw_request(
            replica.addr(),
            "/v1/completions",
            &[],
            &completion_body("a long answer please", 10_000, false, false),
        )
        .await;
        wait_for_metrics(&replica, |text| {
            sample(text, &series("vllm:num_requests_running")) == 1.0
        })
        .await;
        drop(stream);
        let after = wait_for_metrics(&replica, |text| {
            sample(text, &success_series("abort")) == 1.0
        })
        .await;
        assert_eq!(sample(&after, &series("vllm:num_requests_running")), 0.0);
        replica.shutdown().await;
    })
    .await;
}

//! The `spawn_replica` contract others build on: port 0, several replicas per process, bind
//! errors reported, shutdown that ends in-flight streams.

mod support;

use http::StatusCode;
use mock_engine::server::{ServerError, spawn_replica};
use support::*;

#[tokio::test]
async fn several_replicas_on_port_zero_serve_independently() {
    bounded(async {
        let mut a_config = config(fast(), Default::default());
        a_config.name = "L20-A".into();
        let a = start_with(a_config).await;
        let b = start(fast()).await;
        assert_ne!(a.addr().port(), 0);
        assert_ne!(a.addr(), b.addr());
        assert_eq!(a.name(), "L20-A");
        assert_eq!(a.url(), format!("http://127.0.0.1:{}", a.addr().port()));
        let prompt = prompt_of(40, "s");
        post_completion(&a, &completion_body(&prompt, 1, false, false)).await;
        post_completion(&a, &completion_body(&prompt, 1, false, false)).await;
        let on_b = post_completion(&b, &completion_body(&prompt, 1, false, false)).await;
        assert_eq!(on_b.status, StatusCode::OK);
        // b has its own cache: no hit there.
        assert_eq!(
            on_b.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
            0
        );
        let a_metrics = wait_for_metrics(&a, |t| sample(t, &success_series("length")) == 2.0).await;
        assert_eq!(
            sample(&a_metrics, &series("vllm:prefix_cache_hits_total")),
            32.0
        );
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_taken_port_is_a_bind_error_naming_the_replica() {
    bounded(async {
        let first = start(fast()).await;
        let mut clash = config(fast(), Default::default());
        clash.name = "second".into();
        clash.listen = first.addr();
        let err = spawn_replica(clash).await.unwrap_err();
        assert!(matches!(err, ServerError::Bind { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("second") && message.contains(&first.addr().to_string()),
            "{message}"
        );

        let mut bad_scale = config(fast(), Default::default());
        bad_scale.time_scale = 0.0;
        assert!(matches!(
            spawn_replica(bad_scale).await,
            Err(ServerError::TimeScale { .. })
        ));
        first.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_ends_in_flight_streams_and_frees_the_port() {
    bounded(async {
        let replica = start(slow(0.02)).await;
        let addr = replica.addr();
        let mut stream = raw_request(
            addr,
            "/v1/chat/completions",
            &[],
            &chat_body("x", 10_000, true, false),
        )
        .await;
        let head = read_until(&mut stream, "\"content\":\" ").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        replica.shutdown().await;
        let rest = read_to_close(&mut stream).await;
        assert!(!rest.contains("[DONE]"));
        // The listener is gone: the port can be bound again.
        let mut again = config(fast(), Default::default());
        again.listen = addr;
        let reborn = spawn_replica(again)
            .await
            .expect("port free after shutdown");
        assert_eq!(get(&reborn, "/health").await.status, StatusCode::OK);
        reborn.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn time_scale_speeds_the_engine_up() {
    bounded(async {
        // 100 s engine steps at ×100 000: three tokens in a few wall milliseconds. Without
        // the scale they would take 300 s and the test would miss its 60 s deadline.
        let mut scaled = config(slow(100.0), Default::default());
        scaled.time_scale = 100_000.0;
        let replica = start_with(scaled).await;
        let answer = post_completion(&replica, &completion_body("x", 3, false, false)).await;
        assert_eq!(answer.status, StatusCode::OK);
        let text =
            wait_for_metrics(&replica, |t| sample(t, &success_series("length")) == 1.0).await;
        let e2e = sample(&text, &series("vllm:e2e_request_latency_seconds_sum"));
        // Reported in engine seconds (float sums may round a hair below).
        assert!(e2e >= 300.0 - 1e-6, "three 100 s steps: {e2e}");
        replica.shutdown().await;
    })
    .await;
}

/// A request sent after a drain began gets no HTTP answer at all: the connection is refused,
/// or (when it raced the listener's close) reset or closed before a byte.
async fn gets_no_answer(addr: std::net::SocketAddr) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return true;
    };
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await;
    read_to_close(&mut stream).await.is_empty()
}

#[tokio::test]
async fn a_drain_refuses_new_requests_closes_idle_connections_and_finishes_streams() {
    bounded(async {
        // 150 tokens at 20 ms a step: the stream is still running when the drain begins.
        let replica = start(slow(0.02)).await;
        let addr = replica.addr();
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        {
            use tokio::io::AsyncWriteExt;
            idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
        }
        let health = read_until(&mut idle, "\r\n\r\n").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        let mut stream = raw_request(
            addr,
            "/v1/chat/completions",
            &[],
            &chat_body("x", 150, true, false),
        )
        .await;
        let head = read_until(&mut stream, "\"content\":\" ").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");

        let drain = replica.drain(None);
        assert_eq!(drain.in_flight_at_signal(), 1);
        assert!(gets_no_answer(addr).await, "a new request was answered");
        // The idle keep-alive connection is closed by the server, with nothing sent.
        assert_eq!(read_to_close(&mut idle).await, "");
        let rest = read_to_close(&mut stream).await;
        assert!(rest.contains("data: [DONE]"), "the stream was cut: {rest}");
        let outcome = drain.finished().await;
        assert_eq!(outcome.in_flight_at_signal, 1);
        assert_eq!(outcome.cut, 0);
        // Stopped: the port is free again.
        let mut again = config(fast(), Default::default());
        again.listen = addr;
        spawn_replica(again)
            .await
            .expect("port free")
            .shutdown()
            .await;
    })
    .await;
}

#[tokio::test]
async fn a_drain_deadline_cuts_the_streams_still_running() {
    bounded(async {
        // 10 000 tokens at 20 ms: far longer than the 50 ms deadline.
        let replica = start(slow(0.02)).await;
        let mut stream = raw_request(
            replica.addr(),
            "/v1/chat/completions",
            &[],
            &chat_body("x", 10_000, true, false),
        )
        .await;
        let head = read_until(&mut stream, "\"content\":\" ").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let outcome = replica
            .drain(Some(std::time::Duration::from_millis(50)))
            .finished()
            .await;
        assert_eq!(outcome.in_flight_at_signal, 1);
        assert_eq!(outcome.cut, 1);
        let rest = read_to_close(&mut stream).await;
        assert!(!rest.contains("[DONE]"));
    })
    .await;
}

#[tokio::test]
async fn an_idle_replica_drains_at_once() {
    bounded(async {
        let replica = start(fast()).await;
        assert_eq!(replica.in_flight(), 0);
        let outcome = replica.drain(None).finished().await;
        assert_eq!((outcome.in_flight_at_signal, outcome.cut), (0, 0));
    })
    .await;
}

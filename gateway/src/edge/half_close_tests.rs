//! The held end of input through a real listener and real sockets, on the paused clock (the
//! clock jumps to each timer when nothing else can run, so probe intervals cost no time).

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::*;
use crate::edge::listener;

/// How long `/slow` takes: several probe intervals.
const SLOW: Duration = Duration::from_secs(2);

/// Counts handlers dropped before they finished (their client was taken for gone).
struct Abandoned(Arc<AtomicUsize>, bool);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A listener serving `/fast`, `/slow` (answers after [`SLOW`]; POST reads its body first),
/// `/hang` (never answers) and `/begun` (a body that sends a chunk, waits [`SLOW`], ends).
async fn serving() -> (SocketAddr, Arc<AtomicUsize>, watch::Sender<bool>) {
    let abandoned = Arc::new(AtomicUsize::new(0));
    let slow = {
        let abandoned = Arc::clone(&abandoned);
        move || {
            let guard = Abandoned(Arc::clone(&abandoned), false);
            async move {
                let mut guard = guard;
                tokio::time::sleep(SLOW).await;
                guard.1 = true;
                "slow"
            }
        }
    };
    let slow_post = move |body: axum::body::Bytes| async move {
        tokio::time::sleep(SLOW).await;
        format!("read {}", body.len())
    };
    let hang = {
        let abandoned = Arc::clone(&abandoned);
        move || {
            let _guard = Abandoned(Arc::clone(&abandoned), false);
            async move {
                let _guard = _guard;
                std::future::pending::<()>().await;
            }
        }
    };
    let begun = || async {
        let chunks = futures_util::stream::unfold(0, |i| async move {
            match i {
                0 => Some((Ok::<_, io::Error>("first;"), 1)),
                1 => {
                    tokio::time::sleep(SLOW).await;
                    Some((Ok("last"), 2))
                }
                _ => None,
            }
        });
        axum::body::Body::from_stream(chunks)
    };
    let router = Router::new()
        .route("/fast", get(|| async { "fast" }))
        .route("/slow", get(slow).post(slow_post))
        .route("/hang", get(hang))
        .route("/begun", get(begun));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = watch::channel(false);
    listener::spawn(tcp, router, None, stopped);
    (addr, abandoned, stop)
}

/// Sends `request`, shuts the write side (`nc -N`) and reads until the server closes.
async fn half_closed(addr: SocketAddr, request: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(600), tcp.read_to_end(&mut answer))
        .await
        .expect("the server closes once it has answered")
        .unwrap();
    String::from_utf8(answer).unwrap()
}

/// The leading probes' count and the response after them.
fn after_probes(answer: &str) -> (usize, &str) {
    let probe = std::str::from_utf8(PROBE).unwrap();
    let response = answer.trim_start_matches(probe);
    ((answer.len() - response.len()) / probe.len(), response)
}

#[tokio::test(start_paused = true)]
async fn a_half_closed_client_reads_probes_then_its_response() {
    let (addr, abandoned, _stop) = serving().await;
    let answer = half_closed(addr, "GET /slow HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let (probes, response) = after_probes(&answer);
    assert!(
        probes >= 1,
        "a response slower than the interval is probed: {answer}"
    );
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(response.ends_with("\r\n\r\nslow"), "{answer}");
    assert_eq!(abandoned.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn pipelined_requests_are_probed_only_between_whole_responses() {
    let (addr, _abandoned, _stop) = serving().await;
    let answer = half_closed(
        addr,
        "GET /fast HTTP/1.1\r\nhost: x\r\n\r\nGET /slow HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    let fast_end = answer.find("\r\n\r\nfast").expect("the first response") + 8;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let (probes, second) = after_probes(&answer[fast_end..]);
    assert!(probes >= 1, "{answer}");
    assert!(second.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(second.ends_with("\r\n\r\nslow"), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn a_response_that_has_begun_is_never_probed() {
    let (addr, _abandoned, _stop) = serving().await;
    let answer = half_closed(addr, "GET /begun HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(
        answer.contains("first;") && answer.contains("last"),
        "{answer}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_left_is_released_within_two_probe_intervals() {
    let (addr, abandoned, _stop) = serving().await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // Let the request reach its handler, then close both sides.
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(tcp);
    let start = Instant::now();
    while abandoned.load(Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() <= PROBE_INTERVAL * 2,
            "still held after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_http_1_0_client_that_half_closes_is_taken_for_gone() {
    let (addr, abandoned, _stop) = serving().await;
    let answer = half_closed(addr, "GET /slow HTTP/1.0\r\nhost: x\r\n\r\n").await;
    assert_eq!(answer, "", "no 1xx may go to an HTTP/1.0 client");
    assert_eq!(abandoned.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_body_cut_short_by_the_end_of_input_is_not_held() {
    let (addr, _abandoned, _stop) = serving().await;
    let answer = half_closed(
        addr,
        "POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhalf.",
    )
    .await;
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert!(!answer.contains("read "), "{answer}");
}

#[tokio::test(start_paused = true)]
async fn a_whole_body_then_the_end_of_input_is_answered() {
    let (addr, _abandoned, _stop) = serving().await;
    let answer = half_closed(
        addr,
        "POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n0123456789",
    )
    .await;
    let (_, response) = after_probes(&answer);
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(response.ends_with("read 10"), "{answer}");
}

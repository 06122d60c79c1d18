use super::*;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use router_core::PodLoad;

use std::sync::Arc;

use crate::clock::Clock;
use crate::metrics::Metrics;

type Chunks = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, String>>>>;

fn upstream(chunks: Vec<Result<&'static str, &'static str>>) -> Chunks {
    let frames: Vec<Result<Frame<Bytes>, String>> = chunks
        .into_iter()
        .map(|c| {
            c.map(|s| Frame::data(Bytes::from_static(s.as_bytes())))
                .map_err(str::to_owned)
        })
        .collect();
    StreamBody::new(stream::iter(frames))
}

fn completion() -> Completion {
    Completion {
        metrics: Arc::new(Metrics::new().unwrap().pod("a")),
        sent_at: Instant::now(),
        clock: Clock::new(),
    }
}

#[tokio::test]
async fn releases_once_at_the_end_of_a_good_stream() {
    let load = PodLoad::new();
    let body = GuardedBody::new(
        upstream(vec![Ok("data: 1\n\n"), Ok("data: [DONE]\n\n")]),
        load.acquire(),
        true,
        Duration::from_secs(5),
        completion(),
    );
    assert_eq!(load.outstanding(), 1);
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"data: 1\n\ndata: [DONE]\n\n");
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test]
async fn sse_failure_becomes_an_error_event_then_done() {
    let load = PodLoad::new();
    let body = GuardedBody::new(
        upstream(vec![Ok("data: 1\n\ndata: par"), Err("connection reset")]),
        load.acquire(),
        true,
        Duration::from_secs(5),
        completion(),
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(
        text.starts_with("data: 1\n\ndata: par\n\ndata: {\"error\":"),
        "{text}"
    );
    assert!(text.contains("connection reset"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test]
async fn non_sse_failure_is_a_body_error() {
    let load = PodLoad::new();
    let body = GuardedBody::new(
        upstream(vec![Ok("{\"a\":"), Err("reset")]),
        load.acquire(),
        false,
        Duration::from_secs(5),
        completion(),
    );
    assert!(body.collect().await.is_err());
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test]
async fn the_first_chunk_ends_pending_prefill_and_the_end_releases_the_rest() {
    let load = PodLoad::new();
    let guard = load.acquire_work(router_core::load::RequestWork {
        blocks: 10,
        prefill_blocks: 4,
        shared_prefix: None,
        copies_prefix: false,
        max_tokens: None,
    });
    let mut body = GuardedBody::new(
        upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
        guard,
        true,
        Duration::from_secs(5),
        completion(),
    );
    assert_eq!(
        (load.pending_prefill_blocks(), load.active_blocks()),
        (4, 10)
    );
    body.frame().await.unwrap().unwrap();
    assert_eq!(
        (load.pending_prefill_blocks(), load.active_blocks()),
        (0, 10)
    );
    assert_eq!(load.outstanding(), 1);
    while body.frame().await.is_some() {}
    assert_eq!((load.active_blocks(), load.outstanding()), (0, 0));
}

#[tokio::test]
async fn dropping_the_body_mid_stream_releases() {
    let load = PodLoad::new();
    let mut body = GuardedBody::new(
        upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
        load.acquire(),
        true,
        Duration::from_secs(5),
        completion(),
    );
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "data: 1\n\n");
    assert_eq!(load.outstanding(), 1);
    drop(body);
    assert_eq!(load.outstanding(), 0);
}

proptest::proptest! {
    /// Whatever the upstream does and wherever the client stops reading, the pod is
    /// released exactly once, and a fully read SSE stream always ends with `[DONE]`.
    #[test]
    fn releases_exactly_once_whatever_happens(
        chunks in proptest::collection::vec(proptest::option::weighted(0.8, "[a-z]{0,8}"), 0..8),
        read in 0usize..10,
        sse in proptest::bool::ANY,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        runtime.block_on(async {
            let load = PodLoad::new();
            let frames: Vec<Result<Frame<Bytes>, String>> = chunks
                .iter()
                .map(|c| match c {
                    Some(text) => Ok(Frame::data(Bytes::from(format!("data: {text}\n\n")))),
                    None => Err("reset".to_owned()),
                })
                .collect();
            let mut body = GuardedBody::new(
                StreamBody::new(stream::iter(frames)),
                load.acquire(),
                sse,
                Duration::from_secs(5),
                completion(),
            );
            let mut seen = Vec::new();
            let mut ended = false;
            for _ in 0..read {
                match body.frame().await {
                    Some(Ok(frame)) => seen.extend_from_slice(&frame.into_data().unwrap()),
                    Some(Err(_)) | None => {
                        ended = true;
                        break;
                    }
                }
            }
            let failed = chunks.iter().any(Option::is_none);
            if ended && sse && failed {
                proptest::prop_assert!(seen.ends_with(b"data: [DONE]\n\n"));
            }
            // Released by the end of the stream (or its failure), before the body drops.
            proptest::prop_assert!(load.outstanding() <= 1);
            if ended {
                proptest::prop_assert_eq!(load.outstanding(), 0);
            }
            drop(body);
            proptest::prop_assert_eq!(load.outstanding(), 0);
            Ok(())
        })?;
    }
}

#[tokio::test(start_paused = true)]
async fn the_token_charge_settles_to_the_streamed_usage_when_the_body_ends() {
    use crate::admit::{Admission, AdmissionConfig};
    use router_core::text::Endpoint;
    let admission = Admission::new(AdmissionConfig {
        tenant_tokens_per_second: 1,
        tenant_token_burst: 1_000,
        ..AdmissionConfig::default()
    })
    .unwrap();
    let body = br#"{"model":"m","prompt":"abcdabcd","max_tokens":500}"#;
    let fields = router_core::text::routing_fields(Endpoint::Completions, body).unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-tenant", "B".parse().unwrap());
    let metrics = Metrics::new().unwrap();
    let charge = || {
        admission
            .charge_tokens(&headers, Endpoint::Completions, body, &fields, &metrics)
            .unwrap()
    };
    let load = PodLoad::new();
    let stream = GuardedBody::new(
        upstream(vec![
            Ok("data: {\"choices\":[{\"text\":\"x\"}]}\n\n"),
            Ok("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":30}}\n\n"),
            Ok("data: [DONE]\n\n"),
        ]),
        load.acquire(),
        true,
        Duration::from_secs(5),
        completion(),
    )
    .with_token_hold(charge());
    assert_eq!(admission.token_level("B"), Some(498.0));
    stream.collect().await.unwrap();
    assert_eq!(
        admission.token_level("B"),
        Some(968.0),
        "settled to 32 used"
    );

    // A client that leaves before the usage chunk leaves the estimate charged.
    let mut stream = GuardedBody::new(
        upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
        load.acquire(),
        true,
        Duration::from_secs(5),
        completion(),
    )
    .with_token_hold(charge());
    stream.frame().await.unwrap().unwrap();
    drop(stream);
    assert_eq!(admission.token_level("B"), Some(466.0));
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_upstream_times_out_into_an_error_event() {
    let load = PodLoad::new();
    let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, String>>());
    let body = GuardedBody::new(
        silent,
        load.acquire(),
        true,
        Duration::from_secs(3),
        completion(),
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.contains("no first token) within 3000 ms"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_first_token_has_its_own_limit_and_message() {
    // 5 s in the engine's queue, then tokens 1 s apart: within a 10 s first-token limit
    // though past the 3 s idle limit, which only counts once the body has begun.
    let queued_then_silent = StreamBody::new(stream::unfold(0u8, |sent| async move {
        let wait = match sent {
            0 => Duration::from_secs(5),
            1 => Duration::from_secs(1),
            _ => return std::future::pending().await,
        };
        tokio::time::sleep(wait).await;
        Some((
            Ok::<_, String>(Frame::data(Bytes::from("data: x\n\n"))),
            sent + 1,
        ))
    }));
    let load = PodLoad::new();
    let body = GuardedBody::new(
        Box::pin(queued_then_silent),
        load.acquire(),
        true,
        Duration::from_secs(3),
        completion(),
    )
    .with_first_token_limit(Duration::from_secs(10));
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.starts_with("data: x\n\ndata: x\n\n"), "{text}");
    assert!(
        text.contains("sent nothing for 3000 ms mid-response"),
        "{text}"
    );
    // Past the first-token limit, the message says what was waited for.
    let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, String>>());
    let body = GuardedBody::new(
        silent,
        load.acquire(),
        true,
        Duration::from_secs(3),
        completion(),
    )
    .with_first_token_limit(Duration::from_secs(10));
    let bytes = body.collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(text.contains("no first token) within 10000 ms"), "{text}");
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test]
async fn a_body_that_is_whole_at_once_never_makes_a_timer() {
    let load = PodLoad::new();
    let mut body = GuardedBody::new(
        upstream(vec![Ok("{\"ok\":true}")]),
        load.acquire(),
        false,
        Duration::from_secs(3),
        completion(),
    );
    let bytes = (&mut body).collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"{\"ok\":true}");
    assert!(body.idle_timer.is_none());
    assert_eq!(load.outstanding(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_idle_limit_counts_each_wait_not_the_whole_stream() {
    let load = PodLoad::new();
    // Three chunks 2 s apart: 6 s in all, but no single wait reaches the 3 s limit.
    let slow = StreamBody::new(stream::unfold(0u8, |sent| async move {
        if sent == 3 {
            return None;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Some((
            Ok::<_, String>(Frame::data(Bytes::from("data: x\n\n"))),
            sent + 1,
        ))
    }));
    let body = GuardedBody::new(
        Box::pin(slow),
        load.acquire(),
        true,
        Duration::from_secs(3),
        completion(),
    );
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"data: x\n\ndata: x\n\ndata: x\n\n");
    assert_eq!(load.outstanding(), 0);
}

/// A plain answer of known length ends with its last frame: the server stops polling once
/// the size hint is met, so waiting for the end of the body would never record the request's
/// end (its usage, its `cached_tokens`).
#[tokio::test]
async fn a_body_of_known_length_ends_with_its_last_frame() {
    let load = PodLoad::new();
    let text = r#"{"usage":{"prompt_tokens":40,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":36}}}"#;
    let mut guard = load.decide(
        router_core::load::RequestWork {
            blocks: 10,
            prefill_blocks: 0,
            shared_prefix: None,
            copies_prefix: false,
            max_tokens: None,
        },
        0,
    );
    guard.first_byte(0);
    let mut body = GuardedBody::new(
        http_body_util::Full::new(Bytes::from_static(text.as_bytes())),
        guard,
        false,
        Duration::from_secs(5),
        completion(),
    );
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.data_ref().unwrap().len(), text.len());
    assert!(body.is_end_stream(), "nothing more to poll");
    assert_eq!(load.outstanding(), 0, "ended without a poll for the end");
    // The end carried the usage: the replica has now reported cached tokens, so a response
    // without them would read as 0.
    let usage = router_core::Usage {
        prompt_tokens: 40,
        cached_tokens: None,
        completion_tokens: 4,
    };
    let mut again = load.decide(
        router_core::load::RequestWork {
            blocks: 10,
            prefill_blocks: 0,
            shared_prefix: None,
            copies_prefix: false,
            max_tokens: None,
        },
        0,
    );
    again.first_byte(0);
    assert_eq!(
        again.end(1, Some(usage)),
        Some(router_core::load::Verdict::Missed)
    );
}

/// A pod that runs one request at a time, each holding its slot a minute on average, with a
/// request of at most 116 tokens in flight (`max_tokens`), whose body is `chunks`.
fn one_slot_pod(
    chunks: Vec<Result<&'static str, &'static str>>,
    sse: bool,
) -> (Arc<PodLoad>, GuardedBody<Chunks>) {
    let load = PodLoad::new();
    load.set_engine_stats(router_core::EngineStats {
        running: 1,
        waiting: 1,
        kv_usage: 0.1,
    });
    load.observe(&router_core::load::Completed {
        blocks: 0,
        prefill_blocks: 0,
        ttft: 0,
        decode: 60_000,
        usage: None,
        sent_to_idle: false,
        behind_copy: false,
    });
    let guard = load.acquire_work(router_core::load::RequestWork {
        max_tokens: Some(116),
        ..Default::default()
    });
    let body = GuardedBody::new(
        upstream(chunks),
        guard,
        sse,
        Duration::from_secs(5),
        completion(),
    );
    (load, body)
}

/// Reads `body` a frame every 10 ms of (paused) time.
async fn read_every_10_ms(body: &mut GuardedBody<Chunks>, frames: usize) {
    for _ in 0..frames {
        body.frame().await.unwrap().unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_streams_events_set_its_pace_for_the_slot_wait() {
    // One token per event, 10 ms apart; the 16th at 150 ms is the stream clock's first point.
    let (load, mut body) = one_slot_pod(vec![Ok("data: {\"t\":1}\n\n"); 17], true);
    read_every_10_ms(&mut body, 15).await;
    assert_eq!(
        load.slot_wait_ms(150),
        Some(60_000.0),
        "no pace yet: the mean"
    );
    read_every_10_ms(&mut body, 1).await;
    // 15 tokens after the first in 150 ms: 100 left at 10 ms each.
    assert_eq!(load.slot_wait_ms(150), Some(1_000.0));
    while body.frame().await.is_some() {}
    assert_eq!(load.slot_wait_ms(170), Some(0.0), "its slot is free");
}

#[tokio::test(start_paused = true)]
async fn several_events_in_one_frame_each_count() {
    let mut chunks = vec![Ok("data: {}\n\n")];
    chunks.extend([Ok("data: {}\n\ndata: {}\n\n"); 9]);
    let (load, mut body) = one_slot_pod(chunks, true);
    // The first frame's event, then two per frame: 15 tokens, then 17 by 80 ms.
    read_every_10_ms(&mut body, 8).await;
    assert_eq!(load.slot_wait_ms(70), Some(60_000.0));
    read_every_10_ms(&mut body, 1).await;
    assert_eq!(load.slot_wait_ms(80), Some(99.0 * 80.0 / 16.0));
}

#[tokio::test(start_paused = true)]
async fn a_response_that_is_not_streamed_shows_no_pace() {
    // A JSON body that happens to hold the events' marker in its text.
    let (load, mut body) = one_slot_pod(vec![Ok("{\"text\":\"\ndata: x\"}"); 20], false);
    read_every_10_ms(&mut body, 20).await;
    assert_eq!(load.slot_wait_ms(200), Some(60_000.0));
}

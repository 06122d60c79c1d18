use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What hyper would read through a guard when the client writes `input` in pieces of
/// `piece` bytes and hyper reads `read` bytes at a time; with the guard's verdicts.
async fn through_guard(input: &[u8], piece: usize, read: usize) -> (Vec<u8>, Arc<HeadVerdicts>) {
    let (mut client, server) = tokio::io::duplex(piece);
    let verdicts = Arc::new(HeadVerdicts::default());
    let mut guard = HeadGuard::new(server, Arc::clone(&verdicts), true);
    let input = input.to_vec();
    let writer = tokio::spawn(async move {
        // A refused head's rest is dropped, maybe after the guard stopped reading.
        let _ = client.write_all(&input).await;
        let _ = client.shutdown().await;
        client
    });
    let mut out = Vec::new();
    let mut buf = vec![0u8; read];
    loop {
        let n = guard.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    drop(writer.await.unwrap());
    (out, verdicts)
}

const PIPELINED: &[u8] =
    b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\n\r\nhello\
POST /v1/completions HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n\
5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n\
GET /health HTTP/1.1\r\nhost: gw\r\n\r\n";

#[tokio::test]
async fn well_formed_pipelined_requests_pass_unchanged_however_they_are_split() {
    for (piece, read) in [(1, 8192), (7, 24), (64, 8192), (4096, 24), (4096, 8192)] {
        let (out, verdicts) = through_guard(PIPELINED, piece, read).await;
        assert_eq!(out, PIPELINED, "pieces of {piece}, reads of {read}");
        assert_eq!(verdicts.refusal(1), None);
        assert!(!verdicts.unjudged());
    }
}

#[tokio::test]
async fn a_malformed_head_after_good_ones_is_replaced_by_the_stand_in() {
    let mut input = PIPELINED.to_vec();
    input.extend_from_slice(b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab");
    input.extend_from_slice(b"GET /never HTTP/1.1\r\n\r\n");
    for (piece, read) in [(1, 8192), (7, 24), (4096, 8192)] {
        let (out, verdicts) = through_guard(&input, piece, read).await;
        let mut expected = PIPELINED.to_vec();
        expected.extend_from_slice(STAND_IN);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected),
            "pieces of {piece}, reads of {read}"
        );
        assert_eq!(verdicts.refusal(3), None, "an earlier request");
        let error = verdicts.refusal(4).expect("the fourth request stands in");
        assert_eq!(error.code(), "invalid_request_head");
        assert_eq!(verdicts.refusal(4), None, "taken once");
    }
}

#[tokio::test]
async fn the_h2_preface_and_an_upgrade_end_the_judging() {
    let preface = [PREFACE, b"\0\0\x12\x04\0\0\0\0\0garbage that is not HTTP/1"].concat();
    let upgrade = b"GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n\x81\x05hello\r\n\r\n".to_vec();
    for input in [preface, upgrade] {
        for (piece, read) in [(1, 24), (4096, 8192)] {
            let (out, verdicts) = through_guard(&input, piece, read).await;
            assert_eq!(out, input);
            assert!(verdicts.unjudged());
        }
    }
}

#[tokio::test]
async fn a_head_cut_by_the_end_of_input_is_held_back() {
    let (out, verdicts) = through_guard(b"GET / HTTP/1.1\r\nhost: g", 4096, 8192).await;
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(verdicts.refusal(1), None);
}

#[test]
fn a_held_head_is_parsed_again_only_when_new_bytes_may_end_it() {
    let head = b"GET / HTTP/1.1\r\nhost: g\r\n";
    assert!(!may_end_head(head, 5));
    assert!(may_end_head(
        b"GET / HTTP/1.1\r\nhost: g\r\n\r\n",
        head.len()
    ));
    // The blank line's first bytes were in the parsed part.
    assert!(may_end_head(
        b"GET / HTTP/1.1\r\nhost: g\r\n\r\n",
        head.len() + 1
    ));
    assert!(may_end_head(b"GET / HTTP/1.1\nhost: g\n\n", 20));
}

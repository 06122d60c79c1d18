//! The HTTP edge as a client and a replica see it, through real sockets: which headers cross
//! the gateway (RFC 9110 §7.6.1's hop-by-hop rule, `x-forwarded-for`, the gateway's own
//! routing headers) and how a client that half-closes its side is answered.

use prefixgate_tests::{Client, chat_body, gateway_with_one_upstream, shutdown_once_released};

#[tokio::test]
async fn connection_named_headers_and_a_client_s_target_pod_stay_behind() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let answer = client
        .chat(
            &gateway,
            &[
                ("connection", "x-secret"),
                ("x-secret", "s"),
                ("target-pod", "b"),
                ("target-pod-ip", "10.0.0.9:8000"),
                ("x-forwarded-for", "203.0.113.1"),
                ("x-kept", "k"),
            ],
            chat_body("hi", false),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("target-pod"), Some("a"), "the gateway's own");
    let seen = a.seen.headers.lock().unwrap().clone();
    let headers = &seen[0];
    for gone in ["x-secret", "target-pod", "target-pod-ip"] {
        assert!(headers.get(gone).is_none(), "{gone} forwarded: {headers:?}");
    }
    assert_eq!(headers["x-kept"], "k");
    assert_eq!(headers["x-forwarded-for"], "203.0.113.1, 127.0.0.1");
    shutdown_once_released(gateway).await;
}

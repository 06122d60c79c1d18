use super::*;

fn complete(head: &str) -> Framing {
    match parse(head.as_bytes()) {
        Ok(Head::Complete { len, framing }) => {
            assert_eq!(len, head.len(), "{head}");
            framing
        }
        other => panic!("{head}: {other:?}"),
    }
}

fn refused(head: &str) -> GatewayError {
    parse(head.as_bytes()).expect_err(head)
}

#[test]
fn a_head_within_the_limits_passes_and_one_past_either_is_a_431() {
    let mut headers = HeaderMap::new();
    for i in 0..MAX_HEADERS {
        headers.insert(
            http::HeaderName::try_from(format!("x-h{i}")).unwrap(),
            "v".parse().unwrap(),
        );
    }
    assert!(check(&headers).is_ok());
    headers.insert("x-one-more", "v".parse().unwrap());
    let error = check(&headers).unwrap_err();
    assert_eq!(error.status(), 431);
    assert!(error.to_string().contains("101 header fields"), "{error}");

    let mut headers = HeaderMap::new();
    let value = "a".repeat(MAX_HEADER_BYTES - "x-big".len());
    headers.insert("x-big", value.parse().unwrap());
    assert!(check(&headers).is_ok());
    headers.insert("x", "a".parse().unwrap());
    assert_eq!(check(&headers).unwrap_err().code(), "headers_too_large");
}

#[test]
fn parse_applies_the_same_limits_to_raw_heads() {
    let at_limit: String = (0..MAX_HEADERS).map(|i| format!("x-h{i}: v\r\n")).collect();
    let head = format!("GET / HTTP/1.1\r\n{at_limit}\r\n");
    assert_eq!(complete(&head), Framing::Length(0));
    let head = format!("GET / HTTP/1.1\r\n{at_limit}x-one-more: v\r\n\r\n");
    assert_eq!(refused(&head).code(), "headers_too_large");

    let value = "a".repeat(MAX_HEADER_BYTES - "x-big".len());
    assert_eq!(
        complete(&format!("GET / HTTP/1.1\r\nx-big: {value}\r\n\r\n")),
        Framing::Length(0)
    );
    let error = refused(&format!("GET / HTTP/1.1\r\nx-big: {value}\r\nx: a\r\n\r\n"));
    assert_eq!(error.status(), 431, "{error}");

    let target = format!("/{}", "a".repeat(MAX_TARGET_LEN - 1));
    assert_eq!(
        complete(&format!("GET {target} HTTP/1.1\r\n\r\n")),
        Framing::Length(0)
    );
    let error = refused(&format!("GET {target}a HTTP/1.1\r\n\r\n"));
    assert_eq!(
        (error.status().as_u16(), error.code()),
        (414, "uri_too_long")
    );

    // Still incomplete past the longest head that could be within the limits.
    let endless = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD_LEN));
    assert_eq!(refused(&endless).status(), 431);
    assert_eq!(parse(&endless.as_bytes()[..1000]), Ok(Head::Partial));
}

#[test]
fn framing_follows_hyper_s_rules() {
    let cases = [
        (
            "POST / HTTP/1.1\r\ncontent-length: 12\r\n\r\n",
            Framing::Length(12),
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 12\r\ncontent-length: 12\r\n\r\n",
            Framing::Length(12),
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            Framing::Chunked,
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip, Chunked\r\n\r\n",
            Framing::Chunked,
        ),
        ("GET / HTTP/1.0\r\n\r\n", Framing::Length(0)),
        ("CONNECT h:1 HTTP/1.1\r\n\r\n", Framing::Upgrade),
        (
            "GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n",
            Framing::Upgrade,
        ),
        // hyper takes `upgrade` only from HTTP/1.1.
        (
            "GET / HTTP/1.0\r\nupgrade: websocket\r\n\r\n",
            Framing::Length(0),
        ),
        // Empty lines before a request line are skipped (RFC 9112 §2.2).
        ("\r\nGET / HTTP/1.1\r\n\r\n", Framing::Length(0)),
    ];
    for (head, framing) in cases {
        assert_eq!(complete(head), framing, "{head}");
    }
}

#[test]
fn malformed_heads_are_a_400_naming_what_is_wrong() {
    let cases = [
        ("G@T / HTTP/1.1\r\n\r\n", "invalid method"),
        ("GET / HTTP/1.1 extra\r\n\r\n", "invalid line ending"),
        ("GET / HTTP/3.0\r\n\r\n", "invalid HTTP version"),
        (
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
            "invalid header name",
        ),
        (
            "GET / HTTP/1.1\r\nx: a\u{1}b\r\n\r\n",
            "invalid header value",
        ),
        ("GET http://[ HTTP/1.1\r\n\r\n", "request target"),
        (
            "POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "two different content-length values (1 and 2)",
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "invalid content-length",
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 1, 1\r\n\r\n",
            "invalid content-length",
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "invalid content-length",
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "last coding is not chunked",
        ),
        (
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.0",
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            "both content-length and transfer-encoding",
        ),
    ];
    for (head, what) in cases {
        let error = refused(head);
        assert_eq!(error.status(), 400, "{head}: {error}");
        assert_eq!(error.code(), "invalid_request_head", "{head}");
        assert!(error.to_string().contains(what), "{head}: {error}");
    }
}

//! The `mock-engine` binary's contract: it prints `NAME URL` per replica, serves, stops
//! cleanly on SIGTERM (draining as vLLM does), and rejects bad flags with a clear message and a failing status.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_mock-engine");

/// A running `mock-engine` child and the URLs it printed, in order.
struct Engine {
    child: Child,
    urls: Vec<String>,
}

/// Starts the binary with `args` and reads one `NAME URL` line per name in `names`.
fn spawn_engine(args: &[&str], names: &[&str]) -> Engine {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mock-engine");
    // Lines are read on a thread and awaited with a deadline, so a binary that never
    // prints fails the test instead of hanging it.
    let stdout = child.stdout.take().expect("stdout");
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut urls = Vec::new();
    for expected in names {
        let Ok(line) = lines_rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("mock-engine printed no line for replica {expected}");
        };
        let (name, url) = line.split_once(' ').expect("NAME URL");
        assert_eq!(name, *expected);
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        urls.push(url.to_owned());
    }
    Engine { child, urls }
}

impl Engine {
    fn addr(&self, i: usize) -> String {
        self.urls[i].trim_start_matches("http://").to_owned()
    }

    /// Sends SIGTERM, as the kubelet does.
    fn terminate(&self) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success());
    }

    /// Waits (bounded) for the process to exit; its status.
    fn exit_status(self) -> std::process::ExitStatus {
        let mut child = self.child;
        let pid = child.id().to_string();
        let (exit_tx, exit_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = exit_tx.send(child.wait());
        });
        let Ok(status) = exit_rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("mock-engine did not stop on SIGTERM");
        };
        status.expect("wait")
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Reads until `needle` or the end of the connection; what was read.
async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let read = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
            if String::from_utf8_lossy(&seen).contains(needle) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("read within the deadline");
    String::from_utf8_lossy(&seen).into_owned()
}

/// A streamed chat completion of `tokens` tokens on a fresh connection, read up to its
/// first content token.
async fn streaming(addr: &str, tokens: u32) -> TcpStream {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hello"}}],"max_tokens":{tokens},"ignore_eos":true,"stream":true}}"#
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let first = read_until(&mut stream, "\"content\":\" ").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    stream
}

/// Whether a request gets no HTTP answer: refused, or closed before a byte.
async fn gets_no_answer(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return true;
    };
    let _ = stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await;
    read_until(&mut stream, "\u{0}never\u{0}").await.is_empty()
}

#[test]
fn prints_replicas_serves_and_stops_on_sigterm() {
    let engine = spawn_engine(
        &[
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--name",
            "A,B",
            "--profile",
            "fast",
            "--model",
            "m",
        ],
        &["A", "B"],
    );
    assert_ne!(engine.urls[0], engine.urls[1]);
    let version = runtime().block_on(async {
        let mut stream = TcpStream::connect(engine.addr(0)).await.expect("connect");
        stream
            .write_all(b"GET /version HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    });
    assert!(version.starts_with("HTTP/1.1 200"), "{version}");
    assert!(version.ends_with(r#"{"version":"0.32.0"}"#), "{version}");
    engine.terminate();
    let status = engine.exit_status();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}

/// vLLM 0.11 on SIGTERM: the listener closes at once, the stream in flight runs to its end,
/// then the process exits 0. The L20 profile at real time makes 48 tokens last about 3 s.
#[test]
fn sigterm_refuses_new_requests_and_lets_the_stream_in_flight_finish() {
    let engine = spawn_engine(
        &[
            "--listen",
            "127.0.0.1:0",
            "--profile",
            "l20-qwen27b-fp8",
            "--model",
            "m",
        ],
        &["mock-0"],
    );
    let addr = engine.addr(0);
    let rest = runtime().block_on(async {
        let mut stream = streaming(&addr, 48).await;
        engine.terminate();
        // The handler runs on the engine's own runtime: wait until the listener is gone.
        let refused = async {
            while !gets_no_answer(&addr).await {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), refused)
            .await
            .expect("new requests refused after SIGTERM");
        read_until(&mut stream, "data: [DONE]").await
    });
    assert!(rest.contains("data: [DONE]"), "the stream was cut: {rest}");
    let status = engine.exit_status();
    assert!(status.success(), "clean exit after the drain: {status}");
}

/// `--shutdown-timeout 0` (vLLM 0.18's default) aborts the stream at once and exits 0.
#[test]
fn a_zero_shutdown_timeout_cuts_the_stream_in_flight() {
    let engine = spawn_engine(
        &[
            "--listen",
            "127.0.0.1:0",
            "--profile",
            "l20-qwen27b-fp8",
            "--model",
            "m",
            "--shutdown-timeout",
            "0",
        ],
        &["mock-0"],
    );
    let addr = engine.addr(0);
    let rest = runtime().block_on(async {
        let mut stream = streaming(&addr, 2000).await;
        engine.terminate();
        read_until(&mut stream, "data: [DONE]").await
    });
    assert!(!rest.contains("[DONE]"), "the stream was not cut: {rest}");
    let status = engine.exit_status();
    assert!(status.success(), "clean exit: {status}");
}

#[test]
fn bad_flags_fail_with_a_message() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["--profile", "no-such-profile"],
            "unknown engine profile `no-such-profile`",
        ),
        (
            &["--time-scale", "0"],
            "--time-scale must be a finite number > 0",
        ),
        (
            &["--fail", "explode"],
            "unknown failure directive `explode`",
        ),
        (&["--replicas", "2"], "--port-base"),
        (
            &[
                "--kv-events-config",
                r#"{"enable_kv_cache_events":true,"bogus":1}"#,
            ],
            "unknown field `bogus`",
        ),
        (
            &["--kv-events-config", r#"{"endpoint":"ipc:///tmp/kv"}"#],
            "`endpoint` = `ipc:///tmp/kv`",
        ),
        (
            &["--kv-events-config", r#"{"buffer_steps":"many"}"#],
            "`buffer_steps`",
        ),
        (&["--kv-events-config", "{"], "--kv-events-config"),
    ];
    for (args, needle) in cases {
        let output = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run mock-engine");
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

//! The `mock-engine` binary's contract: it prints `NAME URL` per replica, serves, stops
//! cleanly on SIGTERM, and rejects bad flags with a clear message and a failing status.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_mock-engine");

#[test]
fn prints_replicas_serves_and_stops_on_sigterm() {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"])
        .args(["--name", "A,B", "--profile", "fast", "--model", "m"])
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
    for expected in ["A", "B"] {
        let Ok(line) = lines_rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("mock-engine printed no line for replica {expected}");
        };
        let (name, url) = line.split_once(' ').expect("NAME URL");
        assert_eq!(name, expected);
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        urls.push(url.to_owned());
    }
    assert_ne!(urls[0], urls[1]);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let version = runtime.block_on(async {
        let addr = urls[0].trim_start_matches("http://").to_owned();
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /version HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.expect("read");
        answer
    });
    assert!(version.starts_with("HTTP/1.1 200"), "{version}");
    assert!(version.ends_with(r#"{"version":"0.11.0"}"#), "{version}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let pid = child.id().to_string();
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let Ok(status) = exit_rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        panic!("mock-engine did not stop on SIGTERM");
    };
    let status = status.expect("wait");
    assert!(status.success(), "clean exit on SIGTERM: {status}");
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

//! `prefixgate route-replay` as a user runs it: the binary on a trace file or stdin, the
//! router configured by the same environment and flags as serving, one JSON decision per
//! line, errors in place with their line number, and a non-zero exit when a line was refused.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The binary with no routing setting inherited from the environment running the tests.
fn prefixgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_prefixgate"));
    for name in router_core::config::ENV_NAMES {
        command.env_remove(name);
    }
    for (name, _) in std::env::vars() {
        if name.starts_with("PREFIXGATE_ROUTING_") {
            command.env_remove(name);
        }
    }
    command
}

fn run_with_stdin(mut command: Command, input: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn decisions(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// A trace file under the temp dir, removed when dropped.
struct TraceFile(PathBuf);

impl TraceFile {
    fn new(name: &str, lines: &[String]) -> TraceFile {
        let path = std::env::temp_dir().join(format!(
            "prefixgate-replay-{}-{name}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        TraceFile(path)
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn two_pods(a: u64, b: u64, text: &str) -> String {
    serde_json::json!({
        "model": "m",
        "pods": [{"name": "a", "outstanding": a}, {"name": "b", "outstanding": b}],
        "strategy": "prefix-cache",
        "text": text,
    })
    .to_string()
}

#[test]
fn a_trace_replays_stickiness_the_imbalance_gate_and_golden_hashes() {
    let trace = TraceFile::new(
        "sticky",
        &[
            two_pods(0, 1, "abcdegfh"),
            two_pods(5, 0, "abcdegfh"),
            two_pods(17, 0, "abcdegfh"),
            two_pods(0, 0, "zzzz"),
        ],
    );
    let output = prefixgate()
        .env("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "4")
        .args(["route-replay", "--emit-hashes", "--seed", "1", "--trace"])
        .arg(&trace.0)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("4 routed, 0 done, 0 refused"), "{stderr}");
    let out = decisions(&output);
    assert_eq!(out.len(), 4);
    // Line 1: nothing cached, the less loaded pod; the SPEC's golden vector.
    assert_eq!(out[0]["pod"], "a");
    assert_eq!(out[0]["selection"], "least_request_fallback");
    assert_eq!(out[0]["match_percent"], 0);
    assert_eq!(out[0]["bucket"], "0");
    assert_eq!(
        out[0]["hashes"],
        serde_json::json!(["0xe47f32a254016b00", "0xc46f313fc4e609b1"])
    );
    // Line 2: the index remembers line 1, and the busier owner keeps the prefix.
    assert_eq!(out[1]["pod"], "a");
    assert_eq!(out[1]["selection"], "prefix_match");
    assert_eq!(out[1]["match_percent"], 100);
    assert_eq!(out[1]["bucket"], "76-100");
    assert_eq!(out[1]["imbalance"], false);
    // Line 3: 17 − 0 > 16, so only the idle pod may be matched.
    assert_eq!(out[2]["pod"], "b");
    assert_eq!(out[2]["imbalance"], true);
    assert_eq!(out[2]["selection"], "least_request_fallback");
    // Line 4: one full block, its own hash.
    assert_eq!(out[3]["hashes"].as_array().map(Vec::len), Some(1));
}

#[test]
fn done_lines_and_bad_lines_from_stdin() {
    let line =
        r#"{"model":"m","pods":[{"name":"a"},{"name":"b"}],"strategy":"least-request","text":"x"}"#;
    let input = [
        r#"{"model":"m","pods":[{"name":"a","outstanding":0},{"name":"b","outstanding":2}],"strategy":"least-request","text":"x"}"#,
        line,
        r#"{"done":"b"}"#,
        line,
        r#"{"done":"c"}"#,
        "{broken",
        r#"{"done":"a"}"#,
        r#"{"done":"a"}"#,
        line,
    ]
    .join("\n");
    let output = run_with_stdin(
        {
            let mut command = prefixgate();
            command.args(["route-replay", "--seed", "3", "--trace", "-"]);
            command
        },
        &input,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "a refused line fails: {stderr}"
    );
    assert!(stderr.contains("4 routed, 3 done, 2 refused"), "{stderr}");
    let out = decisions(&output);
    let pods: Vec<&str> = out.iter().filter_map(|d| d["pod"].as_str()).collect();
    // a(0) vs b(2) → a; a(1) vs b(2) → a; done b; a(2) vs b(1) → b; done a twice; a(0) → a.
    assert_eq!(pods, ["a", "a", "b", "a"]);
    let errors: Vec<&Value> = out.iter().filter(|d| d.get("error").is_some()).collect();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["line"], 5);
    assert!(
        errors[0]["error"].as_str().unwrap().contains("\"c\""),
        "{}",
        errors[0]
    );
    assert_eq!(errors[1]["line"], 6);
    assert!(
        out[0].get("hashes").is_none(),
        "hashes only with --emit-hashes"
    );
    assert_eq!(out[0]["selection"], Value::Null);
}

#[test]
fn the_same_seed_replays_the_same_decisions() {
    let lines: Vec<String> = (0..40)
        .map(|i| {
            serde_json::json!({
                "model": "m",
                "pods": [{"name": "a", "outstanding": 0}, {"name": "b", "outstanding": 0},
                         {"name": "c", "outstanding": 0}],
                "strategy": if i % 2 == 0 { "random" } else { "prefix-cache" },
                "text": format!("family-{} tail {i}", i % 3),
            })
            .to_string()
        })
        .collect();
    let trace = TraceFile::new("seeded", &lines);
    let replay = |seed: &str| {
        let output = prefixgate()
            .args([
                "--set",
                "routing.block_size=4",
                "route-replay",
                "--seed",
                seed,
                "--trace",
            ])
            .arg(&trace.0)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let first = replay("5");
    assert_eq!(first.lines().count(), 40);
    assert_eq!(first, replay("5"));
    let pods: std::collections::HashSet<String> = first
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["pod"].to_string())
        .collect();
    assert!(
        pods.len() > 1,
        "40 decisions over 3 idle pods all went to {pods:?}"
    );
}

#[test]
fn router_flags_shape_the_hashes() {
    let output = run_with_stdin(
        {
            let mut command = prefixgate();
            command.args([
                "--set",
                "routing.block_size=4",
                "--set",
                "routing.hash_seed=42",
                "route-replay",
                "--emit-hashes",
            ]);
            command
        },
        &two_pods(0, 0, "abcdegfh"),
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        decisions(&output)[0]["hashes"],
        serde_json::json!(["0xc785304b0ea77c8f", "0x88756255c2ed0ae4"])
    );
}

#[test]
fn a_missing_trace_or_a_bad_setting_fails_with_its_name() {
    let output = prefixgate()
        .args(["route-replay", "--trace", "/nonexistent/trace.jsonl"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/trace.jsonl"), "{stderr}");
    let output = prefixgate()
        .env("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "big")
        .args(["route-replay", "--trace", "/nonexistent/trace.jsonl"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("AIBRIX_PREFIX_CACHE_BLOCK_SIZE"),
        "{stderr}"
    );
}

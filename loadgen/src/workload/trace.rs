//! A request trace in the Mooncake FAST'25 format, and the slice of it a replay sends.
//!
//! One JSON object per line:
//! ```text
//! {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, …, 78]}
//! ```
//! `timestamp` is milliseconds since the trace began (never decreasing from line to line),
//! `input_length` the prompt's tokens, `output_length` the tokens generated, and `hash_ids`
//! one id per started 512-token block of the prompt ([`super::blocks`]): equal ids at the same
//! position mean equal block contents, so a shared run of leading ids is a shared prefix.
//! Unknown keys are errors; blank lines are skipped. A line that cannot be used stops the
//! whole read with an error naming the line (counted from 1) and the problem.
//!
//! A replay sends a slice ([`TraceSlice`]): the requests whose timestamps fall in
//! `[start, start + duration)` seconds, at most `limit` of them, with their gaps divided by
//! `speedup`. Each becomes a [`PlannedRequest`] whose prompt is built when it is sent
//! ([`Prompt::Blocks`]) and whose `max_tokens` is the trace's `output_length` (sent with
//! `ignore_eos`, so exactly that many tokens come back).

use std::path::Path;

use serde::Deserialize;

use super::blocks::{BLOCK_TOKENS, BlockPrompt, MAX_BLOCK_ID};
use super::planned::{PlannedRequest, Prompt};

/// One line as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    timestamp: u64,
    input_length: usize,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// Milliseconds since the trace began.
    pub timestamp_ms: u64,
    /// The prompt: its blocks' ids and its length in tokens.
    pub prompt: BlockPrompt,
    /// Tokens to generate.
    pub output_tokens: u32,
}

/// A trace that cannot be read; the message names the file and, for a bad line, the line.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: no requests")]
    Empty { path: String },
    #[error("trace slice: {0}")]
    Slice(String),
}

/// A whole trace, validated.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Where it came from (as given).
    pub origin: String,
    pub requests: Vec<TraceRequest>,
}

impl Trace {
    /// Reads and validates a trace file.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: origin.clone(),
            source,
        })?;
        Trace::parse(&text, &origin)
    }

    /// Parses and validates trace text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Trace, TraceError> {
        let mut requests = Vec::new();
        let mut last_timestamp = 0;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: String| TraceError::Line {
                path: origin.to_owned(),
                line: n + 1,
                message,
            };
            let parsed: TraceLine = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            let request = check_line(parsed, last_timestamp).map_err(bad)?;
            last_timestamp = request.timestamp_ms;
            requests.push(request);
        }
        if requests.is_empty() {
            return Err(TraceError::Empty {
                path: origin.to_owned(),
            });
        }
        Ok(Trace {
            origin: origin.to_owned(),
            requests,
        })
    }

    /// Seconds from the first request to the last.
    pub fn duration_s(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(first), Some(last)) => ms_to_s(last.timestamp_ms - first.timestamp_ms),
            _ => 0.0,
        }
    }
}

/// Checks one parsed line against the format's rules.
fn check_line(line: TraceLine, last_timestamp: u64) -> Result<TraceRequest, String> {
    if line.timestamp < last_timestamp {
        return Err(format!(
            "timestamp {} is earlier than the line before's {last_timestamp} (a trace is in time order)",
            line.timestamp
        ));
    }
    if line.input_length == 0 {
        return Err("input_length must be at least 1".into());
    }
    if line.output_length == 0 {
        return Err("output_length must be at least 1".into());
    }
    let blocks = line.input_length.div_ceil(BLOCK_TOKENS);
    if line.hash_ids.len() != blocks {
        return Err(format!(
            "input_length {} needs {blocks} hash ids (one per started {BLOCK_TOKENS}-token block), got {}",
            line.input_length,
            line.hash_ids.len()
        ));
    }
    if let Some(id) = line.hash_ids.iter().find(|&&id| id > MAX_BLOCK_ID) {
        return Err(format!("hash id {id} is larger than {MAX_BLOCK_ID}"));
    }
    Ok(TraceRequest {
        timestamp_ms: line.timestamp,
        prompt: BlockPrompt {
            ids: line.hash_ids,
            tokens: line.input_length,
        },
        output_tokens: line.output_length,
    })
}

fn ms_to_s(ms: u64) -> f64 {
    // Trace timestamps are far below 2^53 ms, so the conversion is exact.
    ms as f64 / 1000.0
}

/// Which part of a trace a replay sends, and how fast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceSlice {
    /// Seconds of trace time to skip (from the trace's first timestamp).
    pub start_s: f64,
    /// Seconds of trace time to send (`None`: to the end).
    pub duration_s: Option<f64>,
    /// At most this many requests (`None`: all in the window).
    pub limit: Option<usize>,
    /// Inter-arrival times are divided by this (2 sends the slice twice as fast).
    pub speedup: f64,
}

impl Default for TraceSlice {
    fn default() -> Self {
        TraceSlice {
            start_s: 0.0,
            duration_s: None,
            limit: None,
            speedup: 1.0,
        }
    }
}

impl TraceSlice {
    /// Refuses values that select nothing sensible, naming the option.
    pub fn validate(&self) -> Result<(), TraceError> {
        let bad = |m: String| Err(TraceError::Slice(m));
        if !(self.start_s.is_finite() && self.start_s >= 0.0) {
            return bad(format!("--start must be ≥ 0 seconds, got {}", self.start_s));
        }
        if let Some(d) = self.duration_s
            && !(d.is_finite() && d > 0.0)
        {
            return bad(format!("--duration must be > 0 seconds, got {d}"));
        }
        if self.limit == Some(0) {
            return bad("--limit must be at least 1".into());
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return bad(format!("--speedup must be > 0, got {}", self.speedup));
        }
        Ok(())
    }

    /// The slice's requests as planned requests, in trace order, the first at time 0.
    pub fn plan(&self, trace: &Trace) -> Result<Vec<PlannedRequest>, TraceError> {
        self.validate()?;
        let first = trace.requests.first().map_or(0, |r| r.timestamp_ms);
        let in_window = |r: &&TraceRequest| {
            let t = ms_to_s(r.timestamp_ms - first);
            t >= self.start_s && self.duration_s.is_none_or(|d| t < self.start_s + d)
        };
        let chosen: Vec<&TraceRequest> = trace
            .requests
            .iter()
            .filter(in_window)
            .take(self.limit.unwrap_or(usize::MAX))
            .collect();
        let Some(origin) = chosen.first().map(|r| r.timestamp_ms) else {
            return Err(TraceError::Slice(format!(
                "no request of {} falls in the slice (start {} s, duration {:?} s)",
                trace.origin, self.start_s, self.duration_s
            )));
        };
        Ok(chosen
            .into_iter()
            .enumerate()
            .map(|(index, r)| PlannedRequest {
                index,
                family: 0,
                at: ms_to_s(r.timestamp_ms - origin) / self.speedup,
                prompt: Prompt::Blocks(r.prompt.clone()),
                max_tokens: r.output_tokens,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE: &str = r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 500, "input_length": 512, "output_length": 2, "hash_ids": [0]}

{"timestamp": 2500, "input_length": 1025, "output_length": 9, "hash_ids": [0, 1, 7]}
"#;

    #[test]
    fn a_trace_parses_and_slices() {
        let trace = Trace::parse(THREE, "t.jsonl").unwrap();
        assert_eq!(trace.requests.len(), 3);
        assert_eq!(trace.duration_s(), 2.5);
        assert_eq!(trace.requests[2].prompt.ids, vec![0, 1, 7]);

        let all = TraceSlice::default().plan(&trace).unwrap();
        let times: Vec<f64> = all.iter().map(|r| r.at).collect();
        assert_eq!(times, vec![0.0, 0.5, 2.5]);
        assert_eq!(all[2].max_tokens, 9);
        assert_eq!(all[2].index, 2);

        let slice = TraceSlice {
            start_s: 0.4,
            duration_s: Some(3.0),
            limit: Some(1),
            speedup: 2.0,
        };
        let one = slice.plan(&trace).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].index, one[0].at, one[0].max_tokens), (0, 0.0, 2));

        let fast = TraceSlice {
            speedup: 2.0,
            ..TraceSlice::default()
        };
        assert_eq!(fast.plan(&trace).unwrap()[2].at, 1.25);
    }

    #[test]
    fn bad_lines_are_named_with_their_number_and_problem() {
        let good = r#"{"timestamp": 10, "input_length": 512, "output_length": 1, "hash_ids": [3]}"#;
        let cases = [
            ("not json", "line 2", "expected"),
            (
                r#"{"timestamp": 11, "input_length": 513, "output_length": 1, "hash_ids": [3]}"#,
                "line 2",
                "needs 2 hash ids",
            ),
            (
                r#"{"timestamp": 9, "input_length": 512, "output_length": 1, "hash_ids": [3]}"#,
                "line 2",
                "earlier",
            ),
            (
                r#"{"timestamp": 11, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
                "line 2",
                "input_length",
            ),
            (
                r#"{"timestamp": 11, "input_length": 5, "output_length": 0, "hash_ids": [1]}"#,
                "line 2",
                "output_length",
            ),
            (
                r#"{"timestamp": 11, "input_length": 5, "output_length": 1, "hash_ids": [1], "x": 1}"#,
                "line 2",
                "unknown field",
            ),
            (
                r#"{"timestamp": 11, "input_length": 5, "output_length": 1, "hash_ids": [-1]}"#,
                "line 2",
                "invalid value",
            ),
            (
                r#"{"timestamp": 11, "input_length": 5, "output_length": 1, "hash_ids": [1152921504606846976]}"#,
                "line 2",
                "larger than",
            ),
            (
                r#"{"timestamp": 11, "output_length": 1, "hash_ids": [1]}"#,
                "line 2",
                "missing field `input_length`",
            ),
        ];
        for (line, at, problem) in cases {
            let text = format!("{good}\n{line}\n{good}\n");
            let err = Trace::parse(&text, "t.jsonl").unwrap_err().to_string();
            assert!(
                err.contains("t.jsonl") && err.contains(at) && err.contains(problem),
                "{problem:?}: {err}"
            );
        }
        let err = Trace::parse("\n\n", "e.jsonl").unwrap_err().to_string();
        assert!(err.contains("no requests"), "{err}");
    }

    #[test]
    fn an_empty_or_bad_slice_is_refused() {
        let trace = Trace::parse(THREE, "t.jsonl").unwrap();
        let late = TraceSlice {
            start_s: 100.0,
            ..TraceSlice::default()
        };
        assert!(
            late.plan(&trace)
                .unwrap_err()
                .to_string()
                .contains("no request")
        );
        for (slice, option) in [
            (
                TraceSlice {
                    speedup: 0.0,
                    ..TraceSlice::default()
                },
                "--speedup",
            ),
            (
                TraceSlice {
                    limit: Some(0),
                    ..TraceSlice::default()
                },
                "--limit",
            ),
            (
                TraceSlice {
                    duration_s: Some(-1.0),
                    ..TraceSlice::default()
                },
                "--duration",
            ),
            (
                TraceSlice {
                    start_s: f64::NAN,
                    ..TraceSlice::default()
                },
                "--start",
            ),
        ] {
            let err = slice.plan(&trace).unwrap_err().to_string();
            assert!(err.contains(option), "{err}");
        }
    }
}

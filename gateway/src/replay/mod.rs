//! `prefixgate route-replay`: replays a JSONL trace of routing requests through router-core
//! offline and prints one decision per line (SPEC §2.5), so any policy can be checked
//! against recorded traffic, AIBrix's included.
//!
//! This module is the I/O edge: it reads lines (a file, or stdin for `-`), hands each to the
//! pure [`replayer::Replayer`], and writes the results. The line format is in [`trace`].
//! A line that cannot be replayed prints `{"error":"…","line":N}` in its place (N counts
//! from 1, blank lines included) and the replay goes on, so one bad line does not hide the
//! decisions after it; the exit status is then 1. The router settings come from the same
//! `--config` file, AIBrix environment variables and flags as serving.

pub mod replayer;
pub mod trace;

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use replayer::Replayer;
use trace::ReplayError;

/// Where the trace comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceSource {
    Stdin,
    File(PathBuf),
}

impl TraceSource {
    /// `None` and `-` read stdin; anything else is a file path.
    pub fn from_flag(path: Option<&Path>) -> Self {
        match path {
            None => TraceSource::Stdin,
            Some(path) if path.as_os_str() == "-" => TraceSource::Stdin,
            Some(path) => TraceSource::File(path.to_owned()),
        }
    }
}

/// How a replay went: lines routed, `done` lines applied, lines refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    pub routed: u64,
    pub done: u64,
    pub errors: u64,
}

/// Why the replay as a whole stopped (a bad line does not stop it).
#[derive(Debug, thiserror::Error)]
pub enum ReplayIoError {
    #[error("cannot open trace {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot read the trace at line {line}: {source}")]
    Read { line: u64, source: io::Error },
    #[error("cannot write the decisions: {0}")]
    Write(#[from] io::Error),
    #[error("cannot encode a decision: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Opens `source` and replays it into `out`.
pub fn run(
    source: &TraceSource,
    replayer: &mut Replayer,
    out: &mut impl Write,
) -> Result<ReplaySummary, ReplayIoError> {
    match source {
        TraceSource::Stdin => replay(io::stdin().lock(), replayer, out),
        TraceSource::File(path) => {
            let file = File::open(path).map_err(|source| ReplayIoError::Open {
                path: path.clone(),
                source,
            })?;
            replay(BufReader::new(file), replayer, out)
        }
    }
}

/// Replays every line of `input` into `out`, flushing after each so that a replay fed from a
/// pipe answers line by line.
pub fn replay(
    mut input: impl BufRead,
    replayer: &mut Replayer,
    out: &mut impl Write,
) -> Result<ReplaySummary, ReplayIoError> {
    let mut summary = ReplaySummary::default();
    let mut buffer = Vec::new();
    // Bounded by the input: each pass consumes one line, and 0 bytes read is the end.
    for line_number in 1.. {
        buffer.clear();
        let read = input
            .read_until(b'\n', &mut buffer)
            .map_err(|source| ReplayIoError::Read {
                line: line_number,
                source,
            })?;
        if read == 0 {
            break;
        }
        let result = match std::str::from_utf8(&buffer) {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => replayer.line(line.trim_end()).map_err(|e| e.to_string()),
            Err(error) => Err(format!("line is not UTF-8: {error}")),
        };
        match result {
            Ok(Some(decision)) => {
                summary.routed += 1;
                serde_json::to_writer(&mut *out, &decision)?;
            }
            Ok(None) => {
                summary.done += 1;
                continue;
            }
            Err(error) => {
                summary.errors += 1;
                let error = ReplayError {
                    error: &error,
                    line: line_number,
                };
                serde_json::to_writer(&mut *out, &error)?;
            }
        }
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use router_core::{Router, RouterConfig, Strategy};

    use super::*;

    fn replay_text(input: &[u8]) -> (String, ReplaySummary) {
        let router = Router::new(RouterConfig::default()).unwrap();
        let mut replayer = Replayer::new(router, Strategy::LeastRequest, Some(0), false);
        let mut out = Vec::new();
        let summary = replay(input, &mut replayer, &mut out).unwrap();
        (String::from_utf8(out).unwrap(), summary)
    }

    #[test]
    fn bad_lines_print_an_error_with_their_number_and_the_replay_goes_on() {
        let input = b"{\"model\":\"m\",\"pods\":[{\"name\":\"a\"}],\"text\":\"x\"}\n\
            \n\
            not json\n\
            {\"done\":\"a\"}\n\
            \xff\xfe\n\
            {\"model\":\"m\",\"pods\":[{\"name\":\"b\"}],\"text\":\"x\"}";
        let (out, summary) = replay_text(input);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(lines[0]["pod"], "a");
        assert_eq!(lines[1]["line"], 3, "blank lines keep their number");
        assert!(
            lines[1]["error"]
                .as_str()
                .unwrap()
                .contains("not a trace object")
        );
        assert_eq!(lines[2]["line"], 5);
        assert!(lines[2]["error"].as_str().unwrap().contains("UTF-8"));
        assert_eq!(lines[3]["pod"], "b", "the last line has no newline");
        assert_eq!(
            summary,
            ReplaySummary {
                routed: 2,
                done: 1,
                errors: 2
            }
        );
    }

    #[test]
    fn crlf_lines_are_accepted() {
        let (out, summary) =
            replay_text(b"{\"model\":\"m\",\"pods\":[{\"name\":\"a\"}],\"text\":\"x\"}\r\n");
        assert_eq!(summary.errors, 0, "{out}");
    }

    #[test]
    fn dash_and_no_flag_read_stdin() {
        assert_eq!(TraceSource::from_flag(None), TraceSource::Stdin);
        assert_eq!(
            TraceSource::from_flag(Some(Path::new("-"))),
            TraceSource::Stdin
        );
        assert_eq!(
            TraceSource::from_flag(Some(Path::new("t.jsonl"))),
            TraceSource::File("t.jsonl".into())
        );
    }

    #[test]
    fn a_missing_trace_file_is_named() {
        let router = Router::new(RouterConfig::default()).unwrap();
        let mut replayer = Replayer::new(router, Strategy::LeastRequest, None, false);
        let source = TraceSource::File("/nonexistent/trace.jsonl".into());
        let error = run(&source, &mut replayer, &mut Vec::new()).unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/trace.jsonl"),
            "{error}"
        );
    }
}

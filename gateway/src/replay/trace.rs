//! The wire format of `prefixgate route-replay`: one JSON object per input line, one per
//! output line (SPEC §2.5).
//!
//! Input, one of:
//! ```text
//! {"model":"m","pods":[{"name":"a","outstanding":3},{"name":"b"}],
//!  "strategy":"prefix-cache","text":"…"}      # or "messages":[…] (chat) / "prompt":"…"
//! {"done":"a"}                                 # a completion: a's count goes down by one
//! ```
//! `strategy` may be left out (the configured default strategy decides); `outstanding` may
//! be left out (the replay's running count for that pod is used, see [`super::replayer`]).
//! Unknown keys are errors, so a misspelt `outsanding` cannot silently read as 0.
//!
//! Output, one per routing line (`done` lines print nothing):
//! ```text
//! {"pod":"a","selection":"prefix_match","match_percent":100,"bucket":"76-100",
//!  "imbalance":false,"hashes":["0x…"]}        # "hashes" only with --emit-hashes
//! {"error":"…","line":7}                       # a line that could not be replayed
//! ```
//! `selection`, `match_percent` and `bucket` are `null` when the decision did not consult the
//! prefix index (`random`, `least-request`, or a single pod, as in AIBrix).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// One input line, before it is checked: every key optional so that the checks can name
/// what is missing or misplaced.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceLine {
    pub model: Option<String>,
    pub pods: Option<Vec<TracePod>>,
    pub strategy: Option<String>,
    pub text: Option<String>,
    /// Kept raw: the chat text is extracted by router-core's AIBrix rules from these bytes.
    pub messages: Option<Box<RawValue>>,
    /// Kept raw: router-core reads every prompt form (string, batch, token ids) from it.
    pub prompt: Option<Box<RawValue>>,
    pub done: Option<String>,
}

/// A ready pod of a routing line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracePod {
    pub name: String,
    pub outstanding: Option<u64>,
}

/// One output line for a routed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayDecision {
    pub pod: String,
    pub selection: Option<&'static str>,
    pub match_percent: Option<u8>,
    pub bucket: Option<&'static str>,
    pub imbalance: bool,
    /// `0x` and 16 lowercase hex digits per full block; present only with `--emit-hashes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hashes: Option<Vec<String>>,
}

/// The output line for a line that could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayError<'a> {
    pub error: &'a str,
    pub line: u64,
}

/// A block hash as the replay prints it (fixed width, so traces diff cleanly).
pub fn hash_hex(hash: u64) -> String {
    format!("{hash:#018x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_print_with_fixed_width() {
        assert_eq!(hash_hex(0x0d5de48a1f137d93), "0x0d5de48a1f137d93");
        assert_eq!(hash_hex(0), "0x0000000000000000");
    }

    #[test]
    fn hashes_are_left_out_unless_asked_for() {
        let mut decision = ReplayDecision {
            pod: "a".into(),
            selection: None,
            match_percent: None,
            bucket: None,
            imbalance: false,
            hashes: None,
        };
        let text = serde_json::to_string(&decision).unwrap();
        assert_eq!(
            text,
            r#"{"pod":"a","selection":null,"match_percent":null,"bucket":null,"imbalance":false}"#
        );
        decision.hashes = Some(vec![hash_hex(1)]);
        let text = serde_json::to_string(&decision).unwrap();
        assert!(
            text.ends_with(r#""hashes":["0x0000000000000001"]}"#),
            "{text}"
        );
    }

    #[test]
    fn misspelt_keys_are_refused_by_name() {
        let error = serde_json::from_str::<TraceLine>(r#"{"model":"m","modle":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("modle"), "{error}");
        let error = serde_json::from_str::<TraceLine>(r#"{"pods":[{"name":"a","outsanding":1}]}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("outsanding"), "{error}");
    }
}

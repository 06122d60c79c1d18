//! The pure part of `route-replay`: one trace line in, one decision (or an error) out.
//!
//! A [`Replayer`] owns a [`Router`] built from the same settings as serving, so the prefix
//! index persists from line to line: that is what lets a trace reproduce AIBrix's stateful
//! decisions (a prefix routed on line 1 is matched on line 2). No I/O and no clock: the index
//! is given a fixed time, so no block expires during a replay (capacity eviction still
//! applies).
//!
//! Outstanding counts: a pod's `outstanding` in a line is authoritative for that line; the
//! replay adds nothing to it (each line builds fresh loads and drops the decision's guard).
//! The replay also keeps a running count per pod name, for lines that leave `outstanding`
//! out: the last count a line stated for the pod, plus one per request routed to it since,
//! minus one per `{"done": pod}`. A `done` for a pod with no running request is an error.
//! `prefix-load` sees only these counts (no engine statistics, no in-flight block work).

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use router_core::text::{BodyError, Endpoint, routing_fields};
use router_core::tokenize::TokenizeError;
use router_core::{Candidate, PodLoad, RouteError, RouteRequest, Router, Strategy};

use super::trace::{ReplayDecision, TraceLine, TracePod, hash_hex};

/// Why a line could not be replayed. The driver adds the line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not a trace object: {0}")]
    Json(String),
    #[error("{0}")]
    Shape(String),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    #[error("done for pod {0:?}, which has no outstanding request in this replay")]
    NothingOutstanding(String),
}

fn shape(message: impl Into<String>) -> LineError {
    LineError::Shape(message.into())
}

/// Replays trace lines through one router, keeping the prefix index and running counts.
#[derive(Debug)]
pub struct Replayer {
    router: Router,
    default_strategy: Strategy,
    rng: StdRng,
    emit_hashes: bool,
    /// Running outstanding count per pod name, for lines that leave `outstanding` out.
    counts: HashMap<String, u64>,
}

impl Replayer {
    /// A replayer over `router`; `seed` makes every random tie-break reproducible (without
    /// it, the tie-breaks are seeded from the OS).
    pub fn new(
        router: Router,
        default_strategy: Strategy,
        seed: Option<u64>,
        emit_hashes: bool,
    ) -> Self {
        let seed = seed.unwrap_or_else(|| rand::rng().random());
        Replayer {
            router,
            default_strategy,
            rng: StdRng::seed_from_u64(seed),
            emit_hashes,
            counts: HashMap::new(),
        }
    }

    /// Replays one line: `Ok(Some(_))` for a routing line, `Ok(None)` for a `done` line.
    pub fn line(&mut self, line: &str) -> Result<Option<ReplayDecision>, LineError> {
        let trace: TraceLine =
            serde_json::from_str(line).map_err(|e| LineError::Json(e.to_string()))?;
        if let Some(pod) = trace.done {
            if trace.model.is_some()
                || trace.pods.is_some()
                || trace.strategy.is_some()
                || trace.text.is_some()
                || trace.messages.is_some()
                || trace.prompt.is_some()
            {
                return Err(shape("a `done` line has no other key"));
            }
            self.done(pod)?;
            return Ok(None);
        }
        self.route(line, trace).map(Some)
    }

    fn done(&mut self, pod: String) -> Result<(), LineError> {
        match self.counts.get_mut(&pod) {
            Some(count) if *count > 0 => {
                *count -= 1;
                Ok(())
            }
            _ => Err(LineError::NothingOutstanding(pod)),
        }
    }

    fn route(&mut self, line: &str, trace: TraceLine) -> Result<ReplayDecision, LineError> {
        let model = trace.model.ok_or_else(|| shape("`model` is required"))?;
        if model.is_empty() {
            return Err(shape("`model` must not be empty"));
        }
        let pods = trace.pods.ok_or_else(|| shape("`pods` is required"))?;
        let strategy = match trace.strategy {
            Some(name) => name.parse::<Strategy>().map_err(|e| shape(e.to_string()))?,
            None => self.default_strategy,
        };
        let (text, tokens) = match (trace.text, trace.messages, trace.prompt) {
            (Some(text), None, None) => (text, None),
            // router-core's extraction over the line itself: the same bytes, the same rules
            // as a request body at the gateway (a token-id prompt is routed by its ids).
            (None, Some(_), None) => {
                let fields = routing_fields(Endpoint::ChatCompletions, line.as_bytes())?;
                (fields.text, fields.tokens)
            }
            (None, None, Some(_)) => {
                let fields = routing_fields(Endpoint::Completions, line.as_bytes())?;
                (fields.text, fields.tokens)
            }
            (None, None, None) => {
                return Err(shape("one of `text`, `messages`, `prompt` is required"));
            }
            _ => {
                return Err(shape(
                    "only one of `text`, `messages`, `prompt` may be given",
                ));
            }
        };
        let counts = self.line_counts(&pods)?;
        let loads: Vec<Arc<PodLoad>> = counts
            .iter()
            .map(|&count| PodLoad::with_outstanding(count))
            .collect();
        let candidates: Vec<Candidate<'_>> = pods
            .iter()
            .zip(&loads)
            .map(|(pod, load)| Candidate {
                name: &pod.name,
                address: &pod.name,
                load,
            })
            .collect();
        let request = RouteRequest {
            model: &model,
            text: &text,
            tokens: tokens.as_deref(),
            session: Default::default(),
            max_tokens: None,
        };
        let routed = self
            .router
            .route(strategy, &request, &candidates, &mut self.rng, 0)?;
        let decision = routed.decision;
        // The trace's counts stay authoritative: the guard's increment is not kept.
        drop(routed.guard);
        for (pod, &count) in pods.iter().zip(&counts) {
            self.counts.insert(pod.name.clone(), count);
        }
        if let Some(count) = self.counts.get_mut(&decision.pod_name) {
            *count += 1;
        }
        let hashes = if !self.emit_hashes {
            None
        } else if decision.prefix_hashes.is_empty() {
            // The request's blocks whatever the strategy, so hashes can be checked alone.
            Some(self.router.request_hashes(&request)?)
        } else {
            Some(decision.prefix_hashes.clone())
        };
        Ok(ReplayDecision {
            selection: decision.selection.map(|s| s.as_str()),
            match_percent: decision.match_percent,
            bucket: decision.bucket().map(|b| b.as_str()),
            imbalance: decision.imbalance,
            hashes: hashes.map(|hashes| hashes.into_iter().map(hash_hex).collect()),
            pod: decision.pod_name,
        })
    }

    /// Each pod's count for this line: the trace's, else the running count.
    fn line_counts(&self, pods: &[TracePod]) -> Result<Vec<u64>, LineError> {
        if pods.is_empty() {
            return Err(shape("`pods` must name at least one pod"));
        }
        let mut counts = Vec::with_capacity(pods.len());
        for (i, pod) in pods.iter().enumerate() {
            if pod.name.is_empty() {
                return Err(shape(format!("pods[{i}]: `name` must not be empty")));
            }
            if pods[..i].iter().any(|other| other.name == pod.name) {
                return Err(shape(format!(
                    "pods[{i}]: pod {:?} is listed twice",
                    pod.name
                )));
            }
            let running = self.counts.get(&pod.name).copied().unwrap_or(0);
            counts.push(pod.outstanding.unwrap_or(running));
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use router_core::RouterConfig;

    use super::*;

    fn replayer(seed: u64) -> Replayer {
        let router = Router::new(RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        })
        .unwrap();
        Replayer::new(router, Strategy::LeastRequest, Some(seed), true)
    }

    fn routed(replayer: &mut Replayer, line: &str) -> ReplayDecision {
        replayer.line(line).unwrap().unwrap()
    }

    fn prefix_line(a: u64, b: u64, text: &str) -> String {
        format!(
            r#"{{"model":"m","strategy":"prefix-cache","text":"{text}","pods":[{{"name":"a","outstanding":{a}}},{{"name":"b","outstanding":{b}}}]}}"#
        )
    }

    #[test]
    fn the_index_persists_across_lines() {
        let mut r = replayer(1);
        let first = routed(&mut r, &prefix_line(0, 1, "abcdegfh"));
        assert_eq!(first.pod, "a");
        assert_eq!(first.selection, Some("least_request_fallback"));
        assert_eq!((first.match_percent, first.bucket), (Some(0), Some("0")));
        assert_eq!(
            first.hashes.as_deref(),
            Some(
                &[
                    "0xe47f32a254016b00".to_owned(),
                    "0xc46f313fc4e609b1".to_owned()
                ][..]
            )
        );
        // Busier, but it holds the prefix and two pods never fail the σ filter.
        let second = routed(&mut r, &prefix_line(5, 0, "abcdegfh"));
        assert_eq!(second.pod, "a");
        assert_eq!(second.selection, Some("prefix_match"));
        assert_eq!(
            (second.match_percent, second.bucket),
            (Some(100), Some("76-100"))
        );
        assert!(!second.imbalance);
        // Past the imbalance gate (17 − 0 > 16) only the idle pod is a candidate.
        let third = routed(&mut r, &prefix_line(17, 0, "abcdegfh"));
        assert_eq!(third.pod, "b");
        assert!(third.imbalance);
        assert_eq!(third.selection, Some("least_request_fallback"));
    }

    #[test]
    fn trace_counts_are_authoritative_and_done_lines_move_running_counts() {
        let mut r = replayer(2);
        let line = r#"{"model":"m","pods":[{"name":"a"},{"name":"b"}],"text":"x"}"#;
        assert_eq!(
            routed(&mut r, r#"{"model":"m","pods":[{"name":"a","outstanding":0},{"name":"b","outstanding":2}],"text":"x"}"#).pod,
            "a"
        );
        assert_eq!(routed(&mut r, line).pod, "a", "a at 1, b at 2");
        assert_eq!(r.line(r#"{"done":"b"}"#).unwrap(), None);
        assert_eq!(routed(&mut r, line).pod, "b", "a at 2, b at 1");
        for _ in 0..2 {
            r.line(r#"{"done":"a"}"#).unwrap();
        }
        assert_eq!(routed(&mut r, line).pod, "a", "a at 0, b at 2");
        // A stated count replaces the running one and nothing is added to it.
        assert_eq!(
            routed(&mut r, r#"{"model":"m","pods":[{"name":"a","outstanding":9},{"name":"b","outstanding":3}],"text":"x"}"#).pod,
            "b"
        );
        assert_eq!(r.counts["a"], 9);
        assert_eq!(r.counts["b"], 4);
    }

    #[test]
    fn a_done_without_a_request_is_an_error() {
        let mut r = replayer(3);
        let error = r.line(r#"{"done":"ghost"}"#).unwrap_err();
        assert_eq!(error, LineError::NothingOutstanding("ghost".into()));
        let error = r.line(r#"{"done":"a","model":"m"}"#).unwrap_err();
        assert!(error.to_string().contains("no other key"), "{error}");
    }

    #[test]
    fn messages_and_prompt_use_the_gateways_text_rules() {
        let mut r = replayer(4);
        let chat = routed(
            &mut r,
            r#"{"model":"m","pods":[{"name":"a"},{"name":"b"}],"strategy":"random","messages":[{"role":"system","content":"abcd"},{"role":"user","content":"efg"}]}"#,
        );
        let text = routed(
            &mut r,
            r#"{"model":"m","pods":[{"name":"a"},{"name":"b"}],"strategy":"random","text":"abcd efg"}"#,
        );
        assert_eq!(chat.hashes, text.hashes);
        assert_eq!(chat.hashes.as_ref().map(Vec::len), Some(2));
        assert_eq!(chat.selection, None, "random does not consult the index");
        let prompt = routed(
            &mut r,
            r#"{"model":"m","pods":[{"name":"a"},{"name":"b"}],"strategy":"random","prompt":"abcd efg"}"#,
        );
        assert_eq!(prompt.hashes, text.hashes);
        // Token ids are routed by their values, as at the gateway.
        let ids = routed(
            &mut r,
            r#"{"model":"m","pods":[{"name":"a"}],"prompt":[1,2,3,4,5,6,7,8]}"#,
        );
        let bytes = router_core::kv_sync::token_bytes(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            ids.hashes.as_ref().map(Vec::len),
            Some(bytes.len() / 4),
            "{ids:?}"
        );
        let error = r
            .line(r#"{"model":"m","pods":[{"name":"a"}],"prompt":[]}"#)
            .unwrap_err();
        assert!(error.to_string().contains("empty array"), "{error}");
        let error = r
            .line(r#"{"model":"m","pods":[{"name":"a"}],"messages":[]}"#)
            .unwrap_err();
        assert_eq!(error, LineError::Body(BodyError::NoMessages));
    }

    #[test]
    fn a_single_pod_moves_no_prefix_field() {
        let mut r = replayer(5);
        let one = routed(
            &mut r,
            r#"{"model":"m","pods":[{"name":"only","outstanding":4}],"strategy":"prefix-cache","text":"abcdefgh"}"#,
        );
        assert_eq!(one.pod, "only");
        assert_eq!(
            (one.selection, one.match_percent, one.bucket),
            (None, None, None)
        );
    }

    #[test]
    fn bad_lines_name_the_problem() {
        let mut r = replayer(6);
        let cases = [
            ("{", "not a trace object"),
            ("[1]", "not a trace object"),
            (
                r#"{"pods":[{"name":"a"}],"text":"x"}"#,
                "`model` is required",
            ),
            (r#"{"model":"m","text":"x"}"#, "`pods` is required"),
            (r#"{"model":"m","pods":[],"text":"x"}"#, "at least one pod"),
            (r#"{"model":"m","pods":[{"name":"a"}]}"#, "one of `text`"),
            (
                r#"{"model":"m","pods":[{"name":"a"}],"text":"x","prompt":"y"}"#,
                "only one of",
            ),
            (
                r#"{"model":"m","pods":[{"name":"a"},{"name":"a"}],"text":"x"}"#,
                "listed twice",
            ),
            (
                r#"{"model":"m","pods":[{"name":"a"}],"text":"x","strategy":"fastest"}"#,
                "fastest",
            ),
            (
                r#"{"model":"m","pods":[{"name":"a","outstanding":-1}],"text":"x"}"#,
                "not a trace object",
            ),
        ];
        for (line, expected) in cases {
            let error = r.line(line).unwrap_err().to_string();
            assert!(error.contains(expected), "{line}: {error}");
        }
        assert!(r.counts.is_empty(), "a refused line changes no count");
    }

    #[test]
    fn the_same_seed_gives_the_same_tie_breaks() {
        let line = r#"{"model":"m","pods":[{"name":"a","outstanding":0},{"name":"b","outstanding":0},{"name":"c","outstanding":0}],"strategy":"random","text":"x"}"#;
        let picks = |seed| {
            let mut r = replayer(seed);
            (0..32)
                .map(|_| routed(&mut r, line).pod)
                .collect::<Vec<_>>()
        };
        let first = picks(11);
        assert_eq!(first, picks(11));
        assert!(
            first.iter().any(|p| p != &first[0]),
            "32 random picks over 3 pods were all {}",
            first[0]
        );
    }
}

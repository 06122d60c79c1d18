//! What a request costs against its tenant's token rate, before it runs and after.
//!
//! Before: the prompt's tokens plus the completion tokens it may generate. The gateway does
//! not tokenize for admission (routing's tokenizer hashes bytes and may not be the model's),
//! so the prompt is estimated from the message text routing already extracted, at
//! [`BYTES_PER_TOKEN`] bytes per token (about right for English with BPE vocabularies;
//! embeddings, which have no message text, are estimated from the whole body). Completion
//! tokens are `max_completion_tokens`, else `max_tokens` (vLLM's precedence), else the
//! configured default. Both are read in routing's parse of the body
//! ([`RoutingFields::max_tokens`]) and checked only for requests of a tenant under a token
//! limit.
//!
//! After: [`UsageScan`] watches the response bytes on their way to the client for the
//! replica's `usage` (`"prompt_tokens":N`, `"completion_tokens":N`, and `"cached_tokens":N`
//! for the router's lifecycle), the last block of a
//! non-streamed body or the usage chunk of a stream sent with
//! `stream_options.include_usage`. The numbers are matched as raw bytes, so a pattern inside
//! generated text (where quotes are escaped) never matches; a usage block split across two
//! body frames is missed, and then the estimate stands.

use router_core::text::{BodyError, Endpoint, RoutingFields};

/// Bytes of prompt text counted as one token in the admission estimate.
pub const BYTES_PER_TOKEN: u64 = 4;

/// A request's estimated token cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestCost {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl RequestCost {
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The estimated cost of `body` (already parsed into `fields`) sent to `endpoint`.
pub fn estimate(
    endpoint: Endpoint,
    body: &[u8],
    fields: &RoutingFields,
    default_max_tokens: u64,
) -> Result<RequestCost, BodyError> {
    let prompt_bytes = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Completions => fields.text_len,
        Endpoint::Embeddings => body.len(),
    };
    let prompt_tokens = (prompt_bytes as u64).div_ceil(BYTES_PER_TOKEN);
    if endpoint == Endpoint::Embeddings {
        return Ok(RequestCost {
            prompt_tokens,
            completion_tokens: 0,
        });
    }
    let completion_tokens = fields.max_tokens.clone()?.unwrap_or(default_max_tokens);
    Ok(RequestCost {
        prompt_tokens,
        completion_tokens,
    })
}

/// The searcher for [`USAGE_KEY_END`], built once: `memmem::find_iter` builds one per call,
/// which on a stream's small frames cost more than the search (docs/PERFORMANCE.md).
static USAGE_KEY_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(USAGE_KEY_END));

/// The `usage` numbers seen so far in a response body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageScan {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (vLLM with prefix caching reports it).
    pub cached_tokens: Option<u64>,
}

impl UsageScan {
    /// Notes the usage numbers in one body frame (the last number given wins). Every key
    /// ends in `_tokens":`, so one forward pass of memchr's vectorised search finds them all
    /// (most frames, every token chunk of a stream, hold none); the word before tells which.
    pub fn observe(&mut self, frame: &[u8]) {
        for at in USAGE_KEY_FINDER.find_iter(frame) {
            let (key, rest) = frame.split_at(at);
            let field = if key.ends_with(b"\"prompt") {
                &mut self.prompt_tokens
            } else if key.ends_with(b"\"completion") {
                &mut self.completion_tokens
            } else if key.ends_with(b"\"cached") {
                &mut self.cached_tokens
            } else {
                continue;
            };
            if let Some(n) = rest.get(USAGE_KEY_END.len()..).and_then(leading_number) {
                *field = Some(n);
            }
        }
    }

    /// The usage as the router's load view takes it, when the prompt and completion counts
    /// were both seen.
    pub fn router_usage(&self) -> Option<router_core::Usage> {
        Some(router_core::Usage {
            prompt_tokens: self.prompt_tokens?,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens?,
        })
    }

    /// The tokens the request used, filling in unreported parts from `estimate`; `None`
    /// when no usage was seen at all.
    pub fn used(&self, estimate: RequestCost) -> Option<u64> {
        if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
            return None;
        }
        let prompt = self.prompt_tokens.unwrap_or(estimate.prompt_tokens);
        let completion = self.completion_tokens.unwrap_or(estimate.completion_tokens);
        Some(prompt.saturating_add(completion))
    }
}

/// How each usage key (`"prompt_tokens":` and the others) ends: `"` then `:`, which text
/// inside a JSON string cannot hold unescaped, so generated text never matches.
const USAGE_KEY_END: &[u8] = b"_tokens\":";

/// The integer at the start of `rest` (JSON whitespace allowed before it); `None` for
/// anything else (`null`) or a number too large for `u64`.
fn leading_number(rest: &[u8]) -> Option<u64> {
    let digits = rest
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .try_fold(0u64, |n, b| {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        });
    // No digit at all (e.g. `null`) is no number.
    let first = rest.iter().find(|b| !b.is_ascii_whitespace())?;
    if first.is_ascii_digit() { digits } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(endpoint: Endpoint, body: &str) -> Result<RequestCost, BodyError> {
        let fields = router_core::text::routing_fields(endpoint, body.as_bytes()).unwrap();
        estimate(endpoint, body.as_bytes(), &fields, 100)
    }

    #[test]
    fn the_prompt_is_estimated_from_the_message_text() {
        // "hello" + " " + "world!!" = 13 bytes → 4 tokens (rounded up).
        let chat = r#"{"model":"m","messages":[{"role":"system","content":"hello"},
            {"role":"user","content":"world!!"}],"max_tokens":7}"#;
        assert_eq!(
            cost(Endpoint::ChatCompletions, chat).unwrap(),
            RequestCost {
                prompt_tokens: 4,
                completion_tokens: 7
            }
        );
        let completion = r#"{"model":"m","prompt":"12345678"}"#;
        let estimate = cost(Endpoint::Completions, completion).unwrap();
        assert_eq!(
            (estimate.prompt_tokens, estimate.completion_tokens),
            (2, 100)
        );
        assert_eq!(estimate.total(), 102);
        let embedding = r#"{"model":"m","input":"some text to embed"}"#;
        let estimate = cost(Endpoint::Embeddings, embedding).unwrap();
        assert_eq!(
            estimate,
            RequestCost {
                prompt_tokens: (embedding.len() as u64).div_ceil(4),
                completion_tokens: 0
            }
        );
    }

    #[test]
    fn max_completion_tokens_wins_and_null_means_absent() {
        let body = r#"{"model":"m","prompt":"","max_tokens":5,"max_completion_tokens":9}"#;
        assert_eq!(
            cost(Endpoint::Completions, body).unwrap().completion_tokens,
            9
        );
        let body = r#"{"model":"m","prompt":"","max_tokens":null}"#;
        assert_eq!(
            cost(Endpoint::Completions, body).unwrap().completion_tokens,
            100
        );
    }

    #[test]
    fn a_bad_bound_is_a_client_error_naming_the_field() {
        for (body, field) in [
            (r#"{"model":"m","prompt":"","max_tokens":-1}"#, "max_tokens"),
            (
                r#"{"model":"m","prompt":"","max_tokens":"9"}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","prompt":"","max_completion_tokens":1.5}"#,
                "max_completion_tokens",
            ),
        ] {
            match cost(Endpoint::Completions, body).unwrap_err() {
                BodyError::InvalidField { field: got, .. } => assert_eq!(got, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn usage_is_read_from_a_body_or_a_stream_chunk() {
        let mut scan = UsageScan::default();
        let estimate = RequestCost {
            prompt_tokens: 50,
            completion_tokens: 100,
        };
        scan.observe(br#"data: {"choices":[{"delta":{"content":"\"completion_tokens\":7"}}]}"#);
        assert_eq!(
            scan.used(estimate),
            None,
            "text inside content never matches"
        );
        scan.observe(
            br#"{"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8,"prompt_tokens_details":null}}"#,
        );
        assert_eq!(scan.used(estimate), Some(20));
        let mut scan = UsageScan::default();
        scan.observe(b"data: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": null}}");
        assert_eq!(
            scan.used(estimate),
            Some(103),
            "a missing part keeps its estimate"
        );
        scan.observe(br#""completion_tokens":99999999999999999999999"#);
        assert_eq!(
            scan.completion_tokens, None,
            "an overflowing number is no number"
        );
    }

    #[test]
    fn the_last_number_given_wins_and_other_token_keys_are_not_usage() {
        let mut scan = UsageScan::default();
        scan.observe(
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":2}} {"usage":{"prompt_tokens" :5,"total_tokens":9,"completion_tokens": 4,"prompt_tokens_details":{"created_cache_tokens":7}}}"#,
        );
        assert_eq!(
            (
                scan.prompt_tokens,
                scan.completion_tokens,
                scan.cached_tokens
            ),
            (Some(1), Some(4), None),
            "a key with a space before its colon is not read (as before); other keys are not usage"
        );
    }

    #[test]
    fn the_routers_usage_carries_the_cached_tokens_when_reported() {
        let mut scan = UsageScan::default();
        assert_eq!(scan.router_usage(), None);
        scan.observe(br#"{"usage":{"prompt_tokens":5000,"completion_tokens":128,"prompt_tokens_details":null}}"#);
        assert_eq!(
            scan.router_usage(),
            Some(router_core::Usage {
                prompt_tokens: 5000,
                cached_tokens: None,
                completion_tokens: 128,
            })
        );
        scan.observe(br#"{"usage":{"prompt_tokens":5000,"completion_tokens":128,"prompt_tokens_details":{"cached_tokens":4704}}}"#);
        assert_eq!(scan.router_usage().unwrap().cached_tokens, Some(4704));
    }
}

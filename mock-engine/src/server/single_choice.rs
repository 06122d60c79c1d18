//! The head every chat and completion response opens with, streamed chunk or whole body:
//! `id`, `object`, `created`, `model` and the one choice the mock makes (`n` = 1), in vLLM's
//! field order. What follows the choice (`usage`, `service_tier`, …) differs per endpoint and
//! per form, so each shape in `chat` and `completions` names its own choice and tail; this
//! module only writes the head and the response's identity into it.

use serde::Serialize;

use super::envelope::ResponseMeta;

/// A response object with a single choice, followed by `tail`'s fields in its own order.
#[derive(Serialize)]
pub struct SingleChoice<'a, C, T> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [C; 1],
    #[serde(flatten)]
    tail: T,
}

impl<'a, C: Serialize, T: Serialize> SingleChoice<'a, C, T> {
    /// The response `meta` names, as an `object`, holding `choice` and then `tail`.
    pub fn new(meta: &'a ResponseMeta, object: &'static str, choice: C, tail: T) -> Self {
        SingleChoice {
            id: &meta.id,
            object,
            created: meta.created,
            model: &meta.model,
            choices: [choice],
            tail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::envelope::to_json;

    #[derive(Serialize)]
    struct Tail {
        last: Option<()>,
    }

    #[test]
    fn the_head_comes_first_and_the_tail_after_the_choice() {
        let meta = ResponseMeta {
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
        };
        assert_eq!(
            to_json(&SingleChoice::new(&meta, "o", 3, Tail { last: None })),
            r#"{"id":"x-1","object":"o","created":7,"model":"m","choices":[3],"last":null}"#
        );
        // A shape with nothing after its choice flattens the unit type.
        assert_eq!(
            to_json(&SingleChoice::new(&meta, "o", 3, ())),
            r#"{"id":"x-1","object":"o","created":7,"model":"m","choices":[3]}"#
        );
    }
}

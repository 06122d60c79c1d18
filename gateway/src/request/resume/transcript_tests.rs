use super::*;
use crate::request::resume::counting::UsageAsked;

fn chat_chunk(id: &str, created: u64, delta: &str) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    )
}

fn text(bytes: &Bytes) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn the_first_stream_passes_unchanged_in_whole_events() {
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    let role = chat_chunk("a", 1, r#"{"role":"assistant","content":""}"#);
    let token = chat_chunk("a", 1, r#"{"content":" x"}"#);
    let both = format!("{role}{token}");
    let (head, tail) = both.split_at(role.len() + 10);
    assert_eq!(
        text(&t.pass(head.as_bytes())),
        role,
        "the partial event waits"
    );
    assert_eq!(text(&t.pass(tail.as_bytes())), token);
    assert_eq!(
        (t.text(), t.produced()),
        (" x", 1),
        "the role chunk is no token"
    );
    assert!(t.resumable());
}

#[test]
fn a_continuation_takes_the_first_streams_id_and_drops_its_role_chunk() {
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    t.pass(chat_chunk("a", 1, r#"{"role":"assistant","content":""}"#).as_bytes());
    t.pass(chat_chunk("a", 1, r#"{"content":" x"}"#).as_bytes());
    t.pass(b"data: {\"id\":\"a\",\"choi");
    t.begin_continuation();
    let role = t.pass(chat_chunk("b", 9, r#"{"role":"assistant","content":""}"#).as_bytes());
    assert!(role.is_empty());
    let token = t.pass(chat_chunk("b", 9, r#"{"content":" y"}"#).as_bytes());
    assert_eq!(text(&token), chat_chunk("a", 1, r#"{"content":" y"}"#));
    assert_eq!((t.text(), t.produced()), (" x y", 2));
}

#[test]
fn the_continuations_usage_counts_the_whole_answer() {
    let asked = UsageAsked {
        closing: true,
        every_chunk: false,
    };
    let mut t = Transcript::new(Shape::Completions, asked);
    for word in [" a", " b", " c"] {
        let chunk = format!(
            "data: {{\"id\":\"cmpl-1\",\"created\":5,\"choices\":[{{\"index\":0,\"text\":\"{word}\",\"finish_reason\":null}}]}}\n\n"
        );
        t.pass(chunk.as_bytes());
    }
    t.begin_continuation();
    let usage = t.pass(
        b"data: {\"id\":\"cmpl-2\",\"created\":8,\"choices\":[],\"usage\":{\"prompt_tokens\":13,\"total_tokens\":20,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n",
    );
    assert_eq!(
        text(&usage),
        "data: {\"id\":\"cmpl-1\",\"created\":5,\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"total_tokens\":20,\"completion_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n"
    );
}

#[test]
fn a_finished_answer_or_a_reasoning_delta_is_not_resumable() {
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    assert!(!t.resumable(), "nothing generated yet");
    t.pass(
        b"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"},\"finish_reason\":\"length\"}]}\n\n",
    );
    assert!(!t.resumable());
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    t.pass(
        b"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
    );
    t.pass(chat_chunk("a", 1, r#"{"content":" x"}"#).as_bytes());
    assert!(!t.resumable());
}

#[test]
fn other_events_pass_as_they_are() {
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    t.begin_continuation();
    let events = ": ping\n\ndata: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n";
    assert_eq!(text(&t.pass(events.as_bytes())), events);
    assert_eq!(text(&t.flush()), "");
}

/// A chat chunk as vLLM sends it with `continuous_usage_stats`: the running count last.
fn counted_chunk(id: &str, delta: &str, completion: u64) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":4,\"total_tokens\":{},\"completion_tokens\":{completion}}}}}\n\n",
        4 + completion
    )
}

const CLOSING: &str = "data: {\"id\":\"a\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"total_tokens\":7,\"completion_tokens\":3}}\n\n";

#[test]
fn the_engines_running_count_counts_tokens_that_share_a_chunk() {
    let mut t = Transcript::new(Shape::Chat, UsageAsked::default());
    t.pass(counted_chunk("a", r#"{"role":"assistant","content":""}"#, 0).as_bytes());
    // Two tokens held back into one chunk (a character split between them), then one.
    t.pass(counted_chunk("a", r#"{"content":"é"}"#, 2).as_bytes());
    t.pass(counted_chunk("a", r#"{"content":" x"}"#, 3).as_bytes());
    assert_eq!((t.text(), t.produced()), ("é x", 3), "3 tokens in 2 chunks");
    t.begin_continuation();
    t.pass(counted_chunk("b", r#"{"content":" y"}"#, 1).as_bytes());
    assert_eq!(
        t.produced(),
        4,
        "the continuation's count adds to what was sent"
    );
}

#[test]
fn usage_the_client_did_not_ask_for_is_taken_out() {
    let sent = |asked: UsageAsked| {
        let mut t = Transcript::new(Shape::Chat, asked);
        let mut out = String::new();
        for chunk in [
            counted_chunk("a", r#"{"content":" x"}"#, 3),
            CLOSING.to_owned(),
            "data: [DONE]\n\n".to_owned(),
        ] {
            out.push_str(text(&t.pass(chunk.as_bytes())));
        }
        out
    };
    let bare = chat_chunk("a", 1, r#"{"content":" x"}"#);
    assert_eq!(
        sent(UsageAsked::default()),
        format!("{bare}data: [DONE]\n\n")
    );
    let closing = UsageAsked {
        closing: true,
        every_chunk: false,
    };
    assert_eq!(sent(closing), format!("{bare}{CLOSING}data: [DONE]\n\n"));
    let every = UsageAsked {
        closing: true,
        every_chunk: true,
    };
    let counted = counted_chunk("a", r#"{"content":" x"}"#, 3);
    assert_eq!(sent(every), format!("{counted}{CLOSING}data: [DONE]\n\n"));
}

#[test]
fn a_continuations_running_count_is_rewritten_to_the_whole_answers() {
    let every = UsageAsked {
        closing: true,
        every_chunk: true,
    };
    let mut t = Transcript::new(Shape::Chat, every);
    t.pass(counted_chunk("a", r#"{"content":"ab"}"#, 2).as_bytes());
    t.begin_continuation();
    let next = t.pass(counted_chunk("b", r#"{"content":" c"}"#, 1).as_bytes());
    // prompt 4 less the 2 carried tokens; completion 1 plus them.
    let expected = counted_chunk("a", r#"{"content":" c"}"#, 1)
        .replace(
            "\"total_tokens\":5,\"completion_tokens\":1",
            "\"total_tokens\":5,\"completion_tokens\":3",
        )
        .replace("\"prompt_tokens\":4", "\"prompt_tokens\":2");
    assert_eq!(text(&next), expected);
}

#[test]
fn a_member_is_cut_with_the_comma_that_parts_it_from_a_neighbour() {
    let cut = |text: &str| {
        let chunk: ChunkView<'_> = serde_json::from_str(text).unwrap();
        let at = span(text, chunk.usage.unwrap()).unwrap();
        let member = member(text, "usage", at).unwrap();
        splice(text, vec![(member, String::new())])
    };
    assert_eq!(cut(r#"{"id":1,"usage":{"a":1}}"#), r#"{"id":1}"#);
    assert_eq!(cut(r#"{"usage":{"a":1},"id":1}"#), r#"{"id":1}"#);
    assert_eq!(cut(r#"{ "id": 1 , "usage" : {"a":1} }"#), r#"{ "id": 1  }"#);
    assert_eq!(cut(r#"{"usage": {"a":1} , "id":1}"#), r#"{"id":1}"#);
    assert_eq!(cut(r#"{"usage":{"a":1}}"#), r#"{}"#);
}

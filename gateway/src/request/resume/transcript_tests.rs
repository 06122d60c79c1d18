use super::*;

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
    let mut t = Transcript::new(Shape::Chat);
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
    let mut t = Transcript::new(Shape::Chat);
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
    let mut t = Transcript::new(Shape::Completions);
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
    let mut t = Transcript::new(Shape::Chat);
    assert!(!t.resumable(), "nothing generated yet");
    t.pass(
        b"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" x\"},\"finish_reason\":\"length\"}]}\n\n",
    );
    assert!(!t.resumable());
    let mut t = Transcript::new(Shape::Chat);
    t.pass(
        b"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
    );
    t.pass(chat_chunk("a", 1, r#"{"content":" x"}"#).as_bytes());
    assert!(!t.resumable());
}

#[test]
fn other_events_pass_as_they_are() {
    let mut t = Transcript::new(Shape::Chat);
    t.begin_continuation();
    let events = ": ping\n\ndata: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n";
    assert_eq!(text(&t.pass(events.as_bytes())), events);
    assert_eq!(text(&t.flush()), "");
}

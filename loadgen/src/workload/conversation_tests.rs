use mock_engine::model::{EngineModel, EngineProfile, EngineRequest};
use mock_engine::tokenizer;

use super::*;
use crate::workload::chat::engine_prompt;
use crate::workload::seeding::rng_for;

fn spec(sessions: usize, turns: LengthDist, think_s: f64) -> ConversationSpec {
    ConversationSpec {
        sessions,
        turns,
        think_s,
        user_tokens: Some(LengthDist::Range(20, 40)),
    }
}

fn shapes() -> TurnShapes {
    TurnShapes {
        first_user: LengthDist::Range(30, 50),
        later_user: LengthDist::Range(20, 40),
        output: LengthDist::Fixed(37),
    }
}

fn plans(sessions: usize, turns: LengthDist, think_s: f64) -> Vec<SessionPlan> {
    let starts: Vec<f64> = (0..sessions).map(|s| s as f64).collect();
    let families: Vec<usize> = (0..sessions).map(|s| s % 3).collect();
    plan_sessions(
        &spec(sessions, turns, think_s),
        &starts,
        &families,
        shapes(),
        &mut rng_for(9, &["conversations"]),
    )
}

fn prefixes() -> Vec<String> {
    (0..3)
        .map(|f| prompt::family_prefix("p", 9, 0, f, 100))
        .collect()
}

#[test]
fn plans_number_requests_in_order_and_are_seeded() {
    let p = plans(5, LengthDist::Range(1, 6), 4.0);
    let indexes: Vec<usize> = p
        .iter()
        .flat_map(|s| s.turns.iter().map(|t| t.index))
        .collect();
    assert_eq!(indexes, (0..indexes.len()).collect::<Vec<_>>());
    for s in &p {
        assert!((1..=6).contains(&s.turns.len()));
        assert_eq!(s.turns[0].think_s, 0.0);
        assert!((30..=50).contains(&s.turns[0].user_tokens));
        assert!(
            s.turns[1..]
                .iter()
                .all(|t| (20..=40).contains(&t.user_tokens))
        );
        assert!(
            s.turns
                .iter()
                .all(|t| t.max_tokens == 37 && t.think_s >= 0.0)
        );
    }
    assert_eq!(p, plans(5, LengthDist::Range(1, 6), 4.0));
}

#[test]
fn each_turn_sends_the_history_and_a_new_message_after_the_think_time() {
    let p = plans(2, LengthDist::Fixed(3), 5.0);
    let think = p[0].turns[1].think_s;
    let mut source = Conversations::new("p", 9, p, &prefixes());
    assert_eq!(source.planned(), 6);
    let openers = source.openers();
    assert_eq!(openers.len(), 2);
    let first = &openers[0];
    assert_eq!(
        (first.session, first.turn, first.index, first.at),
        (0, 0, 0, 0.0)
    );
    assert_eq!(first.messages.len(), 2);
    assert_eq!(
        first.messages[0],
        ChatMessage::new(Role::System, prefixes()[0].clone())
    );
    assert_eq!(first.messages[1].role, Role::User);

    let second = source
        .turn_ended(0, TurnEnd::Answered(" the cache"), 12.5)
        .unwrap()
        .unwrap();
    assert_eq!((second.turn, second.index), (1, 1));
    assert_eq!(second.at, 12.5 + think);
    assert_eq!(second.messages[..2], first.messages[..]);
    assert_eq!(
        second.messages[2],
        ChatMessage::new(Role::Assistant, " the cache")
    );
    assert_eq!(second.messages[3].role, Role::User);
    assert_ne!(second.messages[3], first.messages[1]);

    // Session 1 fails on its first turn: its other two turns are abandoned.
    assert_eq!(source.turn_ended(1, TurnEnd::Failed, 3.0), Ok(None));
    assert_eq!(source.abandoned(), 2);

    // A turn reported twice, or a session that does not exist, is the runner's bug.
    assert_eq!(
        source.turn_ended(1, TurnEnd::Answered("x"), 13.0),
        Err(ConversationError::NotInFlight(1))
    );
    assert_eq!(
        source.turn_ended(7, TurnEnd::Failed, 13.0),
        Err(ConversationError::NoSuchSession(7))
    );
    let third = source
        .turn_ended(0, TurnEnd::Answered(" a"), 20.0)
        .unwrap()
        .unwrap();
    assert_eq!(third.turn, 2);
    assert!(!source.finished());
    assert_eq!(
        source.turn_ended(0, TurnEnd::Answered(" b"), 30.0),
        Ok(None)
    );
    assert!(source.finished());
    assert_eq!(source.abandoned(), 2);
}

/// Runs `prompt` on `engine` to completion; returns the answer as streamed text and the
/// request's cached tokens.
fn serve(engine: &mut EngineModel, prompt: &str, max_tokens: u32, now: f64) -> (String, u32) {
    let id = engine
        .submit(
            EngineRequest {
                prompt: tokenizer::encode(prompt),
                max_tokens,
                ignore_eos: true,
            },
            now,
        )
        .unwrap();
    let mut answer = String::new();
    let mut cached = None;
    for out in engine.advance(f64::INFINITY) {
        assert_eq!(out.id, id);
        answer.push_str(&tokenizer::decode(out.token));
        cached.get_or_insert(out.cached_tokens);
    }
    (answer, cached.unwrap())
}

/// The proof that a conversation is what the engine's prefix cache sees: turn 2's prompt is
/// turn 1's prompt and answer token for token, and on the same replica the engine serves
/// every full block of them from its cache.
#[test]
fn the_next_turn_extends_prompt_and_answer_token_for_token() {
    let profile = EngineProfile::builtin("fast").unwrap();
    let block = profile.block_size;
    let mut engine = EngineModel::new(profile);
    let p = plans(1, LengthDist::Fixed(3), 0.0);
    let mut source = Conversations::new("p", 9, p, &prefixes());
    let mut turn = source.openers().remove(0);
    let mut history: Vec<u32> = Vec::new();
    let mut now = 0.0;
    for k in 0..3 {
        let prompt = engine_prompt(&turn.messages);
        let tokens = tokenizer::encode(&prompt);
        assert_eq!(
            tokens[..history.len()],
            history[..],
            "turn {k} breaks the history"
        );
        let (answer, cached) = serve(&mut engine, &prompt, turn.max_tokens, now);
        if k > 0 {
            // Every full block of the previous prompt and answer, except that the answer's
            // last token was sampled but never fed back (no KV), as in vLLM.
            let expected = (history.len() - 1) / block * block;
            assert_eq!(cached as usize, expected, "turn {k}");
        }
        assert_eq!(tokenizer::count(&answer), turn.max_tokens as usize);
        history = tokens;
        history.extend(tokenizer::encode(&answer));
        now += 100.0;
        match source
            .turn_ended(0, TurnEnd::Answered(&answer), now)
            .unwrap()
        {
            Some(next) => turn = next,
            None => break,
        }
    }
    assert!(source.finished());
}

#[test]
fn spec_validation_names_the_key() {
    assert!(
        spec(0, LengthDist::Fixed(2), 1.0)
            .validate()
            .unwrap_err()
            .contains("sessions")
    );
    assert!(
        spec(1, LengthDist::Fixed(0), 1.0)
            .validate()
            .unwrap_err()
            .contains("turns")
    );
    assert!(
        spec(1, LengthDist::Fixed(999), 1.0)
            .validate()
            .unwrap_err()
            .contains("turns")
    );
    assert!(
        spec(1, LengthDist::Fixed(2), -1.0)
            .validate()
            .unwrap_err()
            .contains("think_s")
    );
    let parsed: ConversationSpec =
        toml::from_str("sessions = 4\nturns = [2, 5]\nthink_s = 3.0").unwrap();
    assert_eq!(parsed.turns, LengthDist::Range(2, 5));
    assert!(toml::from_str::<ConversationSpec>("sessions = 4\nturns = 2\nthinks = 1").is_err());
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever ends (answers or failures, any order of sessions), the turns sent plus the
        /// turns abandoned equal the plan, and every sent turn carries its session's history.
        #[test]
        fn sent_and_abandoned_add_up(
            sessions in 1usize..8, fails in proptest::collection::vec(0u8..10, 64), seed in any::<u64>()
        ) {
            let starts: Vec<f64> = (0..sessions).map(|s| s as f64).collect();
            let families = vec![0; sessions];
            let plans = plan_sessions(
                &spec(sessions, LengthDist::Range(1, 5), 1.0), &starts, &families, shapes(),
                &mut rng_for(seed, &["c"]),
            );
            let mut source = Conversations::new("p", seed, plans, &prefixes());
            let planned = source.planned();
            let mut queue = source.openers();
            let mut sent = queue.len();
            let mut step = 0;
            while let Some(turn) = queue.pop() {
                let end = if fails[step % fails.len()] == 0 { TurnEnd::Failed } else { TurnEnd::Answered(" the") };
                step += 1;
                prop_assert_eq!(turn.messages.len(), 2 + 2 * turn.turn);
                if let Some(next) = source.turn_ended(turn.session, end, turn.at + 1.0).unwrap() {
                    prop_assert!(next.at >= turn.at + 1.0);
                    sent += 1;
                    queue.insert(0, next);
                }
            }
            prop_assert!(source.finished());
            prop_assert_eq!(sent + source.abandoned(), planned);
        }
    }
}

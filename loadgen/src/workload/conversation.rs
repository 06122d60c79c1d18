//! Multi-turn conversations: sessions whose every turn sends the whole conversation so far
//! (the family's system prompt, each user message and each answer) plus a new user message,
//! after a think time. The workload where prefix routing matters most in chat products: a
//! turn that lands on the replica that served the previous one finds its whole history
//! cached; anywhere else it pays the history's prefill again.
//!
//! Closed loop per session: turn `k + 1` carries turn `k`'s answer, and its send time is
//! turn `k`'s end plus the think time, so it cannot be planned before turn `k` has ended.
//! [`Conversations`] is the source a runner drives: [`Conversations::openers`] gives every
//! session's first turn (open loop, at the sessions' arrival times), and
//! [`Conversations::turn_ended`] takes a turn's answer (the text the engine streamed, which
//! the mock's tokenizer re-encodes to the very tokens it generated) and releases the next
//! turn. A failed turn ends its session; the turns it never sends are counted
//! ([`Conversations::abandoned`]) so a phase's requests and its plan still add up.
//!
//! Everything but the answers is drawn when the phase is planned (turn counts, message
//! lengths, output lengths, think times), from the phase's seed, so every route of a round
//! offers the same conversations. Pure: no clock, no I/O.

use rand::Rng;
use serde::Deserialize;

use super::chat::{ChatMessage, Role};
use super::inter_arrival::unit_exponential;
use super::length::LengthDist;
use super::prompt;

/// `conversations = { sessions = 24, turns = 4, think_s = 8.0 }` in a matrix scenario.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationSpec {
    /// Sessions per phase; they start at the scenario's arrival process and rate (`rps` is
    /// then sessions per second).
    pub sessions: usize,
    /// Turns per session: a number, a range or a distribution ([`LengthDist`]).
    pub turns: LengthDist,
    /// Mean think time in seconds between an answer's end and the next turn's send
    /// (exponential; 0 sends at once).
    #[serde(default)]
    pub think_s: f64,
    /// Length of the user messages after the first (default: the scenario's tail length).
    #[serde(default)]
    pub user_tokens: Option<LengthDist>,
}

/// Most turns a session may have; past it a conversation outgrows any context anyway.
pub const MAX_TURNS: usize = 256;

impl ConversationSpec {
    /// Checks the values; messages name the key under `conversations`.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=100_000).contains(&self.sessions) {
            return Err(format!(
                "conversations.sessions must be 1..=100000, got {}",
                self.sessions
            ));
        }
        self.turns.validate("conversations.turns")?;
        if self.turns.max() > MAX_TURNS {
            return Err(format!(
                "conversations.turns must not exceed {MAX_TURNS}, got up to {}",
                self.turns.max()
            ));
        }
        if !(self.think_s.is_finite() && (0.0..=3600.0).contains(&self.think_s)) {
            return Err(format!(
                "conversations.think_s must be in [0, 3600], got {}",
                self.think_s
            ));
        }
        if let Some(user) = &self.user_tokens {
            user.validate("conversations.user_tokens")?;
        }
        Ok(())
    }
}

/// One turn of a planned session.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlan {
    /// The request's index in the phase (sessions in start order, turns in order).
    pub index: usize,
    /// Words in this turn's new user message (nonce first).
    pub user_tokens: usize,
    pub max_tokens: u32,
    /// Seconds between the previous answer's end and this turn's send (0 for the first).
    pub think_s: f64,
}

/// One planned session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPlan {
    pub session: usize,
    /// The family whose prefix is the session's system prompt.
    pub family: usize,
    /// Send time of the first turn, seconds after the phase starts.
    pub start: f64,
    pub turns: Vec<TurnPlan>,
}

/// What the draws of [`plan_sessions`] follow.
#[derive(Debug, Clone, Copy)]
pub struct TurnShapes {
    /// The first user message (the matrix's tail).
    pub first_user: LengthDist,
    /// Later user messages.
    pub later_user: LengthDist,
    /// Each answer's `max_tokens`.
    pub output: LengthDist,
}

/// Plans sessions that start at `starts` (ascending) in `families` (one per session), all
/// draws from `rng` in a fixed order: per session its turn count, then per turn its user
/// length, its output length and its think time.
pub fn plan_sessions(
    spec: &ConversationSpec,
    starts: &[f64],
    families: &[usize],
    shapes: TurnShapes,
    rng: &mut impl Rng,
) -> Vec<SessionPlan> {
    let mut index = 0;
    starts
        .iter()
        .zip(families)
        .enumerate()
        .map(|(session, (&start, &family))| {
            let count = spec.turns.sample(rng);
            let turns = (0..count)
                .map(|turn| {
                    let user = if turn == 0 {
                        shapes.first_user
                    } else {
                        shapes.later_user
                    };
                    let user_tokens = user.sample(rng);
                    // Validation bounds outputs by MAX_TOKENS (10⁶), so they fit in u32.
                    let max_tokens = u32::try_from(shapes.output.sample(rng)).unwrap_or(u32::MAX);
                    let think = spec.think_s * unit_exponential(rng);
                    let plan = TurnPlan {
                        index,
                        user_tokens,
                        max_tokens,
                        think_s: if turn == 0 { 0.0 } else { think },
                    };
                    index += 1;
                    plan
                })
                .collect();
            SessionPlan {
                session,
                family,
                start,
                turns,
            }
        })
        .collect()
}

/// A turn to send now or at `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRequest {
    pub session: usize,
    /// 0-based turn number within the session.
    pub turn: usize,
    /// The request's index in the phase.
    pub index: usize,
    pub family: usize,
    /// Send time, seconds after the phase starts.
    pub at: f64,
    /// The whole conversation so far, ending with the new user message.
    pub messages: Vec<ChatMessage>,
    pub max_tokens: u32,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd<'a> {
    /// The answer's text as streamed (the concatenated `delta.content`s).
    Answered(&'a str),
    /// No usable answer: the session ends here.
    Failed,
}

/// One session as a source of turns: its plan, the conversation so far, and which turn is
/// out. A live runner moves each into its own task; the simulator keeps them together in
/// [`Conversations`].
#[derive(Debug)]
pub struct Conversation {
    phase: String,
    seed: u64,
    plan: SessionPlan,
    messages: Vec<ChatMessage>,
    in_flight: bool,
    /// Turns sent so far.
    sent: usize,
    closed: bool,
}

/// A runner reported an end the source did not expect (a bug in the runner, never traffic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversationError {
    #[error("session {0} does not exist")]
    NoSuchSession(usize),
    #[error("session {0} has no turn in flight")]
    NotInFlight(usize),
}

impl Conversation {
    /// The session of `plan` with `system_prompt` (its family's prefix); user messages are
    /// seeded by (`phase`, `seed`, request index) like the matrix's tails.
    pub fn new(phase: &str, seed: u64, plan: SessionPlan, system_prompt: String) -> Conversation {
        Conversation {
            phase: phase.to_owned(),
            seed,
            plan,
            messages: vec![ChatMessage::new(Role::System, system_prompt)],
            in_flight: false,
            sent: 0,
            closed: false,
        }
    }

    /// The session's number (its position in start order).
    pub fn session(&self) -> usize {
        self.plan.session
    }

    /// The first turn, at the session's start; `None` once anything was sent.
    pub fn opener(&mut self) -> Option<TurnRequest> {
        if self.sent > 0 || self.closed {
            return None;
        }
        let start = self.plan.start;
        self.next_turn(start)
    }

    /// Records the end of the turn in flight at `ended_at` and returns the next turn (sent
    /// at `ended_at` + its think time), or `None` when the session is over.
    pub fn turn_ended(
        &mut self,
        end: TurnEnd<'_>,
        ended_at: f64,
    ) -> Result<Option<TurnRequest>, ConversationError> {
        if !std::mem::replace(&mut self.in_flight, false) {
            return Err(ConversationError::NotInFlight(self.plan.session));
        }
        match end {
            TurnEnd::Failed => {
                self.closed = true;
                Ok(None)
            }
            TurnEnd::Answered(answer) => {
                self.messages
                    .push(ChatMessage::new(Role::Assistant, answer));
                let think = self.plan.turns.get(self.sent).map_or(0.0, |t| t.think_s);
                Ok(self.next_turn(ended_at + think))
            }
        }
    }

    /// Turns planned.
    pub fn planned(&self) -> usize {
        self.plan.turns.len()
    }

    /// Turns that will never be sent because an earlier turn failed.
    pub fn abandoned(&self) -> usize {
        if self.closed {
            self.plan.turns.len() - self.sent
        } else {
            0
        }
    }

    /// Whether the session is over (every turn ended, or closed by a failure).
    pub fn finished(&self) -> bool {
        !self.in_flight && (self.closed || self.sent == self.plan.turns.len())
    }

    /// Appends the next user message and returns the turn, or closes the session.
    fn next_turn(&mut self, at: f64) -> Option<TurnRequest> {
        let Some(turn) = self.plan.turns.get(self.sent) else {
            self.closed = true;
            return None;
        };
        let text = prompt::request_tail(
            &self.phase,
            self.seed,
            "measure",
            turn.index,
            turn.user_tokens,
        );
        self.messages.push(ChatMessage::new(Role::User, text));
        let request = TurnRequest {
            session: self.plan.session,
            turn: self.sent,
            index: turn.index,
            family: self.plan.family,
            at,
            messages: self.messages.clone(),
            max_tokens: turn.max_tokens,
        };
        self.in_flight = true;
        self.sent += 1;
        Some(request)
    }
}

/// Every session of a phase, addressed by session number (the simulator's view).
#[derive(Debug)]
pub struct Conversations {
    sessions: Vec<Conversation>,
}

impl Conversations {
    /// The sessions of `plans` (numbered 0.., in order), each with its family's system
    /// prompt from `system_prompts`.
    pub fn new(
        phase: &str,
        seed: u64,
        plans: Vec<SessionPlan>,
        system_prompts: &[String],
    ) -> Conversations {
        let sessions = plans
            .into_iter()
            .map(|plan| {
                let system = system_prompts.get(plan.family).cloned().unwrap_or_default();
                Conversation::new(phase, seed, plan, system)
            })
            .collect();
        Conversations { sessions }
    }

    /// Every session's first turn, in send order.
    pub fn openers(&mut self) -> Vec<TurnRequest> {
        let mut out: Vec<TurnRequest> = self
            .sessions
            .iter_mut()
            .filter_map(Conversation::opener)
            .collect();
        out.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.index.cmp(&b.index)));
        out
    }

    /// [`Conversation::turn_ended`] for session `session`.
    pub fn turn_ended(
        &mut self,
        session: usize,
        end: TurnEnd<'_>,
        ended_at: f64,
    ) -> Result<Option<TurnRequest>, ConversationError> {
        self.sessions
            .get_mut(session)
            .ok_or(ConversationError::NoSuchSession(session))?
            .turn_ended(end, ended_at)
    }

    /// Turns planned over every session.
    pub fn planned(&self) -> usize {
        self.sessions.iter().map(Conversation::planned).sum()
    }

    /// Turns never sent because an earlier turn of their session failed.
    pub fn abandoned(&self) -> usize {
        self.sessions.iter().map(Conversation::abandoned).sum()
    }

    /// Whether every session is over.
    pub fn finished(&self) -> bool {
        self.sessions.iter().all(Conversation::finished)
    }

    /// The sessions, for a runner that drives each on its own.
    pub fn into_sessions(self) -> Vec<Conversation> {
        self.sessions
    }
}

#[cfg(test)]
#[path = "conversation_tests.rs"]
mod tests;

//! A scenario's traffic shape, resolved from its table and the file's `[workload]`: how
//! arrivals are spaced, how popular the families are and whether they come and go, how long
//! tails and answers are, and whether the scenario is multi-turn conversations.
//!
//! Every key is optional and its default is the seed's behaviour (constant spacing, the
//! `hot_fraction` split, every family live all phase, the `[workload]` tail range and output
//! length, single requests), so the seed's matrix file gives the seed's traffic bit for bit.
//! [`Traffic::describe`] names whatever differs, for the phase's recorded config.

use super::conversation::ConversationSpec;
use super::inter_arrival::InterArrival;
use super::length::LengthDist;
use super::popularity::{FamilyLifetimes, Popularity};
use super::scenario::{ScenarioSpec, WorkloadShape};

/// A scenario's traffic, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub arrival: InterArrival,
    pub popularity: Popularity,
    pub lifetimes: FamilyLifetimes,
    /// Per-request tail after the family prefix (nonce first); a conversation's first user
    /// message.
    pub tail: LengthDist,
    /// Each request's `max_tokens` (with `ignore_eos`).
    pub output: LengthDist,
    pub conversations: Option<ConversationSpec>,
}

impl Traffic {
    /// Resolves scenario `name`'s traffic over `shape` (the `[workload]` table with the
    /// scenario's `count`, `rps` and `families` already applied). Errors name the key as
    /// `scenario.NAME.KEY`.
    pub fn resolve(
        name: &str,
        spec: &ScenarioSpec,
        shape: &WorkloadShape,
    ) -> Result<Traffic, String> {
        let key = |k: &str| format!("scenario.{name}.{k}");
        let within = |e: String| format!("scenario.{name}.{e}");
        if !(0.0..1.0).contains(&spec.hot_fraction) {
            return Err(format!(
                "{} must be in [0, 1), got {}",
                key("hot_fraction"),
                spec.hot_fraction
            ));
        }
        let popularity = match spec.popularity {
            Some(_) if spec.hot_fraction > 0.0 => {
                return Err(format!(
                    "{} and {} both say how popular families are; keep one",
                    key("hot_fraction"),
                    key("popularity")
                ));
            }
            Some(p) => p,
            None => Popularity::from_hot_fraction(spec.hot_fraction),
        };
        popularity.validate().map_err(within)?;
        spec.arrival.validate().map_err(within)?;
        let lifetimes = FamilyLifetimes::new(shape.families, spec.family_lifetime.unwrap_or(1.0))
            .map_err(within)?;
        let [lo, hi] = shape.tail_tokens;
        let tail = spec.tail_tokens.unwrap_or(LengthDist::Range(lo, hi));
        tail.validate(&key("tail_tokens"))?;
        let output = spec
            .output
            .unwrap_or(LengthDist::Fixed(shape.output as usize));
        output.validate(&key("output"))?;
        if let Some(c) = &spec.conversations {
            c.validate().map_err(within)?;
        }
        Ok(Traffic {
            arrival: spec.arrival,
            popularity,
            lifetimes,
            tail,
            output,
            conversations: spec.conversations.clone(),
        })
    }

    /// What differs from the seed's traffic, for a phase's config (`None`: nothing).
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.arrival != InterArrival::Constant {
            parts.push(format!("arrival {}", self.arrival.label()));
        }
        if let Popularity::Zipf(s) = self.popularity {
            parts.push(format!("zipf {s}"));
        }
        if !self.lifetimes.whole_phase() {
            parts.push(format!("family lifetime {}", self.lifetimes.lifetime));
        }
        if !matches!(self.tail, LengthDist::Range(..)) {
            parts.push(format!("tail {}", self.tail));
        }
        if !matches!(self.output, LengthDist::Fixed(_)) {
            parts.push(format!("output {}", self.output));
        }
        if let Some(c) = &self.conversations {
            let user = c
                .user_tokens
                .map_or(String::new(), |u| format!(", user {u}"));
            parts.push(format!(
                "conversations: {} sessions × {} turns, think {} s{user}",
                c.sessions, c.turns, c.think_s
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

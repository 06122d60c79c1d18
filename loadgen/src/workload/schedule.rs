//! What a phase sends and when: per-family request counts and a seeded family order (or,
//! with families that come and go, a seeded draw among the live ones), arrival times from the
//! scenario's process, and per-request tail and output lengths; for a conversation scenario,
//! the same for its sessions, planned into turns.
//!
//! Everything is seeded by (round seed, scenario), not by route, so every route of a round
//! sees the same traffic shape; only the prefix text is fresh per phase. Each draw has its
//! own stream (`family-order`, `arrivals`, `tail-length`, `output-length`,
//! `conversations`), so a key left at the seed's default draws exactly what the seed drew.

use rand::seq::SliceRandom;

use super::conversation::{SessionPlan, TurnShapes, plan_sessions};
use super::matrix::PhaseSpec;
use super::popularity::churned_families;
use super::seeding::rng_for;

/// One measured request of a phase, before its prompt is known (priming decides which prefix
/// each family uses; [`PhaseSpec::planned_requests`] then makes the [`super::PlannedRequest`]s).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSlot {
    /// Position in the phase (0-based).
    pub index: usize,
    pub family: usize,
    /// Scheduled send time, in seconds after the phase starts.
    pub at: f64,
    /// Words in the tail (nonce included).
    pub tail_tokens: usize,
    pub max_tokens: u32,
}

/// The measured requests of a phase, in send order.
pub fn plan_requests(phase: &PhaseSpec) -> Vec<PhaseSlot> {
    let traffic = &phase.traffic;
    let count = phase.shape.count;
    let families = family_order(phase, count);
    let times = traffic.arrival.times(
        count,
        phase.shape.rps,
        &mut rng_for(phase.seed, &[&phase.scenario, "arrivals"]),
    );
    let mut lengths = rng_for(phase.seed, &[&phase.scenario, "tail-length"]);
    let mut outputs = rng_for(phase.seed, &[&phase.scenario, "output-length"]);
    families
        .into_iter()
        .zip(times)
        .enumerate()
        .map(|(index, (family, at))| PhaseSlot {
            index,
            family,
            at,
            tail_tokens: traffic.tail.sample(&mut lengths),
            max_tokens: output_tokens(traffic.output.sample(&mut outputs)),
        })
        .collect()
}

/// The sessions of a conversation scenario (`None` for single requests): started by the
/// scenario's arrival process at its rate, given families as requests would be, then
/// planned into turns.
pub fn plan_conversations(phase: &PhaseSpec) -> Option<Vec<SessionPlan>> {
    let traffic = &phase.traffic;
    let spec = traffic.conversations.as_ref()?;
    let families = family_order(phase, spec.sessions);
    let starts = traffic.arrival.times(
        spec.sessions,
        phase.shape.rps,
        &mut rng_for(phase.seed, &[&phase.scenario, "arrivals"]),
    );
    let shapes = TurnShapes {
        first_user: traffic.tail,
        later_user: spec.user_tokens.unwrap_or(traffic.tail),
        output: traffic.output,
    };
    Some(plan_sessions(
        spec,
        &starts,
        &families,
        shapes,
        &mut rng_for(phase.seed, &[&phase.scenario, "conversations"]),
    ))
}

/// The family of each of `count` requests (or sessions), in send order: exact counts in the
/// seed's shuffled order, or a draw among live families when they come and go.
fn family_order(phase: &PhaseSpec, count: usize) -> Vec<usize> {
    let traffic = &phase.traffic;
    let mut rng = rng_for(phase.seed, &[&phase.scenario, "family-order"]);
    if !traffic.lifetimes.whole_phase() {
        return churned_families(count, traffic.popularity, traffic.lifetimes, &mut rng);
    }
    let counts = traffic.popularity.counts(count, phase.shape.families);
    let mut families: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(family, &n)| std::iter::repeat_n(family, n))
        .collect();
    families.shuffle(&mut rng);
    families
}

/// A drawn output length as `max_tokens` (validation bounds it by 10⁶).
fn output_tokens(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::matrix::Matrix;

    #[test]
    fn plan_is_seeded_constant_spaced_and_shared_across_routes() {
        let phases = Matrix::builtin().unwrap().phases();
        let random = plan_requests(&phases[6]); // r1-hot50-random
        let least = plan_requests(&phases[7]); // r1-hot50-least-request
        assert_eq!(random, least);
        assert_eq!(random.len(), 96);
        assert_eq!(random.iter().filter(|r| r.family == 0).count(), 48);
        for (i, r) in random.iter().enumerate() {
            assert_eq!(r.index, i);
            assert!((r.at - i as f64 / 1.6).abs() < 1e-9);
            assert!((333..=353).contains(&r.tail_tokens));
        }
        // Shuffled, not blocked: the hot family is spread over the phase.
        assert!(random[..48].iter().any(|r| r.family != 0));
        // A different round seed gives a different order.
        let r2 = plan_requests(&phases[20]); // r2-hot50-random
        assert_ne!(
            random.iter().map(|r| r.family).collect::<Vec<_>>(),
            r2.iter().map(|r| r.family).collect::<Vec<_>>()
        );
    }
}

#[cfg(test)]
mod traffic_tests {
    use super::*;
    use crate::workload::matrix::{MATRIX_24, Matrix};

    fn with(scenario_keys: &str) -> Vec<PhaseSlot> {
        // Keys replace the scenario's hot_fraction line when they set it.
        let head = "[scenario.hot50]\npriming = \"hot\"\n";
        let hot50 = format!("{head}hot_fraction = 0.5\n");
        let keep = if scenario_keys.contains("hot_fraction") {
            head.to_owned()
        } else {
            hot50.clone()
        };
        let text = MATRIX_24.replace(&hot50, &format!("{keep}{scenario_keys}\n"));
        let m = Matrix::from_toml_str(&text, "m").unwrap();
        plan_requests(&m.phases()[6])
    }

    #[test]
    fn each_key_changes_only_its_own_draws() {
        let seed = with("");
        let poisson = with("arrival = \"poisson\"");
        let same = |a: &[PhaseSlot], b: &[PhaseSlot], f: fn(&PhaseSlot) -> f64| {
            a.iter().zip(b).all(|(x, y)| f(x) == f(y))
        };
        assert!(same(&seed, &poisson, |s| s.family as f64));
        assert!(same(&seed, &poisson, |s| s.tail_tokens as f64));
        assert!(!same(&seed, &poisson, |s| s.at));
        assert_eq!(poisson.last().unwrap().at, seed.last().unwrap().at);

        let outputs =
            with("output = { dist = \"lognormal\", mean = 200.0, cv = 1.0, min = 8, max = 4000 }");
        assert!(same(&seed, &outputs, |s| s.at));
        assert!(same(&seed, &outputs, |s| s.tail_tokens as f64));
        assert!(seed.iter().all(|s| s.max_tokens == 128));
        assert!(
            outputs
                .iter()
                .any(|s| s.max_tokens != outputs[0].max_tokens)
        );

        let zipf = with("hot_fraction = 0.0\npopularity = { zipf = 1.0 }");
        let counts: Vec<usize> = (0..8)
            .map(|f| zipf.iter().filter(|s| s.family == f).count())
            .collect();
        assert_eq!(counts, vec![35, 18, 12, 9, 7, 6, 5, 4]);

        let churn = with("hot_fraction = 0.0\npopularity = { zipf = 1.0 }\nfamily_lifetime = 0.25");
        assert!(churn[..10].iter().all(|s| s.family <= 1));
        assert!(churn[90..].iter().all(|s| s.family >= 6));
    }
}

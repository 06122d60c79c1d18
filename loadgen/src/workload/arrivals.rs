//! What an operations phase sends and when: arrival times of a staged open-loop profile, the
//! tenant and prompt of request `i`, and the prompt text.
//!
//! Everything is a function of (file seed, phase name, index), so a closed-loop sender can
//! make request `i` when it gets there and two runs of a phase send the same text. Tenants
//! take arrivals round-robin (the seed's 210 arrivals split 105/105). A prompt is
//! `16 × repeat` words plus a tail of 30–40 words; with the chat template's two tokens that
//! is the seed harness's size (512–522 prompt tokens at `repeat = 30`, 1472–1482 at 90,
//! 4832–4842 at 300, against the seed's 4831–4842). Without
//! `shared_prefix` the text starts with a nonce unique to the request, so no two requests
//! share a cached block; with it, a tenant's requests share their `16 × repeat`-word prefix,
//! and so do that tenant's requests in every other `shared_prefix` phase of the file (the
//! prefix depends on the file seed, tenant and size, not on the phase): the seed's four
//! online cache phases hit one prefix that stayed cached from phase to phase.

use rand::Rng;

use super::operations::{ArrivalProcess, Load, OperationsPhase, Stage, TenantShape};
use super::prompt;
use super::seeding::rng_for;

/// Prompt words per unit of `repeat`.
pub const TOKENS_PER_REPEAT: usize = 16;

/// Inclusive range of the per-request tail (nonce included).
pub const TAIL_TOKENS: [usize; 2] = [30, 40];

/// Send times (seconds after the phase starts) of staged arrivals, in order.
///
/// Constant: stage `k` contributes `round(duration × rps)` arrivals `1/rps` apart from the
/// stage's start. Poisson: exponential gaps of mean `1/rps` inside each stage, seeded by
/// `(seed, name)`. A stage with `rps = 0` is a pause.
pub fn stage_arrivals(
    stages: &[Stage],
    process: ArrivalProcess,
    seed: u64,
    name: &str,
) -> Vec<f64> {
    let mut rng = rng_for(seed, &[name, "arrivals"]);
    let mut out = Vec::new();
    let mut start = 0.0;
    for stage in stages {
        if stage.rps > 0.0 {
            let end = start + stage.duration;
            match process {
                ArrivalProcess::Constant => {
                    // duration × rps is bounded by validation, so the cast is exact enough.
                    let n = (stage.duration * stage.rps).round() as usize;
                    out.extend((0..n).map(|i| start + i as f64 / stage.rps));
                }
                ArrivalProcess::Poisson => {
                    let mut t = start;
                    // Bounded: 4× the expected count (validation keeps that small) ends it.
                    let bound = (stage.duration * stage.rps * 4.0).ceil() as usize + 16;
                    for _ in 0..bound {
                        let u: f64 = rng.random_range(0.0..1.0);
                        t += -(1.0 - u).ln() / stage.rps;
                        if t >= end {
                            break;
                        }
                        out.push(t);
                    }
                }
            }
        }
        start += stage.duration;
    }
    out
}

/// One request of an operations phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationsRequest {
    /// Arrival (open loop) or send (closed loop) number, 0-based.
    pub index: usize,
    /// Index into the phase's tenants.
    pub tenant: usize,
    pub tail_tokens: usize,
}

impl OperationsPhase {
    /// Arrival times of an open-loop phase (empty for a closed loop).
    pub fn arrivals(&self) -> Vec<f64> {
        match &self.load {
            Load::Open {
                stages, arrival, ..
            } => stage_arrivals(stages, *arrival, self.seed, &self.def.name),
            Load::Closed { .. } => Vec::new(),
        }
    }

    /// Request `index`: its tenant (round-robin) and tail length (seeded per index).
    pub fn request(&self, index: usize) -> OperationsRequest {
        let i = index.to_string();
        let mut rng = rng_for(self.seed, &[&self.def.name, "tail-length", &i]);
        OperationsRequest {
            index,
            tenant: index % self.tenants.len().max(1),
            tail_tokens: rng.random_range(TAIL_TOKENS[0]..=TAIL_TOKENS[1]),
        }
    }

    /// The tenant of `request`.
    pub fn tenant_of(&self, request: &OperationsRequest) -> &TenantShape {
        &self.tenants[request.tenant % self.tenants.len()]
    }

    /// The prompt text of `request`.
    pub fn prompt(&self, request: &OperationsRequest) -> String {
        let body = self.tenant_of(request).repeat as usize * TOKENS_PER_REPEAT;
        let name = &self.def.name;
        if self.def.shared_prefix {
            let tenant = format!("shared-prefix-{}", self.tenant_of(request).name);
            let prefix = prompt::family_prefix(&tenant, self.seed, 0, 0, body);
            let tail =
                prompt::request_tail(name, self.seed, "ops", request.index, request.tail_tokens);
            prompt::join(&prefix, &tail)
        } else {
            prompt::request_tail(
                name,
                self.seed,
                "ops",
                request.index,
                body + request.tail_tokens,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::operations::Operations;

    fn stages(list: &[(f64, f64)]) -> Vec<Stage> {
        list.iter()
            .map(|&(duration, rps)| Stage { duration, rps })
            .collect()
    }

    #[test]
    fn constant_stages_give_the_seed_wave_counts_and_spacing() {
        let wave = stages(&[(60.0, 0.2), (240.0, 1.6), (90.0, 0.2)]);
        let at = stage_arrivals(&wave, ArrivalProcess::Constant, 1, "w");
        assert_eq!(at.len(), 12 + 384 + 18);
        assert_eq!(at[0], 0.0);
        assert!((at[11] - 55.0).abs() < 1e-9);
        assert!((at[12] - 60.0).abs() < 1e-9);
        assert!((at[13] - 60.625).abs() < 1e-9);
        assert!((at[396] - 300.0).abs() < 1e-9);
        assert!((at[413] - 385.0).abs() < 1e-9);
        assert!(at.windows(2).all(|w| w[0] < w[1]));
        // A pause stage adds time, not arrivals.
        let paused = stages(&[(2.0, 1.0), (10.0, 0.0), (2.0, 1.0)]);
        assert_eq!(
            stage_arrivals(&paused, ArrivalProcess::Constant, 1, "p"),
            vec![0.0, 1.0, 12.0, 13.0]
        );
    }

    #[test]
    fn poisson_stages_are_seeded_in_order_and_inside_their_stage() {
        let wave = stages(&[(100.0, 0.5), (100.0, 4.0)]);
        let a = stage_arrivals(&wave, ArrivalProcess::Poisson, 7, "w");
        assert_eq!(a, stage_arrivals(&wave, ArrivalProcess::Poisson, 7, "w"));
        assert_ne!(a, stage_arrivals(&wave, ArrivalProcess::Poisson, 8, "w"));
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        let first = a.iter().filter(|&&t| t < 100.0).count();
        let second = a.len() - first;
        // Expected 50 and 400; these bounds are > 5 sigma wide.
        assert!((20..=85).contains(&first), "{first}");
        assert!((300..=500).contains(&second), "{second}");
        assert!(a.iter().all(|&t| (0.0..200.0).contains(&t)));
    }

    #[test]
    fn tenants_alternate_and_prompts_have_the_seed_sizes() {
        let ops = Operations::builtin().unwrap();
        let protected = ops
            .phases
            .iter()
            .find(|p| p.def.name == "tenants-protected")
            .unwrap();
        let arrivals = protected.arrivals();
        assert_eq!(arrivals.len(), 210);
        let b = (0..210)
            .filter(|&i| protected.request(i).tenant == 1)
            .count();
        assert_eq!(b, 105);
        // Prompt tokens as the mock engine counts them: through its chat template.
        let words =
            |s: &str| mock_engine::tokenizer::encode(&format!("<|user|> {s} <|assistant|>")).len();
        let a0 = protected.request(0);
        let b0 = protected.request(1);
        assert!((512..=522).contains(&words(&protected.prompt(&a0))));
        assert!((1472..=1482).contains(&words(&protected.prompt(&b0))));
        assert_eq!(
            protected.prompt(&a0),
            protected.prompt(&protected.request(0))
        );
        // Unshared prompts differ from the first word; shared ones share 16 × repeat words.
        let first = |s: String| s.split(' ').next().unwrap().to_owned();
        assert_ne!(
            first(protected.prompt(&a0)),
            first(protected.prompt(&protected.request(2)))
        );
        let cache = ops
            .phases
            .iter()
            .find(|p| p.def.name == "cache-online-prefix-a")
            .unwrap();
        let (x, y) = (
            cache.prompt(&cache.request(0)),
            cache.prompt(&cache.request(1)),
        );
        let shared = x
            .split(' ')
            .zip(y.split(' '))
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(shared, 300 * TOKENS_PER_REPEAT);
        // The next cache phase's requests share that prefix too, not their tails.
        let next = ops
            .phases
            .iter()
            .find(|p| p.def.name == "cache-online-prefix-b")
            .unwrap();
        let z = next.prompt(&next.request(0));
        let common = x
            .split(' ')
            .zip(z.split(' '))
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(common, 300 * TOKENS_PER_REPEAT);
        assert!((4832..=4842).contains(&words(&x)));
    }
}

//! Fidelity (issue 6): the simulated stack (router-core policies + the calibrated
//! `l20-qwen27b-fp8` engine model) reproduces the seed's 24-phase table for `random`,
//! `least-request` and `prefix-cache`, within the tolerances of `docs/FIDELITY.md`.
//! Virtual time only, so every figure is deterministic and nothing depends on the machine.
//!
//! Three checks, because the seed's `prefix-cache` cells hang on routing draws that two
//! rounds cannot pin down (docs/FIDELITY.md, "Draws"):
//! - the seed's own rounds (seeds 102, 103): hit ratios, peaks, the hot50 collapse and its
//!   split, and goodput of every cell whose outcome is not decided by a draw;
//! - an ensemble of the seed's rounds plus six more round seeds: every cell's mean goodput in
//!   the seed's range ±15 and the seed's winners;
//! - warm-uniform `prefix-cache` with the priming split forced to the seed's 4:4 and 6:2:
//!   both of the seed's outcomes (96 and 43 good);
//! - cold-uniform `prefix-cache` with each family's first placement forced: the seed's 3:5
//!   family sets give the seed's outcome (59 and 40 good), a 4:4 split a better one.

use std::collections::BTreeMap;

use loadgen::measure::{MatrixResult, PhaseResult};
use loadgen::run::{SimOptions, simulate_matrix};
use loadgen::workload::Matrix;
use mock_engine::model::EngineProfile;

const SEED: &str = include_str!("../testdata/matrix-24-phase.json");
const MATRIX_24: &str = include_str!("../../config/matrix-24.toml");
const ROUTES: [&str; 3] = ["random", "least-request", "prefix-cache"];
/// Goodput tolerance around the seed's two-round range (issue 6).
const GOOD_SLACK: f64 = 15.0;
const HIT_SLACK: f64 = 0.03;
/// Round seeds added to the seed's 102 and 103 for the ensemble.
const EXTRA_SEEDS: [u64; 6] = [200, 201, 202, 203, 204, 205];

/// (scenario, route) → that cell's phases, in run order.
type Cells<'a> = BTreeMap<(String, String), Vec<&'a PhaseResult>>;

fn seed() -> MatrixResult {
    serde_json::from_str(SEED).expect("the embedded seed parses in our schema")
}

fn cells(phases: &[PhaseResult]) -> Cells<'_> {
    let mut out = Cells::new();
    for p in phases {
        out.entry((p.scenario.clone(), p.route.clone()))
            .or_default()
            .push(p);
    }
    out
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { f64::NAN } else { sum / n as f64 }
}

fn mean_good(phases: &[&PhaseResult]) -> f64 {
    mean(phases.iter().map(|p| p.good as f64))
}

/// The largest value of `f` over a phase's replicas.
fn replica_max(p: &PhaseResult, f: fn(&loadgen::measure::ReplicaResult) -> f64) -> f64 {
    p.replicas.values().map(f).fold(0.0, f64::max)
}

/// Replica request counts, ascending (the split, whichever replica got more).
fn split(p: &PhaseResult) -> Vec<usize> {
    let mut s: Vec<usize> = p.replicas.values().map(|r| r.requests).collect();
    s.sort_unstable();
    s
}

fn simulate(matrix_text: &str, options: &SimOptions, routes: &[&str]) -> Vec<PhaseResult> {
    let routes: Vec<String> = routes.iter().map(|r| (*r).to_owned()).collect();
    let matrix = Matrix::from_toml_str(matrix_text, "fidelity test matrix")
        .and_then(|m| m.with_routes(&routes))
        .expect("matrix is valid");
    simulate_matrix(&matrix, options, &mut |_, _| {})
        .map_err(|partial| partial.error)
        .expect("simulation completes")
        .phases
}

fn options() -> SimOptions {
    SimOptions::seed_like(EngineProfile::builtin("l20-qwen27b-fp8").expect("built-in profile"))
}

/// The matrix with the seed's rounds and `extra` round seeds after them (alternating
/// direction, as the seed's two rounds do).
fn matrix_with_rounds(extra: &[u64]) -> String {
    let mut text = MATRIX_24.to_owned();
    for (i, seed) in extra.iter().enumerate() {
        let number = i + 3;
        let reverse = i % 2 == 1;
        text = text.replacen(
            "[scenario.cold-uniform]",
            &format!(
                "[[round]]\nnumber = {number}\nseed = {seed}\nreverse_routes = {reverse}\n\n\
                 [scenario.cold-uniform]"
            ),
            1,
        );
    }
    text
}

/// Goodput of a cell within the seed's two-round range widened by [`GOOD_SLACK`].
fn good_problem(key: &(String, String), seed: &[&PhaseResult], ours: f64) -> Option<String> {
    let lo = seed.iter().map(|p| p.good).min().unwrap_or(0) as f64 - GOOD_SLACK;
    let hi = seed.iter().map(|p| p.good).max().unwrap_or(0) as f64 + GOOD_SLACK;
    (!(lo..=hi).contains(&ours)).then(|| {
        format!(
            "{}/{}: good {ours:.1} outside the seed's [{lo}, {hi}]",
            key.0, key.1
        )
    })
}

/// Does the `prefix-cache` outcome of this cell hang on a routing draw our rounds did not
/// make the seed's way? (cold-uniform: the family split of the least-request fallback;
/// warm-uniform: the coin-toss priming split; hot50: where the hot family's requests fall in
/// the shuffled order, which two rounds cannot average out.) Those cells are checked by the
/// ensemble and the forced-split test instead.
fn decided_by_a_draw(key: &(String, String), seed: &[&PhaseResult], ours: &[&PhaseResult]) -> bool {
    if key.1 != "prefix-cache" {
        return false;
    }
    key.0 == "hot50"
        || seed
            .iter()
            .map(|p| split(p))
            .ne(ours.iter().map(|p| split(p)))
}

#[test]
fn the_seed_rounds_match_the_seed_within_tolerance() {
    let seed = seed();
    let ours = simulate(MATRIX_24, &options(), &ROUTES);
    let (seed_cells, our_cells) = (cells(&seed.phases), cells(&ours));
    let mut problems = Vec::new();
    for (key, s) in &seed_cells {
        let o = our_cells.get(key).expect("every seed cell is simulated");
        if !decided_by_a_draw(key, s, o)
            && let Some(p) = good_problem(key, s, mean_good(o))
        {
            problems.push(p);
        }
        let (sh, oh) = (
            mean(s.iter().map(|p| p.cache_hit_ratio)),
            mean(o.iter().map(|p| p.cache_hit_ratio)),
        );
        if (sh - oh).abs() > HIT_SLACK {
            problems.push(format!(
                "{}/{}: hit ratio {oh:.3} vs seed {sh:.3}",
                key.0, key.1
            ));
        }
        // "Same order": the busiest replica's peaks, averaged over the rounds.
        for (what, f) in [
            (
                "running_peak",
                (|r: &loadgen::measure::ReplicaResult| r.running_peak) as fn(&_) -> f64,
            ),
            ("waiting_peak", |r| r.waiting_peak),
        ] {
            let sp = mean(s.iter().map(|p| replica_max(p, f)));
            let op = mean(o.iter().map(|p| replica_max(p, f)));
            if op > 2.0 * sp + 3.0 || op < sp / 2.0 - 3.0 {
                problems.push(format!(
                    "{}/{}: {what} {op:.1} vs seed {sp:.1}",
                    key.0, key.1
                ));
            }
        }
    }
    // The collapse: every hot50 prefix-cache round splits at least 65/31.
    for p in our_cells[&("hot50".into(), "prefix-cache".into())].iter() {
        let s = split(p);
        if s.first().copied().unwrap_or(0) > 31 {
            problems.push(format!("{}: split {s:?} is not at least 65/31", p.phase));
        }
    }
    assert!(
        problems.is_empty(),
        "fidelity problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn an_ensemble_of_rounds_matches_the_seed_goodput_and_winners() {
    let seed = seed();
    let ours = simulate(&matrix_with_rounds(&EXTRA_SEEDS), &options(), &ROUTES);
    let (seed_cells, our_cells) = (cells(&seed.phases), cells(&ours));
    let mut problems = Vec::new();
    let mut table = Vec::new();
    for (key, s) in &seed_cells {
        let o = &our_cells[key];
        assert_eq!(
            o.len(),
            2 + EXTRA_SEEDS.len(),
            "{key:?}: one phase per round"
        );
        table.push(format!(
            "{}/{}: ours {:.1} (rounds {:?}) seed {:.1}",
            key.0,
            key.1,
            mean_good(o),
            o.iter().map(|p| p.good).collect::<Vec<_>>(),
            mean_good(s)
        ));
        problems.extend(good_problem(key, s, mean_good(o)));
    }
    // Winners: where both seed rounds agree and the mean gap exceeds 15, ours agree too.
    for ((scenario, a), sa) in &seed_cells {
        for ((scenario_b, b), sb) in &seed_cells {
            if scenario != scenario_b || a >= b {
                continue;
            }
            let agree = sa.iter().zip(sb.iter()).map(|(x, y)| x.good.cmp(&y.good));
            let first = sa[0].good.cmp(&sb[0].good);
            let gap = mean_good(sa) - mean_good(sb);
            if agree.clone().all(|c| c == first) && first.is_ne() && gap.abs() > GOOD_SLACK {
                let ours_gap = mean_good(&our_cells[&(scenario.clone(), a.clone())])
                    - mean_good(&our_cells[&(scenario.clone(), b.clone())]);
                if ours_gap.signum() != gap.signum() {
                    problems.push(format!("{scenario}: winner of {a} vs {b} flipped"));
                }
            }
        }
    }
    println!("{}", table.join("\n"));
    assert!(
        problems.is_empty(),
        "fidelity problems:\n{}",
        problems.join("\n")
    );
}

/// The matrix with only `scenario` in it.
fn matrix_of(scenario: &str) -> String {
    let text = MATRIX_24.replace(
        "scenarios = [\"cold-uniform\", \"warm-uniform\", \"hot50\", \"hot90\"]",
        &format!("scenarios = [\"{scenario}\"]"),
    );
    assert_ne!(
        text, MATRIX_24,
        "the scenario list is where the test expects it"
    );
    text
}

/// The warm-uniform prefix-cache rounds of a matrix with only that cell, priming split forced.
fn warm_prefix_cache(owners: Vec<usize>) -> Vec<PhaseResult> {
    let mut options = options();
    options.warm_owners = Some(owners);
    simulate(&matrix_of("warm-uniform"), &options, &["prefix-cache"])
}

/// The cold-uniform prefix-cache rounds with family `f`'s first request forced onto
/// replica `owners[f]`.
fn cold_prefix_cache(owners: Vec<usize>) -> Vec<PhaseResult> {
    let mut options = options();
    options.first_owners = Some(owners);
    simulate(&matrix_of("cold-uniform"), &options, &["prefix-cache"])
}

/// Replica index (0 = L20-A) of each family, from a seed phase's per-replica family counts.
fn seed_family_owners(p: &PhaseResult) -> Vec<usize> {
    let mut owners = vec![usize::MAX; 8];
    for (replica, (_, r)) in p.replicas.iter().enumerate() {
        for family in r.family_counts.keys() {
            let f: usize = family.parse().expect("family ids are numbers");
            owners[f] = replica;
        }
    }
    owners
}

#[test]
fn cold_uniform_prefix_cache_follows_the_family_split_as_in_the_seed() {
    let seed = seed();
    let seed_phase = |name: &str| {
        seed.phases
            .iter()
            .find(|p| p.phase == name)
            .expect("seed phase exists")
    };
    let (seed_r1, seed_r2) = (
        seed_phase("r1-cold-uniform-prefix-cache"),
        seed_phase("r2-cold-uniform-prefix-cache"),
    );
    // Both seed rounds put 3 families on one replica and 5 on the other, and nothing moved
    // afterwards (36/60 and 60/36). Force each of our rounds onto the seed's family sets.
    let mut seed_split = Vec::new();
    for (owners, want) in [
        (seed_family_owners(seed_r1), seed_r1),
        (seed_family_owners(seed_r2), seed_r2),
    ] {
        assert!(owners.iter().all(|&o| o < 2), "{owners:?}");
        let phases = cold_prefix_cache(owners.clone());
        for p in &phases {
            println!(
                "owners {owners:?}: {}: split {:?}, {} good",
                p.phase,
                split(p),
                p.good
            );
            assert_eq!(split(p), split(want), "{}: families stay put", p.phase);
        }
        seed_split.extend(phases);
    }
    let refs: Vec<&PhaseResult> = seed_split.iter().collect();
    let ours = mean_good(&refs);
    let lo = seed_r1.good.min(seed_r2.good) as f64 - GOOD_SLACK;
    let hi = seed_r1.good.max(seed_r2.good) as f64 + GOOD_SLACK;
    assert!(
        (lo..=hi).contains(&ours),
        "{ours:.1} good under the seed's 3:5 family sets, seed band [{lo}, {hi}]"
    );
    // The mechanism: a 4:4 split spreads the 8 first prefills and the load evenly.
    let even = cold_prefix_cache(vec![0, 1, 0, 1, 0, 1, 0, 1]);
    for p in &even {
        println!("4:4: {}: split {:?}, {} good", p.phase, split(p), p.good);
        assert_eq!(split(p), vec![48, 48], "{}", p.phase);
    }
    let even_good = mean_good(&even.iter().collect::<Vec<_>>());
    assert!(
        even_good > ours + GOOD_SLACK,
        "4:4 gives {even_good:.1}, the seed's 3:5 sets {ours:.1}"
    );
}

#[test]
fn warm_uniform_prefix_cache_gives_both_seed_outcomes_under_their_priming_splits() {
    let seed = seed();
    let seed_good = |phase: &str| {
        seed.phases
            .iter()
            .find(|p| p.phase == phase)
            .map(|p| p.good as f64)
            .expect("seed phase exists")
    };
    // Round 1 of the seed: owners 4:4, 48/48, 96 good.
    let even = warm_prefix_cache(vec![0, 1, 0, 1, 0, 1, 0, 1]);
    // Round 2 of the seed: owners 6:2, 70/26, 43 good.
    let skewed = warm_prefix_cache(vec![0, 0, 1, 0, 0, 0, 1, 0]);
    for p in even.iter().chain(&skewed) {
        println!("{}: split {:?}, {} good", p.phase, split(p), p.good);
    }
    assert_eq!((even.len(), skewed.len()), (2, 2), "one phase per round");
    // The tolerance is on our average over the rounds, as for every other cell.
    for p in &even {
        assert_eq!(split(p), vec![48, 48], "{}", p.phase);
    }
    let (even_good, want) = (
        mean_good(&even.iter().collect::<Vec<_>>()),
        seed_good("r1-warm-uniform-prefix-cache"),
    );
    assert!(
        even_good >= want - GOOD_SLACK,
        "{even_good:.1} good under a 4:4 split, seed {want}"
    );
    for p in &skewed {
        // The seed's 70/26: requests of the big side move only when the imbalance gate fires.
        assert!(split(p)[1] >= 65, "{}: split {:?}", p.phase, split(p));
    }
    let (skewed_good, want) = (
        mean_good(&skewed.iter().collect::<Vec<_>>()),
        seed_good("r2-warm-uniform-prefix-cache"),
    );
    assert!(
        ((want - GOOD_SLACK)..=(want + GOOD_SLACK)).contains(&skewed_good),
        "{skewed_good:.1} good under a 6:2 split, seed {want}"
    );
    // The mechanism: the skewed split costs the phase most of the even split's goodput.
    assert!(
        skewed_good + GOOD_SLACK < even_good,
        "{skewed_good} vs {even_good}"
    );
}

//! The ensemble evaluation: the whole matrix over 34 round seeds instead of the seed's two,
//! because two rounds cannot tell a better rule from a luckier draw
//! (docs/POLICY-EVALUATION.md, "Over more rounds"). `#[ignore]`d; run with `--ignored
//! --nocapture evaluation_ensemble`.

use super::*;

/// Round seeds of the ensemble: the seed's two (102, 103) and 200–231.
fn ensemble_seeds() -> Vec<u64> {
    [102, 103].into_iter().chain(200..232).collect()
}

/// The matrix text with its own `[[round]]` tables replaced by one per ensemble seed.
fn ensemble_matrix_text() -> String {
    let rounds: String = ensemble_seeds()
        .iter()
        .enumerate()
        .map(|(i, seed)| {
            format!(
                "[[round]]\nnumber = {}\nseed = {seed}\nreverse_routes = false\n\n",
                i + 1
            )
        })
        .collect();
    // The file's own [[round]] tables (up to the first scenario) give way to the ensemble's.
    let mut text = String::new();
    let mut in_rounds = false;
    for line in MATRIX_24.lines() {
        if line == "[[round]]" {
            in_rounds = true;
        }
        if in_rounds && line.starts_with("[scenario.") {
            text.push_str(&rounds);
            in_rounds = false;
        }
        if !in_rounds {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Two rounds cannot tell a better rule from a luckier draw: the four scenarios over the 34
/// rounds of [`ensemble_seeds`], with 8 and 16 families. The baselines run once; then, for
/// each weight set of `PL_WEIGHTS`, prints each route's mean good per phase, the rounds in
/// which `prefix-load` fell below the best other route, and prefix-load's mean good per
/// round over all scenarios (docs/POLICY-EVALUATION.md, "Over more rounds"). With
/// `PL_KV_SYNCED` set, every route's index also learns warm priming
/// ([`SimOptions::kv_synced_priming`]); with
/// `PL_KV_SYNC` set, the engines' KV events feed it ([`SimOptions::kv_sync`]).
#[test]
#[ignore = "evaluation: minutes in release"]
fn evaluation_ensemble() {
    let text = ensemble_matrix_text();
    for families in [8, 16] {
        let variant = Variant {
            name: format!("ensemble, {families} families"),
            matrix_edits: vec![("families = 8 ".into(), format!("families = {families} "))],
            // The index also learns warm priming, as KV-event sync would.
            kv_synced_priming: std::env::var_os("PL_KV_SYNCED").is_some(),
            kv_sync: pl_kv_sync(),
            ..Variant::seed_like()
        };
        let baselines = variant.run_on(&text, &ROUTES[..3], &PrefixLoadConfig::default());
        for weights in weight_sets() {
            let mut phases = baselines.clone();
            phases.extend(variant.run_on(&text, &[POLICY], &weights));
            println!("{families} families, prefix-load {weights:?}");
            let good = |scenario: &str, route: &str| -> Vec<usize> {
                phases
                    .iter()
                    .filter(|p| p.scenario == scenario && p.route == route)
                    .map(|p| p.good)
                    .collect()
            };
            let mut below_all = 0;
            let mut ours_all = 0;
            for scenario in ["cold-uniform", "warm-uniform", "hot50", "hot90"] {
                let ours = good(scenario, POLICY);
                let others: Vec<Vec<usize>> =
                    ROUTES[..3].iter().map(|r| good(scenario, r)).collect();
                let below = (0..ours.len())
                    .filter(|&i| others.iter().any(|o| o[i] > ours[i]))
                    .count();
                below_all += below;
                ours_all += ours.iter().sum::<usize>();
                let means: Vec<String> = ROUTES
                    .iter()
                    .map(|r| {
                        let g = good(scenario, r);
                        format!("{r} {:.1}", g.iter().sum::<usize>() as f64 / g.len() as f64)
                    })
                    .collect();
                println!(
                    "{families} families, {scenario}, {} rounds: {}; prefix-load below the best other in {below}",
                    ours.len(),
                    means.join(", ")
                );
                // Per round too, so that two weight sets can be compared round by round.
                let best: Vec<usize> = (0..ours.len())
                    .map(|i| others.iter().map(|o| o[i]).max().unwrap_or(0))
                    .collect();
                println!("{families} families, {scenario}, prefix-load per round: {ours:?}");
                println!("{families} families, {scenario}, best other per round: {best:?}");
            }
            println!(
                "{families} families, all scenarios: prefix-load {:.2} good per round, below the best other in {below_all} cells\n",
                ours_all as f64 / ensemble_seeds().len() as f64
            );
        }
    }
}

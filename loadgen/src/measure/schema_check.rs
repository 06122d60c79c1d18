//! The seed-schema check, in Rust: the same rule as `shared/tools/seed_schema_check.py`, so a
//! test (and `loadgen report --check-schema`) can hold results to it without Python.
//!
//! Every JSON key path of the seed's phases that is present in all phases of a scenario must
//! exist in ours with a JSON type the seed uses at that path (or `null` where the seed has
//! `null` there). Maps keyed by family, replica, candidate, tenant or status are wildcarded
//! (`*`). Extra keys in ours are allowed. The top-level keys must all exist and every seed
//! phase name appear.
//!
//! A seed without scenarios (the operations seed) is compared phase by phase instead: each of
//! our phases against the seed phase of the same name, whose kinds differ (waves, closed
//! loops, tenant mixes). There a run may select phases, so a seed phase we did not run is no
//! problem; a phase the seed lacks is.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Maps whose keys are data (families, replicas, candidates), compared by value type only.
const WILDCARD_MAPS: [&str; 8] = [
    "families",
    "replicas",
    "family_counts",
    "initial_prefix_owners",
    "family_map",
    "initial_owners",
    "tenants",
    "status_counts",
];

/// Key path → JSON kinds seen there. Paths look like `.replicas.*.requests`, `.ttft.p50`,
/// `.routing_counter_deltas[].labels.selection`.
pub fn key_paths(value: &Value) -> BTreeMap<String, BTreeSet<&'static str>> {
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

fn walk(value: &Value, path: String, out: &mut BTreeMap<String, BTreeSet<&'static str>>) {
    out.entry(path.clone()).or_default().insert(kind(value));
    match value {
        Value::Object(map) => {
            let last = path.rsplit('.').next().unwrap_or("");
            let wild = WILDCARD_MAPS.contains(&last);
            for (key, child) in map {
                let name = if wild { "*" } else { key.as_str() };
                walk(child, format!("{path}.{name}"), out);
            }
        }
        Value::Array(items) => {
            for item in items {
                walk(item, format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// Problems with `ours` measured against `seed` (empty when the schema matches).
pub fn check_against_seed(seed: &Value, ours: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if let (Some(seed_top), Some(our_top)) = (seed.as_object(), ours.as_object()) {
        for key in seed_top.keys().filter(|k| *k != "phases") {
            if !our_top.contains_key(key) {
                problems.push(format!("top-level key missing: {key}"));
            }
        }
    }
    let empty = Vec::new();
    let seed_phases = seed
        .get("phases")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let our_phases = ours
        .get("phases")
        .and_then(Value::as_array)
        .unwrap_or(&empty);

    // Per scenario (or per phase name): paths common to all of its seed phases, and every
    // kind seen per path.
    let group = if seed_phases.iter().any(|p| p.get("scenario").is_some()) {
        "scenario"
    } else {
        "phase"
    };
    type Paths = BTreeMap<String, BTreeSet<&'static str>>;
    let mut by_scenario: BTreeMap<String, Vec<Paths>> = BTreeMap::new();
    for phase in seed_phases {
        let scenario = phase.get(group).and_then(Value::as_str).unwrap_or("");
        by_scenario
            .entry(scenario.to_owned())
            .or_default()
            .push(key_paths(phase));
    }
    for phase in our_phases {
        let name = phase.get("phase").and_then(Value::as_str).unwrap_or("?");
        let scenario = phase.get(group).and_then(Value::as_str).unwrap_or("");
        let Some(seed_paths) = by_scenario.get(scenario) else {
            problems.push(format!("{name}: unknown {group} {scenario:?}"));
            continue;
        };
        let mine = key_paths(phase);
        let mut allowed: Paths = BTreeMap::new();
        for paths in seed_paths {
            for (path, kinds) in paths {
                allowed.entry(path.clone()).or_default().extend(kinds);
            }
        }
        for (path, kinds) in &allowed {
            if !seed_paths.iter().all(|p| p.contains_key(path)) {
                continue;
            }
            match mine.get(path) {
                None => problems.push(format!("{name}: missing {path}")),
                Some(our_kinds) => {
                    let extra: Vec<_> = our_kinds.difference(kinds).collect();
                    if !extra.is_empty() {
                        problems.push(format!(
                            "{name}: {path} is {our_kinds:?}, seed has {kinds:?}"
                        ));
                    }
                }
            }
        }
    }
    let ours_names: BTreeSet<&str> = our_phases
        .iter()
        .filter_map(|p| p.get("phase").and_then(Value::as_str))
        .collect();
    for phase in seed_phases.iter().filter(|_| group == "scenario") {
        if let Some(name) = phase.get("phase").and_then(Value::as_str)
            && !ours_names.contains(name)
        {
            problems.push(format!("phase missing: {name}"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/matrix-24-phase.json");

    #[test]
    fn the_seed_passes_its_own_check() {
        let seed: Value = serde_json::from_str(SEED).unwrap();
        assert_eq!(check_against_seed(&seed, &seed), Vec::<String>::new());
    }

    #[test]
    fn a_missing_key_a_wrong_type_and_a_missing_phase_are_caught() {
        let seed: Value = serde_json::from_str(SEED).unwrap();
        let mut ours = seed.clone();
        let phases = ours["phases"].as_array_mut().unwrap();
        for replica in ["L20-A", "L20-B"] {
            phases[0]["replicas"][replica]
                .as_object_mut()
                .unwrap()
                .remove("kv_usage_peak");
        }
        phases[1]["good"] = Value::String("43".into());
        phases[2]["ttft"]["p50"] = Value::Null;
        phases.pop();
        ours.as_object_mut().unwrap().remove("aibrix");
        let problems = check_against_seed(&seed, &ours);
        let all = problems.join("\n");
        assert!(
            all.contains("r1-cold-uniform-random: missing .replicas.*.kv_usage_peak"),
            "{all}"
        );
        assert!(
            all.contains("r1-cold-uniform-least-request: .good"),
            "{all}"
        );
        assert!(
            all.contains("r1-cold-uniform-prefix-cache: .ttft.p50"),
            "{all}"
        );
        assert!(all.contains("phase missing: r2-hot90-random"), "{all}");
        assert!(all.contains("top-level key missing: aibrix"), "{all}");
        assert_eq!(problems.len(), 5, "{all}");
    }

    const OPERATIONS_SEED: &str = include_str!("../../testdata/operations-phases.json");

    #[test]
    fn the_operations_seed_is_compared_phase_by_phase() {
        let seed: Value = serde_json::from_str(OPERATIONS_SEED).unwrap();
        assert_eq!(check_against_seed(&seed, &seed), Vec::<String>::new());
        let mut ours = seed.clone();
        let phases = ours["phases"].as_array_mut().unwrap();
        // A selection of phases is fine; a wave without its stages, a tenant without its
        // status counts, a string count and an unknown phase are not.
        phases.truncate(8);
        phases[0]["config"]
            .as_object_mut()
            .unwrap()
            .remove("stages");
        for tenant in ["A", "B"] {
            phases[7]["tenants"][tenant]
                .as_object_mut()
                .unwrap()
                .remove("status_counts");
        }
        phases[4]["dropped_arrivals"] = Value::String("0".into());
        phases[5]["phase"] = Value::String("my-own-phase".into());
        let problems = check_against_seed(&seed, &ours);
        let all = problems.join("\n");
        assert!(all.contains("fixed1-wave: missing .config.stages"), "{all}");
        assert!(
            all.contains("tenants-protected: missing .tenants.*.status_counts"),
            "{all}"
        );
        assert!(all.contains("drain-native: .dropped_arrivals"), "{all}");
        assert!(all.contains("my-own-phase: unknown phase"), "{all}");
        // Stages: the list, its items and their two keys; status counts: the map and its values.
        assert_eq!(problems.len(), 4 + 2 + 1 + 1, "{all}");
    }
}

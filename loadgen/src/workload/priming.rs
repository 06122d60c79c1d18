//! Priming plans (SPEC §5.1): which prefixes to prime where, and the balanced choice of
//! families after hot priming.
//!
//! Runners execute the plan (directly on replicas, or through the router/gateway) and report
//! which replica each routed priming request landed on; the functions here turn those
//! owners into the seed's `family_map`, `initial_owners` and `initial_prefix_owners`. Pure:
//! no I/O, no randomness.

use std::collections::BTreeMap;

/// The outcome of a hot setup attempt that found a balanced choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotAssignment {
    /// `family_map[f]` is the candidate whose prefix family `f` uses.
    pub family_map: Vec<usize>,
    /// The replica that owns family 0 (the hot family).
    pub hot_replica: String,
}

/// The replica that gets the hot family: the last by name. The seed's harness put family 0
/// on `L20-B` (the second of two) in all ten hot phases; "last by name" reproduces that and
/// is defined for any number of replicas.
pub fn hot_replica(replicas: &[String]) -> Option<&String> {
    replicas.iter().max()
}

/// Chooses `families` candidates so each replica owns its share: `families / n` each, and the
/// `families % n` extra families go to replicas that own enough, the hot replica first, then
/// the others by name. The replicas are filled in that order (hot replica first), each with
/// its lowest-numbered owned candidates, to consecutive families. With two replicas and 8
/// families the hot replica gets families 0–3 and the other 4–7, as in the seed. `None` when
/// no balanced choice exists (the caller retries with fresh candidates).
///
/// `owners[c]` is the replica candidate `c` was routed to.
pub fn choose_hot_families(
    owners: &[String],
    replicas: &[String],
    families: usize,
) -> Option<HotAssignment> {
    let hot = hot_replica(replicas)?.clone();
    let mut order: Vec<&String> = replicas.iter().filter(|r| **r != hot).collect();
    order.sort();
    order.insert(0, &hot);
    let owned: Vec<Vec<usize>> = order
        .iter()
        .map(|replica| {
            owners
                .iter()
                .enumerate()
                .filter(|(_, owner)| owner == replica)
                .map(|(c, _)| c)
                .collect()
        })
        .collect();
    let base = families / order.len();
    let mut extra = families % order.len();
    let mut quotas = vec![base; order.len()];
    for (quota, candidates) in quotas.iter_mut().zip(&owned) {
        if extra > 0 && candidates.len() > base {
            *quota += 1;
            extra -= 1;
        }
    }
    // Family 0 is the hot replica's first; it must get at least one.
    if extra > 0 || quotas[0] == 0 || owned.iter().zip(&quotas).any(|(o, q)| o.len() < *q) {
        return None;
    }
    let family_map = owned
        .iter()
        .zip(&quotas)
        .flat_map(|(o, q)| o[..*q].iter().copied())
        .collect();
    Some(HotAssignment {
        family_map,
        hot_replica: hot,
    })
}

/// How many candidates to prime: the configured number (the seed's 16 for 2 replicas and 8
/// families) times the larger of `replicas / 2` and `families / 8` (each at least 1).
///
/// Why the larger and not the product: a balanced choice needs each replica to own its quota
/// of `families / replicas` among random owners. More families raise every quota, so the
/// pool grows with them (2 candidates per family, as the seed's 16 for 8); more replicas
/// shrink each quota but make a short replica likelier (with 8 replicas some replica owns
/// none of 16 random candidates 94 % of the time), so the pool grows with them too. The
/// product counted both at once: 48 families on 6 replicas primed 288 prefixes where 96
/// give each replica 16 on average against a quota of 8 (some replica falls short in about
/// 1 attempt of 30 with random owners, and the next attempt retries), and every extra prefix
/// is a 4704-token prefill that can evict chosen ones. The
/// rule equals the product whenever one factor is 1, which covers the seed and every
/// replica or family sweep so far.
pub fn candidate_count(configured: usize, replicas: usize, families: usize) -> usize {
    configured * (replicas / 2).max(families.div_ceil(8)).max(1)
}

/// The seed's `initial_owners`: replica → the candidates it owns, ascending; every replica is
/// listed, owning nothing or not.
pub fn initial_owners(owners: &[String], replicas: &[String]) -> BTreeMap<String, Vec<usize>> {
    let mut map: BTreeMap<String, Vec<usize>> =
        replicas.iter().map(|r| (r.clone(), Vec::new())).collect();
    for (c, owner) in owners.iter().enumerate() {
        map.entry(owner.clone()).or_default().push(c);
    }
    map
}

/// The seed's `initial_prefix_owners` for hot phases: family → `[owner of its candidate]`.
pub fn family_owners(family_map: &[usize], owners: &[String]) -> BTreeMap<String, Vec<String>> {
    family_map
        .iter()
        .enumerate()
        .filter_map(|(f, &c)| owners.get(c).map(|o| (f.to_string(), vec![o.clone()])))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn reproduces_the_seed_r1_hot50_prefix_cache_choice() {
        // initial_owners of r1-hot50-prefix-cache: A owns 0,1,2,3,4,7,9,10,12,14,15; B the rest.
        let b = [5, 6, 8, 11, 13];
        let owners: Vec<String> = (0..16)
            .map(|c| if b.contains(&c) { "L20-B" } else { "L20-A" }.to_owned())
            .collect();
        let replicas = names(&["L20-A", "L20-B"]);
        let got = choose_hot_families(&owners, &replicas, 8).unwrap();
        assert_eq!(got.family_map, vec![5, 6, 8, 11, 0, 1, 2, 3]);
        assert_eq!(got.hot_replica, "L20-B");
        let fam = family_owners(&got.family_map, &owners);
        assert_eq!(fam["0"], vec!["L20-B".to_owned()]);
        assert_eq!(fam["7"], vec!["L20-A".to_owned()]);
        let init = initial_owners(&owners, &replicas);
        assert_eq!(init["L20-B"], b.to_vec());
        assert_eq!(init["L20-A"].len(), 11);
    }

    #[test]
    fn candidates_scale_with_replicas_and_families() {
        assert_eq!(candidate_count(16, 1, 8), 16);
        assert_eq!(candidate_count(16, 2, 8), 16);
        assert_eq!(candidate_count(16, 3, 8), 16);
        assert_eq!(candidate_count(16, 4, 8), 32);
        assert_eq!(candidate_count(16, 8, 8), 64);
        assert_eq!(candidate_count(16, 2, 16), 32);
        assert_eq!(candidate_count(16, 2, 4), 16);
        // Both grown: the larger factor, not the product (288 before).
        assert_eq!(candidate_count(16, 6, 48), 96);
        assert_eq!(candidate_count(16, 8, 16), 64);
    }

    #[test]
    fn unbalanced_owners_have_no_choice() {
        let mut owners = vec!["L20-A".to_owned(); 16];
        owners[3] = "L20-B".into();
        owners[9] = "L20-B".into();
        owners[12] = "L20-B".into();
        assert_eq!(
            choose_hot_families(&owners, &names(&["L20-A", "L20-B"]), 8),
            None
        );
        assert_eq!(choose_hot_families(&owners, &[], 8), None);
    }

    #[test]
    fn shares_split_over_three_replicas() {
        let replicas = names(&["a", "b", "c"]);
        let owners: Vec<String> = (0..16).map(|c| replicas[c % 3].clone()).collect();
        let got = choose_hot_families(&owners, &replicas, 8).unwrap();
        // c (hot) gets 3, a gets 3, b gets 2.
        assert_eq!(got.family_map, vec![2, 5, 8, 0, 3, 6, 1, 4]);
        assert_eq!(got.hot_replica, "c");
        let init = initial_owners(&owners[..2], &replicas);
        assert_eq!(init["c"], Vec::<usize>::new());
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A choice, when there is one, uses distinct candidates, gives every replica its
        /// share, and puts family 0 on the hot replica.
        #[test]
        fn choices_are_balanced(owner_ids in proptest::collection::vec(0usize..4, 1..40), n in 1usize..5, families in 1usize..12) {
            let replicas: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
            let owners: Vec<String> = owner_ids.iter().map(|o| replicas[o % n].clone()).collect();
            if let Some(choice) = choose_hot_families(&owners, &replicas, families) {
                prop_assert_eq!(choice.family_map.len(), families);
                let mut seen = choice.family_map.clone();
                seen.sort_unstable();
                seen.dedup();
                prop_assert_eq!(seen.len(), families);
                prop_assert_eq!(&owners[choice.family_map[0]], &choice.hot_replica);
                for r in &replicas {
                    let got = choice.family_map.iter().filter(|&&c| owners[c] == *r).count();
                    prop_assert!(got == families / n || got == families / n + 1);
                }
            }
            // A choice exists exactly when every replica owns its base share, enough replicas
            // own one more for the remainder, and the hot replica gets a family.
            let counts: Vec<usize> = replicas
                .iter()
                .map(|r| owners.iter().filter(|o| *o == r).count())
                .collect();
            let (base, extra) = (families / n, families % n);
            let hot = counts[n - 1];
            let feasible = counts.iter().all(|c| *c >= base)
                && counts.iter().filter(|c| **c > base).count() >= extra
                && (base >= 1 || hot > 0);
            prop_assert_eq!(choose_hot_families(&owners, &replicas, families).is_some(), feasible);
        }
    }
}

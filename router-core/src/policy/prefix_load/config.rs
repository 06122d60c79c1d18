//! `prefix-load`'s settings: the weights of its cost model, with prefixgate's own
//! environment names (`PREFIXGATE_PREFIX_LOAD_*`), validated like the AIBrix ones.
//!
//! They live in the gateway's `[routing.prefix_load]` table (unknown keys are errors); the
//! environment overrides the file. Every weight is a plain decimal number ≥ 0.

use serde::{Deserialize, Serialize};

use crate::config::error::ConfigError;
use crate::index::recall;

/// The weights of `prefix-load`'s cost (see `docs/POLICY.md`). The unit of cost is one
/// prompt block of work already placed on a pod.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct PrefixLoadConfig {
    /// `PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT`: the cost of one block this request would
    /// have to prefill on a pod (not cached there), against one active block already there.
    pub prefill_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_PENDING_WEIGHT`: the cost of one block other requests still
    /// have to prefill on a pod before it answers them (they delay this request's prefill).
    pub pending_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_WAITING_WEIGHT`: when the engine is scraped, the cost of each
    /// request waiting in its queue, in units of that pod's mean active blocks per request.
    pub waiting_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_IDLE_PREFILL_WEIGHT`: `prefill_weight` on a pod with nothing
    /// outstanding, where a prefill shares no step and delays no other request: about its
    /// own blocks, plus as much again for the next arrival that will wait behind it there.
    /// An owner carrying more than this many requests' work loses a hot prefix to an idle
    /// pod, so the copy is made while it is fast.
    pub idle_prefill_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_FAMILY_WEIGHT`: for a prompt no pod holds any of (a new
    /// family), the cost of serving all the prompt families lately routed anywhere, in
    /// prompts of this request's size; each pod is charged its share of them, scaled by the
    /// fraction of them that have recurred. A new family goes where fewer families will keep
    /// sending their requests; the charge is bounded by this weight, and one-off prompts
    /// steer nothing. Off (0) by default: 16 serves more in cold phases over many simulated
    /// rounds but fewer on the seed's two, locally (docs/POLICY-EVALUATION.md, "New families by
    /// the families each pod serves").
    pub family_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_FAMILY_WINDOW_SECONDS`: a family stops counting as served by
    /// a pod after this long without a request routed there.
    pub family_window_seconds: f64,
    /// `PREFIXGATE_PREFIX_LOAD_COPY_WEIGHT`: a copy (a pod holding less of the prompt than
    /// its best holder) pays its prefill `1 + copy_weight / (1 + n)` times, `n` the
    /// prefix's requests in flight on its best holders. A copy's prefill is paid once and
    /// shared by the prefix's later requests, whose rate the requests in flight measure
    /// (Little's law): a hot prefix is copied nearly at cost, a family with few requests left
    /// pays up to `1 + copy_weight` times. Off (0) by default. It needs an index that sees
    /// every holder (KV-event sync): otherwise a real hit on a pod the index does not know
    /// looks like a copy (docs/POLICY-EVALUATION.md, "Over more rounds").
    pub copy_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_LEARN_WEIGHT`: how much of the correction learned from the
    /// engines' `usage.prompt_tokens_details.cached_tokens` to apply to what the prefix index
    /// says each pod holds, from 0 (the index as it is) to 1. Each pod's responses measure
    /// the share of the blocks the index credited to it that it really held, and the share
    /// of the others that it held all the same; `prefix-load` expects each pod to hold
    /// accordingly (docs/ROUTING.md, "Learning from responses"). `prefix-cache` never reads
    /// it. Not applied with KV-event sync, whose index already sees the engines' caches.
    pub learn_weight: f64,
    /// `PREFIXGATE_PREFIX_LOAD_TTFT_SLO_SECONDS`: the time-to-first-token target of the
    /// in-time and overload rules, 2 by default (the seed's TTFT SLO); 0 leaves both off. A
    /// pod's expected first token for a request is its wait for a batch slot (the ends of its
    /// decoding streams, each at its own pace, then the mean turnover), then its prefill
    /// rate, learned from its answers, times the prefill pending there and the request's
    /// own. While some busy pod is expected later than this and some pod in time, the late
    /// ones are passed over. When every pod is busy and late and the backlog grows (the
    /// prefill offered over the last seconds outruns what the pods prefill at those rates,
    /// or every batch is full and the fleet's outstanding requests are not falling), the
    /// request goes to the most backed-up of the pods where it adds the least prefill, so
    /// the other pods keep answering within it instead of all missing it together. While
    /// the backlog drains by itself (a burst, a phase's cold start, a prompt too long for
    /// the SLO anywhere), the cost model chooses as without it (docs/POLICY-EVALUATION.md,
    /// "The merged overload rule", "Issue 28, v3: a stream clock and the in-time rule").
    pub ttft_slo_seconds: f64,
    /// `PREFIXGATE_PREFIX_LOAD_RECALL_BLOCKS`: how many prompt blocks back `prefix-load`
    /// remembers where requests went, beyond the prefix index's `block_capacity`; 0 turns
    /// the memory off. It keeps one block in [`recall::STRIDE`] (16), so it costs a
    /// sixteenth of an index of that size (about 86 bytes a kept block: 2.2 MB at the
    /// default 400 000) and recalls a prefix in steps of 16 blocks. The index keeps
    /// AIBrix's 200 000 blocks for `prefix-cache`, while the engines behind it cache several
    /// times that: on 16 H200s the index forgot about 330 prefixes of the Mooncake trace
    /// that an engine still held (docs/POLICY-EVALUATION.md, "The recall: what the index
    /// forgot"). Best near the engines' cache in router blocks (replicas × `num_gpu_blocks`
    /// × engine block tokens × bytes per token / `block_size`): beyond it, it recalls
    /// prefixes the engines have evicted. Not used with KV-event sync, whose index follows
    /// the engines' evictions.
    pub recall_blocks: usize,
    /// `PREFIXGATE_PREFIX_LOAD_GIVE_UP_LATE_SECONDS`: how late a slow pod's latest first token
    /// must be for the pod to be given up, 4 by default (twice the seed's 2 s TTFT target); 0
    /// leaves the slow-replica rules out. A pod is slow when its prefill rate, learned from
    /// requests sent while it was idle, is at least 1.5 times the fastest pod's; it is given
    /// up while it is slow and its latest first token took longer than this. While some pod
    /// is given up and no other has room for the request (each is expected to answer it
    /// after `ttft_slo_seconds`, or every pod's engine has requests waiting), the request
    /// goes to the given-up pods, so the faster pods keep answering in time instead of all
    /// falling behind together. Otherwise a busy slow pod takes no copy of a prefix it
    /// cannot prefill within `ttft_slo_seconds` even idle while another pod can answer in
    /// time, unless the prefix is hot. On equal replicas no pod reads as slow, and nothing
    /// changes (docs/POLICY-EVALUATION.md, "Unequal replicas: one give-up rule").
    pub give_up_late_seconds: f64,
    /// `PREFIXGATE_PREFIX_LOAD_SESSION_HELD_SHARE`: the share of a request's prompt, from 0 to
    /// 1, that the pod its session names (`x-session-id`, else `x-aibrix-session-key`'s
    /// rendezvous pod) is expected to hold when the prefix index says it holds less: a
    /// session's next turn resends the turns before it, which that pod served. 0.8 by default
    /// (the history is most of a later turn's prompt, and an engine may have evicted some of
    /// it); 0 ignores sessions. The cost model then weighs that cache against the pod's load,
    /// so a session stays while its pod has room and moves when it does not
    /// (docs/ROUTING.md, "Sessions").
    pub session_held_share: f64,
    /// `PREFIXGATE_PREFIX_LOAD_SPREAD_FRACTION`: how far apart, as a fraction of the cheapest
    /// pod's cost, two costs may be and still count as equal, from 0 to 1. The cost is an
    /// estimate (output lengths are unknown, cluster peers' load arrives late), so pods within
    /// this of the cheapest are all taken as best, and the one with the fewest requests in
    /// flight (every gateway's) is chosen, then one at random: a burst does not herd onto a
    /// pod that is cheaper only within the estimate's error. 0 chooses uniformly among exact
    /// ties only (docs/ROUTING.md, "Ties and herding").
    pub spread_fraction: f64,
}

/// The most [`PrefixLoadConfig::recall_blocks`] accepted: as many kept blocks as the
/// index's own bound.
pub const MAX_RECALL_BLOCKS: usize = crate::config::MAX_BLOCK_CAPACITY * recall::STRIDE;

/// A prefix with this many requests in flight on its holders is hot: a copy of it is worth
/// its own late first token, so the slow-replica copy filter does not hold it back (at 10
/// and above the 4-replica unequal fleet's hot50 cell drops, at 12 by 14).
pub const HOT_IN_FLIGHT: u64 = 8;

/// [`PrefixLoadConfig::spread_fraction`]'s default (docs/ROUTING.md, "Ties and herding").
pub const SPREAD_FRACTION: f64 = 0.05;

impl Default for PrefixLoadConfig {
    fn default() -> Self {
        PrefixLoadConfig {
            prefill_weight: 5.0,
            pending_weight: 0.5,
            waiting_weight: 2.0,
            idle_prefill_weight: 2.0,
            family_weight: 0.0,
            family_window_seconds: 60.0,
            copy_weight: 0.0,
            learn_weight: 1.0,
            ttft_slo_seconds: 2.0,
            recall_blocks: 400_000,
            give_up_late_seconds: 4.0,
            session_held_share: 0.8,
            spread_fraction: SPREAD_FRACTION,
        }
    }
}

/// The environment variables [`PrefixLoadConfig::apply_env`] reads, in `--help` order.
pub const PREFIX_LOAD_ENV_NAMES: [&str; 13] = [
    "PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_PENDING_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_WAITING_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_IDLE_PREFILL_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_FAMILY_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_FAMILY_WINDOW_SECONDS",
    "PREFIXGATE_PREFIX_LOAD_COPY_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_LEARN_WEIGHT",
    "PREFIXGATE_PREFIX_LOAD_TTFT_SLO_SECONDS",
    "PREFIXGATE_PREFIX_LOAD_RECALL_BLOCKS",
    "PREFIXGATE_PREFIX_LOAD_GIVE_UP_LATE_SECONDS",
    "PREFIXGATE_PREFIX_LOAD_SESSION_HELD_SHARE",
    "PREFIXGATE_PREFIX_LOAD_SPREAD_FRACTION",
];

/// Largest accepted weight: beyond it one term swamps the others entirely, which a user
/// should ask for by zeroing the others instead.
const MAX_WEIGHT: f64 = 1_000_000.0;

impl PrefixLoadConfig {
    /// Applies the `PREFIXGATE_PREFIX_LOAD_*` variables that are set; an invalid value is an
    /// error naming the variable.
    pub fn apply_env(
        &mut self,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let [
            prefill,
            pending,
            waiting,
            idle,
            family,
            window,
            copy,
            learn,
            slo,
            recall,
            give_up,
            session,
            spread,
        ] = PREFIX_LOAD_ENV_NAMES;
        for (name, field) in [
            (prefill, &mut self.prefill_weight),
            (pending, &mut self.pending_weight),
            (waiting, &mut self.waiting_weight),
            (idle, &mut self.idle_prefill_weight),
            (family, &mut self.family_weight),
            (window, &mut self.family_window_seconds),
            (copy, &mut self.copy_weight),
            (slo, &mut self.ttft_slo_seconds),
            (give_up, &mut self.give_up_late_seconds),
        ] {
            if let Some(value) = lookup(name) {
                *field = weight(name, &value, value.trim().parse().ok())?;
            }
        }
        for (name, field) in [
            (learn, &mut self.learn_weight),
            (session, &mut self.session_held_share),
            (spread, &mut self.spread_fraction),
        ] {
            if let Some(value) = lookup(name) {
                *field = share(name, &value, value.trim().parse().ok())?;
            }
        }
        if let Some(value) = lookup(recall) {
            self.recall_blocks = blocks(recall, &value, value.trim().parse().ok())?;
        }
        Ok(())
    }

    /// [`family_window_seconds`](Self::family_window_seconds) in milliseconds (validated
    /// values are at most 10⁶ s, so this neither overflows nor loses a whole millisecond).
    pub fn family_window_millis(&self) -> crate::Millis {
        (self.family_window_seconds * 1000.0).round() as crate::Millis
    }

    /// The SLO rules' TTFT target in milliseconds; `None` when they are off (0).
    pub fn ttft_slo_millis(&self) -> Option<f64> {
        (self.ttft_slo_seconds > 0.0).then_some(self.ttft_slo_seconds * 1000.0)
    }

    /// [`give_up_late_seconds`](Self::give_up_late_seconds) in milliseconds, when set.
    pub fn give_up_late_millis(&self) -> Option<f64> {
        (self.give_up_late_seconds > 0.0).then_some(self.give_up_late_seconds * 1000.0)
    }

    /// Checks weights read from a file (finite, 0 to 10⁶).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("prefix_load.prefill_weight", self.prefill_weight),
            ("prefix_load.pending_weight", self.pending_weight),
            ("prefix_load.waiting_weight", self.waiting_weight),
            ("prefix_load.idle_prefill_weight", self.idle_prefill_weight),
            ("prefix_load.family_weight", self.family_weight),
            (
                "prefix_load.family_window_seconds",
                self.family_window_seconds,
            ),
            ("prefix_load.copy_weight", self.copy_weight),
            ("prefix_load.ttft_slo_seconds", self.ttft_slo_seconds),
            (
                "prefix_load.give_up_late_seconds",
                self.give_up_late_seconds,
            ),
        ] {
            weight(key, &value.to_string(), Some(value))?;
        }
        for (key, value) in [
            ("prefix_load.learn_weight", self.learn_weight),
            ("prefix_load.session_held_share", self.session_held_share),
            ("prefix_load.spread_fraction", self.spread_fraction),
        ] {
            share(key, &value.to_string(), Some(value))?;
        }
        blocks(
            "prefix_load.recall_blocks",
            &self.recall_blocks.to_string(),
            Some(self.recall_blocks),
        )?;
        Ok(())
    }
}

/// `parsed` as a count of blocks up to [`MAX_RECALL_BLOCKS`], or an error naming `key` and
/// the raw `value`.
fn blocks(key: &str, value: &str, parsed: Option<usize>) -> Result<usize, ConfigError> {
    match parsed {
        Some(n) if n <= MAX_RECALL_BLOCKS => Ok(n),
        _ => Err(ConfigError {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: format!("must be a whole number from 0 to {MAX_RECALL_BLOCKS}"),
        }),
    }
}

/// `parsed` as a share from 0 to 1, or an error naming `key` and the raw `value`.
fn share(key: &str, value: &str, parsed: Option<f64>) -> Result<f64, ConfigError> {
    match parsed {
        Some(w) if (0.0..=1.0).contains(&w) => Ok(w),
        _ => Err(ConfigError {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: "must be a decimal number from 0 to 1".to_owned(),
        }),
    }
}

/// `parsed` as a weight, or an error naming `key` and the raw `value`.
fn weight(key: &str, value: &str, parsed: Option<f64>) -> Result<f64, ConfigError> {
    match parsed {
        Some(w) if w.is_finite() && (0.0..=MAX_WEIGHT).contains(&w) => Ok(w),
        _ => Err(ConfigError {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: format!("must be a decimal number from 0 to {MAX_WEIGHT}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with_env(vars: &[(&str, &str)]) -> Result<PrefixLoadConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut config = PrefixLoadConfig::default();
        config.apply_env(&|name| map.get(name).cloned())?;
        Ok(config)
    }

    #[test]
    fn every_variable_is_applied() {
        let config = with_env(&[
            ("PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT", "3.5"),
            ("PREFIXGATE_PREFIX_LOAD_PENDING_WEIGHT", " 0 "),
            ("PREFIXGATE_PREFIX_LOAD_WAITING_WEIGHT", "7"),
            ("PREFIXGATE_PREFIX_LOAD_IDLE_PREFILL_WEIGHT", "0.5"),
            ("PREFIXGATE_PREFIX_LOAD_FAMILY_WEIGHT", "8"),
            ("PREFIXGATE_PREFIX_LOAD_FAMILY_WINDOW_SECONDS", "2.5"),
            ("PREFIXGATE_PREFIX_LOAD_COPY_WEIGHT", "1"),
            ("PREFIXGATE_PREFIX_LOAD_LEARN_WEIGHT", "0.5"),
            ("PREFIXGATE_PREFIX_LOAD_TTFT_SLO_SECONDS", "1.5"),
            ("PREFIXGATE_PREFIX_LOAD_RECALL_BLOCKS", "64"),
            ("PREFIXGATE_PREFIX_LOAD_GIVE_UP_LATE_SECONDS", "6"),
            ("PREFIXGATE_PREFIX_LOAD_SESSION_HELD_SHARE", "0.25"),
            ("PREFIXGATE_PREFIX_LOAD_SPREAD_FRACTION", "0.1"),
        ])
        .unwrap();
        assert_eq!(
            config,
            PrefixLoadConfig {
                prefill_weight: 3.5,
                pending_weight: 0.0,
                waiting_weight: 7.0,
                idle_prefill_weight: 0.5,
                family_weight: 8.0,
                family_window_seconds: 2.5,
                copy_weight: 1.0,
                learn_weight: 0.5,
                ttft_slo_seconds: 1.5,
                recall_blocks: 64,
                give_up_late_seconds: 6.0,
                session_held_share: 0.25,
                spread_fraction: 0.1,
            }
        );
        assert_eq!(config.family_window_millis(), 2500);
        assert_eq!(config.ttft_slo_millis(), Some(1500.0));
        let off = with_env(&[("PREFIXGATE_PREFIX_LOAD_TTFT_SLO_SECONDS", "0")]).unwrap();
        assert_eq!(off.ttft_slo_millis(), None);
        assert_eq!(PrefixLoadConfig::default().ttft_slo_millis(), Some(2000.0));
        assert_eq!(config.give_up_late_millis(), Some(6000.0));
        assert_eq!(
            PrefixLoadConfig::default().give_up_late_millis(),
            Some(4000.0)
        );
        let off = with_env(&[("PREFIXGATE_PREFIX_LOAD_GIVE_UP_LATE_SECONDS", "0")]).unwrap();
        assert_eq!(off.give_up_late_millis(), None);
        assert_eq!(with_env(&[]).unwrap(), PrefixLoadConfig::default());
        PrefixLoadConfig::default().validate().unwrap();
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for name in PREFIX_LOAD_ENV_NAMES {
            for value in ["-1", "NaN", "inf", "", "two", "1e7"] {
                let err = with_env(&[(name, value)]).unwrap_err();
                assert_eq!((err.key.as_str(), err.value.as_str()), (name, value));
                assert!(err.to_string().contains(name), "{err}");
            }
        }
    }

    #[test]
    fn validate_names_the_key() {
        let config = PrefixLoadConfig {
            pending_weight: f64::NAN,
            ..PrefixLoadConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().key,
            "prefix_load.pending_weight"
        );
        let config = PrefixLoadConfig {
            prefill_weight: -0.5,
            ..PrefixLoadConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().key,
            "prefix_load.prefill_weight"
        );
    }

    #[test]
    fn file_keys_are_checked() {
        let config: PrefixLoadConfig = serde_json::from_str(r#"{"prefill_weight": 4}"#).unwrap();
        assert_eq!(config.prefill_weight, 4.0);
        assert!(serde_json::from_str::<PrefixLoadConfig>(r#"{"prefil_weight": 4}"#).is_err());
    }
}

//! The per-request trace of a simulated run (`loadgen simulate --trace FILE`): one JSON line
//! per measured request, saying where the router sent it, why, and what came of it. It is how
//! a phase's figures are explained request by request (docs/POLICY-EVALUATION.md traces its
//! gaps so).

use serde::Serialize;

use super::cluster::Served;
use crate::measure::{PhaseResult, Slo, is_good};

/// One measured request of a simulated phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceLine {
    pub phase: String,
    /// The request's index in the phase's arrival order.
    pub index: usize,
    pub family: usize,
    /// Seconds from the phase's first arrival to this one's.
    pub at_s: f64,
    /// The replica it ran on (`target-pod`).
    pub pod: Option<String>,
    /// The decision's selection label, as in `aibrix_prefix_cache_routing_selection_total`
    /// (`null` for routes that do not consult the prefix index).
    pub selection: Option<String>,
    pub match_percent: Option<u8>,
    /// The chosen replica's outstanding requests before this one.
    pub outstanding_at_selection: Option<u64>,
    /// The engine's `prompt_tokens` and `cached_tokens` (what the engine held of the prompt
    /// when it scheduled it: how a decision's believed match turned out).
    pub prompt_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    /// Within the SLO (`good` in the phase's result).
    pub good: bool,
}

/// The trace lines of one phase, in arrival order.
pub fn trace_lines(phase: &PhaseResult, served: &[Served], slo: &Slo) -> Vec<TraceLine> {
    let start = served
        .iter()
        .map(|s| s.record.scheduled)
        .fold(f64::INFINITY, f64::min);
    served
        .iter()
        .map(|s| {
            let r = &s.record;
            let decision = s.decision.as_ref();
            TraceLine {
                phase: phase.phase.clone(),
                index: r.index,
                family: r.family,
                at_s: r.scheduled - start,
                pod: r.target_pod.clone(),
                selection: decision
                    .and_then(|d| d.selection)
                    .map(|sel| sel.as_str().to_owned()),
                match_percent: decision.and_then(|d| d.match_percent),
                outstanding_at_selection: r.outstanding_at_selection,
                prompt_tokens: r.usage.map(|u| u.prompt_tokens),
                cached_tokens: r.usage.and_then(|u| u.cached_tokens),
                ttft_s: r.ttft(),
                e2e_s: r.e2e(),
                good: is_good(r, slo),
            }
        })
        .collect()
}

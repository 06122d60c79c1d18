//! A phase's admission settings for the local gateway (`[phase.admission]` in the operations
//! file): loadgen's own type, so the workload never depends on the gateway's. The local
//! runner converts it into the gateway's `[admission]` table when it starts a stack
//! (`crate::run::local`); a key left out keeps the gateway's default.
//!
//! The keys are the gateway's (docs/GATEWAY.md, "Admission"), less `api_keys`: loadgen sends
//! no key, so a phase that set one would only see 401s.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `[phase.admission]` as written (unknown keys are errors).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSpec {
    /// Requests in flight through the whole gateway at most; 0 for no cap.
    pub max_in_flight: Option<usize>,
    /// The request header that names the tenant; must equal the file's `tenant_header`.
    pub tenant_header: Option<String>,
    /// Requests in flight per tenant without its own entry; 0 for no cap.
    pub tenant_max_in_flight: Option<usize>,
    /// Per-tenant limits that override the defaults.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantLimit>,
    /// `Retry-After` seconds sent with a 429 for an in-flight cap.
    pub retry_after_secs: Option<u64>,
    /// Tokens per second per tenant without its own rate; 0 for no limit.
    pub tenant_tokens_per_second: Option<u64>,
    /// Tokens a tenant may spend at once; 0 for the gateway's default burst.
    pub tenant_token_burst: Option<u64>,
    /// Completion tokens charged for a request without `max_tokens`.
    pub default_max_tokens: Option<u64>,
}

/// One tenant's limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimit {
    /// Requests in flight for this tenant at most; 0 for no cap.
    pub max_in_flight: usize,
    /// Tokens per second for this tenant; absent for the default rate.
    pub tokens_per_second: Option<u64>,
    /// This tenant's token burst; absent for the default.
    pub token_burst: Option<u64>,
}

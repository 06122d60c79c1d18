//! The routing strategies a request can name (`routing-strategy` header, the gateway's
//! default strategy): their names and which of them read the prefix index. The policies that
//! implement them are in [`crate::policy`].

use std::fmt;
use std::str::FromStr;

/// A routing strategy, as named in the `routing-strategy` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    Random,
    LeastRequest,
    PrefixCache,
    /// prefixgate's cost model over cache and load (`policy/prefix_load/`).
    PrefixLoad,
    /// AIBrix's session routing (`policy/session_affinity/`).
    SessionAffinity,
}

impl Strategy {
    /// Every strategy, in the order `--help` lists them.
    pub const ALL: [Strategy; 5] = [
        Strategy::Random,
        Strategy::LeastRequest,
        Strategy::PrefixCache,
        Strategy::PrefixLoad,
        Strategy::SessionAffinity,
    ];

    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Random => "random",
            Strategy::LeastRequest => "least-request",
            Strategy::PrefixCache => "prefix-cache",
            Strategy::PrefixLoad => "prefix-load",
            Strategy::SessionAffinity => "session-affinity",
        }
    }

    /// Whether responses carry an `x-session-id` naming the pod that served them: the
    /// strategies that honour one (AIBrix sets it only under `session-affinity`).
    pub fn issues_session_id(self) -> bool {
        matches!(self, Strategy::SessionAffinity | Strategy::PrefixLoad)
    }

    /// Whether the policy reads the prefix index (and so needs the request's block hashes).
    pub fn uses_prefix_index(self) -> bool {
        matches!(self, Strategy::PrefixCache | Strategy::PrefixLoad)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `routing-strategy` value that names no known strategy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown routing strategy {0:?} (known: random, least-request, prefix-cache, prefix-load, session-affinity)"
)]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

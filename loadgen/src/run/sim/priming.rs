//! The simulated cluster as [`PrimingCluster`]: priming requests run to completion on the
//! virtual clock, with the simulator's two evaluation knobs applied here, where the request's
//! purpose is known: `SimOptions::warm_owners` forces a family's routed warm request onto a
//! replica, and `SimOptions::kv_synced_priming` shows warm priming's direct requests to the
//! router's index.

use super::cluster::{SimCluster, SimError, Target};
use super::options::SimOptions;
use crate::run::priming::{PRIMING_MAX_TOKENS, PrimingCluster, PrimingError, PrimingRoute};

/// A simulated cluster being primed under `options`.
#[derive(Debug)]
pub struct SimPrimer<'a> {
    pub cluster: &'a mut SimCluster,
    pub options: &'a SimOptions,
}

impl From<PrimingError> for SimError {
    fn from(error: PrimingError) -> Self {
        match error {
            PrimingError::NoBalancedSetup(attempts) => SimError::NoBalancedSetup(attempts),
        }
    }
}

impl SimPrimer<'_> {
    fn target(&self, route: PrimingRoute) -> Result<Target, SimError> {
        Ok(match route {
            PrimingRoute::Direct(replica) => Target::Direct(replica),
            PrimingRoute::HotCandidate { route } => Target::Routed(route),
            PrimingRoute::WarmOwner { route, family } => {
                let Some(owners) = self.options.warm_owners.as_deref() else {
                    return Ok(Target::Routed(route));
                };
                match owners.get(family) {
                    Some(&r) if r < self.cluster.names().len() => Target::RoutedOnto(route, r),
                    _ => {
                        return Err(SimError::Config(format!(
                            "warm_owners names no replica for family {family}"
                        )));
                    }
                }
            }
        })
    }
}

impl PrimingCluster for SimPrimer<'_> {
    type Error = SimError;

    fn replica_names(&self) -> Vec<String> {
        self.cluster.names().to_vec()
    }

    async fn prime_one(
        &mut self,
        text: String,
        route: PrimingRoute,
    ) -> Result<Option<String>, SimError> {
        let target = self.target(route)?;
        if let Target::Direct(engine) = target
            && self.options.kv_synced_priming
            && !self.options.kv_sync
        {
            self.cluster.index_as_cached(engine, &text)?;
        }
        let served = self.cluster.run_one(text, PRIMING_MAX_TOKENS, target)?;
        if served.record.succeeded() {
            Ok(served.record.target_pod)
        } else {
            Err(SimError::Priming(served.record.status))
        }
    }
}

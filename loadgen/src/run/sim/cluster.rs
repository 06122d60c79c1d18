//! A simulated cluster: N engine models and one router on a virtual clock, no sockets.
//!
//! [`SimCluster::drive`] is the event loop: it merges request arrivals, each engine's
//! `next_wakeup()` and (optionally) a 250 ms scrape tick, advances every engine to the
//! earliest of them, and turns the tokens that come out into the same [`RequestRecord`]s the
//! live runner writes. Routed requests hold the router's outstanding guard until their last
//! token, as the gateway's response body does, so the counts the policies see behave as in
//! the live path: the first token releases the request's pending prefill
//! (`InFlight::first_byte`), the last ends it with the engine's usage (`InFlight::end`, which
//! feeds the replica's learned speed), and each scrape tick publishes the engine's
//! running/waiting/KV gauges to its `PodLoad`, as the gateway's engine scrape does. At equal
//! times, tokens are processed before arrivals (a request that finishes at `t` is no longer
//! outstanding for one that arrives at `t`).
//!
//! [`SimCluster::drive_closed`] runs the same loop for a closed-loop source (conversations):
//! when a request ends, the source is told (with the answer's text for a chat) and may hand
//! back the request that follows it, which joins the arrivals at its own time.
//!
//! With KV-event sync ([`SimCluster::with_kv_sync`]) each engine records vLLM's KV-cache
//! events, the batches of every step are applied to the router's index right after the step
//! (so before any arrival at its end time, see [`super::kv_sync`]), and routed requests
//! are hashed on the engine's token ids, as the gateway does with `[kv_sync]` on.

use std::collections::HashMap;

use mock_engine::model::{EngineModel, EngineProfile, EngineRequest, FinishReason, RequestId};
use rand::rngs::StdRng;
use router_core::kv_sync::token_bytes;
use router_core::{Candidate, EngineStats, InFlight, RouteRequest, Router};

pub use super::arrival::{Arrival, Served, SimError, Target};
use super::flight::{Flight, engine_usage};
use super::gateways::{GatewayEvent, Gateways, PeerSharing};
use super::kv_sync::{ClusterSync, KvSyncStats};
use crate::measure::{EngineCounters, ErrorClass, Peaks, RequestRecord, Usage};
use crate::run::assignment::GatewayAssignment;
use crate::workload::chat::engine_prompt;
use crate::workload::seeding::rng_for;
use crate::workload::{PlannedRequest, Prompt};

/// A closed-loop source's answer to a request's end: what became of it and, for a chat that
/// succeeded, the answer's text; it returns the request to send next, if any.
pub type FollowUp<'a> = dyn FnMut(&Served, Option<&str>) -> Result<Option<Arrival>, SimError> + 'a;

/// Puts `arrival` among the arrivals not yet sent (from `next` on) in time order, after any
/// due at the same time; never earlier than `now`.
fn queue_arrival(arrivals: &mut Vec<Arrival>, next: usize, mut arrival: Arrival, now: f64) {
    arrival.request.at = arrival.request.at.max(now);
    let at = arrival.request.at;
    let pos = next + arrivals[next..].partition_point(|a| a.request.at <= at);
    arrivals.insert(pos, arrival);
}

/// Seconds between two scrapes of the engines' gauges (the live runner's period).
pub const SCRAPE_PERIOD: f64 = 0.25;

/// A gauge as the engine's `/metrics` would print it, clamped to the scrape's integer type.
fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX - 1)
}

/// Bounds on one `drive` call, so a model bug shows up as an error, never as a hang.
const MAX_EVENTS: u64 = 20_000_000;
const MAX_VIRTUAL_SECONDS: f64 = 6.0 * 3600.0;

/// N engines and the gateways in front of them (one by default), on one virtual clock.
#[derive(Debug)]
pub struct SimCluster {
    names: Vec<String>,
    engines: Vec<EngineModel>,
    gateways: Gateways,
    /// The routers' random draws (tie-breaks, `random`'s picks), shared by all gateways.
    rng: StdRng,
    model: String,
    now: f64,
    /// KV-event sync is on (each gateway holds its own subscriptions).
    kv_sync: bool,
    /// Requests submitted so far (numbers each one for the gateways' peers).
    submitted: u64,
}

impl SimCluster {
    /// A cluster of one engine per name, all idle at time 0; engine `i` runs
    /// `profiles[i % profiles.len()]` (one profile for all, or unequal replicas).
    ///
    /// # Panics
    /// If `profiles` is empty.
    pub fn new(
        names: Vec<String>,
        profiles: &[EngineProfile],
        router: Router,
        rng: StdRng,
        model: &str,
    ) -> Self {
        let gateways = Gateways::new(
            vec![router],
            names.len(),
            GatewayAssignment::RoundRobin,
            rng_for(0, &["one gateway"]),
        );
        Self::with_gateways(names, profiles, gateways, rng, model)
    }

    /// [`SimCluster::new`] behind several gateways (each its own router and load view).
    ///
    /// # Panics
    /// If `profiles` is empty.
    pub fn with_gateways(
        names: Vec<String>,
        profiles: &[EngineProfile],
        gateways: Gateways,
        rng: StdRng,
        model: &str,
    ) -> Self {
        SimCluster {
            engines: names
                .iter()
                .enumerate()
                .map(|(i, _)| EngineModel::new(profiles[i % profiles.len()].clone()))
                .collect(),
            names,
            gateways,
            rng,
            model: model.to_owned(),
            now: 0.0,
            kv_sync: false,
            submitted: 0,
        }
    }

    /// Turns KV-event sync on: the engines record their KV-cache events, which reach the
    /// router's index after each step, and routed prompts are hashed on engine token ids.
    /// Fails when the router's block size (bytes of 4-byte token ids) is not a whole number
    /// of engine blocks: every `BlockStored` would then be refused.
    pub fn with_kv_sync(mut self) -> Result<Self, SimError> {
        let router_bytes = self.router().config().block_size;
        for engine in &mut self.engines {
            let engine_bytes = 4 * engine.profile().block_size;
            if engine_bytes == 0 || router_bytes % engine_bytes != 0 {
                return Err(SimError::Config(format!(
                    "KV-event sync needs the router block_size ({router_bytes} bytes) to be a multiple of 4 x the engine block size ({} tokens)",
                    engine.profile().block_size
                )));
            }
            engine.set_kv_events(true);
        }
        // Every gateway subscribes to every engine.
        for gateway in self.gateways.iter_mut() {
            gateway.sync = Some(ClusterSync::new(self.engines.len(), &self.model));
        }
        self.kv_sync = true;
        Ok(self)
    }

    /// What KV-event sync has applied so far, over every gateway's subscriptions (`None`
    /// when it is off).
    pub fn kv_sync_stats(&self) -> Option<KvSyncStats> {
        self.gateways.kv_sync_stats()
    }

    /// The first gateway's router, with its prefix index.
    ///
    /// # Panics
    /// Never: a cluster has at least one gateway ([`Gateways::new`] is given its routers).
    pub fn router(&self) -> &Router {
        match self.gateways.get(0) {
            Some(gateway) => &gateway.router,
            None => unreachable!("a cluster has at least one gateway"),
        }
    }

    /// The gateways.
    pub fn gateways(&self) -> &Gateways {
        &self.gateways
    }

    /// Replaces what the gateways share (default: nothing, see [`super::gateways`]).
    pub fn set_peer_sharing(&mut self, peers: Box<dyn PeerSharing>) {
        self.gateways.set_peer_sharing(peers);
    }

    /// Replica names, in index order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The current virtual time.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Each engine's counters now.
    pub fn counters(&self) -> Vec<EngineCounters> {
        self.engines
            .iter()
            .map(|e| {
                let m = e.metrics();
                let s = &m.request_success;
                EngineCounters {
                    completed: (s.stop + s.length + s.abort) as f64,
                    queries: m.prefix_cache_queries as f64,
                    hits: m.prefix_cache_hits as f64,
                    preemptions: m.preemptions as f64,
                }
            })
            .collect()
    }

    /// Gateway-side outstanding counts, summed over the gateways (all zero between phases
    /// when guards are released).
    pub fn outstanding(&self) -> Vec<u64> {
        (0..self.engines.len())
            .map(|i| {
                let loads = self.gateways.iter().filter_map(|g| g.loads.get(i));
                loads.map(|l| l.outstanding()).sum()
            })
            .collect()
    }

    /// Holds enough outstanding counts in `gateway`'s view on every replica except `replica`
    /// that each has more than `replica` while the returned guards live (counting the
    /// requests its peers told it of, as the policies do).
    fn load_all_above(&self, gateway: usize, replica: usize) -> Result<Vec<InFlight>, SimError> {
        let loads = &self
            .gateways
            .get(gateway)
            .ok_or(SimError::Config(format!("no gateway {gateway}")))?
            .loads;
        let floor = loads
            .get(replica)
            .ok_or(SimError::NoSuchReplica(replica))?
            .shared_outstanding();
        Ok(loads
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != replica)
            .flat_map(|(_, load)| {
                let short = (floor + 1).saturating_sub(load.shared_outstanding());
                (0..short).map(|_| load.acquire())
            })
            .collect())
    }

    /// Sends one request at the current time and runs until it has finished.
    pub fn run_one(
        &mut self,
        text: String,
        max_tokens: u32,
        target: Target,
    ) -> Result<Served, SimError> {
        let arrival = Arrival {
            request: PlannedRequest {
                index: 0,
                family: 0,
                at: self.now,
                prompt: Prompt::Text(text),
                max_tokens,
            },
            target,
        };
        let mut served = self.drive(vec![arrival], None)?;
        served.pop().ok_or(SimError::Stalled(0))
    }

    /// Records `text`'s blocks in the router's prefix index as cached on `engine`, as a
    /// KV-event sync would after the engine served it (see `SimOptions::kv_synced_priming`).
    pub fn index_as_cached(&self, engine: usize, text: &str) -> Result<(), SimError> {
        let name = self
            .names
            .get(engine)
            .ok_or(SimError::NoSuchReplica(engine))?;
        let now_ms = (self.now * 1000.0) as u64;
        for gateway in self.gateways.iter() {
            let hashes = gateway
                .router
                .hashes(text)
                .map_err(|e| SimError::Config(format!("tokenizing a priming prompt: {e}")))?;
            gateway
                .router
                .index()
                .add(&self.model, &hashes, name, now_ms);
        }
        Ok(())
    }

    /// Sends `arrivals` (sorted by time) and runs until every one has finished. With
    /// `peaks`, scrapes every engine's gauges every [`SCRAPE_PERIOD`] into it.
    pub fn drive(
        &mut self,
        arrivals: Vec<Arrival>,
        peaks: Option<&mut [Peaks]>,
    ) -> Result<Vec<Served>, SimError> {
        self.drive_closed(arrivals, peaks, &mut |_, _| Ok(None))
    }

    /// [`SimCluster::drive`] for a closed-loop source: when a request ends (its last token,
    /// or an error), `ended` gets what became of it and, for a chat prompt that succeeded,
    /// the answer's text (the decoded tokens, as a live stream's `delta.content`s
    /// concatenate), and may return a request to send next, at its own time (not before
    /// now). Runs until no request is in flight and none is due.
    pub fn drive_closed(
        &mut self,
        mut arrivals: Vec<Arrival>,
        mut peaks: Option<&mut [Peaks]>,
        ended: &mut FollowUp<'_>,
    ) -> Result<Vec<Served>, SimError> {
        arrivals.sort_by(|a, b| a.request.at.total_cmp(&b.request.at));
        let start = self.now;
        let mut served: Vec<Served> = Vec::with_capacity(arrivals.len());
        let mut in_flight: HashMap<(usize, RequestId), Flight> = HashMap::new();
        let mut next_arrival = 0;
        let mut next_scrape = self.now;
        for _ in 0..MAX_EVENTS {
            let t_arrival = arrivals
                .get(next_arrival)
                .map(|a| a.request.at.max(self.now));
            if t_arrival.is_none() && in_flight.is_empty() {
                return Ok(served);
            }
            let t_engine = self
                .engines
                .iter()
                .filter_map(EngineModel::next_wakeup)
                .min_by(f64::total_cmp);
            let mut t = match (t_arrival, t_engine) {
                (Some(a), Some(e)) => a.min(e),
                (Some(a), None) => a,
                (None, Some(e)) => e,
                (None, None) => return Err(SimError::Stalled(in_flight.len())),
            };
            if peaks.is_some() {
                t = t.min(next_scrape);
            }
            if let Some(due) = self.gateways.next_delivery() {
                t = t.min(due);
            }
            self.now = t.max(self.now);
            if self.now - start > MAX_VIRTUAL_SECONDS {
                return Err(SimError::Runaway("virtual time"));
            }
            for engine in 0..self.engines.len() {
                for out in self.engines[engine].advance(self.now) {
                    let Some(flight) = in_flight.get_mut(&(engine, out.id)) else {
                        continue;
                    };
                    let Some(entry) = served.get_mut(flight.slot) else {
                        continue;
                    };
                    let record = &mut entry.record;
                    if out.index == 0 {
                        record.first_content = Some(out.at);
                        flight.first_token(&mut self.gateways, out.at);
                    }
                    flight.streamed(&mut self.gateways, u64::from(out.index) + 1, out.at);
                    record.last_token = Some(out.at);
                    record.usage = Some(Usage {
                        prompt_tokens: out.prompt_tokens,
                        completion_tokens: out.index + 1,
                        cached_tokens: Some(out.cached_tokens),
                    });
                    if let Some(answer) = flight.answer.as_mut() {
                        answer.push_str(&mock_engine::tokenizer::decode(out.token));
                    }
                    if let Some(finish) = out.finish {
                        record.stream_end = Some(out.at);
                        if finish == FinishReason::Abort {
                            record.error = Some(ErrorClass::StreamBroken);
                        }
                        if finish == FinishReason::Abort {
                            flight.cut(&mut self.gateways, out.at);
                        }
                        flight.end(&mut self.gateways, out.at, record.usage.map(engine_usage));
                        let answer = flight.answer.take();
                        let slot = flight.slot;
                        in_flight.remove(&(engine, out.id));
                        let answer = answer.filter(|_| served[slot].record.error.is_none());
                        if let Some(next) = ended(&served[slot], answer.as_deref())? {
                            queue_arrival(&mut arrivals, next_arrival, next, self.now);
                        }
                    }
                }
                if self.kv_sync {
                    self.apply_kv_events(engine);
                }
            }
            if let Some(peaks) = peaks.as_deref_mut()
                && next_scrape <= self.now
            {
                for (i, (p, e)) in peaks.iter_mut().zip(&self.engines).enumerate() {
                    p.observe(e.num_waiting() as f64, e.num_running() as f64, e.kv_usage());
                    // Each gateway scrapes each engine's `/metrics` on the same period
                    // (`engine_scrape.interval_ms` = 250) into its own `PodLoad`.
                    let stats = EngineStats {
                        running: saturating_u32(e.num_running()),
                        waiting: saturating_u32(e.num_waiting()),
                        kv_usage: e.kv_usage(),
                    };
                    for load in self.gateways.iter().filter_map(|g| g.loads.get(i)) {
                        load.set_engine_stats(stats);
                    }
                }
                next_scrape += SCRAPE_PERIOD;
            }
            // Shared routing state due now reaches the other gateways before any arrival
            // at this time is routed.
            self.gateways.deliver(self.now);
            while let Some(arrival) = arrivals.get(next_arrival)
                && arrival.request.at <= self.now
            {
                next_arrival += 1;
                let slot = served.len();
                let (entry, flight) = self.dispatch(arrival, slot)?;
                let refused = flight.is_none();
                if let Some((engine, id, flight)) = flight {
                    in_flight.insert((engine, id), flight);
                }
                served.push(entry);
                if refused && let Some(next) = ended(&served[slot], None)? {
                    queue_arrival(&mut arrivals, next_arrival, next, self.now);
                }
            }
        }
        Err(SimError::Runaway("event count"))
    }

    /// Applies engine `engine`'s KV-cache events of the steps just run to every gateway's
    /// index (each gateway subscribes to every engine).
    fn apply_kv_events(&mut self, engine: usize) {
        let batches = self.engines[engine].take_kv_event_batches();
        if batches.is_empty() {
            return;
        }
        let now_ms = (self.now * 1000.0) as u64;
        let name = &self.names[engine];
        let mut batches = batches;
        let last = self.gateways.len().saturating_sub(1);
        for (g, gateway) in self.gateways.iter_mut().enumerate() {
            if let Some(sync) = gateway.sync.as_mut() {
                // The last gateway takes the batches; the others get copies.
                let these = if g == last {
                    std::mem::take(&mut batches)
                } else {
                    batches.clone()
                };
                sync.apply(&gateway.router, engine, name, these, now_ms);
            }
        }
    }

    /// Routes (if asked) and submits one arrival at the current time.
    #[expect(clippy::type_complexity, reason = "private, used once")]
    fn dispatch(
        &mut self,
        arrival: &Arrival,
        slot: usize,
    ) -> Result<(Served, Option<(usize, RequestId, Flight)>), SimError> {
        let planned = &arrival.request;
        let mut record = RequestRecord::sent(planned.index, planned.family, planned.at, self.now);
        let number = self.submitted;
        self.submitted += 1;
        // A trace prompt's text is built here and dropped with this call. The router reads
        // the text the gateway would extract; the engine tokenizes what its server would
        // render (the same text, but a chat through its template).
        let text = planned.prompt.text();
        let (prompt, answer) = match &planned.prompt {
            Prompt::Chat(messages) => (
                mock_engine::tokenizer::encode(&engine_prompt(messages)),
                Some(String::new()),
            ),
            _ => (mock_engine::tokenizer::encode(&text), None),
        };
        let (engine, decision, routed) = match arrival.target {
            Target::Direct(engine) => {
                if engine >= self.engines.len() {
                    return Err(SimError::NoSuchReplica(engine));
                }
                (engine, None, None)
            }
            Target::Routed(strategy) | Target::RoutedOnto(strategy, _) => {
                let g = self.gateways.assign();
                let _hold = match arrival.target {
                    Target::RoutedOnto(_, replica) => self.load_all_above(g, replica)?,
                    _ => Vec::new(),
                };
                let gateway = self
                    .gateways
                    .get(g)
                    .ok_or(SimError::Config(format!("no gateway {g}")))?;
                let candidates: Vec<Candidate<'_>> = self
                    .names
                    .iter()
                    .zip(&gateway.loads)
                    .map(|(name, load)| Candidate {
                        name,
                        address: name,
                        load,
                    })
                    .collect();
                // With sync the gateway asks the engine's `/tokenize` and hashes those ids
                // (4 bytes big-endian each), the bytes the engine's events carry.
                let tokens =
                    (self.kv_sync && strategy.uses_prefix_index()).then(|| token_bytes(&prompt));
                let request = RouteRequest {
                    model: &self.model,
                    text: &text,
                    tokens: tokens.as_deref(),
                    session: Default::default(),
                    max_tokens: Some(u64::from(planned.max_tokens)),
                };
                let now_ms = (self.now * 1000.0) as u64;
                let routed =
                    gateway
                        .router
                        .route(strategy, &request, &candidates, &mut self.rng, now_ms)?;
                record.target_pod = Some(routed.decision.pod_name.clone());
                record.outstanding_at_selection = Some(routed.decision.outstanding_at_selection);
                let pod = routed.decision.pod;
                let event = GatewayEvent::Decided {
                    request: number,
                    pod,
                    decision: &routed.decision,
                    work: routed.guard.work(),
                };
                self.gateways.publish(g, event, self.now);
                (pod, Some(routed.decision), Some((g, routed.guard)))
            }
        };
        let request = EngineRequest {
            prompt,
            max_tokens: planned.max_tokens,
            ignore_eos: true,
        };
        match self.engines[engine].submit(request, self.now) {
            Ok(id) => {
                record.status = Some(200);
                let served = Served {
                    record,
                    engine,
                    decision,
                };
                let flight = Flight {
                    slot,
                    engine,
                    routed,
                    request: number,
                    answer,
                };
                Ok((served, Some((engine, id, flight))))
            }
            Err(_) => {
                // vLLM answers 400 (context length); the guard drops here, as the gateway's
                // body guard does when the upstream answers with an error.
                let mut refused = Flight {
                    slot,
                    engine,
                    routed,
                    request: number,
                    answer: None,
                };
                refused.cut(&mut self.gateways, self.now);
                record.status = Some(400);
                record.error = Some(ErrorClass::Status);
                let served = Served {
                    record,
                    engine,
                    decision,
                };
                Ok((served, None))
            }
        }
    }
}

//! How requests are spread over several gateways, as a Kubernetes Service spreads them over
//! gateway replicas: in turn, or at random. Shared by the simulated cluster's gateways and the
//! live sender; pure and seeded.

use std::str::FromStr;

use rand::Rng;
use rand::rngs::StdRng;

/// How requests are spread over the gateways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GatewayAssignment {
    /// Gateway 0, 1, …, G − 1, 0, … in send order (kube-proxy's IPVS `rr`).
    #[default]
    RoundRobin,
    /// A gateway drawn uniformly for every request (kube-proxy's iptables mode).
    Random,
}

impl GatewayAssignment {
    pub fn as_str(self) -> &'static str {
        match self {
            GatewayAssignment::RoundRobin => "round-robin",
            GatewayAssignment::Random => "random",
        }
    }
}

impl FromStr for GatewayAssignment {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "round-robin" => Ok(GatewayAssignment::RoundRobin),
            "random" => Ok(GatewayAssignment::Random),
            other => Err(format!(
                "unknown gateway assignment {other:?} (round-robin or random)"
            )),
        }
    }
}

/// Picks the gateway of each request in send order.
#[derive(Debug, Clone)]
pub struct Assigner {
    gateways: usize,
    assignment: GatewayAssignment,
    /// The next gateway in turn (round-robin).
    turn: usize,
    /// Draws gateways for [`GatewayAssignment::Random`]; its own generator, so the routers'
    /// draws do not depend on how requests were spread.
    draw: StdRng,
}

impl Assigner {
    pub fn new(gateways: usize, assignment: GatewayAssignment, draw: StdRng) -> Self {
        Assigner {
            gateways,
            assignment,
            turn: 0,
            draw,
        }
    }

    /// The gateway (`0..gateways`) of the next request; always 0 with one gateway.
    pub fn next_gateway(&mut self) -> usize {
        let n = self.gateways;
        if n <= 1 {
            return 0;
        }
        match self.assignment {
            GatewayAssignment::RoundRobin => {
                let g = self.turn % n;
                self.turn = (self.turn + 1) % n;
                g
            }
            GatewayAssignment::Random => self.draw.random_range(0..n),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn assigner(n: usize, assignment: GatewayAssignment) -> Assigner {
        Assigner::new(n, assignment, StdRng::seed_from_u64(7))
    }

    #[test]
    fn requests_go_round_robin_or_at_random() {
        let mut rr = assigner(3, GatewayAssignment::RoundRobin);
        let turns: Vec<usize> = (0..7).map(|_| rr.next_gateway()).collect();
        assert_eq!(turns, vec![0, 1, 2, 0, 1, 2, 0]);

        let mut random = assigner(4, GatewayAssignment::Random);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[random.next_gateway()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");

        let mut one = assigner(1, GatewayAssignment::Random);
        assert!((0..5).all(|_| one.next_gateway() == 0));
    }

    #[test]
    fn assignments_parse_or_explain() {
        assert_eq!("random".parse(), Ok(GatewayAssignment::Random));
        assert_eq!("round-robin".parse(), Ok(GatewayAssignment::RoundRobin));
        let err = "hash".parse::<GatewayAssignment>().unwrap_err();
        assert!(err.contains("round-robin or random"), "{err}");
    }
}

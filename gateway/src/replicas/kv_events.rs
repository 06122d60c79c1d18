//! Where a replica publishes its vLLM KV-cache events: [`EventEndpoints`], carried by the
//! replica when it says so itself (embedded mock engines) and otherwise derived by KV sync
//! from the `[kv_sync]` ports and the replica's host. Part of the replica, so the replica
//! set knows nothing of KV sync, which follows it.

/// Where one replica publishes its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEndpoints {
    /// `tcp://HOST:PORT` of the PUB socket.
    pub events: String,
    /// `tcp://HOST:PORT` of the replay ROUTER socket, if any.
    pub replay: Option<String>,
}

impl EventEndpoints {
    /// The endpoints of data-parallel rank `rank` when these are rank 0's: both ports
    /// offset by the rank, as vLLM's publisher offsets them. `None` when a port cannot be
    /// read or would pass 65535.
    pub fn for_rank(&self, rank: u32) -> Option<EventEndpoints> {
        if rank == 0 {
            return Some(self.clone());
        }
        let replay = match &self.replay {
            Some(replay) => Some(offset_port(replay, rank)?),
            None => None,
        };
        Some(EventEndpoints {
            events: offset_port(&self.events, rank)?,
            replay,
        })
    }
}

/// `tcp://HOST:PORT` with `PORT + rank`.
fn offset_port(endpoint: &str, rank: u32) -> Option<String> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let port = port
        .parse::<u16>()
        .ok()?
        .checked_add(u16::try_from(rank).ok()?)?;
    Some(format!("{host}:{port}"))
}

//! The Redis side of cluster sharing: one stream per fleet, four commands.
//!
//! - publish: `XADD prefixgate:{name}:routing MINID ~ <now − history> * m <message>` for each
//!   message of a batch, and `PEXPIRE key 2 × history`, in one pipeline (one round trip);
//!   the stream thus keeps about `history` of messages and disappears when a fleet is gone;
//! - catch up: `TIME` (the server's clock), then read from `<server ms − history>-0`: the
//!   recent history is the snapshot a late or reconnecting gateway starts from, and stream
//!   ids are the server's milliseconds, so every gateway reads the same window;
//! - follow: `XREAD BLOCK 1000 COUNT 512 STREAMS key <last id>`, which returns as soon as
//!   an entry is added; after a lost connection the reader resumes after the last id it
//!   applied, so nothing still in the stream is missed.
//!
//! Requires Redis ≥ 6.2 (`XADD … MINID`). Each link is its own connection: the reader's
//! blocking `XREAD` must not hold up the publisher's `XADD`s.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamReadReply};
use redis::{AsyncConnectionConfig, Client, RedisResult, Value};

/// How long one `XREAD` blocks waiting for entries.
pub const BLOCK: Duration = Duration::from_secs(1);
/// Entries read at most per `XREAD`.
const COUNT: usize = 512;
/// A connect attempt gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A command (other than the blocking read, which gets this on top of its block) gives up
/// after this long: a server that stopped answering is a lost link, not a hang.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// One fleet's stream on one server.
#[derive(Debug, Clone)]
pub struct Stream {
    client: Client,
    key: String,
    history: Duration,
}

/// A stream entry: its id and its message bytes (`None`: no `m` field of bytes).
#[derive(Debug)]
pub struct Entry {
    pub id: String,
    /// The server's time when it was added, from its id.
    pub added_ms: u64,
    pub message: Option<Vec<u8>>,
}

impl Stream {
    /// The stream `key` on the server at `url` (checked by the config), keeping `history`.
    pub fn new(url: &str, key: String, history: Duration) -> RedisResult<Self> {
        Ok(Stream {
            client: Client::open(url)?,
            key,
            history,
        })
    }

    /// A connection for publishing.
    pub async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.connection(RESPONSE_TIMEOUT).await
    }

    /// A connection for the blocking reads.
    pub async fn connect_reader(&self) -> RedisResult<MultiplexedConnection> {
        self.connection(BLOCK + RESPONSE_TIMEOUT).await
    }

    async fn connection(&self, response: Duration) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Appends `messages` in one round trip, trimming what is older than the history.
    pub async fn publish(
        &self,
        connection: &mut MultiplexedConnection,
        messages: &[Vec<u8>],
        now_ms: u64,
    ) -> RedisResult<()> {
        let history_ms = u64::try_from(self.history.as_millis()).unwrap_or(u64::MAX);
        let min_id = now_ms.saturating_sub(history_ms);
        let mut pipe = redis::pipe();
        for message in messages {
            pipe.cmd("XADD")
                .arg(&self.key)
                .arg("MINID")
                .arg("~")
                .arg(min_id)
                .arg("*")
                .arg("m")
                .arg(message.as_slice())
                .ignore();
        }
        pipe.cmd("PEXPIRE")
            .arg(&self.key)
            .arg(history_ms.saturating_mul(2))
            .ignore();
        pipe.query_async::<()>(connection).await
    }

    /// Where a gateway with nothing applied yet starts reading: `history` before the
    /// server's clock.
    pub async fn catch_up_from(
        &self,
        connection: &mut MultiplexedConnection,
    ) -> RedisResult<String> {
        let now = self.server_ms(connection).await?;
        let history_ms = u64::try_from(self.history.as_millis()).unwrap_or(u64::MAX);
        Ok(format!("{}-0", now.saturating_sub(history_ms)))
    }

    /// The server's clock, in milliseconds.
    pub async fn server_ms(&self, connection: &mut MultiplexedConnection) -> RedisResult<u64> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(connection).await?;
        Ok(secs.saturating_mul(1000) + micros / 1000)
    }

    /// The entries after `after`, waiting up to [`BLOCK`] for one.
    pub async fn read(
        &self,
        connection: &mut MultiplexedConnection,
        after: &str,
    ) -> RedisResult<Vec<Entry>> {
        let reply: Option<StreamReadReply> = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(u64::try_from(BLOCK.as_millis()).unwrap_or(1000))
            .arg("COUNT")
            .arg(COUNT)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(after)
            .query_async(connection)
            .await?;
        Ok(reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids)
            .map(entry)
            .collect())
    }
}

fn entry(id: StreamId) -> Entry {
    let added_ms = id
        .id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or(0);
    let message = match id.map.get("m") {
        Some(Value::BulkString(bytes)) => Some(bytes.clone()),
        _ => None,
    };
    Entry {
        id: id.id,
        added_ms,
        message,
    }
}

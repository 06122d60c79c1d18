//! vLLM's KV-cache event wire format (`vllm/distributed/kv_events.py`), in both of the forms
//! vLLM has written: decoded for KV-event sync and encoded by the mock engine, from this one
//! definition.
//!
//! A ZMQ message is three frames: `[topic, seq, payload]`, `seq` an unsigned 64-bit
//! big-endian counter from 0, one per batch ([`seq_frame`], [`read_seq`]); the replay
//! socket's last message is seq [`END_OF_REPLAY`] with an empty payload. The payload is
//! msgpack. vLLM 0.9–0.11 writes it with `msgspec` `array_like` structs, so everything is
//! positional ([`positional`], [`EventFormat::Positional`]):
//!
//! ```text
//! batch:   [ts: float, events: [event…], data_parallel_rank: int]      (rank optional)
//! events:  ["BlockStored", [hash…], parent_hash | nil, [token_id…], block_size, lora_id?, medium?, lora_name?, …]
//!          ["BlockRemoved", [hash…], medium?, …]
//!          ["AllBlocksCleared", …]
//! ```
//!
//! Newer vLLMs drop `array_like`, so an event is a msgpack **map** with a `"type"` tag and
//! named fields (and the newest source drops it on the batch too); [`map`] reads and writes
//! those ([`EventFormat::Map`]). Both forms may appear in one batch, and each event decodes
//! to the same [`KvEvent`].
//!
//! Hashes are msgpack integers (vLLM's default int form, up to 2^64 − 1) or byte strings
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: raw sha256), which are read as their **first 8
//! bytes big-endian**, as AIBrix does. Engine hashes are only ever compared with each other
//! (stored, parent, removed), so any fixed reading works as long as it is the same for all.
//! Fields past the ones listed are ignored (newer vLLMs append them). An event with an unknown
//! tag is skipped and counted, not an error: a newer engine must not stop the sync. Anything
//! else malformed is a [`WireError`] that names the field. The encoder writes hashes as
//! unsigned integers, integers in msgpack's smallest encoding and `ts` as a float64, as
//! msgspec does; the tests hold payloads msgspec itself wrote. Nothing here knows sockets:
//! the gateway and the mock engine move the frames.

use rmpv::Value;

mod event;
pub mod map;
pub mod positional;

use event::shape;
pub use event::{EventBatch, KvEvent, MEDIUM_GPU, WireError};

/// The seq frame of the replay's last message (`(-1).to_bytes(8, "big", signed=True)`).
pub const END_OF_REPLAY: u64 = u64::MAX;

/// The `seq` frame of a batch.
pub fn seq_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The seq a frame carries; `None` for a frame that is not 8 bytes.
pub fn read_seq(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

/// Which of vLLM's two event encodings to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// Tagged positional arrays (vLLM 0.9–0.11; what AIBrix v0.7.0 reads).
    #[default]
    Positional,
    /// Maps with a `"type"` tag and named fields (newer vLLMs).
    Map,
}

/// An event format name that is not `positional` or `map`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--kv-events-format: `{0}` is not one of positional, map")]
pub struct UnknownEventFormat(pub String);

impl std::str::FromStr for EventFormat {
    type Err = UnknownEventFormat;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "positional" => Ok(EventFormat::Positional),
            "map" => Ok(EventFormat::Map),
            other => Err(UnknownEventFormat(other.to_owned())),
        }
    }
}

impl std::fmt::Display for EventFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EventFormat::Positional => "positional",
            EventFormat::Map => "map",
        })
    }
}

/// The msgpack payload of `batch`, its events in `format`, inside a positional batch (as
/// released vLLMs write it; the rank is left out when `None`). Each event's LoRA name is
/// `batch.lora_names`' entry at its place (none when the list is short). [`decode_batch`]
/// reads it back to `batch` (with `skipped` 0).
pub fn encode_batch(batch: &EventBatch, format: EventFormat) -> Vec<u8> {
    let encode_event = match format {
        EventFormat::Positional => positional::encode_event,
        EventFormat::Map => map::encode_event,
    };
    let events = batch
        .events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let lora = batch.lora_names.get(i).and_then(Option::as_deref);
            encode_event(event, lora)
        })
        .collect();
    let mut fields = vec![Value::F64(batch.ts), Value::Array(events)];
    if let Some(rank) = batch.data_parallel_rank {
        fields.push(Value::from(rank));
    }
    let mut bytes = Vec::new();
    // Writing into a Vec cannot fail: rmpv's only errors are the writer's.
    if rmpv::encode::write_value(&mut bytes, &Value::Array(fields)).is_err() {
        bytes.clear();
    }
    bytes
}

/// Decodes one payload frame.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, WireError> {
    let mut rest = payload;
    let value =
        rmpv::decode::read_value(&mut rest).map_err(|e| WireError::Msgpack(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    let (ts, events, rank) = match &value {
        Value::Array(items) => match items.as_slice() {
            [ts, events] => (ts, events, None),
            [ts, events, rank] => (ts, events, Some(rank)),
            _ => return Err(shape("batch", "2 or 3 elements")),
        },
        Value::Map(entries) => map::batch_fields(entries)?,
        _ => return Err(shape("batch", "an array [ts, events, dp_rank] or a map")),
    };
    let ts = ts.as_f64().ok_or_else(|| shape("batch ts", "a number"))?;
    let Value::Array(events) = events else {
        return Err(shape("batch events", "an array"));
    };
    let data_parallel_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(rank) => Some(
            rank.as_i64()
                .ok_or_else(|| shape("data_parallel_rank", "an integer"))?,
        ),
    };
    let mut decoded = Vec::with_capacity(events.len());
    let mut lora_names = Vec::with_capacity(events.len());
    let mut skipped = 0;
    for (i, event) in events.iter().enumerate() {
        let event = match event {
            Value::Array(fields) => positional::decode_event(i, fields)?,
            Value::Map(entries) => map::decode_event(i, entries)?,
            _ => return Err(shape(format!("events[{i}]"), "a tagged array or a map")),
        };
        match event {
            Some((event, lora)) => {
                decoded.push(event);
                lora_names.push(lora);
            }
            None => skipped += 1,
        }
    }
    Ok(EventBatch {
        ts,
        events: decoded,
        lora_names,
        data_parallel_rank,
        skipped,
    })
}

#[cfg(test)]
mod tests;

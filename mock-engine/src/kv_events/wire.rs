//! vLLM's KV-event wire format (0.9–0.11, `vllm/distributed/kv_events.py`), encoded and
//! decoded.
//!
//! A ZMQ message is three frames: `[topic, seq, payload]`, `seq` an unsigned 64-bit
//! big-endian counter from 0, one per batch. The payload is msgpack, written by vLLM with
//! `msgspec` `array_like` structs, so everything is positional:
//!
//! ```text
//! batch:   [ts: float64, events: [event…], data_parallel_rank: int]
//! events:  ["BlockStored", [hash…], parent_hash | nil, [token_id…], block_size, lora_id | nil, "GPU"]
//!          ["BlockRemoved", [hash…], "GPU"]
//!          ["AllBlocksCleared"]
//! ```
//!
//! Hashes go out as msgpack unsigned integers (vLLM's default
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` form; values ≥ 2^63 are uint64). Integers use
//! msgpack's smallest encoding and `ts` is always a float64, as msgspec writes them. The
//! replay socket's end marker is seq [`END_OF_REPLAY`] with an empty payload.
//!
//! Decoding ([`decode_batch`]) is here for tests, the example subscriber and anyone lining
//! the mock up with a subscriber; it accepts what vLLM 0.9–0.11 send (a 2- or 3-element
//! batch, hashes as ints or as bytes whose last 8 bytes are read big-endian, trailing
//! fields after `medium` ignored) and names what is wrong otherwise.

use rmpv::Value;
use thiserror::Error;

use crate::model::{KvEvent, KvEventBatch};

/// The seq frame of the replay's last message (`(-1).to_bytes(8, "big", signed=True)`).
pub const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// The storage medium vLLM names for GPU blocks.
pub const MEDIUM_GPU: &str = "GPU";

/// The `seq` frame of a batch.
pub fn seq_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The msgpack payload of one batch. `ts` is written as given (the publisher has already
/// turned engine seconds into the timestamp it publishes).
pub fn encode_batch(ts: f64, events: &[KvEvent], data_parallel_rank: u32) -> Vec<u8> {
    let value = Value::Array(vec![
        Value::F64(ts),
        Value::Array(events.iter().map(event_value).collect()),
        Value::from(data_parallel_rank),
    ]);
    let mut bytes = Vec::new();
    // Writing into a Vec cannot fail; an error here would be a bug in rmpv.
    if let Err(e) = rmpv::encode::write_value(&mut bytes, &value) {
        tracing::error!(error = %e, "msgpack encoding into memory failed");
    }
    bytes
}

fn event_value(event: &KvEvent) -> Value {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
        } => Value::Array(vec![
            Value::from("BlockStored"),
            hashes_value(block_hashes),
            parent_block_hash.map_or(Value::Nil, Value::from),
            Value::Array(token_ids.iter().map(|t| Value::from(*t)).collect()),
            Value::from(*block_size as u64),
            Value::Nil, // lora_id: the mock serves no adapters
            Value::from(MEDIUM_GPU),
        ]),
        KvEvent::BlockRemoved { block_hashes } => Value::Array(vec![
            Value::from("BlockRemoved"),
            hashes_value(block_hashes),
            Value::from(MEDIUM_GPU),
        ]),
        KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
    }
}

fn hashes_value(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|h| Value::from(*h)).collect())
}

/// A decoded payload: the batch and the data-parallel rank (`None` for a 2-element batch).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedBatch {
    pub batch: KvEventBatch,
    pub data_parallel_rank: Option<i64>,
}

/// Why a payload is not a vLLM KV-event batch.
#[derive(Debug, Error)]
pub enum WireError {
    #[error("not msgpack: {0}")]
    Msgpack(#[from] rmpv::decode::Error),
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    #[error("{what}: expected {expected}")]
    Shape {
        what: String,
        expected: &'static str,
    },
    #[error("unknown event tag `{0}`")]
    UnknownTag(String),
}

fn shape(what: impl Into<String>, expected: &'static str) -> WireError {
    WireError::Shape {
        what: what.into(),
        expected,
    }
}

/// Decodes one payload frame.
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch, WireError> {
    let mut rest = payload;
    let value = rmpv::decode::read_value(&mut rest)?;
    if !rest.is_empty() {
        return Err(WireError::Trailing(rest.len()));
    }
    let Value::Array(items) = value else {
        return Err(shape("batch", "an array [ts, events, dp_rank]"));
    };
    let (ts, events, rank) = match items.as_slice() {
        [ts, events] => (ts, events, None),
        [ts, events, rank] => (ts, events, Some(rank)),
        _ => return Err(shape("batch", "2 or 3 elements")),
    };
    let ts = ts.as_f64().ok_or_else(|| shape("batch ts", "a number"))?;
    let Value::Array(events) = events else {
        return Err(shape("batch events", "an array"));
    };
    let data_parallel_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(rank) => Some(
            rank.as_i64()
                .ok_or_else(|| shape("dp_rank", "an integer"))?,
        ),
    };
    let events = events
        .iter()
        .enumerate()
        .map(|(i, e)| decode_event(i, e))
        .collect::<Result<_, _>>()?;
    Ok(DecodedBatch {
        batch: KvEventBatch { ts, events },
        data_parallel_rank,
    })
}

fn decode_event(index: usize, value: &Value) -> Result<KvEvent, WireError> {
    let what = |field: &str| format!("events[{index}].{field}");
    let Value::Array(fields) = value else {
        return Err(shape(format!("events[{index}]"), "a tagged array"));
    };
    let tag = fields
        .first()
        .and_then(Value::as_str)
        .ok_or_else(|| shape(what("tag"), "a string"))?;
    match tag {
        "BlockStored" => {
            let field = |i: usize, name: &str| {
                fields
                    .get(i)
                    .ok_or_else(|| shape(what(name), "present (BlockStored has 5+ fields)"))
            };
            let block_hashes = decode_hashes(field(1, "block_hashes")?, &what("block_hashes"))?;
            let parent_block_hash = match field(2, "parent_block_hash")? {
                Value::Nil => None,
                parent => Some(decode_hash(parent, &what("parent_block_hash"))?),
            };
            let Value::Array(tokens) = field(3, "token_ids")? else {
                return Err(shape(what("token_ids"), "an array"));
            };
            let token_ids = tokens
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| shape(what("token_ids"), "integers in 0..2^32"))?;
            let block_size = field(4, "block_size")?
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())
                .filter(|b| *b > 0)
                .ok_or_else(|| shape(what("block_size"), "an integer > 0"))?;
            if token_ids.len() != block_hashes.len() * block_size {
                return Err(shape(what("token_ids"), "block_hashes × block_size ids"));
            }
            Ok(KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            })
        }
        "BlockRemoved" => {
            let hashes = fields
                .get(1)
                .ok_or_else(|| shape(what("block_hashes"), "present"))?;
            Ok(KvEvent::BlockRemoved {
                block_hashes: decode_hashes(hashes, &what("block_hashes"))?,
            })
        }
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        other => Err(WireError::UnknownTag(other.to_owned())),
    }
}

fn decode_hashes(value: &Value, what: &str) -> Result<Vec<u64>, WireError> {
    let Value::Array(items) = value else {
        return Err(shape(what, "an array of hashes"));
    };
    items.iter().map(|h| decode_hash(h, what)).collect()
}

/// An int hash, or vLLM's bytes form read as its published int (last 8 bytes, big-endian).
fn decode_hash(value: &Value, what: &str) -> Result<u64, WireError> {
    match value {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|v| v as u64))
            .ok_or_else(|| shape(what, "a 64-bit hash")),
        Value::Binary(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        }
        _ => Err(shape(what, "an integer or bytes hash")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![u64::MAX - 1, 7],
            parent_block_hash: None,
            token_ids: vec![1, 2, 300, 70_000],
            block_size: 2,
        }
    }

    #[test]
    fn the_payload_is_vllms_positional_msgpack_byte_for_byte() {
        let events = [
            KvEvent::BlockRemoved {
                block_hashes: vec![5],
            },
            KvEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(1.5, &events, 0);
        let mut expected = vec![0x93, 0xcb];
        expected.extend(1.5f64.to_be_bytes());
        expected.push(0x92);
        // ["BlockRemoved", [5], "GPU"]
        expected.extend([0x93, 0xac]);
        expected.extend(b"BlockRemoved");
        expected.extend([0x91, 0x05, 0xa3]);
        expected.extend(b"GPU");
        // ["AllBlocksCleared"]
        expected.extend([0x91, 0xb0]);
        expected.extend(b"AllBlocksCleared");
        expected.push(0x00); // dp rank 0
        assert_eq!(bytes, expected);
    }

    #[test]
    fn block_stored_has_seven_fields_and_big_hashes_are_uint64() {
        let bytes = encode_batch(0.0, &[stored()], 0);
        let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        let event = &value[1][0];
        assert_eq!(event.as_array().unwrap().len(), 7);
        assert_eq!(event[0].as_str(), Some("BlockStored"));
        assert_eq!(event[1][0].as_u64(), Some(u64::MAX - 1));
        assert!(event[2].is_nil());
        assert_eq!(event[4].as_u64(), Some(2));
        assert!(event[5].is_nil(), "lora_id");
        assert_eq!(event[6].as_str(), Some("GPU"));
        // uint64 marker 0xcf followed by the hash, big-endian.
        let mut needle = vec![0xcf];
        needle.extend((u64::MAX - 1).to_be_bytes());
        assert!(bytes.windows(9).any(|w| w == needle.as_slice()));
    }

    #[test]
    fn decoding_inverts_encoding() {
        let events = vec![
            stored(),
            KvEvent::BlockStored {
                block_hashes: vec![9],
                parent_block_hash: Some(7),
                token_ids: vec![4, 5],
                block_size: 2,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![u64::MAX],
            },
            KvEvent::AllBlocksCleared,
        ];
        let decoded = decode_batch(&encode_batch(12.25, &events, 3)).unwrap();
        assert_eq!(decoded.batch, KvEventBatch { ts: 12.25, events });
        assert_eq!(decoded.data_parallel_rank, Some(3));
    }

    #[test]
    fn bytes_hashes_and_two_element_batches_are_accepted() {
        let mut hash = vec![0u8; 24];
        hash.extend(0x0102_0304_0506_0708u64.to_be_bytes());
        let value = Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![Value::Array(vec![
                Value::from("BlockRemoved"),
                Value::Array(vec![Value::Binary(hash)]),
            ])]),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &value).unwrap();
        let decoded = decode_batch(&bytes).unwrap();
        assert_eq!(decoded.data_parallel_rank, None);
        assert_eq!(
            decoded.batch.events,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![0x0102_0304_0506_0708]
            }]
        );
    }

    #[test]
    fn malformed_payloads_are_named_errors() {
        let err = |bytes: &[u8]| decode_batch(bytes).unwrap_err().to_string();
        assert!(err(&[0x93]).contains("msgpack"), "{}", err(&[0x93])); // truncated
        assert!(err(&[0x01]).contains("batch"));
        let mut one = encode_batch(1.0, &[], 0);
        one.push(0);
        assert!(err(&one).contains("trailing"));
        let value = Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![Value::Array(vec![Value::from("BlockMoved")])]),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &value).unwrap();
        assert!(err(&bytes).contains("BlockMoved"));
        // token_ids not a multiple of the blocks
        let bad = KvEvent::BlockStored {
            block_hashes: vec![1],
            parent_block_hash: None,
            token_ids: vec![1],
            block_size: 2,
        };
        assert!(err(&encode_batch(1.0, &[bad], 0)).contains("token_ids"));
    }

    #[test]
    fn seq_frames_are_big_endian() {
        assert_eq!(seq_frame(1), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(END_OF_REPLAY, (-1i64).to_be_bytes());
    }
}

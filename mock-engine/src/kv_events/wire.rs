//! vLLM's KV-event wire format (`vllm/distributed/kv_events.py`), encoded in either of the
//! two forms vLLM has published.
//!
//! A ZMQ message is three frames: `[topic, seq, payload]`, `seq` an unsigned 64-bit
//! big-endian counter from 0, one per batch. The payload is msgpack. vLLM 0.9–0.11 writes it
//! with `msgspec` `array_like` structs, so everything is positional
//! ([`EventFormat::Positional`], the default):
//!
//! ```text
//! batch:   [ts: float64, events: [event…], data_parallel_rank: int]
//! events:  ["BlockStored", [hash…], parent_hash | nil, [token_id…], block_size, lora_id | nil, "GPU"]
//!          ["BlockRemoved", [hash…], "GPU"]
//!          ["AllBlocksCleared"]
//! ```
//!
//! Newer vLLMs (PR #42892; seen from 0.2x) write each event as a map with a `"type"` tag
//! and named fields, in the struct's field order, inside the same positional batch
//! ([`EventFormat::Map`]). Fields without a default are always written (`lora_id`, `medium`
//! and `lora_name` as nil when unset); of the defaulted ones the mock writes what a
//! single-group vLLM 0.2x writes (`extra_keys`, one nil per block, `group_idx` 0 and
//! `kv_cache_spec_kind` `"full_attention"`):
//!
//! ```text
//! {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
//!  "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys", "group_idx", "kv_cache_spec_kind"}
//! {"type": "BlockRemoved", "block_hashes", "medium": "GPU", "group_idx": 0}
//! {"type": "AllBlocksCleared"}
//! ```
//!
//! Hashes go out as msgpack unsigned integers (vLLM's default
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1` form; values ≥ 2^63 are uint64). Integers use
//! msgpack's smallest encoding and `ts` is always a float64, as msgspec writes them. The
//! replay socket's end marker is seq [`END_OF_REPLAY`] with an empty payload.
//!
//! There is one decoder in the workspace, the gateway's: `router_core::kv_sync::decode_batch`.
//! The tests and the example subscriber decode with it, so they check the mock against the
//! consumer that reads it in production rather than against a second decoder of its own.

use rmpv::Value;

use crate::model::KvEvent;

/// The seq frame of the replay's last message (`(-1).to_bytes(8, "big", signed=True)`).
pub const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// The storage medium vLLM names for GPU blocks.
pub const MEDIUM_GPU: &str = "GPU";

/// The `seq` frame of a batch.
pub fn seq_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Which of vLLM's two event encodings to publish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// Tagged positional arrays (vLLM 0.9–0.11; what AIBrix v0.7.0 reads).
    #[default]
    Positional,
    /// Maps with a `"type"` tag and named fields (newer vLLMs).
    Map,
}

/// Why a `--kv-events-format` value was refused.
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

/// The msgpack payload of one batch in the positional form. `ts` is written as given (the
/// publisher has already turned engine seconds into the timestamp it publishes).
pub fn encode_batch(ts: f64, events: &[KvEvent], data_parallel_rank: u32) -> Vec<u8> {
    encode_batch_as(EventFormat::Positional, ts, events, data_parallel_rank)
}

/// The msgpack payload of one batch, its events in `format`.
pub fn encode_batch_as(
    format: EventFormat,
    ts: f64,
    events: &[KvEvent],
    data_parallel_rank: u32,
) -> Vec<u8> {
    let event_value = match format {
        EventFormat::Positional => positional_event,
        EventFormat::Map => map_event,
    };
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

fn positional_event(event: &KvEvent) -> Value {
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

fn map_event(event: &KvEvent) -> Value {
    let fields = match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
        } => vec![
            ("type", Value::from("BlockStored")),
            ("block_hashes", hashes_value(block_hashes)),
            (
                "parent_block_hash",
                parent_block_hash.map_or(Value::Nil, Value::from),
            ),
            (
                "token_ids",
                Value::Array(token_ids.iter().map(|t| Value::from(*t)).collect()),
            ),
            ("block_size", Value::from(*block_size as u64)),
            // The mock serves no adapters: no lora_id, no lora_name, no extra hash keys.
            ("lora_id", Value::Nil),
            ("medium", Value::from(MEDIUM_GPU)),
            ("lora_name", Value::Nil),
            (
                "extra_keys",
                Value::Array(vec![Value::Nil; block_hashes.len()]),
            ),
            ("group_idx", Value::from(0u64)),
            ("kv_cache_spec_kind", Value::from("full_attention")),
        ],
        KvEvent::BlockRemoved { block_hashes } => vec![
            ("type", Value::from("BlockRemoved")),
            ("block_hashes", hashes_value(block_hashes)),
            ("medium", Value::from(MEDIUM_GPU)),
            ("group_idx", Value::from(0u64)),
        ],
        KvEvent::AllBlocksCleared => vec![("type", Value::from("AllBlocksCleared"))],
    };
    Value::Map(
        fields
            .into_iter()
            .map(|(key, value)| (Value::from(key), value))
            .collect(),
    )
}

fn hashes_value(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|h| Value::from(*h)).collect())
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

    /// One event of each kind, a chained store among them.
    fn every_kind() -> Vec<KvEvent> {
        vec![
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
        ]
    }

    #[test]
    fn the_gateways_decoder_reads_what_the_mock_publishes() {
        use router_core::kv_sync::{KvEvent as Read, decode_batch};
        let events = every_kind();
        let read = decode_batch(&encode_batch(12.25, &events, 3)).unwrap();
        assert_eq!(read.ts, 12.25);
        assert_eq!(read.data_parallel_rank, Some(3));
        assert_eq!(read.skipped, 0);
        assert_eq!(
            read.events,
            [
                Read::BlockStored {
                    block_hashes: vec![u64::MAX - 1, 7],
                    parent: None,
                    token_ids: vec![1, 2, 300, 70_000],
                    block_size: 2,
                },
                Read::BlockStored {
                    block_hashes: vec![9],
                    parent: Some(7),
                    token_ids: vec![4, 5],
                    block_size: 2,
                },
                Read::BlockRemoved {
                    block_hashes: vec![u64::MAX],
                },
                Read::AllBlocksCleared,
            ]
        );
    }

    #[test]
    fn map_events_are_vllms_named_fields_in_field_order() {
        let events = [
            stored(),
            KvEvent::BlockRemoved {
                block_hashes: vec![7],
            },
            KvEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch_as(EventFormat::Map, 2.0, &events, 0);
        let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        // The batch stays positional; each event is a map.
        assert_eq!(value.as_array().unwrap().len(), 3);
        let keys = |event: &Value| -> Vec<String> {
            event
                .as_map()
                .unwrap()
                .iter()
                .map(|(k, _)| k.as_str().unwrap().to_owned())
                .collect()
        };
        let field = |event: &Value, name: &str| -> Value {
            event
                .as_map()
                .unwrap()
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let stored = &value[1][0];
        assert_eq!(
            keys(stored),
            [
                "type",
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "lora_id",
                "medium",
                "lora_name",
                "extra_keys",
                "group_idx",
                "kv_cache_spec_kind",
            ]
        );
        assert_eq!(field(stored, "type").as_str(), Some("BlockStored"));
        assert_eq!(
            field(stored, "block_hashes")[0].as_u64(),
            Some(u64::MAX - 1)
        );
        assert!(field(stored, "parent_block_hash").is_nil());
        assert_eq!(field(stored, "token_ids")[3].as_u64(), Some(70_000));
        assert_eq!(field(stored, "block_size").as_u64(), Some(2));
        assert!(field(stored, "lora_name").is_nil());
        assert_eq!(field(stored, "medium").as_str(), Some("GPU"));
        assert_eq!(field(stored, "extra_keys").as_array().unwrap().len(), 2);
        let removed = &value[1][1];
        assert_eq!(
            keys(removed),
            ["type", "block_hashes", "medium", "group_idx"]
        );
        assert_eq!(field(removed, "type").as_str(), Some("BlockRemoved"));
        assert_eq!(keys(&value[1][2]), ["type"]);
        assert_eq!(
            field(&value[1][2], "type").as_str(),
            Some("AllBlocksCleared")
        );
    }

    /// msgspec 0.22's encoding of the same three events, from structs declared as vLLM's
    /// are (tagged events without `array_like`, `omit_defaults`) in an `array_like` batch.
    const MSGSPEC_MAP_EVENTS: &str = "\
         93cb4004000000000000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf\
         ffffffffffffffff0bb1706172656e745f626c6f636b5f6861736807a9746f6b656e5f6964739401020304aa\
         626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65\
         787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66\
         756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865\
         73910ba66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c65\
         6172656400";

    #[test]
    fn the_map_payload_is_what_msgspec_writes_byte_for_byte() {
        let events = [
            KvEvent::BlockStored {
                block_hashes: vec![u64::MAX, 11],
                parent_block_hash: Some(7),
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![11],
            },
            KvEvent::AllBlocksCleared,
        ];
        let expected: Vec<u8> = (0..MSGSPEC_MAP_EVENTS.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&MSGSPEC_MAP_EVENTS[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(encode_batch_as(EventFormat::Map, 2.5, &events, 0), expected);
    }

    #[test]
    fn the_gateways_decoder_reads_both_forms_alike() {
        use router_core::kv_sync::decode_batch;
        let events = every_kind();
        let positional = encode_batch_as(EventFormat::Positional, 3.0, &events, 0);
        let map = encode_batch_as(EventFormat::Map, 3.0, &events, 0);
        assert_ne!(positional, map);
        assert_eq!(positional, encode_batch(3.0, &events, 0));
        let map = decode_batch(&map).unwrap();
        assert_eq!(map.skipped, 0);
        assert_eq!(map, decode_batch(&positional).unwrap());
        assert_eq!(map.events.len(), 4);
    }

    #[test]
    fn formats_parse_by_name_and_a_wrong_one_is_named() {
        for format in [EventFormat::Positional, EventFormat::Map] {
            assert_eq!(format.to_string().parse::<EventFormat>(), Ok(format));
        }
        assert_eq!(EventFormat::default(), EventFormat::Positional);
        let error = "Map".parse::<EventFormat>().unwrap_err().to_string();
        assert!(
            error.contains("`Map`") && error.contains("positional, map"),
            "{error}"
        );
    }

    #[test]
    fn seq_frames_are_big_endian() {
        assert_eq!(seq_frame(1), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(END_OF_REPLAY, (-1i64).to_be_bytes());
    }
}

//! vLLM's named-field KV events (vLLM PR #42892 and later; llm-d-inference-sim's
//! `--use-vllm-map-event-format`), decoded into the same [`KvEvent`] as the positional form.
//!
//! Without `array_like`, msgspec writes a tagged struct as a msgpack map whose `"type"` key
//! holds the class name, followed by the fields by name; `omit_defaults` drops a field that
//! has a default and equals it:
//!
//! ```text
//! {"type": "BlockStored", "block_hashes": [hash…], "parent_block_hash": hash | nil,
//!  "token_ids": [id…], "block_size": int, "lora_id": int | nil, "medium": str | nil,
//!  "lora_name": str | nil, "extra_keys"?, "group_idx"?, "kv_cache_spec_kind"?, …}
//! {"type": "BlockRemoved", "block_hashes": [hash…], "medium": str | nil, "group_idx"?}
//! {"type": "AllBlocksCleared"}
//! ```
//!
//! The four fields the sync needs from `BlockStored` (and `block_hashes` of `BlockRemoved`)
//! are required: vLLM gives them no default, so a map without one is malformed and the error
//! names it. `lora_id`, `medium` and `lora_name` have no default either, but other publishers
//! omit them when nil, so absent reads as nil. Every other key is ignored, so fields a newer
//! vLLM adds do not stop the sync. vLLM's newest source also writes the batch itself as a
//! map (`{"ts", "events", "data_parallel_rank"}`; released 0.2x engines keep it positional),
//! so [`batch_fields`] reads that too. Hashes are read as in the positional form.

use rmpv::Value;

use super::event::{Decoded, KvEvent, MEDIUM_GPU, StoredFields, WireError, hashes_value};
use super::event::{lora_value, parent_value, removed, shape, stored, tokens_value};

/// The key msgspec writes a tagged struct's class name under.
pub const TAG_KEY: &str = "type";

/// `(ts, events, data_parallel_rank)` of a map batch.
pub(super) fn batch_fields(
    entries: &[(Value, Value)],
) -> Result<(&Value, &Value, Option<&Value>), WireError> {
    let ts = get(entries, "ts").ok_or_else(|| shape("batch ts", "present"))?;
    let events = get(entries, "events").ok_or_else(|| shape("batch events", "present"))?;
    Ok((ts, events, get(entries, "data_parallel_rank")))
}

/// One map event; `None` for a `type` this decoder does not know (skipped).
pub(super) fn decode_event(
    index: usize,
    entries: &[(Value, Value)],
) -> Result<Option<Decoded>, WireError> {
    let what = |field: &str| format!("events[{index}].{field}");
    let tag = get(entries, TAG_KEY)
        .and_then(Value::as_str)
        .ok_or_else(|| shape(what(TAG_KEY), "a string tag"))?;
    let required = |name: &str| get(entries, name).ok_or_else(|| shape(what(name), "present"));
    match tag {
        "BlockStored" => stored(
            index,
            StoredFields {
                block_hashes: required("block_hashes")?,
                parent_block_hash: required("parent_block_hash")?,
                token_ids: required("token_ids")?,
                block_size: required("block_size")?,
                lora_name: get(entries, "lora_name"),
            },
        )
        .map(Some),
        "BlockRemoved" => removed(index, required("block_hashes")?).map(Some),
        "AllBlocksCleared" => Ok(Some((KvEvent::AllBlocksCleared, None))),
        _ => Ok(None),
    }
}

/// The value under string key `key` (the first, should a publisher repeat it).
fn get<'a>(entries: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// One event as a map, in the struct's field order. Fields without a default are always
/// written (`lora_id`, `medium`, `lora_name`, nil when unset); of the defaulted ones, what a
/// single-group vLLM 0.2x writes (`extra_keys` one nil per block, `group_idx` 0,
/// `kv_cache_spec_kind` `"full_attention"`).
pub(super) fn encode_event(event: &KvEvent, lora_name: Option<&str>) -> Value {
    let fields = match event {
        KvEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
        } => vec![
            (TAG_KEY, Value::from("BlockStored")),
            ("block_hashes", hashes_value(block_hashes)),
            ("parent_block_hash", parent_value(*parent)),
            ("token_ids", tokens_value(token_ids)),
            ("block_size", Value::from(*block_size as u64)),
            ("lora_id", Value::Nil),
            ("medium", Value::from(MEDIUM_GPU)),
            ("lora_name", lora_value(lora_name)),
            (
                "extra_keys",
                Value::Array(vec![Value::Nil; block_hashes.len()]),
            ),
            ("group_idx", Value::from(0u64)),
            ("kv_cache_spec_kind", Value::from("full_attention")),
        ],
        KvEvent::BlockRemoved { block_hashes } => vec![
            (TAG_KEY, Value::from("BlockRemoved")),
            ("block_hashes", hashes_value(block_hashes)),
            ("medium", Value::from(MEDIUM_GPU)),
            ("group_idx", Value::from(0u64)),
        ],
        KvEvent::AllBlocksCleared => vec![(TAG_KEY, Value::from("AllBlocksCleared"))],
    };
    Value::Map(
        fields
            .into_iter()
            .map(|(key, value)| (Value::from(key), value))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{EventBatch, EventFormat, decode_batch, encode_batch};
    use super::*;

    fn encode(value: Value) -> Vec<u8> {
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &value).unwrap();
        bytes
    }

    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        )
    }

    fn ints(values: &[u64]) -> Value {
        Value::Array(values.iter().map(|v| Value::from(*v)).collect())
    }

    /// A positional batch around `events`.
    fn batch(events: Vec<Value>) -> Vec<u8> {
        encode(Value::Array(vec![
            Value::F64(2.5),
            Value::Array(events),
            Value::from(0u64),
        ]))
    }

    fn decode(events: Vec<Value>) -> EventBatch {
        decode_batch(&batch(events)).unwrap()
    }

    /// vLLM's `BlockStored` as the newest vLLM writes it, every field present.
    fn full_stored(lora_name: Value) -> Value {
        map(vec![
            ("type", Value::from("BlockStored")),
            ("block_hashes", ints(&[u64::MAX, 11])),
            ("parent_block_hash", Value::from(7u64)),
            ("token_ids", ints(&[1, 2, 3, 4])),
            ("block_size", Value::from(2u64)),
            ("lora_id", Value::Nil),
            ("medium", Value::from("GPU")),
            ("lora_name", lora_name),
            ("extra_keys", Value::Array(vec![Value::Nil, Value::Nil])),
            ("group_idx", Value::from(0u64)),
            ("kv_cache_spec_kind", Value::from("full_attention")),
        ])
    }

    fn expected_stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![u64::MAX, 11],
            parent: Some(7),
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
        }
    }

    #[test]
    fn each_event_kind_decodes_with_its_lora_name() {
        let batch = decode(vec![
            full_stored(Value::from("sql-adapter")),
            map(vec![
                ("type", Value::from("BlockRemoved")),
                ("block_hashes", ints(&[11])),
                ("medium", Value::from("GPU")),
                ("group_idx", Value::from(0u64)),
            ]),
            map(vec![("type", Value::from("AllBlocksCleared"))]),
        ]);
        assert_eq!(batch.ts, 2.5);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.skipped, 0);
        assert_eq!(
            batch.events,
            [
                expected_stored(),
                KvEvent::BlockRemoved {
                    block_hashes: vec![11]
                },
                KvEvent::AllBlocksCleared,
            ]
        );
        assert_eq!(batch.lora_names, [Some("sql-adapter".into()), None, None]);
    }

    #[test]
    fn omitted_defaults_and_nil_or_empty_lora_names_are_the_base_model() {
        let bare = map(vec![
            ("type", Value::from("BlockStored")),
            ("block_hashes", ints(&[u64::MAX, 11])),
            ("parent_block_hash", Value::from(7u64)),
            ("token_ids", ints(&[1, 2, 3, 4])),
            ("block_size", Value::from(2u64)),
        ]);
        let batch = decode(vec![
            bare,
            full_stored(Value::Nil),
            full_stored(Value::from("")),
            map(vec![
                ("type", Value::from("BlockRemoved")),
                ("block_hashes", ints(&[5])),
            ]),
        ]);
        assert_eq!(
            batch.events[..3],
            [expected_stored(), expected_stored(), expected_stored()]
        );
        assert_eq!(batch.lora_names, [None, None, None, None]);
    }

    #[test]
    fn unknown_keys_are_ignored_and_unknown_types_skipped() {
        let mut stored = full_stored(Value::Nil);
        if let Value::Map(entries) = &mut stored {
            // A key a future vLLM might add, before the known ones and after.
            entries.insert(1, (Value::from("priority"), Value::from(3u64)));
            entries.push((
                Value::from("future"),
                map(vec![("nested", Value::Array(vec![]))]),
            ));
            // A non-string key is no field of ours either.
            entries.push((Value::from(5u64), Value::Nil));
        }
        let batch = decode(vec![
            map(vec![
                ("type", Value::from("BlockPromoted")),
                ("block_hashes", ints(&[1])),
            ]),
            stored,
        ]);
        assert_eq!(batch.skipped, 1);
        assert_eq!(batch.events, [expected_stored()]);
    }

    #[test]
    fn byte_string_hashes_read_like_the_positional_form() {
        let mut hash = vec![0, 0, 0, 0, 0, 0, 1, 2];
        hash.extend([0xaa; 24]); // a 32-byte sha256: its first 8 bytes count
        let stored = map(vec![
            ("type", Value::from("BlockStored")),
            (
                "block_hashes",
                Value::Array(vec![Value::Binary(hash.clone())]),
            ),
            ("parent_block_hash", Value::Binary(vec![9])),
            ("token_ids", ints(&[1, 2])),
            ("block_size", Value::from(2u64)),
        ]);
        let removed = map(vec![
            ("type", Value::from("BlockRemoved")),
            ("block_hashes", Value::Array(vec![Value::Binary(hash)])),
        ]);
        let batch = decode(vec![stored, removed]);
        assert_eq!(
            batch.events,
            [
                KvEvent::BlockStored {
                    block_hashes: vec![0x0102],
                    parent: Some(9),
                    token_ids: vec![1, 2],
                    block_size: 2,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![0x0102]
                },
            ]
        );
    }

    #[test]
    fn a_batch_may_mix_the_two_forms_and_be_a_map_itself() {
        let positional = Value::Array(vec![
            Value::from("BlockStored"),
            ints(&[u64::MAX, 11]),
            Value::from(7u64),
            ints(&[1, 2, 3, 4]),
            Value::from(2u64),
            Value::Nil,
            Value::from("GPU"),
            Value::from("sql-adapter"),
        ]);
        let events = Value::Array(vec![full_stored(Value::Nil), positional]);
        let payload = encode(map(vec![
            ("ts", Value::F64(4.0)),
            ("events", events),
            ("data_parallel_rank", Value::from(1u64)),
        ]));
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.ts, 4.0);
        assert_eq!(batch.data_parallel_rank, Some(1));
        assert_eq!(batch.events, [expected_stored(), expected_stored()]);
        assert_eq!(batch.lora_names, [None, Some("sql-adapter".into())]);
        // The rank has a default (None) and may be omitted.
        let payload = encode(map(vec![
            ("ts", Value::F64(4.0)),
            ("events", Value::Array(vec![])),
        ]));
        assert_eq!(decode_batch(&payload).unwrap().data_parallel_rank, None);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Written by msgspec 0.22 itself, from structs declared as vLLM's are (tagged events
    /// without `array_like`, `omit_defaults`): a positional batch as released vLLMs send,
    /// every `BlockStored` field present and a LoRA name.
    const MSGSPEC_ARRAY_BATCH: &str = "\
         93cb4004000000000000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf\
         ffffffffffffffff0bb1706172656e745f626c6f636b5f6861736807a9746f6b656e5f6964739401020304aa\
         626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65ab7371\
         6c2d61646170746572aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f\
         737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac\
         626c6f636b5f686173686573910ba66d656469756da3475055a967726f75705f6964780081a474797065b041\
         6c6c426c6f636b73436c656172656400";

    /// The same, the batch itself a map (vLLM's newest source), defaults omitted, a nil
    /// `medium`, and 32-byte hashes (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`).
    const MSGSPEC_MAP_BATCH: &str = "\
         83a27473cb4010000000000000a66576656e74739288a474797065ab426c6f636b53746f726564ac626c6f63\
         6b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fb1\
         706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647392090aaa626c6f636b5f73697a6502a7\
         6c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b5265\
         6d6f766564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d0e0f10111213141516\
         1718191a1b1c1d1e1fa66d656469756dc0b2646174615f706172616c6c656c5f72616e6b00";

    #[test]
    fn payloads_msgspec_wrote_decode() {
        let batch = decode_batch(&hex(MSGSPEC_ARRAY_BATCH)).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank), (2.5, Some(0)));
        assert_eq!(
            batch.events,
            [
                expected_stored(),
                KvEvent::BlockRemoved {
                    block_hashes: vec![11]
                },
                KvEvent::AllBlocksCleared,
            ]
        );
        assert_eq!(batch.lora_names, [Some("sql-adapter".into()), None, None]);
        let batch = decode_batch(&hex(MSGSPEC_MAP_BATCH)).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank), (4.0, Some(0)));
        assert_eq!(
            batch.events,
            [
                KvEvent::BlockStored {
                    block_hashes: vec![0x0001_0203_0405_0607],
                    parent: None,
                    token_ids: vec![9, 10],
                    block_size: 2,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![0x0001_0203_0405_0607]
                },
            ]
        );
        assert_eq!(batch.lora_names, [None, None]);
        assert_eq!(batch.skipped, 0);
    }

    #[test]
    fn a_missing_field_or_a_wrong_type_names_the_field() {
        let without = |field: &str| {
            let Value::Map(entries) = full_stored(Value::Nil) else {
                unreachable!()
            };
            Value::Map(
                entries
                    .into_iter()
                    .filter(|(k, _)| k.as_str() != Some(field))
                    .collect(),
            )
        };
        let with = |field: &str, value: Value| {
            let Value::Map(mut entries) = full_stored(Value::Nil) else {
                unreachable!()
            };
            for entry in &mut entries {
                if entry.0.as_str() == Some(field) {
                    entry.1 = value.clone();
                }
            }
            Value::Map(entries)
        };
        let cases: Vec<(Value, &str, &str)> = vec![
            (without("type"), "events[0].type", "a string tag"),
            (
                with("type", Value::from(1u64)),
                "events[0].type",
                "a string tag",
            ),
            (without("block_hashes"), "events[0].block_hashes", "present"),
            (
                without("parent_block_hash"),
                "events[0].parent_block_hash",
                "present",
            ),
            (without("token_ids"), "events[0].token_ids", "present"),
            (without("block_size"), "events[0].block_size", "present"),
            (
                with("block_hashes", Value::from("h")),
                "events[0].block_hashes",
                "an array of hashes",
            ),
            (
                with("parent_block_hash", Value::from(1.5)),
                "events[0].parent_block_hash",
                "hashes",
            ),
            (
                with("token_ids", Value::from(3u64)),
                "events[0].token_ids",
                "an array",
            ),
            (
                with("block_size", Value::from("16")),
                "events[0].block_size",
                "> 0",
            ),
            (
                with("block_size", Value::from(3u64)),
                "events[0].token_ids",
                "full blocks",
            ),
            (
                with("lora_name", Value::from(4u64)),
                "events[0].lora_name",
                "a string or nil",
            ),
            (
                map(vec![("type", Value::from("BlockRemoved"))]),
                "events[0].block_hashes",
                "present",
            ),
        ];
        for (event, what, expected) in cases {
            let error = decode_batch(&batch(vec![event])).unwrap_err();
            assert_eq!(error.kind(), "shape");
            let text = error.to_string();
            assert!(
                text.contains(what) && text.contains(expected),
                "{text:?} should name {what:?} and say {expected:?}"
            );
        }
        let no_ts = encode(map(vec![("events", Value::Array(vec![]))]));
        assert!(
            decode_batch(&no_ts)
                .unwrap_err()
                .to_string()
                .contains("batch ts")
        );
        let no_events = encode(map(vec![("ts", Value::F64(0.0))]));
        let error = decode_batch(&no_events).unwrap_err().to_string();
        assert!(error.contains("batch events"), "{error}");
    }

    #[test]
    fn map_events_are_vllms_named_fields_in_field_order() {
        let stored = KvEvent::BlockStored {
            block_hashes: vec![u64::MAX - 1, 7],
            parent: None,
            token_ids: vec![1, 2, 300, 70_000],
            block_size: 2,
        };
        let events = vec![
            stored,
            KvEvent::BlockRemoved {
                block_hashes: vec![7],
            },
            KvEvent::AllBlocksCleared,
        ];
        let payload = EventBatch {
            ts: 2.0,
            lora_names: vec![None; events.len()],
            events,
            data_parallel_rank: Some(0),
            skipped: 0,
        };
        let bytes = encode_batch(&payload, EventFormat::Map);
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
            get(event.as_map().unwrap(), name).unwrap().clone()
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

    /// msgspec 0.22's encoding of three events, from structs declared as vLLM's are (tagged
    /// events without `array_like`, `omit_defaults`) in an `array_like` batch, base model.
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
        let mut written = decode_batch(&hex(MSGSPEC_ARRAY_BATCH)).unwrap();
        assert_eq!(written.events.len(), 3);
        // The same batch written by msgspec for the base model.
        written.lora_names = vec![None; 3];
        assert_eq!(
            encode_batch(&written, EventFormat::Map),
            hex(MSGSPEC_MAP_EVENTS)
        );
        // With the adapter's name, what msgspec wrote for it.
        written.lora_names[0] = Some("sql-adapter".into());
        assert_eq!(
            encode_batch(&written, EventFormat::Map),
            hex(MSGSPEC_ARRAY_BATCH)
        );
    }
}

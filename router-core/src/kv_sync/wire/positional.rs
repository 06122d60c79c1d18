//! The positional form: vLLM 0.9–0.11 writes events with `msgspec` `array_like` structs, so an
//! event is a tagged array whose fields sit at fixed places (see [`super`]).

use rmpv::Value;

use super::event::{Decoded, KvEvent, MEDIUM_GPU, StoredFields, WireError, hashes_value};
use super::event::{lora_value, parent_value, removed, shape, stored, tokens_value};

/// One positional event; `None` for one this decoder does not know (skipped).
pub(super) fn decode_event(index: usize, fields: &[Value]) -> Result<Option<Decoded>, WireError> {
    let what = |field: &str| format!("events[{index}].{field}");
    let tag = fields
        .first()
        .and_then(Value::as_str)
        .ok_or_else(|| shape(what("tag"), "a string"))?;
    let field = |i: usize, name: &str| fields.get(i).ok_or_else(|| shape(what(name), "present"));
    match tag {
        "BlockStored" => stored(
            index,
            StoredFields {
                block_hashes: field(1, "block_hashes")?,
                parent_block_hash: field(2, "parent_block_hash")?,
                token_ids: field(3, "token_ids")?,
                block_size: field(4, "block_size")?,
                // [5] lora_id (deprecated for lora_name), [6] medium.
                lora_name: fields.get(7),
            },
        )
        .map(Some),
        "BlockRemoved" => removed(index, field(1, "block_hashes")?).map(Some),
        "AllBlocksCleared" => Ok(Some((KvEvent::AllBlocksCleared, None))),
        _ => Ok(None),
    }
}

/// One event as a tagged array. A `BlockStored` has vLLM 0.9–0.10's seven fields (`lora_id`
/// nil, `medium` `"GPU"`), and 0.11's `lora_name` as an eighth only when it names an adapter.
pub(super) fn encode_event(event: &KvEvent, lora_name: Option<&str>) -> Value {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
        } => {
            let mut fields = vec![
                Value::from("BlockStored"),
                hashes_value(block_hashes),
                parent_value(*parent),
                tokens_value(token_ids),
                Value::from(*block_size as u64),
                Value::Nil, // lora_id: deprecated for lora_name
                Value::from(MEDIUM_GPU),
            ];
            if lora_name.is_some() {
                fields.push(lora_value(lora_name));
            }
            Value::Array(fields)
        }
        KvEvent::BlockRemoved { block_hashes } => Value::Array(vec![
            Value::from("BlockRemoved"),
            hashes_value(block_hashes),
            Value::from(MEDIUM_GPU),
        ]),
        KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
    }
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

    fn stored(hashes: Vec<Value>, parent: Value, tokens: &[u64], block_size: u64) -> Value {
        Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(hashes),
            parent,
            Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
            Value::from(block_size),
            Value::Nil,
            Value::from("GPU"),
        ])
    }

    #[test]
    fn decodes_the_three_events_with_int_and_byte_hashes() {
        let payload = encode(Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                stored(
                    vec![Value::from(u64::MAX), Value::from(7u64)],
                    Value::Nil,
                    &[1, 2, 3, 4],
                    2,
                ),
                stored(
                    vec![Value::Binary(vec![0, 0, 0, 0, 0, 0, 1, 2, 0xff, 0xff])],
                    Value::from(7u64),
                    &[5, 6],
                    2,
                ),
                Value::Array(vec![
                    Value::from("BlockRemoved"),
                    Value::Array(vec![Value::from(-1i64)]),
                    Value::from("GPU"),
                ]),
                Value::Array(vec![Value::from("AllBlocksCleared")]),
            ]),
            Value::from(0u64),
        ]));
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.ts, 1.5);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.skipped, 0);
        assert_eq!(
            batch.events,
            [
                KvEvent::BlockStored {
                    block_hashes: vec![u64::MAX, 7],
                    parent: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                },
                KvEvent::BlockStored {
                    block_hashes: vec![0x0102],
                    parent: Some(7),
                    token_ids: vec![5, 6],
                    block_size: 2,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![u64::MAX]
                },
                KvEvent::AllBlocksCleared,
            ]
        );
    }

    #[test]
    fn unknown_tags_are_skipped_and_counted() {
        let payload = encode(Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![
                Value::Array(vec![Value::from("SomethingNew"), Value::from(1u64)]),
                Value::Map(vec![(Value::from("type"), Value::from("SomethingElse"))]),
                Value::Array(vec![Value::from("AllBlocksCleared")]),
            ]),
        ]));
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.skipped, 2);
        assert_eq!(batch.events, [KvEvent::AllBlocksCleared]);
        assert_eq!(batch.lora_names, [None]);
        assert_eq!(batch.data_parallel_rank, None);
    }

    #[test]
    fn a_positional_lora_name_is_carried_and_a_wrong_one_named() {
        let mut event = stored(vec![Value::from(1u64)], Value::Nil, &[1, 2], 2);
        if let Value::Array(fields) = &mut event {
            fields.push(Value::from("sql-adapter"));
            // extra_keys, group_idx: ignored.
            fields.push(Value::Array(vec![Value::Nil]));
            fields.push(Value::from(0u64));
        }
        let payload = encode(Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![event.clone()]),
        ]));
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(batch.lora_names, [Some("sql-adapter".to_owned())]);
        let (read, lora) = batch.events_with_lora().next().unwrap();
        assert!(matches!(read, KvEvent::BlockStored { .. }));
        assert_eq!(lora, Some("sql-adapter"));
        if let Value::Array(fields) = &mut event {
            fields[7] = Value::from(3u64);
        }
        let payload = encode(Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![event]),
        ]));
        let error = decode_batch(&payload).unwrap_err().to_string();
        assert!(error.contains("events[0].lora_name"), "{error}");
    }

    #[test]
    fn malformed_payloads_name_the_problem() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0x92], "not msgpack"),
            ([encode(Value::Array(vec![])), vec![0]].concat(), "trailing"),
            (encode(Value::from(3u64)), "batch"),
            (encode(Value::Array(vec![Value::F64(0.0)])), "2 or 3"),
            (
                encode(Value::Array(vec![Value::from("x"), Value::Array(vec![])])),
                "batch ts",
            ),
            (
                encode(Value::Array(vec![Value::F64(0.0), Value::from(1u64)])),
                "batch events",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![Value::Array(vec![Value::from(1u64)])]),
                ])),
                "events[0].tag",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![stored(vec![Value::from(1u64)], Value::Nil, &[1], 2)]),
                ])),
                "events[0].token_ids",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![stored(
                        vec![Value::from(1u64)],
                        Value::Nil,
                        &[1 << 40, 2],
                        2,
                    )]),
                ])),
                "0..2^32",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![stored(vec![Value::from("h")], Value::Nil, &[1, 2], 2)]),
                ])),
                "events[0].block_hashes",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![stored(vec![Value::from(1u64)], Value::Nil, &[], 0)]),
                ])),
                "events[0].block_size",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![Value::Array(vec![Value::from("BlockRemoved")])]),
                ])),
                "events[0].block_hashes",
            ),
            (
                encode(Value::Array(vec![
                    Value::F64(0.0),
                    Value::Array(vec![]),
                    Value::from("r"),
                ])),
                "data_parallel_rank",
            ),
        ];
        for (payload, needle) in cases {
            let error = decode_batch(&payload).unwrap_err().to_string();
            assert!(error.contains(needle), "{error:?} should name {needle:?}");
        }
    }

    /// A positional batch of `events`, base model, rank `rank`.
    fn batch_of(ts: f64, events: Vec<KvEvent>, rank: i64) -> EventBatch {
        EventBatch {
            ts,
            lora_names: vec![None; events.len()],
            events,
            data_parallel_rank: Some(rank),
            skipped: 0,
        }
    }

    #[test]
    fn the_payload_is_vllms_positional_msgpack_byte_for_byte() {
        let events = vec![
            KvEvent::BlockRemoved {
                block_hashes: vec![5],
            },
            KvEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(&batch_of(1.5, events, 0), EventFormat::Positional);
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
        let event = KvEvent::BlockStored {
            block_hashes: vec![u64::MAX - 1, 7],
            parent: None,
            token_ids: vec![1, 2, 300, 70_000],
            block_size: 2,
        };
        let bytes = encode_batch(&batch_of(0.0, vec![event], 0), EventFormat::Positional);
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
}

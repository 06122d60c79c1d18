//! Decoding vLLM's KV-cache event batches (the msgpack payload frame), in both of the forms
//! vLLM has written.
//!
//! vLLM 0.9–0.11 writes the payload with `msgspec` `array_like` structs, so everything is
//! positional:
//!
//! ```text
//! batch:   [ts: float, events: [event…], data_parallel_rank: int]      (rank optional)
//! events:  ["BlockStored", [hash…], parent_hash | nil, [token_id…], block_size, lora_id?, medium?, lora_name?, …]
//!          ["BlockRemoved", [hash…], medium?, …]
//!          ["AllBlocksCleared", …]
//! ```
//!
//! Newer vLLMs drop `array_like`, so an event is a msgpack **map** with a `"type"` tag and
//! named fields (and the newest source drops it on the batch too); [`super::wire_map`]
//! decodes those. Both forms may appear in one batch, and each event decodes to the same
//! [`KvEvent`].
//!
//! Hashes are msgpack integers (vLLM's default int form, up to 2^64 − 1) or byte strings
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: raw sha256), which are read as their **first 8
//! bytes big-endian**, as AIBrix does. Engine hashes are only ever compared with each other
//! (stored, parent, removed), so any fixed reading works as long as it is the same for all.
//! Fields past the ones listed are ignored (newer vLLMs append them). An event with an unknown
//! tag is skipped and counted, not an error: a newer engine must not stop the sync. Anything
//! else malformed is a [`WireError`] that names the field. This module knows nothing of
//! sockets: the gateway hands it the payload frame.

use rmpv::Value;

use super::wire_map;

/// One KV-cache event, as the sync needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// The engine cached `block_hashes.len()` new full blocks, chained after `parent`.
    BlockStored {
        block_hashes: Vec<u64>,
        /// The block before the first new one; `None` for a prompt's first block.
        parent: Option<u64>,
        /// The new blocks' tokens, `block_size` per block.
        token_ids: Vec<u32>,
        /// Tokens per engine block.
        block_size: usize,
    },
    /// The engine evicted these blocks.
    BlockRemoved { block_hashes: Vec<u64> },
    /// The engine dropped its whole prefix cache.
    AllBlocksCleared,
}

/// A decoded payload frame.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// The engine's wall-clock time of the step, in seconds.
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// One per entry of `events`: the LoRA adapter a `BlockStored` was cached for (vLLM's
    /// `lora_name`, whose blocks the engine hashes apart from the base model's); `None` for
    /// the base model and for the other events. See [`super::index_models`].
    pub lora_names: Vec<Option<String>>,
    /// `None` for a 2-element batch, or a map batch without the field.
    pub data_parallel_rank: Option<i64>,
    /// Events skipped because their tag is not one of the three above.
    pub skipped: usize,
}

impl EventBatch {
    /// Each event with its LoRA adapter name.
    pub fn events_with_lora(&self) -> impl Iterator<Item = (&KvEvent, Option<&str>)> {
        self.events
            .iter()
            .zip(self.lora_names.iter().map(Option::as_deref))
    }
}

/// Why a payload is not a KV-event batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("KV-event payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("KV-event payload has {0} trailing bytes after the batch")]
    Trailing(usize),
    #[error("KV-event payload: {what}: expected {expected}")]
    Shape {
        what: String,
        expected: &'static str,
    },
}

impl WireError {
    /// A short label for the error counter (`decode`, `shape`).
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Msgpack(_) | WireError::Trailing(_) => "decode",
            WireError::Shape { .. } => "shape",
        }
    }
}

pub(super) fn shape(what: impl Into<String>, expected: &'static str) -> WireError {
    WireError::Shape {
        what: what.into(),
        expected,
    }
}

/// An event as decoded, with the LoRA adapter of a `BlockStored`.
pub(super) type Decoded = (KvEvent, Option<String>);

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
        Value::Map(entries) => wire_map::batch_fields(entries)?,
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
            Value::Array(fields) => decode_positional(i, fields)?,
            Value::Map(entries) => wire_map::decode_event(i, entries)?,
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

/// One positional event; `None` for one this decoder does not know (skipped).
fn decode_positional(index: usize, fields: &[Value]) -> Result<Option<Decoded>, WireError> {
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

/// The fields of a `BlockStored` the sync reads, wherever they sit on the wire.
pub(super) struct StoredFields<'a> {
    pub block_hashes: &'a Value,
    pub parent_block_hash: &'a Value,
    pub token_ids: &'a Value,
    pub block_size: &'a Value,
    /// Absent (older vLLMs) reads as nil.
    pub lora_name: Option<&'a Value>,
}

pub(super) fn stored(index: usize, fields: StoredFields<'_>) -> Result<Decoded, WireError> {
    let what = |field: &str| format!("events[{index}].{field}");
    let block_hashes = decode_hashes(fields.block_hashes, &what("block_hashes"))?;
    let parent = match fields.parent_block_hash {
        Value::Nil => None,
        parent => Some(decode_hash(parent, &what("parent_block_hash"))?),
    };
    let Value::Array(tokens) = fields.token_ids else {
        return Err(shape(what("token_ids"), "an array"));
    };
    let token_ids = tokens
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| shape(what("token_ids"), "integers in 0..2^32"))?;
    let block_size = fields
        .block_size
        .as_u64()
        .and_then(|b| usize::try_from(b).ok())
        .filter(|b| *b > 0)
        .ok_or_else(|| shape(what("block_size"), "an integer > 0"))?;
    if Some(token_ids.len()) != block_hashes.len().checked_mul(block_size) {
        return Err(shape(
            what("token_ids"),
            "block_size ids per block hash (full blocks only)",
        ));
    }
    let lora_name = match fields.lora_name {
        None | Some(Value::Nil) => None,
        // An empty name is no adapter (what vLLM's falsy check would make of it).
        Some(name) => Some(
            name.as_str()
                .ok_or_else(|| shape(what("lora_name"), "a string or nil"))?
                .to_owned(),
        )
        .filter(|name| !name.is_empty()),
    };
    Ok((
        KvEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
        },
        lora_name,
    ))
}

pub(super) fn removed(index: usize, block_hashes: &Value) -> Result<Decoded, WireError> {
    let what = format!("events[{index}].block_hashes");
    let block_hashes = decode_hashes(block_hashes, &what)?;
    Ok((KvEvent::BlockRemoved { block_hashes }, None))
}

fn decode_hashes(value: &Value, what: &str) -> Result<Vec<u64>, WireError> {
    let Value::Array(items) = value else {
        return Err(shape(what, "an array of hashes"));
    };
    items.iter().map(|item| decode_hash(item, what)).collect()
}

/// An int hash as its 64 bits (a negative int as its two's complement, as Go's int64 cast
/// would read it); a byte-string hash as its first 8 bytes big-endian (shorter strings
/// left-padded with zeros).
fn decode_hash(value: &Value, what: &str) -> Result<u64, WireError> {
    if let Some(hash) = value.as_u64() {
        return Ok(hash);
    }
    if let Some(hash) = value.as_i64() {
        return Ok(hash as u64);
    }
    match value {
        Value::Binary(bytes) if !bytes.is_empty() => {
            let head = &bytes[..bytes.len().min(8)];
            Ok(head.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        _ => Err(shape(what, "integer or non-empty byte-string hashes")),
    }
}

#[cfg(test)]
mod tests {
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
}

//! The events vLLM publishes about its prefix cache, and the field-level reading and writing
//! both wire forms share (hashes, token ids, a `BlockStored`'s fields wherever they sit).
//! A leaf: [`super::positional`] and [`super::map`] place these fields on the wire.

use rmpv::Value;

/// The storage medium vLLM names for GPU blocks (what the encoder writes).
pub const MEDIUM_GPU: &str = "GPU";

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
pub type Decoded = (KvEvent, Option<String>);

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

/// A list of hashes as msgpack unsigned integers (vLLM's default int form; values ≥ 2^63
/// are uint64).
pub(super) fn hashes_value(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|h| Value::from(*h)).collect())
}

/// A parent hash, or nil for a prompt's first block.
pub(super) fn parent_value(parent: Option<u64>) -> Value {
    parent.map_or(Value::Nil, Value::from)
}

/// Token ids as msgpack integers (smallest encoding each, as msgspec writes them).
pub(super) fn tokens_value(token_ids: &[u32]) -> Value {
    Value::Array(token_ids.iter().map(|t| Value::from(*t)).collect())
}

/// A LoRA adapter's name, or nil for the base model.
pub(super) fn lora_value(lora_name: Option<&str>) -> Value {
    lora_name.map_or(Value::Nil, Value::from)
}

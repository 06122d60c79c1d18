//! From the wire to the index: a map-form batch leaves the index exactly as its positional
//! twin does, and a LoRA adapter's blocks are indexed under the adapter's name only.

use rmpv::Value;

use super::*;
use crate::hash::block_hashes;
use crate::index::PrefixIndex;

const BASE: &str = "m";
const ADAPTER: &str = "sql-adapter";
const ENGINE_TOKENS: u64 = 16;

fn settings() -> SyncSettings {
    SyncSettings {
        router_block_bytes: 128,
        seed: 3,
        max_engine_blocks: DEFAULT_MAX_ENGINE_BLOCKS,
    }
}

fn served() -> Vec<String> {
    vec![BASE.to_owned(), ADAPTER.to_owned()]
}

/// `blocks` engine blocks of tokens `first..`.
fn tokens(first: u64, blocks: u64) -> Vec<u64> {
    (first..first + blocks * ENGINE_TOKENS).collect()
}

fn ints(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|v| Value::from(*v)).collect())
}

fn encode(value: Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &value).unwrap();
    bytes
}

/// One engine event, written in either form, with the fields vLLM 0.2x sends.
enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u64>,
        lora: Option<&'static str>,
    },
    Removed(Vec<u64>),
    Cleared,
}

impl Event {
    fn positional(&self) -> Value {
        match self {
            Event::Stored {
                hashes,
                parent,
                tokens,
                lora,
            } => Value::Array(vec![
                Value::from("BlockStored"),
                ints(hashes),
                parent.map_or(Value::Nil, Value::from),
                ints(tokens),
                Value::from(ENGINE_TOKENS),
                Value::Nil,
                Value::from("GPU"),
                lora.map_or(Value::Nil, Value::from),
            ]),
            Event::Removed(hashes) => Value::Array(vec![
                Value::from("BlockRemoved"),
                ints(hashes),
                Value::from("GPU"),
            ]),
            Event::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        }
    }

    fn map(&self) -> Value {
        let pairs: Vec<(&str, Value)> = match self {
            Event::Stored {
                hashes,
                parent,
                tokens,
                lora,
            } => vec![
                ("type", Value::from("BlockStored")),
                ("block_hashes", ints(hashes)),
                ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
                ("token_ids", ints(tokens)),
                ("block_size", Value::from(ENGINE_TOKENS)),
                ("lora_id", Value::Nil),
                ("medium", Value::from("GPU")),
                ("lora_name", lora.map_or(Value::Nil, Value::from)),
                ("extra_keys", Value::Array(vec![Value::Nil; hashes.len()])),
                ("group_idx", Value::from(0u64)),
                ("kv_cache_spec_kind", Value::from("full_attention")),
            ],
            Event::Removed(hashes) => vec![
                ("type", Value::from("BlockRemoved")),
                ("block_hashes", ints(hashes)),
                ("medium", Value::from("GPU")),
            ],
            Event::Cleared => vec![("type", Value::from("AllBlocksCleared"))],
        };
        Value::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect(),
        )
    }
}

fn payload(events: &[Event], form: fn(&Event) -> Value) -> Vec<u8> {
    encode(Value::Array(vec![
        Value::F64(1.0),
        Value::Array(events.iter().map(form).collect()),
        Value::from(0u64),
    ]))
}

/// Decodes `payload` and applies it for pod "a" the way the gateway's subscriber does.
fn apply(payload: &[u8], sync: &mut PodSync, index: &PrefixIndex) {
    let batch = decode_batch(payload).unwrap();
    assert_eq!(batch.skipped, 0);
    let served = served();
    for (event, lora) in batch.events_with_lora() {
        let models = index_models(lora, &served);
        sync.apply(event, "a", &models, index, &settings(), 0)
            .unwrap();
    }
}

/// The router hashes of a prompt of these token ids.
fn request(ids: &[u64]) -> Vec<u64> {
    let ids: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
    block_hashes(&token_bytes(&ids), 128, settings().seed)
}

/// Match % of pod "a" for every prefix length of each prompt, under each model.
fn state(index: &PrefixIndex, prompts: &[Vec<u64>]) -> Vec<u8> {
    let mut seen = vec![index.len() as u8];
    for model in [BASE, ADAPTER] {
        for prompt in prompts {
            let hashes = request(prompt);
            for end in 1..=hashes.len() {
                seen.extend(index.match_names(model, &hashes[..end], &["a"]));
            }
        }
    }
    seen
}

#[test]
fn a_map_batch_leaves_the_index_as_its_positional_twin() {
    let base = tokens(100, 6);
    let lora = tokens(5_000, 4);
    let batches = [
        vec![
            Event::Stored {
                hashes: vec![1, 2, 3],
                parent: None,
                tokens: base[..48].to_vec(),
                lora: None,
            },
            Event::Stored {
                hashes: vec![4, 5, 6],
                parent: Some(3),
                tokens: base[48..].to_vec(),
                lora: None,
            },
            Event::Stored {
                hashes: vec![21, 22, 23, 24],
                parent: None,
                tokens: lora.clone(),
                lora: Some(ADAPTER),
            },
        ],
        vec![Event::Removed(vec![3, 24])],
        vec![Event::Cleared],
    ];
    let prompts = [base, lora];
    let (positional, map) = (
        PrefixIndex::new(1_000, 60_000),
        PrefixIndex::new(1_000, 60_000),
    );
    let (mut p_sync, mut m_sync) = (PodSync::new(), PodSync::new());
    let mut states = Vec::new();
    for events in &batches {
        let (p_payload, m_payload) = (
            payload(events, Event::positional),
            payload(events, Event::map),
        );
        assert_ne!(p_payload, m_payload);
        assert_eq!(
            decode_batch(&p_payload).unwrap(),
            decode_batch(&m_payload).unwrap()
        );
        apply(&p_payload, &mut p_sync, &positional);
        apply(&m_payload, &mut m_sync, &map);
        let from_map = state(&map, &prompts);
        assert_eq!(from_map, state(&positional, &prompts));
        assert_eq!(p_sync.len(), m_sync.len());
        states.push(from_map);
    }
    // The states compared are not trivially equal: stored, then cut, then empty.
    assert_eq!(states[0][0], 3 + 2, "3 base blocks, 2 adapter blocks");
    assert_eq!(
        states[1][0],
        2 + 1,
        "the router block of each removed engine block went"
    );
    assert_eq!(states[2][0], 0);
}

#[test]
fn an_adapters_blocks_match_only_requests_for_the_adapter() {
    let index = PrefixIndex::new(1_000, 60_000);
    let mut sync = PodSync::new();
    let ids = tokens(7, 4);
    let stored = |hashes: Vec<u64>, lora| Event::Stored {
        hashes,
        parent: None,
        tokens: ids.clone(),
        lora,
    };
    apply(
        &payload(&[stored(vec![1, 2, 3, 4], Some(ADAPTER))], Event::map),
        &mut sync,
        &index,
    );
    let hashes = request(&ids);
    assert_eq!(index.match_names(ADAPTER, &hashes, &["a"]), [100]);
    assert_eq!(
        index.match_names(BASE, &hashes, &["a"]),
        [0],
        "the engine hashed them with the adapter: a base request would not hit them"
    );
    // The same tokens for the base model (other engine hashes) match under every name.
    apply(
        &payload(&[stored(vec![11, 12, 13, 14], None)], Event::positional),
        &mut sync,
        &index,
    );
    assert_eq!(index.match_names(BASE, &hashes, &["a"]), [100]);
    assert_eq!(index.match_names(ADAPTER, &hashes, &["a"]), [100]);
    assert_eq!(index_models(None, &served()).as_ref(), served().as_slice());
    assert_eq!(
        index_models(Some("x"), &served()).as_ref(),
        ["x".to_owned()]
    );
}

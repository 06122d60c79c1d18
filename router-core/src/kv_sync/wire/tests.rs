//! The two forms against each other: whatever is encoded decodes back to the same batch.

use proptest::prelude::*;

use super::*;

/// One event of each kind, a chained store among them.
fn every_kind() -> Vec<KvEvent> {
    vec![
        KvEvent::BlockStored {
            block_hashes: vec![u64::MAX - 1, 7],
            parent: None,
            token_ids: vec![1, 2, 300, 70_000],
            block_size: 2,
        },
        KvEvent::BlockStored {
            block_hashes: vec![9],
            parent: Some(7),
            token_ids: vec![4, 5],
            block_size: 2,
        },
        KvEvent::BlockRemoved {
            block_hashes: vec![u64::MAX],
        },
        KvEvent::AllBlocksCleared,
    ]
}

fn batch(events: Vec<KvEvent>, lora_names: Vec<Option<String>>, rank: Option<i64>) -> EventBatch {
    EventBatch {
        ts: 12.25,
        events,
        lora_names,
        data_parallel_rank: rank,
        skipped: 0,
    }
}

#[test]
fn both_forms_decode_back_to_the_batch_encoded() {
    let mut lora_names = vec![None; 4];
    lora_names[1] = Some("sql-adapter".to_owned());
    for rank in [None, Some(0), Some(3)] {
        let written = batch(every_kind(), lora_names.clone(), rank);
        let positional = encode_batch(&written, EventFormat::Positional);
        let map = encode_batch(&written, EventFormat::Map);
        assert_ne!(positional, map);
        assert_eq!(decode_batch(&positional).unwrap(), written);
        assert_eq!(decode_batch(&map).unwrap(), written);
    }
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
fn seq_frames_are_big_endian_and_the_replay_ends_at_minus_one() {
    assert_eq!(seq_frame(1), [0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(read_seq(&seq_frame(0x0102)), Some(0x0102));
    assert_eq!(read_seq(&[1, 2, 3]), None);
    assert_eq!(seq_frame(END_OF_REPLAY), (-1i64).to_be_bytes());
}

fn event() -> impl Strategy<Value = KvEvent> {
    let hashes = proptest::collection::vec(any::<u64>(), 1..4);
    prop_oneof![
        (hashes.clone(), any::<Option<u64>>(), 1usize..4).prop_flat_map(
            |(block_hashes, parent, block_size)| {
                let n = block_hashes.len() * block_size;
                proptest::collection::vec(any::<u32>(), n).prop_map(move |token_ids| {
                    KvEvent::BlockStored {
                        block_hashes: block_hashes.clone(),
                        parent,
                        token_ids,
                        block_size,
                    }
                })
            }
        ),
        hashes.prop_map(|block_hashes| KvEvent::BlockRemoved { block_hashes }),
        Just(KvEvent::AllBlocksCleared),
    ]
}

proptest! {
    /// Any batch survives a round trip through either form (LoRA names only on stores, as
    /// vLLM writes them).
    #[test]
    fn any_batch_round_trips(
        events in proptest::collection::vec(event(), 0..6),
        adapter in proptest::option::of("[a-z]{1,8}"),
        rank in proptest::option::of(0i64..64),
        map in any::<bool>(),
    ) {
        let lora_names = events
            .iter()
            .map(|e| matches!(e, KvEvent::BlockStored { .. }).then(|| adapter.clone()).flatten())
            .collect();
        let written = batch(events, lora_names, rank);
        let format = if map { EventFormat::Map } else { EventFormat::Positional };
        prop_assert_eq!(decode_batch(&encode_batch(&written, format)).unwrap(), written);
    }
}

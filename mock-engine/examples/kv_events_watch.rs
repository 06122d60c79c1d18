//! Watches a vLLM (or mock-engine) KV-event publisher and prints each batch decoded: a
//! manual check of the wire format, and a starting point for a subscriber.
//!
//! ```text
//! mock-engine --profile fast --kv-events-config \
//!   '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}' &
//! cargo run -p mock-engine --example kv_events_watch -- --endpoint tcp://127.0.0.1:5557
//! cargo run -p mock-engine --example kv_events_watch -- --replay tcp://127.0.0.1:5558 --from 0
//! ```
//!
//! With `--endpoint` it subscribes to every topic and prints live batches (until `--count`
//! messages or Ctrl-C); with `--replay` it asks the replay socket for every batch from
//! `--from` and prints them until the end marker.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use router_core::kv_sync::wire::{END_OF_REPLAY, read_seq};
use router_core::kv_sync::{KvEvent, decode_batch};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

#[derive(Debug, Parser)]
struct Args {
    /// The PUB endpoint to subscribe to, e.g. tcp://127.0.0.1:5557.
    #[arg(long, required_unless_present = "replay")]
    endpoint: Option<String>,
    /// The replay (ROUTER) endpoint to ask instead, e.g. tcp://127.0.0.1:5558.
    #[arg(long, conflicts_with = "endpoint")]
    replay: Option<String>,
    /// First seq to replay.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Stop after this many messages.
    #[arg(long, default_value_t = u64::MAX)]
    count: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(replay) = &args.replay {
        let mut dealer = DealerSocket::new();
        dealer.connect(replay).await.context("connecting")?;
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&args.from.to_be_bytes()),
        ])
        .map_err(|_| anyhow::anyhow!("building the replay request"))?;
        dealer
            .send(request)
            .await
            .context("sending the replay request")?;
        for _ in 0..args.count {
            let reply = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
                .await
                .context("no replay answer within 10 s")??
                .into_vec();
            let [_, seq, payload] = reply.as_slice() else {
                bail!("replay reply with {} frames, expected 3", reply.len());
            };
            if read_seq(seq) == Some(END_OF_REPLAY) {
                println!("end of replay");
                return Ok(());
            }
            print_batch("replay", seq, payload)?;
        }
        return Ok(());
    }
    let endpoint = args.endpoint.context("--endpoint or --replay")?;
    let mut sub = SubSocket::new();
    sub.connect(&endpoint).await.context("connecting")?;
    sub.subscribe("").await.context("subscribing")?;
    for _ in 0..args.count {
        let frames = sub.recv().await.context("receiving")?.into_vec();
        let [topic, seq, payload] = frames.as_slice() else {
            bail!("message with {} frames, expected 3", frames.len());
        };
        print_batch(&String::from_utf8_lossy(topic), seq, payload)?;
    }
    Ok(())
}

fn print_batch(topic: &str, seq: &[u8], payload: &[u8]) -> Result<()> {
    let seq = u64::from_be_bytes(seq.try_into().context("seq frame is not 8 bytes")?);
    let decoded = decode_batch(payload)?;
    println!(
        "seq={seq} topic={topic:?} ts={:.6} dp_rank={:?}",
        decoded.ts, decoded.data_parallel_rank
    );
    for event in &decoded.events {
        match event {
            KvEvent::BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
            } => {
                let hashes: Vec<String> =
                    block_hashes.iter().map(|h| format!("{h:#018x}")).collect();
                println!(
                    "  BlockStored blocks={} hashes=[{}] parent={} block_size={block_size} token_ids[..8]={:?} ({} ids)",
                    block_hashes.len(),
                    hashes.join(","),
                    parent.map_or("nil".into(), |p| format!("{p:#018x}")),
                    &token_ids[..token_ids.len().min(8)],
                    token_ids.len()
                );
            }
            KvEvent::BlockRemoved { block_hashes } => {
                let hashes: Vec<String> =
                    block_hashes.iter().map(|h| format!("{h:#018x}")).collect();
                println!("  BlockRemoved hashes=[{}]", hashes.join(","));
            }
            KvEvent::AllBlocksCleared => println!("  AllBlocksCleared"),
        }
    }
    Ok(())
}

"""Interoperability check for mock-engine's KV events against libzmq and msgspec.

Not part of the Rust build (cargo only discovers .rs examples). It subscribes with pyzmq
(libzmq), decodes every payload with msgspec structs shaped as vLLM 0.11's
(`array_like`, `omit_defaults`, tagged events; written from the reference notes, not copied),
checks a chat request's BlockStored token ids against /tokenize, then replays from seq 0 on a
DEALER and expects the end marker. Usage (see docs/MOCK_ENGINE_HTTP.md, "KV-cache events"):

    python3 -m venv /tmp/kv && /tmp/kv/bin/pip install msgspec pyzmq
    mock-engine --listen 127.0.0.1:8000 --profile fast --kv-events-config \
      '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}' &
    /tmp/kv/bin/python mock-engine/examples/kv_events_msgspec_check.py \
      http://127.0.0.1:8000 tcp://127.0.0.1:5557 tcp://127.0.0.1:5558
"""
import sys, json, urllib.request, msgspec, zmq
from typing import Optional, Union

class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass
class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str]
class AllBlocksCleared(KVCacheEvent):
    pass
class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Optional[int] = None

dec = msgspec.msgpack.Decoder(type=KVEventBatch)
url, pub, rep = sys.argv[1:4]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.connect(pub); sub.setsockopt(zmq.SUBSCRIBE, b""); sub.RCVTIMEO = 500
body = {"model": "mock-model", "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(40))}], "max_tokens": 2}
def post(path, b):
    req = urllib.request.Request(url + path, data=json.dumps(b).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req)) if path == "/tokenize" else urllib.request.urlopen(req).read()
got = None
for i in range(20):
    body["messages"][0]["content"] = " ".join(f"p{i}w{j}" for j in range(40))
    post("/v1/chat/completions", body)
    try:
        got = sub.recv_multipart(); break
    except zmq.Again:
        continue
assert got, "nothing received"
topic, seq, payload = got
batch = dec.decode(payload)
toks = post("/tokenize", body)["tokens"]
print("libzmq SUB:", topic, int.from_bytes(seq, "big"), batch)
ev = batch.events[0]
assert isinstance(ev, BlockStored) and ev.token_ids == toks[:len(ev.token_ids)] and ev.medium == "GPU" and ev.parent_block_hash is None
d = ctx.socket(zmq.DEALER); d.connect(rep); d.RCVTIMEO = 5000
d.send_multipart([b"", (0).to_bytes(8, "big")])
n = 0
while True:
    _, s, p = d.recv_multipart()
    if s == (-1).to_bytes(8, "big", signed=True):
        assert p == b""; break
    dec.decode(p); n += 1
print("libzmq DEALER replay:", n, "batches then the end marker; token ids match /tokenize")

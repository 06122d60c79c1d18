"""Builds the tiny Llama-shaped model the real-vLLM tests serve (random weights, no model hub).

Usage: python make_model.py OUT_DIR

Everything is deterministic (fixed seeds), so two machines build the same tokenizer and the same
weights, and a test's expected token counts hold everywhere:
- a byte-level BPE tokenizer (vocabulary 512, specials <unk> <s> </s>) trained on generated
  English-like lines, saved as `tokenizer.json` (which prefixgate's `hf` tokenizer can load),
  that puts <s> first when asked for special tokens (completions' default), and a chat
  template that starts every message with <s> itself (chat asks for no special tokens), so a
  test notices when a router tokenizes either with the other's special-token handling;
- a 2-layer LlamaForCausalLM (hidden 128, 2 heads of 64: vLLM's CPU attention refuses a head
  size of 16) in float32, a few MB.
"""

import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 512
MAX_MODEL_LEN = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
WORDS = (
    "the a of to and in is that for it as with was on be by at this from or an are which "
    "model replica cache prefix block token request route gateway engine stream latency "
    "prompt family session answer system user assistant question document summary table "
    "data value result first second third last next time step phase round queue batch load"
).split()


def corpus(lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 999)))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return out


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(600, seed=7), trainer=trainer)
    # Like Llama's tokenizers: encoding with special tokens (completions' default) puts <s>
    # first; chat leaves that to the template.
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    # The generation config would make vLLM stop at EOS, which random weights emit at random;
    # the tests set max_tokens and ignore_eos themselves, so none is written.
    gen = out / "generation_config.json"
    if gen.exists():
        gen.unlink()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    (out / "prefixgate-model.json").write_text(
        json.dumps({"vocab_size": VOCAB_SIZE, "max_model_len": MAX_MODEL_LEN}) + "\n"
    )
    print(out)


if __name__ == "__main__":
    main()

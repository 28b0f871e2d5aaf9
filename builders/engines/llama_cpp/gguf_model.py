"""A tiny random Llama in GGUF, the one file llama-server loads, made fully offline.

llama.cpp has no dummy loader: unlike vLLM's `--load-format dummy` it reads every weight from the file, so
the weights are written (random, seeded; a few hundred KiB at the default size). The tokenizer is the same
byte-level BPE the vLLM tiny model uses (builders/engines/tiny_model.py), stored as GGUF `tokenizer.ggml.*`
keys, so both engines see the same prompts as the same number of tokens and a sweep compares like with like.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

from builders.engines.tiny_model import BOS, CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS, VOCAB_SIZE, build_tokenizer
from builders.errors import SmokeFailed

ARCHITECTURE = "llama"
HEAD_DIM = 32
# Padding ids are never produced by the tokenizer; marked UNUSED so llama.cpp never prints them as text.
_PAD_PREFIX = "<unused"


def _merges(tokenizer_json: str) -> list[str]:
    merges = json.loads(tokenizer_json)["model"]["merges"]
    # tokenizers >= 0.20 stores a merge as a pair, older releases as one "left right" string; GGUF wants the latter.
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def write_tiny_gguf(
    path: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = VOCAB_SIZE,
    ctx: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random `layers`-layer Llama of width `hidden` with a `vocab`-entry BPE tokenizer to `path`.

    `vocab` may exceed the trained tokenizer's size (the rest is padding); `ctx` is the trained context
    llama-server reports and defaults `-c` to. Same arguments, same bytes. Returns `path`.
    """
    if hidden % HEAD_DIM:
        raise SmokeFailed(f"write_tiny_gguf: hidden={hidden} must be a multiple of the head size {HEAD_DIM}")
    if layers < 1 or ctx < 1:
        raise SmokeFailed(f"write_tiny_gguf: layers={layers} and ctx={ctx} must both be at least 1")
    tokenizer = build_tokenizer()
    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab < trained:
        raise SmokeFailed(f"write_tiny_gguf: vocab={vocab} is below the generated tokenizer's {trained} tokens")
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(trained)] + [f"{_PAD_PREFIX}{i}>" for i in range(trained, vocab)]
    specials = set(SPECIAL_TOKENS)
    types = [
        TokenType.CONTROL if t in specials else TokenType.UNUSED if i >= trained else TokenType.NORMAL
        for i, t in enumerate(tokens)
    ]

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), ARCHITECTURE)
    heads = hidden // HEAD_DIM
    ffn = 2 * hidden
    writer.add_name("forge-tiny-llama")
    writer.add_context_length(ctx)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(LlamaFileType.ALL_F32)

    # "gpt2" is llama.cpp's name for byte-level BPE; "default" its GPT-2 pre-tokenizer split, the one the
    # HF tokenizer's ByteLevel pre-tokenizer applies.
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(_merges(tokenizer.to_str()))
    for name, setter in (
        (BOS, writer.add_bos_token_id),
        (EOS, writer.add_eos_token_id),
        (PAD, writer.add_pad_token_id),
    ):
        token_id = tokenizer.token_to_id(name)
        if token_id is None:
            raise SmokeFailed(f"the generated tokenizer lost its special token {name!r}")
        setter(token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        # numpy shape is (rows, cols) = GGML's ne reversed; the scale keeps activations from overflowing.
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    ones = np.ones(hidden, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    for layer in range(layers):
        blk = f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{proj}.weight", weight(hidden, hidden))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones)
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(hidden, ffn))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(vocab, hidden))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

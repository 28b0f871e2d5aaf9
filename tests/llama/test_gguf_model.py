"""The Forge-written GGUF, read back with gguf's own reader: a consistent Llama and a tokenizer llama.cpp can use."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType, TokenType

from builders.engines.llama_cpp.gguf_model import write_tiny_gguf
from builders.engines.tiny_model import BOS, EOS, IM_END, IM_START, build_tokenizer
from builders.errors import SmokeFailed


def _scalar(reader: GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> GGUFReader:
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hidden=64, layers=3, vocab=1100, ctx=2048)
    return GGUFReader(path)


def test_metadata_describes_the_requested_llama(reader: GGUFReader) -> None:
    assert _scalar(reader, "general.architecture") == "llama"
    assert _scalar(reader, "llama.block_count") == 3
    assert _scalar(reader, "llama.embedding_length") == 64
    assert _scalar(reader, "llama.context_length") == 2048
    assert _scalar(reader, "llama.vocab_size") == 1100
    heads = _scalar(reader, "llama.attention.head_count")
    assert isinstance(heads, int) and heads * _scalar(reader, "llama.rope.dimension_count") == 64  # type: ignore[operator]


def test_every_tensor_llama_cpp_loads_is_there_with_its_shape(reader: GGUFReader) -> None:
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    # GGML order (ne0 first): the embedding is hidden x vocab.
    assert shapes["token_embd.weight"] == (64, 1100)
    assert shapes["output.weight"] == (64, 1100)
    assert shapes["output_norm.weight"] == (64,)
    per_layer = {n.split(".", 2)[2] for n in shapes if n.startswith("blk.")}
    assert per_layer == {
        f"{name}.weight"
        for name in (
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        )
    }
    assert {n.split(".")[1] for n in shapes if n.startswith("blk.")} == {"0", "1", "2"}
    assert shapes["blk.2.ffn_down.weight"] == (128, 64)


def test_tokenizer_keys_match_the_bpe_the_vllm_model_uses(reader: GGUFReader) -> None:
    tokenizer = build_tokenizer()
    tokens = _scalar(reader, "tokenizer.ggml.tokens")
    types = _scalar(reader, "tokenizer.ggml.token_type")
    assert isinstance(tokens, list) and isinstance(types, list)
    assert len(tokens) == len(types) == 1100
    assert _scalar(reader, "tokenizer.ggml.model") == "gpt2"
    for word in ("hello world", " the system", "Paris"):
        for token_id in tokenizer.encode(word).ids:
            assert tokens[token_id] == tokenizer.id_to_token(token_id)
    for special in (BOS, EOS, IM_START, IM_END):
        assert types[tokens.index(special)] == TokenType.CONTROL
    assert _scalar(reader, "tokenizer.ggml.bos_token_id") == tokens.index(BOS)
    assert _scalar(reader, "tokenizer.ggml.eos_token_id") == tokens.index(EOS)
    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    assert set(types[trained:]) == {TokenType.UNUSED}
    merges = _scalar(reader, "tokenizer.ggml.merges")
    assert isinstance(merges, list) and merges and all(len(m.split(" ")) == 2 for m in merges)
    assert reader.fields["tokenizer.ggml.merges"].types == [GGUFValueType.ARRAY, GGUFValueType.STRING]
    template = _scalar(reader, "tokenizer.chat_template")
    assert isinstance(template, str) and IM_START in template


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", seed=1).read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=1).read_bytes()
    c = write_tiny_gguf(tmp_path / "c.gguf", seed=2).read_bytes()
    assert a == b
    assert len(a) == len(c) and a != c


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"hidden": 48}, "hidden=48"), ({"vocab": 10}, "vocab=10"), ({"layers": 0}, "layers=0")],
)
def test_bad_shape_is_refused_naming_the_argument(tmp_path: Path, kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(SmokeFailed, match=fragment):
        write_tiny_gguf(tmp_path / "x.gguf", **kwargs)

"""The tiny model directory: consistent config, a tokenizer that round-trips, a chat template with tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2.sandbox
import pytest
from tokenizers import Tokenizer

from builders.engines.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, ModelShape, build_tokenizer, write_tiny_model
from builders.traffic.plan import DEFAULT_VOCABULARY


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", max_position_embeddings=2048)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_writes_every_file_vllm_reads_and_no_weights(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert names == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    }


def test_config_is_a_consistent_two_layer_llama(model_dir: Path) -> None:
    config = _json(model_dir / "config.json")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2
    assert config["hidden_size"] == config["num_attention_heads"] * config["head_dim"] == 128
    assert config["num_key_value_heads"] == 2
    assert config["max_position_embeddings"] == 2048
    assert config["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)
    for key, token in (("bos_token_id", "<s>"), ("eos_token_id", "</s>"), ("pad_token_id", "<pad>")):
        assert config[key] == tokenizer.token_to_id(token)


def test_generation_stops_on_end_of_turn_and_end_of_text(model_dir: Path) -> None:
    generation = _json(model_dir / "generation_config.json")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert generation["eos_token_id"] == [tokenizer.token_to_id("</s>"), tokenizer.token_to_id("<|im_end|>")]


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, please summarize the following document.",
        "def main() -> int:\n    return 0\n",
        "Ünïcödé ✓ 日本語 emoji 🚀 and\ttabs",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "",
    ],
)
def test_tokenizer_round_trips_any_text(text: str) -> None:
    tokenizer = build_tokenizer()
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_special_tokens_are_single_ids_that_survive_encoding() -> None:
    tokenizer = build_tokenizer()
    for token in SPECIAL_TOKENS:
        assert tokenizer.encode(token).ids == [tokenizer.token_to_id(token)]


def test_traffic_words_cost_one_token_each_as_the_traffic_plan_assumes() -> None:
    tokenizer = build_tokenizer()
    costly = [w for w in DEFAULT_VOCABULARY if len(tokenizer.encode(" " + w).ids) != 1]
    assert costly == []
    sentence = " ".join(DEFAULT_VOCABULARY[:40])
    assert len(tokenizer.encode(sentence).ids) == 40


def test_the_tokenizer_is_the_same_on_every_build() -> None:
    assert build_tokenizer().to_str() == build_tokenizer().to_str()


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    # Hugging Face renders chat templates in an immutable sandbox with these options.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value)
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=True)


def test_chat_template_renders_tools_calls_and_results() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ]
    text = _render(messages, tools)
    assert text.startswith("<|im_start|>system\nbe brief\n\nYou may call these tools.")
    assert '{"name": "lookup", "parameters": {"type": "object"}}' in text
    assert '<tool_call>{"name": "lookup", "arguments": {"q": 1}}</tool_call>' in text
    assert "<|im_start|>tool\n<tool_response>sunny</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_takes_content_as_string_or_as_parts() -> None:
    # vLLM hands content over in either form depending on how it reads the template.
    as_string = [{"role": "system", "content": "doc"}, {"role": "user", "content": "question?"}]
    as_parts = [
        {"role": "system", "content": [{"type": "text", "text": "doc"}]},
        {"role": "user", "content": [{"type": "text", "text": "question?"}]},
    ]
    assert _render(as_string) == _render(as_parts)
    assert _render(as_string) == "<|im_start|>system\ndoc<|im_end|>\n<|im_start|>user\nquestion?<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )


def test_tokenizer_config_names_the_template_and_special_tokens(model_dir: Path) -> None:
    config = _json(model_dir / "tokenizer_config.json")
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["eos_token"] == "</s>"
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    decoder = {int(k): v["content"] for k, v in config["added_tokens_decoder"].items()}
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert decoder == {tokenizer.token_to_id(t): t for t in SPECIAL_TOKENS}


def test_a_larger_model_is_written_with_heads_of_64(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "big", shape=ModelShape(hidden_size=1024, num_hidden_layers=8))
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (1024, 8, 2048)
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 16 and config["head_dim"] == 64

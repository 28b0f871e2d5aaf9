"""A tiny random Llama model directory that vLLM serves with `--load-format dummy`, made fully offline.

The smoke stack measures the router and the scheduler, not the model, so the weights are never stored:
vLLM's dummy loader fills them in. Only the files vLLM reads before loading weights are written here —
the model config and a real tokenizer, so prompts are tokenized and outputs detokenized exactly as with a
production model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from builders.errors import SmokeFailed

if TYPE_CHECKING:
    from builders.config.profile import StackProfile

HEAD_DIM = 64
BOS = "<s>"
EOS = "</s>"
PAD = "<pad>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START, IM_END)

# Byte-level BPE: every possible input encodes (no unknown tokens) and any generated id decodes, so random
# weights cannot produce an undecodable stream.
VOCAB_SIZE = 1024

# The words the traffic generator (builders/traffic/plan.py) builds its prompts from: common short English words
# that byte-level BPE tokenizers encode as one token each after a space. Kept here, with the tokenizer trained on
# them, so this engine-side module does not import the runtime layer.
DEFAULT_VOCABULARY: tuple[str, ...] = (
    "the", "cat", "dog", "sun", "sea", "tree", "house", "road", "blue", "red", "green", "small",
    "large", "old", "new", "fast", "slow", "city", "river", "stone", "bird", "fish", "book", "door",
    "light", "night", "day", "time", "year", "man", "woman", "child", "water", "fire", "wind", "rain",
    "snow", "cold", "warm", "good", "bad", "long", "short", "high", "low", "open", "close", "run",
    "walk", "read", "write", "sing", "play", "work", "rest", "eat", "drink", "see", "hear", "find",
    "give", "take", "make", "keep",
)  # fmt: skip

# Fixed corpus the merges are learned from: ordinary English plus the traffic generator's vocabulary, whose
# plans assume one token per word after a space (TrafficPlan.tokens_per_word = 1.0), as with Llama's BPE.
_CORPUS_WORDS = (  # noqa: SIM905 - one readable block of text, not 140 quoted words
    "the of and to in is was for on that with as by at from it an be this are or which have not but "
    "had his they you were their one all we can her has there been if more when will would who so no "
    "she other its may these two about than into could out only some what time first new very after "
    "system user assistant tool function call result answer question context document summary please "
    "explain write code test build image model token request response stream batch agent query search "
    "retrieve prefix long short fast slow router pool replica server latency throughput python json "
    "data value key name type list item number text file line error warning info debug start stop "
    "hello world thanks help find show tell make give read run check list compare plan step next"
).split()
_CORPUS_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please summarize the following document in three sentences.",
    "Call the search tool with the query and return the result as JSON.",
    "What is the capital of France? The answer is Paris.",
    "def main() -> int:\n    return 0\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "0 1 2 3 4 5 6 7 8 9 10 100 1000",
)

# ChatML with tools, in the shape vLLM's OpenAI server renders: `tools` arrive as OpenAI tool dicts,
# assistant turns may carry `tool_calls`, tool results come back with role "tool". vLLM passes message
# content either as a string or as a list of parts (it guesses the format from the template), so every
# content goes through one macro that accepts both.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable -%}"
    "{%- for part in content -%}{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- text(messages[0]['content']) + '\\n\\n' }}{%- endif %}"
    '{{- \'You may call these tools. Reply with <tool_call>{"name": ..., "arguments": ...}</tool_call>.\\n\' }}'
    "{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson }}"
    "{{- '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + text(messages[0]['content']) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + text(message['content']) + '</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + text(message['content']) }}"
    "{%- if message.tool_calls is defined and message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    '{{- \'<tool_call>{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer() -> Tokenizer:
    """A deterministic byte-level BPE tokenizer learned from a fixed in-memory corpus (no downloads)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The traffic vocabulary is repeated most, so its words are merged into single tokens before the
    # vocabulary budget runs out.
    corpus = [" ".join(DEFAULT_VOCABULARY)] * 16 + [" ".join(_CORPUS_WORDS), *_CORPUS_SENTENCES] * 4
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


class LlamaConfig(TypedDict):
    """The model's config.json, in Hugging Face transformers' LlamaConfig keys (theirs, not Forge's)."""

    architectures: list[str]
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    torch_dtype: str
    use_cache: bool


def _model_config(
    vocab_size: int, bos_id: int, eos_id: int, pad_id: int, max_position: int, shape: ModelShape
) -> LlamaConfig:
    heads = shape.hidden_size // HEAD_DIM
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size or 2 * shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": max_position,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        # What `--dtype auto` would serve: the run passes its host-chosen dtype (builders/serving_dtype.py).
        "torch_dtype": shape.torch_dtype,
        "use_cache": True,
    }


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """Size of the generated Llama: the smoke default is tiny; a sweep wants prefills that cost real time."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    intermediate_size: int | None = None
    torch_dtype: str = "float32"


def write_tiny_model(dest: Path, *, max_position_embeddings: int = 4096, shape: ModelShape | None = None) -> Path:
    """Write config, tokenizer and generation config of a random Llama (2 layers unless `shape` says
    otherwise) into `dest`; return `dest`.

    Serve it with `vllm serve DEST --load-format dummy` and HF_HUB_OFFLINE=1; no weight files exist.
    """
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    ids: dict[str, int] = {}
    for tok in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(tok)
        if token_id is None:
            raise SmokeFailed(f"the generated tokenizer lost its special token {tok!r}")
        ids[tok] = token_id
    tokenizer.save(str(dest / "tokenizer.json"))

    config = _model_config(vocab_size, ids[BOS], ids[EOS], ids[PAD], max_position_embeddings, shape or ModelShape())
    added = {
        str(ids[tok]): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
    }
    special_tokens_map = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": [IM_START, IM_END],
    }
    generation_config = {
        "bos_token_id": ids[BOS],
        # The chat template ends turns with <|im_end|>; stopping on it keeps chat replies one turn long.
        "eos_token_id": [ids[EOS], ids[IM_END]],
        "pad_token_id": ids[PAD],
    }
    for name, payload in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special_tokens_map),
        ("generation_config.json", generation_config),
    ):
        (dest / name).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return dest


def write_profile_model(dest: Path, profile: StackProfile, *, dtype: str) -> Path:
    """The tiny Llama a smoke profile's `model` describes, at the run's dtype: what every engine that loads a Hugging
    Face model directory (vLLM, SGLang) serves."""
    return write_tiny_model(
        dest,
        max_position_embeddings=profile.model.max_position_embeddings,
        shape=ModelShape(
            hidden_size=profile.model.hidden_size,
            num_hidden_layers=profile.model.num_hidden_layers,
            intermediate_size=profile.model.intermediate_size,
            torch_dtype=dtype,
        ),
    )

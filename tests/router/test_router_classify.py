"""Classification rules, their order, the header override, and request validation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from builders.router.classes import RequestClass
from builders.router.classify import Classifier, prefix_key
from builders.router.config import config_from_mapping
from builders.router.openai_request import BadRequest, Endpoint, parse_request

CONFIG = config_from_mapping(
    {
        "pools": {"p": ["http://127.0.0.1:9"]},
        "default_pool": "p",
        "long_prefill_tokens": 100,
        "batch_max_tokens": 64,
        "prefix_chars": 40,
    }
)

DOC = "the quick brown fox jumps over the lazy dog " * 3  # 132 chars: past prefix_chars, under 100 tokens
LONG = "word " * 100  # 500 chars -> 125 estimated tokens
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def chat(*messages: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"messages": list(messages), **extra}).encode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# (name, body, headers, expected class); each row runs on a fresh classifier unless it needs memory.
TABLE: list[tuple[str, bytes, dict[str, str], RequestClass]] = [
    ("plain chat", chat(user("hi")), {}, RequestClass.INTERACTIVE),
    ("tools", chat(user("hi"), tools=TOOLS), {}, RequestClass.AGENT),
    (
        "tool result turn",
        chat(
            user("hi"),
            {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "1", "content": "42"},
        ),
        {},
        RequestClass.AGENT,
    ),
    ("tools beat long prompt", chat(user(LONG), tools=TOOLS), {}, RequestClass.AGENT),
    ("long prompt", chat(user(LONG)), {}, RequestClass.LONG_PREFILL),
    ("long beats batch", chat(user(LONG), max_tokens=500), {}, RequestClass.LONG_PREFILL),
    ("batch", chat(user("summarise"), max_tokens=64), {}, RequestClass.BATCH),
    ("max_completion_tokens counts", chat(user("s"), max_completion_tokens=80), {}, RequestClass.BATCH),
    ("streamed is not batch", chat(user("s"), max_tokens=500, stream=True), {}, RequestClass.INTERACTIVE),
    ("under batch threshold", chat(user("s"), max_tokens=63), {}, RequestClass.INTERACTIVE),
    ("slow header", chat(user("hi"), stream=True), {"x-client-slow": "1"}, RequestClass.SLOW_STREAM),
    ("batch beats slow header", chat(user("s"), max_tokens=64), {"x-client-slow": "1"}, RequestClass.BATCH),
    ("header wins", chat(user("hi"), tools=TOOLS), {"x-request-class": "batch"}, RequestClass.BATCH),
    ("header case", chat(user("hi")), {"x-request-class": " RAG "}, RequestClass.RAG),
]


@pytest.mark.parametrize(("body", "headers", "expected"), [row[1:] for row in TABLE], ids=[r[0] for r in TABLE])
def test_classification_table(body: bytes, headers: dict[str, str], expected: RequestClass) -> None:
    decision = Classifier(CONFIG).classify(parse_request(Endpoint.CHAT, body), headers)
    assert decision.request_class is expected


def test_token_id_prompt_counts_exactly() -> None:
    parsed = parse_request(Endpoint.COMPLETIONS, json.dumps({"prompt": list(range(100))}).encode())
    assert parsed.token_estimate == 100
    assert Classifier(CONFIG).classify(parsed, {}).request_class is RequestClass.LONG_PREFILL


def test_shared_prefix_makes_rag_on_second_sight() -> None:
    classifier = Classifier(CONFIG)
    first = parse_request(Endpoint.CHAT, chat({"role": "system", "content": DOC}, user("who?")))
    second = parse_request(Endpoint.CHAT, chat({"role": "system", "content": DOC}, user("where?")))
    assert classifier.classify(first, {}).request_class is RequestClass.INTERACTIVE
    decision = classifier.classify(second, {})
    assert decision.request_class is RequestClass.RAG
    assert decision.prefix == prefix_key(first, CONFIG.prefix_chars)
    # The same words under another role are a different prefix for the engine, so not rag.
    other_role = parse_request(Endpoint.CHAT, chat(user(DOC + " what?")))
    assert classifier.classify(other_role, {}).request_class is RequestClass.INTERACTIVE


def test_a_batch_request_over_a_seen_prefix_is_batch_not_rag() -> None:
    classifier = Classifier(CONFIG)
    classifier.classify(parse_request(Endpoint.CHAT, chat({"role": "system", "content": DOC}, user("who?"))), {})
    summary = json.loads(chat({"role": "system", "content": DOC}, user("summarise it")))
    summary |= {"stream": False, "max_tokens": CONFIG.batch_max_tokens}
    decision = classifier.classify(parse_request(Endpoint.CHAT, json.dumps(summary).encode()), {})
    assert (decision.request_class, decision.reason) == (RequestClass.BATCH, "max_tokens")
    # Streamed, the same request over the same prefix is rag: only a long unstreamed answer is batch.
    streamed = json.dumps(summary | {"stream": True}).encode()
    assert classifier.classify(parse_request(Endpoint.CHAT, streamed), {}).request_class is RequestClass.RAG


def test_short_prompts_have_no_prefix_so_repeats_stay_interactive() -> None:
    classifier = Classifier(CONFIG)
    for _ in range(3):
        decision = classifier.classify(parse_request(Endpoint.CHAT, chat(user("hi"))), {})
        assert decision.request_class is RequestClass.INTERACTIVE
        assert decision.prefix is None


def test_prefix_memory_expires() -> None:
    now = [0.0]
    classifier = Classifier(CONFIG, clock=lambda: now[0])
    body = parse_request(Endpoint.COMPLETIONS, json.dumps({"prompt": DOC + " q1"}).encode())
    classifier.classify(body, {})
    now[0] += CONFIG.prefix_ttl_s + 1
    assert classifier.classify(body, {}).request_class is RequestClass.INTERACTIVE
    assert classifier.classify(body, {}).request_class is RequestClass.RAG


def test_known_slow_client_is_remembered() -> None:
    classifier = Classifier(CONFIG)
    body = parse_request(Endpoint.CHAT, chat(user("hi"), stream=True))
    assert classifier.classify(body, {"x-client-id": "c1"}).request_class is RequestClass.INTERACTIVE
    classifier.mark_slow("c1")
    assert classifier.classify(body, {"x-client-id": "c1"}).request_class is RequestClass.SLOW_STREAM
    assert classifier.classify(body, {"x-client-id": "c2"}).request_class is RequestClass.INTERACTIVE


def test_unknown_class_header_names_the_header() -> None:
    with pytest.raises(BadRequest) as err:
        Classifier(CONFIG).classify(parse_request(Endpoint.CHAT, chat(user("hi"))), {"x-request-class": "urgent"})
    assert err.value.param == "x-request-class"
    assert "urgent" in err.value.message and "interactive" in err.value.message


@pytest.mark.parametrize(
    ("endpoint", "raw", "param"),
    [
        (Endpoint.CHAT, b"{not json", "body"),
        (Endpoint.CHAT, b"[1, 2]", "body"),
        (Endpoint.CHAT, b"{}", "messages"),
        (Endpoint.CHAT, json.dumps({"messages": "hi"}).encode(), "messages"),
        (Endpoint.CHAT, json.dumps({"messages": [{"content": "x"}]}).encode(), "messages[0].role"),
        (Endpoint.CHAT, json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), "messages[0].content"),
        (Endpoint.CHAT, chat(user("x"), max_tokens="10"), "max_tokens"),
        (Endpoint.CHAT, chat(user("x"), max_tokens=True), "max_tokens"),
        (Endpoint.CHAT, chat(user("x"), max_tokens=0), "max_tokens"),
        (Endpoint.CHAT, chat(user("x"), stream="yes"), "stream"),
        (Endpoint.CHAT, chat(user("x"), tools={"a": 1}), "tools"),
        (Endpoint.CHAT, chat(user("x"), model=3), "model"),
        (Endpoint.COMPLETIONS, json.dumps({"prompt": 3}).encode(), "prompt"),
        (Endpoint.COMPLETIONS, json.dumps({"prompt": ["a", 1]}).encode(), "prompt"),
        (Endpoint.COMPLETIONS, b"{}", "prompt"),
    ],
)
def test_bad_fields_are_named(endpoint: Endpoint, raw: bytes, param: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_request(endpoint, raw)
    assert err.value.param == param

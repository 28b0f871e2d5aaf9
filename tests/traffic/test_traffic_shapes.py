"""The request shapes each class builds, checked on the built requests without any server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from builders.router.classes import RequestClass
from builders.traffic import ShapeBuilder, TrafficPlan

PLAN = TrafficPlan.model_validate(
    {
        "model": "tiny",
        "max_model_len": 2048,
        "rag": {"documents": 2},
        "agent": {"turns": 3, "tools": 2},
        "batch": {"max_tokens": 600},
    }
)


def test_interactive_is_short_streamed_chat() -> None:
    builder = ShapeBuilder(PLAN)
    for i in range(20):
        spec = builder.interactive(i)
        words = spec.body["messages"][-1]["content"].split()
        assert PLAN.interactive.prompt_words_min <= len(words) <= PLAN.interactive.prompt_words_max
        assert set(words) <= set(PLAN.vocabulary)
        assert spec.stream and spec.body["max_tokens"] == 32 and spec.path == "/v1/chat/completions"


def test_rag_requests_share_a_long_document_prefix() -> None:
    builder = ShapeBuilder(PLAN)
    specs = [builder.rag(i) for i in range(4)]
    systems = [s.body["messages"][0]["content"] for s in specs]
    questions = [s.body["messages"][1]["content"] for s in specs]
    assert systems[0] == systems[2] and systems[1] == systems[3] and systems[0] != systems[1]
    assert len(set(questions)) == 4
    doc_words = len(systems[0].split())
    assert doc_words >= 0.3 * PLAN.max_model_len * 0.9


def test_long_prefill_fills_the_context_but_leaves_room() -> None:
    spec = ShapeBuilder(PLAN).long_prefill(0)
    tokens = len(spec.body["prompt"].split()) * PLAN.tokens_per_word
    room = PLAN.max_model_len - spec.body["max_tokens"]
    assert 0.75 * room <= tokens < room - PLAN.long_prefill.template_margin_tokens
    assert spec.stream and spec.path == "/v1/completions"


def test_batch_is_long_output_not_streamed_and_shares_no_prefix() -> None:
    builder = ShapeBuilder(PLAN)
    a, b = builder.batch(0), builder.batch(1)
    assert not a.stream and a.body["max_tokens"] == 600 and a.body["ignore_eos"] is True
    assert a.body["prompt"].endswith("Summarize the text above in detail.")
    shared = next(i for i, (x, y) in enumerate(zip(a.body["prompt"], b.body["prompt"], strict=False)) if x != y)
    assert shared < 40


def test_slow_stream_identifies_itself_and_reads_in_small_pieces() -> None:
    spec = ShapeBuilder(PLAN).slow_stream(3)
    assert spec.headers["x-client-slow"] == "1" and spec.headers["x-client-id"].startswith("slow-")
    assert spec.read_bytes == PLAN.slow_stream.read_bytes and spec.read_delay_s == PLAN.slow_stream.read_delay_s
    quiet = TrafficPlan.model_validate({"model": "m", "max_model_len": 512, "slow_stream": {"send_slow_header": False}})
    assert "x-client-slow" not in ShapeBuilder(quiet).slow_stream(0).headers


def test_agent_context_grows_and_carries_tools_and_tool_results() -> None:
    conversation = ShapeBuilder(PLAN).agent(0)
    sizes: list[int] = []
    while not conversation.done:
        spec = conversation.next_request()
        assert spec.request_class is RequestClass.AGENT and spec.turn == len(sizes)
        assert [t["function"]["name"] for t in spec.body["tools"]] == ["tool_0", "tool_1"]
        assert spec.body["tool_choice"] == "none"
        sizes.append(len(spec.body["messages"]))
        conversation.record_reply(f"reply {spec.turn}")
    assert sizes == [2, 4, 6]
    last = spec.body["messages"]
    assert last[2]["role"] == "assistant" and last[2]["content"] == "reply 0"
    call = last[2]["tool_calls"][0]
    assert last[3] == {"role": "tool", "tool_call_id": call["id"], "content": last[3]["content"]}
    assert len(last[3]["content"].split()) == PLAN.agent.tool_result_words


def test_class_header_only_when_asked() -> None:
    headed = TrafficPlan.model_validate(
        {"model": "m", "max_model_len": 2048, **{c.value: {"send_class_header": True} for c in RequestClass}}
    )
    for plan, expected in ((PLAN, False), (headed, True)):
        builder = ShapeBuilder(plan)
        for c in RequestClass:
            spec = builder.agent(0).next_request() if c is RequestClass.AGENT else builder.single(c, 0)
            assert ("x-request-class" in spec.headers) is expected
            if expected:
                assert spec.headers["x-request-class"] == c.value


def test_same_seed_same_text_other_seed_other_text() -> None:
    again = ShapeBuilder(PLAN).rag(1).body
    assert again == ShapeBuilder(PLAN).rag(1).body
    other = ShapeBuilder(PLAN.model_copy(update={"seed": 7})).rag(1).body
    assert other != again


def test_plan_refuses_shapes_that_cannot_fit() -> None:
    with pytest.raises(ValidationError, match=r"batch: prompt and output need about \d+ tokens"):
        # 0.25 * 700 tokens of text + 512 of output + the template: over 700.
        TrafficPlan.model_validate({"model": "m", "max_model_len": 700, "batch": {"count": 1}})
    with pytest.raises(ValidationError, match="max_tokens"):
        TrafficPlan.model_validate({"model": "m", "max_model_len": 512, "interactive": {"count": 1, "max_tokens": 512}})
    with pytest.raises(ValidationError, match="extra"):
        TrafficPlan.model_validate({"model": "m", "max_model_len": 512, "interactiv": {}})

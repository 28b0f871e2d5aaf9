"""Bounded fuzzing of the request parser: any bytes give a ParsedRequest or a BadRequest, never anything else.

A BadRequest is a 400 naming a field; any other exception would be a 500 with a traceback. The cost
check is compared with a reference walk of the decoded value, so brackets and commas inside strings
(escaped quotes included) can neither hide nesting nor invent it.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from builders.router.openai_request import BadRequest, Endpoint, ParsedRequest, check_json_cost, parse_request

# Bounded so the suite stays fast on a 2-core CI box; derandomized so a failure reproduces.
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

# Strings heavy in the characters the scanner must get right inside strings.
tricky_text = st.text(alphabet=st.sampled_from('ab"\\[]{},: \n\u00e9\ud800'), max_size=12) | st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | tricky_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=40,
)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


def parse_or_reject(endpoint: Endpoint, raw: bytes, **limits: int) -> ParsedRequest | BadRequest:
    try:
        return parse_request(endpoint, raw, **limits)
    except BadRequest as exc:
        assert exc.param and exc.message
        return exc


@FUZZ
@given(raw=st.binary(max_size=300), endpoint=st.sampled_from(list(Endpoint)))
@example(raw=b"[" * 5000, endpoint=Endpoint.CHAT)
@example(raw=b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", endpoint=Endpoint.CHAT)
@example(raw=b'{"messages": [{"role": "user", "content": "\\ud800"}]}', endpoint=Endpoint.CHAT)
@example(raw=b"\xff\xfe{}", endpoint=Endpoint.COMPLETIONS)
def test_any_bytes_parse_or_get_a_400(raw: bytes, endpoint: Endpoint) -> None:
    parse_or_reject(endpoint, raw)


@FUZZ
@given(value=json_values, endpoint=st.sampled_from(list(Endpoint)))
def test_any_json_value_parses_or_gets_a_400(value: Any, endpoint: Endpoint) -> None:
    parse_or_reject(endpoint, json.dumps(value).encode())


request_bodies = st.fixed_dictionaries(
    {
        "model": st.one_of(st.text(max_size=8), st.integers()),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", 3]), "content": json_values}),
            max_size=4,
        ),
        "prompt": json_values,
    },
    optional={
        "stream": json_values,
        "max_tokens": json_values,
        "max_completion_tokens": json_values,
        "tools": json_values,
        "stream_options": json_values,
    },
)


@FUZZ
@given(body=request_bodies, endpoint=st.sampled_from(list(Endpoint)), ascii_only=st.booleans())
def test_near_valid_requests_parse_or_name_the_field(
    body: dict[str, Any], endpoint: Endpoint, ascii_only: bool
) -> None:
    outcome = parse_or_reject(endpoint, json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    if isinstance(outcome, ParsedRequest):
        assert outcome.endpoint is endpoint
        # What the router hashes and forwards is text the engine can take.
        outcome.prompt_text.encode()


@FUZZ
@given(value=json_values, max_depth=st.integers(4, 8))
def test_depth_check_matches_the_decoded_depth(value: Any, max_depth: int) -> None:
    raw = json.dumps(value).encode()
    try:
        check_json_cost(raw, max_depth=max_depth, max_elements=10**9)
    except BadRequest:
        assert depth_of(value) > max_depth
    else:
        assert depth_of(value) <= max_depth


def values_in(value: Any) -> int:
    if isinstance(value, list):
        return 1 + sum(values_in(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(values_in(v) for v in value.values())
    return 1


@FUZZ
@given(value=json_values, max_elements=st.integers(1, 30))
def test_size_check_refuses_only_bodies_over_the_limit(value: Any, max_elements: int) -> None:
    raw = json.dumps(value).encode()
    try:
        check_json_cost(raw, max_depth=10**6, max_elements=max_elements)
    except BadRequest:
        assert values_in(value) > max_elements

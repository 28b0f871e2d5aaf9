"""Checks an OpenAI-style request body and extracts what routing needs, naming the field at fault."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeGuard

from builders.router.classes import ServiceClass


class Endpoint(StrEnum):
    """Every path the router relays to a replica, on the same path (vLLM's OpenAI server's routes)."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"
    EMBEDDINGS = "/v1/embeddings"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"
    SCORE = "/score"
    SCORE_V1 = "/v1/score"
    RERANK = "/rerank"
    RERANK_V1 = "/v1/rerank"
    TRANSCRIPTIONS = "/v1/audio/transcriptions"


# Module constants for the per-request identity tests: an enum member looked up on its class is a Python call in 3.11.
_CHAT, _COMPLETIONS, _RESPONSES = Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES

SERVICE_OF: dict[Endpoint, ServiceClass] = {
    Endpoint.EMBEDDINGS: ServiceClass.EMBEDDINGS,
    Endpoint.TOKENIZE: ServiceClass.TOKENIZE,
    Endpoint.DETOKENIZE: ServiceClass.TOKENIZE,
    Endpoint.SCORE: ServiceClass.SCORE,
    Endpoint.SCORE_V1: ServiceClass.SCORE,
    Endpoint.RERANK: ServiceClass.RERANK,
    Endpoint.RERANK_V1: ServiceClass.RERANK,
    Endpoint.TRANSCRIPTIONS: ServiceClass.TRANSCRIPTION,
}
"""The endpoints that generate nothing the class policy knows about, and the class each is counted as."""

UPLOADS = frozenset({Endpoint.TRANSCRIPTIONS})
"""Endpoints whose body is a multipart upload, relayed as it arrives (builders/router/uploads.py); the rest are JSON."""


class BadRequest(Exception):
    """A client error the router answers with 400 and the offending field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True, kw_only=True)
class ParsedRequest:
    """What the router reads from a request; the original bytes are forwarded unchanged."""

    endpoint: Endpoint
    stream: bool
    max_tokens: int | None
    uses_tools: bool
    prompt_text: str
    prompt_token_ids: int
    """Exact token count when the prompt was given as token ids, else 0."""
    tools_chars: int
    model: str | None
    service: ServiceClass | None = None
    """The class of a request that is not generation (embeddings, score, ...); None for chat, completions, responses."""

    @property
    def token_estimate(self) -> int:
        # chars/4 is the usual English BPE ratio; it costs nothing and only needs to separate
        # "near the context limit" from "short", not to count exactly.
        return self.prompt_token_ids + (len(self.prompt_text) + self.tools_chars + 3) // 4


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _content_text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"{param}[{i}]", f"`{param}[{i}]` must be an object (a content part)")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        return "".join(texts)
    raise BadRequest(param, f"`{param}` must be a string, a list of content parts or null")


def _chat_prompt(body: dict[str, Any]) -> tuple[str, bool]:
    messages = body.get("messages")
    if messages is None:
        raise BadRequest("messages", "`messages` is required for chat completions")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "`messages` must be a non-empty list of message objects")
    parts = []
    tool_turns = False
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(where, f"`{where}` must be an object with `role` and `content`")
        role = message.get("role")
        if not isinstance(role, str):
            raise BadRequest(f"{where}.role", f"`{where}.role` must be a string")
        text = _content_text(message.get("content"), f"{where}.content")
        if role == "tool" or message.get("tool_calls"):
            tool_turns = True
        # The role is part of the rendered text so that a system document and a user document with
        # the same words are different prefixes, as they are for the engine's prefix cache.
        parts.append(f"{role}: {text}\n")
    return "".join(parts), tool_turns


def _completion_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("prompt", "`prompt` is required for completions")
    if isinstance(prompt, str):
        return prompt, 0
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), 0
        if all(_is_int(t) for t in prompt):
            return "", len(prompt)
        if all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt):
            return "", sum(len(p) for p in prompt)
    raise BadRequest(
        "prompt", "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists"
    )


_DECODER = json.JSONDecoder()

# A JSON string (escapes included) or one structural byte. Strings match as one token, so brackets and
# commas inside them are not counted, and scanning costs one step per token, not per byte.
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')


def check_json_cost(raw: bytes, *, max_depth: int, max_elements: int) -> None:
    """Refuse a body whose nesting or value count is over the limits, before the decoder builds it.

    The decoder holds the GIL while it builds every object, so the cost of a body must be bounded
    before it runs: a million tiny messages cost hundreds of MB and seconds, and deep nesting ends in
    a RecursionError. Two byte counts settle ordinary bodies; only the others are scanned.
    """
    check_depth = raw.count(b"[") + raw.count(b"{") > max_depth
    # Every value but the last is followed by a comma, so a body with few commas has few values.
    check_count = raw.count(b",") + 1 > max_elements
    if not (check_depth or check_count):
        return
    depth = 0
    values = 1
    for match in _JSON_TOKEN.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if check_depth and depth > max_depth:
                raise BadRequest("body", f"request body nests arrays/objects more than {max_depth} deep")
        elif token in (b"]", b"}"):
            depth -= 1
        elif token == b",":
            values += 1
            if check_count and values > max_elements:
                raise BadRequest("body", f"request body has more than {max_elements} JSON values")


def _check_encodable(text: str, param: str) -> None:
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError:
        raise BadRequest(
            param, f"`{param}` contains a lone UTF-16 surrogate (like \\ud800), which is not text"
        ) from None


def _decode(raw: bytes, max_depth: int, max_elements: int) -> dict[str, object]:
    check_json_cost(raw, max_depth=max_depth, max_elements=max_elements)
    try:
        # JSON between systems is UTF-8 (RFC 8259 section 8.1); decoding it here skips json.loads's
        # detection of UTF-16 and UTF-32, a third of its cost on an ordinary request.
        # A byte order mark is tolerated, as json.loads does.
        body = _DECODER.decode(raw.decode().removeprefix("\ufeff"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest("body", f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        # Only reachable with a max_depth above the decoder's own recursion limit.
        raise BadRequest("body", "request body nests arrays/objects too deep") from None
    if not isinstance(body, dict):
        raise BadRequest("body", f"request body must be a JSON object, found {type(body).__name__}")
    return body


def _model(body: dict[str, object]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model", "`model` must be a string")
    return model


def _responses_prompt(body: dict[str, object]) -> tuple[str, bool]:
    """The Responses API's `instructions` and `input` as one text (rendered as chat's are), and whether it carries
    tool turns. `input` may be absent (a request that continues a stored response)."""
    parts = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions", "`instructions` must be a string")
        parts.append(f"system: {instructions}\n")
    given = body.get("input")
    tool_turns = False
    if isinstance(given, str):
        parts.append(f"user: {given}\n")
    elif isinstance(given, list):
        for i, item in enumerate(given):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                raise BadRequest(where, f"`{where}` must be an object (a message or another input item)")
            kind = item.get("type")
            if isinstance(kind, str) and kind.startswith("function_call"):
                tool_turns = True
                continue
            role = item.get("role", "user")
            if not isinstance(role, str):
                raise BadRequest(f"{where}.role", f"`{where}.role` must be a string")
            parts.append(f"{role}: {_content_text(item.get('content'), f'{where}.content')}\n")
    elif given is not None:
        raise BadRequest("input", "`input` must be a string or a list of input items")
    return "".join(parts), tool_turns


def _service_request(endpoint: Endpoint, model: str | None) -> ParsedRequest:
    # The replica validates the rest (input, query, documents, tokens, an upload's file): the router needs only
    # where to send it, so a JSON body and an upload's form field end in the same request.
    return ParsedRequest(
        endpoint=endpoint,
        stream=False,
        max_tokens=None,
        uses_tools=False,
        prompt_text="",
        prompt_token_ids=0,
        tools_chars=0,
        model=model,
        service=SERVICE_OF[endpoint],
    )


def _parse_generation(endpoint: Endpoint, body: dict[str, object]) -> ParsedRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("model", "`model` must be a string")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream", "`stream` must be true or false")
    max_tokens: int | None = None
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise BadRequest(name, f"`{name}` must be a positive integer")
        if max_tokens is None:
            max_tokens = value
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("tools", "`tools` must be a list of tool objects")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options", "`stream_options` must be an object")

    tool_turns = False
    token_ids = 0
    if endpoint is _CHAT:
        text, tool_turns = _chat_prompt(body)
        param = "messages"
    elif endpoint is _COMPLETIONS:
        text, token_ids = _completion_prompt(body)
        param = "prompt"
    else:
        text, tool_turns = _responses_prompt(body)
        param = "input"
    # The prefix is hashed as UTF-8 and the engine tokenizes UTF-8: a lone surrogate is a client error.
    _check_encodable(text, param)
    return ParsedRequest(
        endpoint=endpoint,
        stream=stream,
        max_tokens=max_tokens,
        uses_tools=bool(tools) or tool_turns,
        prompt_text=text,
        prompt_token_ids=token_ids,
        tools_chars=len(json.dumps(tools)) if tools else 0,
        model=model,
    )


def parse_request(endpoint: Endpoint, raw: bytes, *, max_depth: int = 64, max_elements: int = 200_000) -> ParsedRequest:
    """Validate the fields the router relies on; the engine validates the rest. Not for uploads (upload_request)."""
    body = _decode(raw, max_depth, max_elements)
    if endpoint is _CHAT or endpoint is _COMPLETIONS or endpoint is _RESPONSES:
        return _parse_generation(endpoint, body)
    return _service_request(endpoint, _model(body))


def upload_request(model: str | None) -> ParsedRequest:
    """What routing knows of a multipart upload: its `model` form field, if one came before the file."""
    return _service_request(Endpoint.TRANSCRIPTIONS, model)

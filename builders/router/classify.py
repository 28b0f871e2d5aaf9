"""Decides a request's class: an explicit header wins, otherwise fixed rules over the request body.

A request that is not generation (embeddings, score, rerank, tokenize, transcription) is of its endpoint's class
(builders/router/classes.py ServiceClass), whatever its headers say. For chat, completions and responses the
rule order (the first that matches decides):

1. header ``x-request-class`` (an unknown value is a 400 naming the header);
2. ``agent``: the request carries ``tools``, a ``tool`` message or an assistant ``tool_calls`` turn;
3. ``long_prefill``: estimated prompt tokens (characters / 4, plus exact counts of token-id prompts)
   >= ``long_prefill_tokens``;
4. ``batch``: not streamed and ``max_tokens`` (or ``max_completion_tokens``, ``max_output_tokens``)
   >= ``batch_max_tokens`` (a request without one is not batch), a seen prefix or not;
5. ``rag``: the prompt's shared prefix (its first ``prefix_chars`` characters, roles included, only
   when the prompt is longer than that) was seen within ``prefix_ttl_s``;
6. ``slow_stream``: header ``x-client-slow: 1``, or the client (``x-client-id``) stalled a stream recently;
7. ``interactive``.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from builders.router.classes import RequestClass, TrafficClass
from builders.router.config import RouterConfig
from builders.router.openai_request import BadRequest, ParsedRequest

CLASS_HEADER = "x-request-class"
SLOW_HEADER = "x-client-slow"


class TimedMemory:
    """A bounded set of keys that each expire; the oldest are dropped first when full."""

    def __init__(self, *, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def contains(self, key: str) -> bool:
        stamp = self._seen.get(key)
        if stamp is None:
            return False
        if self._clock() - stamp > self._ttl:
            del self._seen[key]
            return False
        return True

    def add(self, key: str) -> None:
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)


def prefix_key(parsed: ParsedRequest, prefix_chars: int) -> str | None:
    """Hash of the shared prefix, or None when the prompt is too short to have one worth sharing."""
    if len(parsed.prompt_text) <= prefix_chars:
        return None
    digest = hashlib.blake2b(parsed.prompt_text[:prefix_chars].encode(), digest_size=12)
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Decision:
    request_class: TrafficClass
    reason: str
    prefix: str | None


class Classifier:
    """Holds the memories the rules need (recent prefixes, slow clients) and applies the rules in order."""

    def __init__(self, config: RouterConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self.prefixes = TimedMemory(ttl_s=config.prefix_ttl_s, max_entries=config.prefix_cache_entries, clock=clock)
        self.slow_clients = TimedMemory(
            ttl_s=config.slow_client.remember_s, max_entries=config.slow_client.max_clients, clock=clock
        )

    def client_id(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get(self._config.slow_client.client_id_header)
        return value.strip() or None if value else None

    def mark_slow(self, client_id: str | None) -> None:
        if client_id and self._config.slow_client.enabled:
            self.slow_clients.add(client_id)

    def classify(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> Decision:
        service = parsed.service
        if service is not None:
            # Not generation: no prompt to remember, no latency class to guess; the endpoint names the class.
            return Decision(request_class=service, reason="endpoint", prefix=None)
        prefix = prefix_key(parsed, self._config.prefix_chars)
        try:
            return self._decide(parsed, headers, prefix)
        finally:
            if prefix is not None:
                self.prefixes.add(prefix)

    def _decide(self, parsed: ParsedRequest, headers: Mapping[str, str], prefix: str | None) -> Decision:
        cfg = self._config
        explicit = headers.get(CLASS_HEADER)
        if explicit is not None:
            try:
                chosen = RequestClass(explicit.strip().lower())
            except ValueError:
                valid = ", ".join(c.value for c in RequestClass)
                raise BadRequest(
                    CLASS_HEADER, f"header {CLASS_HEADER}: {explicit!r} is not a request class; use one of {valid}"
                ) from None
            return Decision(request_class=chosen, reason="header", prefix=prefix)
        if parsed.uses_tools:
            return Decision(request_class=RequestClass.AGENT, reason="tools", prefix=prefix)
        if parsed.token_estimate >= cfg.long_prefill_tokens:
            return Decision(request_class=RequestClass.LONG_PREFILL, reason="token_estimate", prefix=prefix)
        # Batch before rag: a long unstreamed answer is what the client asked for, a seen prefix only a guess
        # at cache reuse, and a batch answer decoded on the interactive pool costs its latency for the whole
        # decode while the prefix would save only the prefill (a summary of a document seen before went there).
        if not parsed.stream and parsed.max_tokens is not None and parsed.max_tokens >= cfg.batch_max_tokens:
            return Decision(request_class=RequestClass.BATCH, reason="max_tokens", prefix=prefix)
        if prefix is not None and self.prefixes.contains(prefix):
            return Decision(request_class=RequestClass.RAG, reason="shared_prefix", prefix=prefix)
        if headers.get(SLOW_HEADER, "").strip() == "1":
            return Decision(request_class=RequestClass.SLOW_STREAM, reason="slow_header", prefix=prefix)
        client = self.client_id(headers)
        if client is not None and cfg.slow_client.enabled and self.slow_clients.contains(client):
            return Decision(request_class=RequestClass.SLOW_STREAM, reason="known_slow_client", prefix=prefix)
        return Decision(request_class=RequestClass.INTERACTIVE, reason="default", prefix=prefix)

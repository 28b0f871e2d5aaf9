"""Work-conserving class-aware routing: bulk work may borrow idle latency replicas, and every request carries
its class's priority into vLLM's scheduler.

A static split leaves the latency pool idle between interactive bursts while bulk work queues on its own
pool. Two small rules recover that capacity without giving the latency classes' TTFT back:

- **spill**: a request of a pool with a `spill` target goes to the target pool instead, but only while a
  target replica has nothing in flight and every replica of its own pool is busy. The next interactive
  request then finds the borrowed replica busy with one bulk request at most, never a queue of them.
  With `spill_max_prompt_tokens`, only requests with short prompts spill: a borrowed long prefill makes
  every step of the latency replica longer until it is done, which is what its own classes would wait for.
- **priority**: with `class_priority`, the router writes `"priority": N` into the request body (vLLM serves
  lower values first when started with `--scheduling-policy priority`), so an interactive request that
  arrives behind a borrowed bulk request is scheduled first in the replica's waiting queue.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from builders.router.classes import RequestClass, TrafficClass
from builders.router.replicas import Pool


def spill_target(
    pool: Pool,
    pools: Mapping[str, Pool],
    spill: Mapping[str, str],
    *,
    prompt_tokens: int = 0,
    max_prompt_tokens: int | None = None,
) -> Pool:
    """The pool a request of `pool` should go to now: `pool` itself unless a spill rule, the request's
    prompt size and idleness say the spill target may take it."""
    target_name = spill.get(pool.name)
    if target_name is None or (max_prompt_tokens is not None and prompt_tokens > max_prompt_tokens):
        return pool
    own = pool.healthy()
    if own and min(r.in_flight for r in own) == 0:
        return pool
    target = pools[target_name]
    if any(r.in_flight == 0 for r in target.healthy()):
        return target
    return pool


def with_priority(raw: bytes, request_class: TrafficClass, priorities: Mapping[RequestClass, int]) -> bytes:
    """The request body with the class's priority set (a priority the client sent is replaced: the router,
    not the client, decides who goes first). Only generation classes have one."""
    if not priorities or not isinstance(request_class, RequestClass):
        return raw
    priority = priorities.get(request_class)
    if priority is None:
        return raw
    body = json.loads(raw)
    body["priority"] = priority
    return json.dumps(body, separators=(",", ":")).encode()

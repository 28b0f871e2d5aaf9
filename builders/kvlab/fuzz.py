"""The pool's invariants after random admit / append / fork / free / window-trim sequences.

Hypothesis draws the sequences (derandomized, so `forge kvlab check` gives the same verdict every run) and shrinks
a failure to a short one. Beside the pool's own invariants, a shadow of which token each slot holds checks that
every request's table still leads to its own tokens, through prefix hits, evictions and copies.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from builders.kvlab.pool import NULL_BLOCK_ID, BlockPool, PoolError, Request

OPS = ("admit", "append", "fork", "free", "trim")
Op = tuple[str, int, int]
EXAMPLES = 60


def run_ops(ops: Sequence[Op], *, cow: bool, window: int | None, bug: str | None) -> None:
    block_size = 4
    pool = BlockPool(24, block_size, cow=cow, sliding_window=window, bug=bug)
    content: dict[int, dict[int, int]] = {}
    prompts = [[(p * 7 + i) % 13 for i in range(40)] for p in range(3)]
    live: list[Request] = []
    serial = 0

    def write(request: Request, tokens: Sequence[int]) -> None:
        copies = len(pool.copies)
        slots = pool.append(request, tokens)
        for source, destination in pool.copies[copies:]:
            content[destination] = dict(content.get(source, {}))
        for (block, offset), token in zip(slots, tokens, strict=False):
            if offset == 0:
                content[block] = {}
            content[block][offset] = token

    for name, pick, size in ops:
        try:
            if name == "admit":
                prompt = prompts[pick % 3][: size + pick % 5] + [100 + serial] * (pick % 2)
                request = pool.add_request(f"r{serial}", prompt)
                serial += 1
                live.append(request)
                write(request, prompt[request.num_tokens :])
            elif live and name == "append":
                write(live[pick % len(live)], [200 + serial + i for i in range(size % 7 + 1)])
                serial += 1
            elif live and name == "fork":
                live.append(pool.fork(live[pick % len(live)], f"r{serial}"))
                serial += 1
            elif live and name == "free":
                pool.free(live.pop(pick % len(live)))
            elif live and name == "trim":
                request = live[pick % len(live)]
                pool.remove_skipped_blocks(request, request.num_tokens)
        except PoolError as exc:
            # Out of blocks, or a fork V1 refuses: allowed outcomes, after which the invariants must still hold.
            if "no free KV block" not in exc.message and "partial block" not in exc.message:
                raise
        pool.check_invariants()
        for request in live:
            for position, token in enumerate(request.tokens):
                block = request.block_ids[position // block_size]
                if block == NULL_BLOCK_ID:
                    continue
                held = content.get(block, {}).get(position % block_size)
                assert held == token, f"{request.req_id} position {position}: block {block} holds {held}, not {token}"


def check_pool_invariants(bug: str | None = None) -> str:
    """Run the sequences; raise AssertionError on the first (shrunk) one that breaks an invariant. Says how."""
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
    except ModuleNotFoundError:
        rng = random.Random(0)
        for _ in range(EXAMPLES):
            ops = [(rng.choice(OPS), rng.randrange(8), rng.randrange(1, 20)) for _ in range(rng.randrange(40))]
            run_ops(ops, cow=rng.random() < 0.5, window=rng.choice([None, 6]), bug=bug)
        return f"{EXAMPLES} seeded random sequences (Hypothesis is not installed)"

    op = st.tuples(st.sampled_from(OPS), st.integers(0, 7), st.integers(1, 20))

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(op, max_size=40), st.booleans(), st.sampled_from([None, 6]))
    def sequences(ops: list[Op], cow: bool, window: int | None) -> None:
        run_ops(ops, cow=cow, window=window, bug=bug)

    sequences()
    return f"{EXAMPLES} Hypothesis sequences (derandomized)"

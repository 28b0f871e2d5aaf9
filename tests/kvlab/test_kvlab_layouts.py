"""The layouts' counters, exactly, on batches small enough to count by hand, and each planted layout bug shown
reaching its layout through a named case. The cases compare outputs only; the ranking reads the counters
(`Stats`), so a layout that groups, gathers or counts wrongly while its outputs stay right would rank wrongly.
`nox -s kvlab-mutation` runs these against every layouts mutant, beside the cases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import pytest

from builders.kvlab.cases import CASES
from builders.kvlab.check import run_case
from builders.kvlab.lab import Lab
from builders.kvlab.layouts import LAYOUTS, Entry
from builders.kvlab.pool import Request
from builders.kvlab.spec import AttnSpec

BLOCK = 4
BYTES_PER_TOKEN = 2 * 2 * 8 * 2  # K and V, 2 KV heads of 8, fp16-sized


def _shared_batch() -> tuple[Lab, list[Request], list[Entry]]:
    """a: 10 tokens in blocks 1-3; b: a's first 8 tokens (a prefix hit on blocks 1-2) and 5 more in 4-5; c: 6
    tokens alone in 6-7; a2: 11 tokens in 8-10, forked at 8 tokens into f, which holds 8-9 only."""
    lab = Lab(AttnSpec(num_heads=4, num_kv_heads=2, head_size=8), block_size=BLOCK, num_blocks=32, cow=True)
    a = lab.admit("a", lab.prompt(10))
    b = lab.admit("b", [*a.tokens[:8], *lab.prompt(5)])
    c = lab.admit("c", lab.prompt(6))
    a2 = lab.admit("a2", lab.prompt(8))
    f = lab.pool.fork(a2, "f")
    lab.compute(a2, lab.prompt(3))
    requests = [a, b, c, a2, f]
    assert [r.block_ids for r in requests] == [(1, 2, 3), (1, 2, 4, 5), (6, 7), (8, 9, 10), (8, 9)]
    entries = [lab.entry(r, 2 if r is b else 1) for r in requests]
    return lab, requests, entries


def _window_batch() -> tuple[Lab, list[Request], list[Entry]]:
    """r: 15 tokens under a window of 5, its blocks 0-1 freed to the null block; s: 7 tokens."""
    spec = AttnSpec(num_heads=4, num_kv_heads=2, head_size=8, sliding_window=5)
    lab = Lab(spec, block_size=BLOCK, num_blocks=32)
    r = lab.admit("r", lab.prompt(14))
    lab.compute(r, lab.prompt(1))
    s = lab.admit("s", lab.prompt(7))
    assert r.block_ids == (0, 0, 3, 4) and s.block_ids == (5, 6)
    return lab, [r, s], [lab.entry(r), lab.entry(s)]


# What each layout reads, counted by its rule (docs/kvlab-oracle.md, "Ranking"). Shared batch, seq lens 10, 13,
# 6, 11, 8 (48 key rows in all):
# - paged: a table padded to 4 blocks (16 bytes) + 4 per request; one lookup per key token;
# - spans: runs (1-3), (1-2, 4-5), (6-7), (8-10), (8-9): 6 runs × 12 + 8 per request; one lookup per run;
# - virtual: a pointer and a length per request; each of the 14 blocks copied into its buffer once;
# - hybrid: groups {a, b} and {a2, f} share 8 tokens (2 blocks, 8 bytes, read once); suffixes: a 8-10 (1 block),
#   b 8-13 (2), c 0-6 (2), a2 8-11 (1), f none; 4 per own block + 8 per request.
SHARED = {
    "paged": {"requests": 5, "metadata_bytes": 100, "kv_tokens_read": 48, "index_lookups": 48, "copy_bytes": 0},
    "spans": {"requests": 5, "metadata_bytes": 112, "kv_tokens_read": 48, "index_lookups": 6, "copy_bytes": 0},
    "virtual": {
        "requests": 5,
        "metadata_bytes": 60,
        "kv_tokens_read": 48,
        "index_lookups": 5,
        "copy_bytes": 14 * BLOCK * BYTES_PER_TOKEN,
    },
    "hybrid": {"requests": 5, "metadata_bytes": 80, "kv_tokens_read": 32, "index_lookups": 10, "copy_bytes": 0},
}
SHARED_CALLS = {"paged": 5, "spans": 5, "virtual": 5, "hybrid": 7}
# Window batch: r's queries see 10-14 (blocks 2-3), s's 2-6 (blocks 0-1); 5 keys each.
WINDOW = {
    "paged": {"requests": 2, "metadata_bytes": 2 * 20, "kv_tokens_read": 10, "index_lookups": 10, "copy_bytes": 0},
    "spans": {"requests": 2, "metadata_bytes": 2 * 12 + 16, "kv_tokens_read": 10, "index_lookups": 2, "copy_bytes": 0},
    "virtual": {
        "requests": 2,
        "metadata_bytes": 24,
        "kv_tokens_read": 10,
        "index_lookups": 2,
        "copy_bytes": 4 * BLOCK * BYTES_PER_TOKEN,
    },
    "hybrid": {"requests": 2, "metadata_bytes": 24 + 16, "kv_tokens_read": 10, "index_lookups": 4, "copy_bytes": 0},
}


Batch = Callable[[], tuple[Lab, list[Request], list[Entry]]]


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize(
    ("batch", "counts", "calls"), [(_shared_batch, SHARED, SHARED_CALLS), (_window_batch, WINDOW, None)]
)
def test_each_layout_answers_and_counts_what_its_rule_says(
    name: str, batch: Batch, counts: dict[str, dict[str, int]], calls: dict[str, int] | None
) -> None:
    lab, requests, entries = batch()
    layout = LAYOUTS[name](BLOCK, lab.spec)
    outs = layout.attend(entries, lab.store)
    assert len(outs) == len(entries)
    for request, entry, out in zip(requests, entries, outs, strict=True):
        assert out.dtype == np.float32 and out.shape == entry.query.shape
        expected = lab.expected(request, entry)
        assert np.allclose(out, expected, atol=2e-5, rtol=0), f"{name} {request.req_id}"
    stats = asdict(layout.stats)
    assert stats.pop("kernel_calls") == (calls[name] if calls else len(entries))
    assert stats == counts[name]


# Each planted layout bug and the first case that catches it, in the order `forge kvlab check --mutants` runs.
CAUGHT_BY = {
    ("paged", "last-block-dropped"): "len-1",
    ("paged", "reads-whole-last-block"): "len-1",
    ("paged", "window-off-by-one"): "sliding-window-edge-mid-block",
    ("paged", "kv-head-tiled"): "gqa-32-8",
    ("spans", "merge-across-gap"): "decode-across-block-boundary",
    ("spans", "last-page-len-mod"): "len-kB",
    ("spans", "positions-from-zero"): "sliding-window-edge-mid-block",
    ("spans", "v-scale-is-k-scale"): "fp8-e4m3-per-tensor-scales",
    ("virtual", "stale-tail"): "decode-across-block-boundary",
    ("virtual", "grow-drops-contents"): "decode-across-block-boundary",
    ("virtual", "seq-len-minus-one"): "len-1",
    ("virtual", "k-scale-twice"): "fp8-e4m3-per-tensor-scales",
    ("hybrid", "merge-mean"): "prefix-reuse-live",
    ("hybrid", "lse-base2-merge"): "prefix-reuse-live",
    ("hybrid", "prefix-assumes-full-blocks"): "cow-write-to-shared-partial-block",
    ("hybrid", "group-window-from-longest"): "window-with-shared-prefix",
    ("hybrid", "alibi-by-kv-head"): "alibi-pow2-gqa",
}


def test_every_planted_layout_bug_is_listed() -> None:
    assert set(CAUGHT_BY) == {(name, bug) for name, cls in LAYOUTS.items() for bug in cls.bugs}


@pytest.mark.parametrize(("name", "bug"), list(CAUGHT_BY))
def test_a_planted_layout_bug_reaches_its_layout(name: str, bug: str) -> None:
    case = next(c for c in CASES if c.name == CAUGHT_BY[name, bug])
    assert run_case(case, name).passed
    assert not run_case(case, name, layout_bug=bug).passed

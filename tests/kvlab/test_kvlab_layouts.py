"""The layouts' counters, exactly, on batches small enough to count by hand, and each planted layout bug shown
reaching its layout through a named case. The cases compare outputs only; the ranking reads the counters
(`Stats`), so a layout that groups, gathers or counts wrongly while its outputs stay right would rank wrongly.
`nox -s kvlab-mutation` runs these against every layouts mutant, beside the cases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import pytest

from builders.kvlab import kernel
from builders.kvlab.cases import CASES
from builders.kvlab.check import run_case
from builders.kvlab.lab import Lab
from builders.kvlab.layouts import LAYOUTS, Entry, Span, VirtualContiguous, csr_seq_len, spans_of, to_csr
from builders.kvlab.pool import Request
from builders.kvlab.spec import AttnSpec
from builders.kvlab.store import KVStore

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
    assert all(type(count) is int for count in stats.values()), stats
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


def test_a_planted_kernel_bug_reaches_the_hybrid_merge() -> None:
    # The hybrid layout hands its kernel switches to kernel.merge too: merge-without-max overflows at logits 200.
    case = next(c for c in CASES if c.name == "logits-200")
    assert run_case(case, "hybrid").passed
    assert not run_case(case, "hybrid", kernel_bug="merge-without-max").passed


def test_each_layout_refuses_a_bug_it_does_not_plant() -> None:
    spec = AttnSpec(num_heads=2, num_kv_heads=2, head_size=4)
    for name, cls in LAYOUTS.items():
        with pytest.raises(ValueError) as caught:
            cls(BLOCK, spec, bug="nope")
        assert str(caught.value) == f"layout {name} has no planted bug 'nope'; known: {', '.join(cls.bugs)}"
        assert cls(BLOCK, spec, bug=next(iter(cls.bugs))).bug == next(iter(cls.bugs))
        with pytest.raises(ValueError) as caught:
            cls(BLOCK, spec, kernel_bug="nope")
        assert str(caught.value) == f"no planted kernel bug 'nope'; known: {', '.join(kernel.KERNEL_BUGS)}"
        planted = next(iter(kernel.KERNEL_BUGS))
        assert getattr(cls(BLOCK, spec, kernel_bug=planted).kernel_bugs, kernel.KERNEL_BUGS[planted][0]) is True


def _entry(block_ids: tuple[int, ...], seq_len: int) -> Entry:
    return Entry(req_id="e", block_ids=block_ids, seq_len=seq_len, query=np.zeros((1, 2, 4), np.float32))


def test_the_exchange_format_is_flashinfers_int32_csr() -> None:
    csr = to_csr([_entry((3, 4), 5), _entry((), 0), _entry((7,), 4)], BLOCK)
    assert csr.kv_indptr.dtype == csr.kv_indices.dtype == csr.kv_last_page_len.dtype == np.int32
    assert csr.kv_indptr.tolist() == [0, 2, 2, 3] and csr.kv_indices.tolist() == [3, 4, 7]
    assert csr.kv_last_page_len[[0, 2]].tolist() == [1, 4]
    assert [csr_seq_len(csr, i, BLOCK) for i in range(3)] == [5, 0, 4]


def test_spans_are_runs_of_following_blocks_from_the_first_page_without_the_null_page() -> None:
    assert spans_of([1, 2, 3]) == [Span(0, 1, 3)]
    assert spans_of([1, 2, 5, 6]) == [Span(0, 1, 2), Span(2, 5, 2)]
    assert spans_of([4, 3]) == [Span(0, 4, 1), Span(1, 3, 1)]
    assert spans_of([0, 0, 3, 4]) == [Span(2, 3, 2)]
    assert spans_of([7, 0, 8]) == [Span(0, 7, 1), Span(2, 8, 1)]
    assert spans_of([3, 4, 9, 10], first_page=2) == [Span(2, 9, 2)]
    # The planted merge-across-gap rule: any higher block joins the run.
    assert spans_of([1, 2, 5], merge_any_ascending=True) == [Span(0, 1, 3)]


def test_spans_start_at_the_windows_first_page() -> None:
    # Block 5 is still held but wholly before the window: it is not a run the attention reads.
    spec = AttnSpec(num_heads=2, num_kv_heads=2, head_size=4, sliding_window=5)
    store = KVStore(16, BLOCK, spec)
    rng = np.random.default_rng(0)
    for block in (5, 9, 10):
        store.k[block], store.v[block] = rng.standard_normal((2, BLOCK, 2, 4)).astype(np.float32)
    entry = Entry(req_id="e", block_ids=(5, 9, 10), seq_len=12, query=rng.standard_normal((1, 2, 4)).astype(np.float32))
    spans, paged = LAYOUTS["spans"](BLOCK, spec), LAYOUTS["paged"](BLOCK, spec)
    assert np.array_equal(spans.attend([entry], store)[0], paged.attend([entry], store)[0])
    assert (spans.stats.index_lookups, spans.stats.metadata_bytes, spans.stats.kv_tokens_read) == (1, 20, 5)


def test_the_virtual_buffer_is_kept_while_it_fits_and_copies_only_what_changed() -> None:
    lab, requests, entries = _shared_batch()
    layout = VirtualContiguous(BLOCK, lab.spec)
    layout.attend(entries, lab.store)
    before = dict(layout.buffers)
    assert {r: b.k.shape[0] for r, b in before.items()} == {"a": 12, "b": 16, "c": 8, "a2": 12, "f": 8}
    copied = layout.stats.copy_bytes
    for request in requests:
        lab.compute(request, lab.prompt(1))
    entries = [lab.entry(r) for r in requests]
    for request, entry, out in zip(requests, entries, layout.attend(entries, lab.store), strict=True):
        assert np.allclose(out, lab.expected(request, entry), atol=2e-5, rtol=0), request.req_id
    # Each request's last block changed (f's is new); nothing else is copied again.
    assert layout.stats.copy_bytes - copied == 5 * BLOCK * BYTES_PER_TOKEN
    assert all(layout.buffers[r] is before[r] for r in ("a", "b", "c", "a2"))
    # f outgrew its 8 rows: a new reservation of twice the old, its mapped blocks carried over.
    assert layout.buffers["f"] is not before["f"] and layout.buffers["f"].k.shape[0] == 16

"""Mutation testing of the KV lab's implementation with mutmut: `nox -s kvlab-mutation`, or
`python -m builders.kvlab.mutation [module ...]`.

The planted bugs of mutants.py are ones the lab's authors thought of; mutmut makes every small change it can
(operators, constants, arguments) to the pool, the kernels, the layouts and the store, and runs the tests that
reach the changed function against each. A mutant no test notices either shows a gap in the cases or changes
nothing observable (an equivalent mutant): EQUIVALENT lists those, each with the argument why.

Each module runs on its own, in a fresh copy under build/kvlab-mutation/<module> (mutmut writes its mutants/
folder beside the code it mutates), under a wall-clock limit: a run cut short reports what it checked. Each
module's result is kept in reports/kvlab-mutation/<module>.json, so modules can be run one at a time; the
summary (summary.md, summary.json) covers every module result there. Code that only plants the lab's own
bugs (kernel.py's `# pragma: no mutate block` blocks) is not mutated: it is the harness, not the kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("store", "kernel", "pool", "layouts")
TESTS = (
    "tests/kvlab/test_kvlab_cases.py",
    "tests/kvlab/test_kvlab_pool.py",
    "tests/kvlab/test_kvlab_layouts.py",
    "tests/kvlab/test_kvlab_rank.py",
)
"""Every case as its own test, the pool's refusals and invariant checks, the layouts' counters counted by hand and
their planted bugs' switches, and the ranking."""

EQUIVALENT: dict[tuple[str, str], str] = {
    # (module, the mutated line as mutmut shows it after "+") -> why no test can tell
    ("store", "self.block_size = None"): "KVStore.block_size is kept for callers; nothing in the lab reads it",
    ("store", "self.k: Array = np.full(shape, None, dtype=np.float32)"): "None fills a float32 array with NaN",
    ("store", "self.v: Array = np.full(shape, None, dtype=np.float32)"): "None fills a float32 array with NaN",
    ("store", "self.k[block_id] = None"): "None assigned into a float32 array is NaN",
    ("store", "self.v[block_id] = None"): "None assigned into a float32 array is NaN",
    ("store", "if self.spec.k_scale is not None or self.spec.v_scale is not None:"): (
        "AttnSpec refuses one scale without the other, so `or` and `and` agree on every spec"
    ),
    ("store", "blocks = np.fromiter((s[0] for s in slots), dtype=np.int64, )"): "count is only a preallocation hint",
    ("store", "offsets = np.fromiter((s[1] for s in slots), dtype=np.int64, )"): "count is only a preallocation hint",
    ("pool", 'digest.update(b"XX,XX".join(str(t).encode() for t in tokens))'): (
        "any separator that is not a digit keeps token lists apart"
    ),
    ("pool", 'block.block_hash = ""'): "a fresh block's hash is only tested against None before it is set",
    ("pool", "limit = max(1, len(tokens) - 1) // b"): (
        "differs only for an empty prompt at block size 1, where no cached block has no tokens"
    ),
    ("pool", "request.blocks = None"): "the request has left the pool; nothing reads its table again",
    ("pool", "self._head = KVBlock(None)"): "the free queue's sentinel ids are never read",
    ("pool", "self._head = KVBlock(+1)"): "the free queue's sentinel ids are never read",
    ("pool", "self._head = KVBlock(-2)"): "the free queue's sentinel ids are never read",
    ("pool", "self._tail = KVBlock(None)"): "the free queue's sentinel ids are never read",
    ("pool", "self._tail = KVBlock(+2)"): "the free queue's sentinel ids are never read",
    ("pool", "self._tail = KVBlock(-3)"): "the free queue's sentinel ids are never read",
    ("pool", "if block.prev is None and block.next is None:"): (
        "a block is linked on both sides or on neither (append, appendleft and remove set both), so and/or agree"
    ),
    (
        "layouts",
        "flat_k = store.k.reshape(-2, *store.k.shape[2:])",
    ): "NumPy takes any negative reshape size as the one to infer",
    (
        "layouts",
        "flat_v = store.v.reshape(-2, *store.v.shape[2:])",
    ): "NumPy takes any negative reshape size as the one to infer",
    (
        "layouts",
        "ks.append(store.k[run].reshape(-2, *store.k.shape[2:])[lo - base : hi - base])",
    ): "NumPy takes any negative reshape size as the one to infer",
    (
        "layouts",
        "vs.append(store.v[run].reshape(-2, *store.v.shape[2:])[lo - base : hi - base])",
    ): "NumPy takes any negative reshape size as the one to infer",
    (
        "layouts",
        "positions = np.arange(self.first_key(entry), end, dtype=None)",
    ): "np.arange of Python ints is int64 already; the dtype only states it",
    (
        "layouts",
        "positions = np.arange(self.first_key(entry), end, )",
    ): "np.arange of Python ints is int64 already; the dtype only states it",
    (
        "layouts",
        "return 0 if (pages == 0) and False else (pages - 1) * block_size + int(csr.kv_last_page_len[i])",
    ): "to_csr gives a request with no pages kv_last_page_len = block size, so the formula gives 0 too",
    (
        "layouts",
        "if hi < lo:",
    ): "unreachable: the runs start at the window's first page and end at seq_len's, so every run has hi > lo",
    (
        "layouts",
        "break",
    ): "unreachable: the runs start at the window's first page and end at seq_len's, so every run has hi > lo",
    (
        "layouts",
        "run = slice(span.physical_block, None)",
    ): "the run's rows past its last block are cut off by the [lo - base : hi - base] slice",
    (
        "layouts",
        "ks, vs, positions = None",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[1, :0]], [store.v[0, :0]], [np.arange(0)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[0, :1]], [store.v[0, :0]], [np.arange(0)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[0, :0]], [store.v[1, :0]], [np.arange(0)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[0, :0]], [store.v[0, :1]], [np.arange(0)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[0, :0]], [store.v[0, :0]], [np.arange(None)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "ks, vs, positions = [store.k[0, :0]], [store.v[0, :0]], [np.arange(1)]",
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    (
        "layouts",
        "shape = (max(capacity, 2 * (buffer.k.shape[0] if buffer else 1)), *store.k.shape[2:])",
    ): "a first buffer is max(capacity, 2) rows, capacity ≥ 1 block: only a one-block buffer at block size 1 differs, and the attention reads [first:seq_len] either way",
    (
        "layouts",
        "grown = _Buffer(np.full(shape, None, np.float32), np.full(shape, np.nan, np.float32))",
    ): "None written into a float32 array is NaN",
    (
        "layouts",
        "grown = _Buffer(np.full(shape, np.nan, np.float32), np.full(shape, None, np.float32))",
    ): "None written into a float32 array is NaN",
    ("layouts", "buffer.k[region] = None"): "None written into a float32 array is NaN",
    ("layouts", "buffer.v[region] = None"): "None written into a float32 array is NaN",
    (
        "layouts",
        "moved = None",
    ): "a block already synced never moves in the lab (only the window changes one, to the null block, handled above), so `grew` decides every copy",
    (
        "layouts",
        "head = entry.block_ids[0] if (entry.block_ids) or True else NULL_BLOCK_ID",
    ): "every entry has a query, so at least one token and one block",
    (
        "layouts",
        "common = 1",
    ): "a group's members share their first block by construction; starting the count at 1 skips a comparison that holds",
    (
        "layouts",
        "tables[1][common] != NULL_BLOCK_ID",
    ): "evaluated only when every table holds the same block there, so tables[1] and tables[0] agree",
    (
        "layouts",
        "return store.k[1, :0], store.v[0, :0]",
    ): "an empty slice of block 1 is the same empty array as one of block 0",
    (
        "layouts",
        "return store.k[0, :0], store.v[1, :0]",
    ): "an empty slice of block 1 is the same empty array as one of block 0",
    (
        "layouts",
        "start, stop = max(lo, logical * b) - logical * b, min(hi, (logical + 2) * b) - logical * b",
    ): "a slice past the block's end stops at the block size: only the last block's stop can be below b, and there (l + 1)·b ≥ hi",
    (
        "layouts",
        "k, v = self._gather(store, entries[1].block_ids, lo, prefix)",
    ): "the shared prefix is the same blocks in every member's table; a group with a prefix has two members or more",
    (
        "layouts",
        "out, lse = self._kernel(entries[1], k, v, np.arange(lo, max(lo, prefix)), queries, q_pos)",
    ): "the shared prefix is the same blocks in every member's table; a group with a prefix has two members or more",
    (
        "layouts",
        "out, lse = self._kernel(None, k, v, np.arange(lo, max(lo, prefix)), queries, q_pos)",
    ): "_kernel reads the entry only for the query and positions, which the prefix call passes itself",
    (
        "layouts",
        'n_blocks = entry.seq_len / b if self.bug == "last-block-dropped" else _cdiv(entry.seq_len, b)',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        'end = n_blocks / b if self.bug == "reads-whole-last-block" else min(entry.seq_len, n_blocks * b)',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "last[i] = entry.seq_len / block_size if last_page_mod else entry.seq_len - (len(pages) - 1) * block_size",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "if follows and (physical >= end - 1 if merge_any_ascending else physical == end):",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "if follows and (physical > end - 2 if merge_any_ascending else physical == end):",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "k_pos = None",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "k_pos = np.arange(None)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        'end = entry.seq_len + 1 if self.bug == "seq-len-minus-one" else entry.seq_len',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        'end = entry.seq_len - 2 if self.bug == "seq-len-minus-one" else entry.seq_len',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "groups.append(None)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "groups.append((members, common / b))",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = None",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(None, key=lambda j: entries[j].seq_len)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(range(len(entries)), key=None)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(key=lambda j: entries[j].seq_len)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(range(len(entries)), )",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(range(None), key=lambda j: entries[j].seq_len)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "longest = max(range(len(entries)), key=lambda j: None)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "firsts = None",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "firsts = [firsts[longest]] / len(entries)",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = None",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] + prefix_parts[j][0]) / 2).astype(None), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] + prefix_parts[j][0]) * 2).astype(np.float32), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] - prefix_parts[j][0]) / 2).astype(np.float32), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[1] + prefix_parts[j][0]) / 2).astype(np.float32), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] + prefix_parts[j][1]) / 2).astype(np.float32), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] + prefix_parts[j][0]) / 3).astype(np.float32), part[1])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "part = (((part[0] + prefix_parts[j][0]) / 2).astype(np.float32), part[2])",
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    ("pool", 'parent, request.tokens[index * b : (index + 2) * b], drop_parent=self.bug == "parentless-hash"'): (
        "the tokens list ends at the block's last token when its hash is taken, so a longer slice stops there"
    ),
    (
        "layouts",
        "return store.k[0, :0], store.v[0, :1]",
    ): "no keys, so no weights: einsum broadcasts V's one row to the weights' empty key axis and sums nothing",
    (
        "layouts",
        'window_slack=2 if bug == "window-off-by-one" else 0,',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        'slack = 2 if self.bug == "window-off-by-one" else 0',
    ): "planted-bug harness, not the layout: a change inside a planted bug's branch changes what the planted bug gets wrong, and its case still catches it (tests/kvlab/test_kvlab_layouts.py)",
    (
        "layouts",
        "return max(0, entry.q_start - self.spec.sliding_window + 1 + slack)",
    ): "slack is 0 but under the planted window-off-by-one, which then narrows the window instead and is still caught: planted-bug harness",
    ("kernel", "peak = np.where(np.isfinite(peak), peak, 1)"): (
        "only when both parts' LSEs are -inf: the weights are exp(-inf) = 0 whatever the peak, out 0, lse -inf"
    ),
    ("kernel", "with np.errstate(over=None):"): "exp of LSEs minus their maximum cannot overflow; only the planted "
    "merge-without-max overflows there",
    ("kernel", 'with np.errstate(divide="ignore", invalid="ignore", over=None):'): (
        "o·w and lse cannot overflow once the weights are ≤ 1; only the planted merge-without-max does"
    ),
    ("kernel", 'with np.errstate(divide="ignore", invalid="ignore", ):'): (
        "o·w and lse cannot overflow once the weights are ≤ 1; only the planted merge-without-max does"
    ),
    ("kernel", 'scores = np.einsum("qkgd,nkd->kgqn", grouped, k, dtype=None) * np.float32(scale)'): (
        "float32 operands give a float32 einsum; the dtype only states it"
    ),
    ("kernel", 'scores = np.einsum("qkgd,nkd->kgqn", grouped, k, ) * np.float32(scale)'): (
        "float32 operands give a float32 einsum; the dtype only states it"
    ),
    ("kernel", 'scores = np.einsum("QKGD,NKD->KGQN", grouped, k, dtype=np.float32) * np.float32(scale)'): (
        "einsum labels are letters of either case: the same contraction renamed"
    ),
    ("kernel", 'out = np.einsum("kgqn,nkd->kgqd", weights, v, dtype=None)'): (
        "float32 operands give a float32 einsum; the dtype only states it"
    ),
    ("kernel", 'out = np.einsum("kgqn,nkd->kgqd", weights, v, )'): (
        "float32 operands give a float32 einsum; the dtype only states it"
    ),
    ("kernel", 'out = np.einsum("KGQN,NKD->KGQD", weights, v, dtype=np.float32)'): (
        "einsum labels are letters of either case: the same contraction renamed"
    ),
    ("kernel", "return out.transpose(2, 0, 1, 3).reshape(n_q, -2, d), lse.transpose(2, 0, 1).reshape(n_q, -1)"): (
        "NumPy takes any negative reshape size as the one to infer"
    ),
    ("kernel", "return out.transpose(2, 0, 1, 3).reshape(n_q, -1, d), lse.transpose(2, 0, 1).reshape(n_q, -2)"): (
        "NumPy takes any negative reshape size as the one to infer"
    ),
    (
        "kernel",
        "peak = scores.max(axis=3, keepdims=True) if scores.shape[3] else np.full((*scores.shape[:3], 1), +np.inf)",
    ): "the next line replaces a non-finite peak by 0 either way",
    ("kernel", "peak = np.where(np.isfinite(peak), peak, 1).astype(np.float32)"): (
        "only for a query that sees no key: exp(-inf - 1) = 0 like exp(-inf), out 0, lse -inf"
    ),
    ("kernel", 'with np.errstate(over=None, invalid="ignore"):'): (
        "exp of scores minus their maximum cannot overflow; only the planted softmax-without-max does"
    ),
    ("kernel", 'with np.errstate(over="ignore", invalid=None):'): (
        "no NaN arises there outside the planted softmax-without-max (peaks are finite, masked scores -inf)"
    ),
    ("kernel", 'with np.errstate(invalid="ignore"):'): (
        "overflow there needs the planted softmax-without-max; the divide-guard twin of this line is killed"
    ),
    ("kernel", 'with np.errstate(over="ignore", ):'): (
        "the invalid it silenced is -inf - (-inf) only under the planted softmax-without-max; no NaN otherwise"
    ),
    ("kernel", "if spec.k_scale is None and spec.v_scale is None:"): (
        "AttnSpec refuses one scale without the other, so `or` and `and` agree on every spec"
    ),
}

STATUS = {0: "survived", 1: "killed", 3: "killed", 5: "no tests", 33: "no tests", 34: "skipped"}
STATUS |= dict.fromkeys((36, 24, -24, 152, 255), "timeout")
"""mutmut's exit codes (mutmut/stats.py). A timeout (36, or SIGXCPU at its CPU limit) is a mutant that made the
tests run on, e.g. a loop that no longer advances: noticed, so counted killed, as mutmut's own score does."""


@dataclass
class ModuleResult:
    module: str
    total: int = 0
    killed: int = 0
    survived: list[dict[str, str]] = field(default_factory=list)
    equivalent: list[dict[str, str]] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    not_checked: int = 0
    seconds: float = 0.0
    timed_out: bool = False


def prepare(work: Path, module: str) -> None:
    """A fresh copy of the package and the tests, with mutmut's settings for this one module."""
    if work.exists():
        shutil.rmtree(work)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "builders", work / "builders", ignore=ignore)
    (work / "tests" / "kvlab").mkdir(parents=True)
    for test in ROOT.glob("tests/kvlab/*.py"):
        shutil.copy2(test, work / "tests" / "kvlab" / test.name)
    selection = "\n    ".join(TESTS)
    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = builders\n"
        f"only_mutate = builders/kvlab/{module}.py\n"
        f"pytest_add_cli_args_test_selection =\n    {selection}\n"
        # The kernels silence the overflows they expect; a RuntimeWarning anywhere else is a changed computation.
        # One argument a line: mutmut reads a one-line value as a single argument.
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q\n    -W\n    error::RuntimeWarning\n"
        "\n[tool:pytest]\ntestpaths = tests\n"
    )


def _diff(work: Path, name: str) -> str:
    shown = subprocess.run(
        ["mutmut", "show", name], cwd=work, capture_output=True, text=True, check=False, timeout=60
    ).stdout
    added = [line[1:].strip() for line in shown.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line[1:].strip() for line in shown.splitlines() if line.startswith("-") and not line.startswith("---")]
    return added[0] if added else f"(removed) {removed[0]}" if removed else "(no diff shown)"


def collect(work: Path, module: str, result: ModuleResult) -> None:
    meta = work / "mutants" / "builders" / "kvlab" / f"{module}.py.meta"
    if not meta.exists():
        return
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    result.total = len(codes)
    for name, code in sorted(codes.items()):
        if code is None:
            result.not_checked += 1
            continue
        status = STATUS.get(code, "suspicious")
        if status in ("killed", "timeout"):
            result.killed += 1
            if status == "timeout":
                result.other["timeout (killed)"] = result.other.get("timeout (killed)", 0) + 1
        elif status == "survived":
            line = _diff(work, name)
            why = EQUIVALENT.get((module, line))
            entry = {"mutant": name.split(".")[-1], "change": line}
            if why:
                result.equivalent.append({**entry, "why": why})
            else:
                result.survived.append(entry)
        else:
            result.other[status] = result.other.get(status, 0) + 1


def run_module(module: str, *, timeout: float, children: int) -> ModuleResult:
    work = ROOT / "build" / "kvlab-mutation" / module
    prepare(work, module)
    result = ModuleResult(module)
    start = time.monotonic()
    result.timed_out = not _mutmut(work, [], timeout=timeout, children=children)
    result.seconds = round(time.monotonic() - start, 1)
    collect(work, module, result)
    return result


def _mutmut(work: Path, names: list[str], *, timeout: float, children: int) -> bool:
    """`mutmut run` in a prepared copy (every mutant, or the named ones), its output to mutmut.log there;
    False when it ran past the timeout."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with (work / "mutmut.log").open("w") as log:
        try:
            subprocess.run(
                ["mutmut", "run", "--max-children", str(children), *names],
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
    return True


def recheck_module(module: str, *, timeout: float, children: int) -> ModuleResult:
    """Re-check a kept run's survivors and unchecked mutants with today's tests, in a fresh copy (changing the
    kept copy's test selection would make mutmut reset every verdict), and fold the new verdicts into the kept
    run. A mutant killed before stays killed: tests are only ever added to the selection."""
    work = ROOT / "build" / "kvlab-mutation" / module
    meta = work / "mutants" / "builders" / "kvlab" / f"{module}.py.meta"
    if not meta.exists():
        return run_module(module, timeout=timeout, children=children)
    data = json.loads(meta.read_text())
    codes: dict[str, int | None] = data["exit_code_by_key"]
    names = [n for n, c in codes.items() if c is None or STATUS.get(c) not in ("killed", "timeout")]
    fresh = work.with_name(f"{module}-recheck")
    prepare(fresh, module)
    result = ModuleResult(module)
    start = time.monotonic()
    result.timed_out = not _mutmut(fresh, names, timeout=timeout, children=children)
    fresh_meta = fresh / "mutants" / "builders" / "kvlab" / f"{module}.py.meta"
    if fresh_meta.exists():
        new_codes = json.loads(fresh_meta.read_text())["exit_code_by_key"]
        for name in names:
            if new_codes.get(name) is not None:
                codes[name] = new_codes[name]
        meta.write_text(json.dumps(data))
    result.seconds = round(time.monotonic() - start, 1)
    collect(work, module, result)
    return result


def score(results: list[ModuleResult]) -> tuple[int, int, int]:
    """(killed, checked, equivalent): the killed share is killed / (checked - equivalent)."""
    killed = sum(r.killed for r in results)
    checked = sum(r.total - r.not_checked for r in results)
    equivalent = sum(len(r.equivalent) for r in results)
    return killed, checked, equivalent


def render(results: list[ModuleResult]) -> str:
    killed, checked, equivalent = score(results)
    share = killed / max(1, checked - equivalent)
    lines = [
        "| module | mutants | checked | killed | equivalent | survived | other | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        other = ", ".join(f"{n} {s}" for s, n in r.other.items()) or "-"
        cut = " (time limit)" if r.timed_out else ""
        lines.append(
            f"| {r.module} | {r.total} | {r.total - r.not_checked}{cut} | {r.killed} | {len(r.equivalent)} | "
            f"{len(r.survived)} | {other} | {r.seconds:g} |"
        )
    lines += ["", f"killed {killed} of {checked - equivalent} non-equivalent checked mutants: {share:.1%}", ""]
    for r in results:
        for s in r.survived:
            lines.append(f"- survived {r.module}: `{s['mutant']}`: `{s['change']}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("modules", nargs="*", default=list(MODULES), help=f"of {', '.join(MODULES)}")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per module (default 1800)")
    parser.add_argument("--children", type=int, default=2, help="mutants checked in parallel (default 2)")
    parser.add_argument("--min-killed", type=float, default=0.9, help="fail below this killed share (default 0.9)")
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="re-check only the kept run's survivors and unchecked mutants, with today's tests",
    )
    parser.add_argument("--report-only", action="store_true", help="only summarise the module results kept")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}")
    if shutil.which("mutmut") is None and not args.report_only:
        print("kvlab-mutation: mutmut is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    report = ROOT / "reports" / "kvlab-mutation"
    report.mkdir(parents=True, exist_ok=True)
    for module in [] if args.report_only else args.modules:
        if args.recheck:
            kept = report / f"{module}.json"
            before = json.loads(kept.read_text())["seconds"] if kept.exists() else 0.0
            result = recheck_module(module, timeout=args.timeout, children=args.children)
            result.seconds = round(result.seconds + before, 1)
        else:
            result = run_module(module, timeout=args.timeout, children=args.children)
        (report / f"{module}.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
        print(f"{module}: {result.killed} killed of {result.total - result.not_checked} checked", flush=True)
    results = [ModuleResult(**json.loads(path.read_text())) for m in MODULES if (path := report / f"{m}.json").exists()]
    for result in results:
        # A kept result is judged by today's EQUIVALENT list: an argument added since moves its survivors.
        still = []
        for entry in result.survived:
            why = EQUIVALENT.get((result.module, entry["change"]))
            if why:
                result.equivalent.append({**entry, "why": why})
            else:
                still.append(entry)
        result.survived = still
    text = render(results)
    (report / "summary.md").write_text(text)
    (report / "summary.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    print(text)
    killed, checked, equivalent = score(results)
    return 0 if checked and killed / max(1, checked - equivalent) >= args.min_killed else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Mutation testing of the KV lab's implementation with mutmut: `nox -s kvlab-mutation`, or
`python -m builders.kvlab.mutation [module ...]`.

The planted bugs of mutants.py are ones the lab's authors thought of; mutmut makes every small change it can
(operators, constants, arguments) to the pool, the kernels, the layouts and the store, and runs the tests that
reach the changed function against each. A mutant no test notices either shows a gap in the cases or changes
nothing observable (an equivalent mutant): EQUIVALENT lists those, each with the argument why, keyed by the
mutant's identity (module, function, line counted from the function's `def`, and the change), so that the same
text on another line is another mutant and counts as a survivor until it is argued.

Code that only plants the lab's own bugs is the harness, not the lab. kernel.py's and pool.py's planted-bug
branches sit in `# pragma: no mutate block`s and are not mutated; mutants in any other planted-bug branch (the
true arm of an `if` whose condition holds only with a planted bug switched on, SWITCHES) are left out of the score
by where they sit, never argued equivalent. The score reports the raw count (every checked mutant), the
harness-excluded and the equivalent-excluded counts, and the share killed of the rest; it fails below 90 %.

Each module runs on its own, in a fresh copy under build/kvlab-mutation/<module> (mutmut writes its mutants/
folder beside the code it mutates), under a wall-clock limit: a run cut short reports what it checked. Each
module's result is kept in reports/kvlab-mutation/<module>.json, so modules can be run one at a time; the
summary (summary.md, summary.json) covers every module result there."""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

from builders.results import Figure, LoadWatch, Result

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

STATUS = {0: "survived", 1: "killed", 3: "killed", 5: "no tests", 33: "no tests", 34: "skipped"}
STATUS |= dict.fromkeys((36, 24, -24, 152, 255), "timeout")
"""mutmut's exit codes (mutmut/stats.py). A timeout (36, or SIGXCPU at its CPU limit) is a mutant that made the
tests run on, e.g. a loop that no longer advances: noticed, so counted killed, as mutmut's own score does."""

SWITCHES = frozenset(
    {"bug", "bugs", "kernel_bug", "base2", "drop_parent", "k_scale_twice", "v_by_k_scale", "merge_any_ascending"}
    | {"last_page_mod"}
)
"""The names through which a planted bug is switched on (`self.bug == "merge-mean"`, `bugs.tile_heads`,
`merge_any_ascending`). Code that runs only when one is on is the planted-bug harness, not the lab."""


class MutantId(NamedTuple):
    """What a mutant is, wherever the code around it moves: its module, its function (Class.method), the line of
    the change counted from the function's `def`, and the change itself as `before → after` (the smallest
    expression or statement that differs, or `drop X` for a removed argument)."""

    module: str
    function: str
    line: int
    operator: str

    def __str__(self) -> str:
        return f"{self.module}:{self.function}+{self.line}: {self.operator}"


EQUIVALENT: dict[MutantId, str] = {
    # MutantId(module, function, line from its `def`, change) -> why no test can tell. Keyed by identity, not text:
    # the same text elsewhere (another line, another function) is another mutant, and counts until argued.
    MutantId(
        "store", "KVStore.__init__", 3, "block_size → None"
    ): "KVStore.block_size is kept for callers; nothing in the lab reads it",
    MutantId("store", "KVStore.__init__", 4, "np.nan → None"): "None fills a float32 array with NaN",
    MutantId("store", "KVStore.__init__", 5, "np.nan → None"): "None fills a float32 array with NaN",
    MutantId("store", "KVStore.poison", 1, "np.nan → None"): "None assigned into a float32 array is NaN",
    MutantId("store", "KVStore.poison", 2, "np.nan → None"): "None assigned into a float32 array is NaN",
    MutantId(
        "store",
        "KVStore.write",
        4,
        "self.spec.k_scale is not None and self.spec.v_scale is not None → self.spec.k_scale is not None or self.spec.v_scale is not None",
    ): "AttnSpec refuses one scale without the other, so `or` and `and` agree on every spec",
    MutantId("store", "KVStore.write", 7, "drop count=len(slots)"): "count is only a preallocation hint",
    MutantId("store", "KVStore.write", 8, "drop count=len(slots)"): "count is only a preallocation hint",
    MutantId(
        "kernel", "attend", 22, "dtype=np.float32 → dtype=None (1st)"
    ): "float32 operands give a float32 einsum; the dtype only states it",
    MutantId(
        "kernel", "attend", 22, "drop dtype=np.float32"
    ): "float32 operands give a float32 einsum; the dtype only states it",
    MutantId(
        "kernel", "attend", 22, "'qkgd,nkd->kgqn' → 'QKGD,NKD->KGQN'"
    ): "einsum labels are letters of either case: the same contraction renamed",
    MutantId("kernel", "attend", 43, "-np.inf → +np.inf"): "the next line replaces a non-finite peak by 0 either way",
    MutantId(
        "kernel", "attend", 44, "0 → 1"
    ): "only for a query that sees no key: exp(-inf - 1) = 0 like exp(-inf), out 0, lse -inf",
    MutantId(
        "kernel", "attend", 47, "over='ignore' → over=None (1st)"
    ): "exp of scores minus their maximum cannot overflow; only the planted softmax-without-max does",
    MutantId(
        "kernel", "attend", 47, "invalid='ignore' → invalid=None (2nd)"
    ): "no NaN arises there outside the planted softmax-without-max (peaks are finite, masked scores -inf)",
    MutantId(
        "kernel", "attend", 47, "drop over='ignore'"
    ): "overflow there needs the planted softmax-without-max; the divide-guard twin of this line is killed",
    MutantId(
        "kernel", "attend", 47, "drop invalid='ignore'"
    ): "the invalid it silenced is -inf - (-inf) only under the planted softmax-without-max; no NaN otherwise",
    MutantId(
        "kernel", "attend", 50, "over='ignore' → over=None (1st)"
    ): "exp of scores minus their maximum cannot overflow; only the planted softmax-without-max does",
    MutantId(
        "kernel", "attend", 50, "invalid='ignore' → invalid=None (2nd)"
    ): "no NaN arises there outside the planted softmax-without-max (peaks are finite, masked scores -inf)",
    MutantId(
        "kernel", "attend", 50, "drop over='ignore'"
    ): "overflow there needs the planted softmax-without-max; the divide-guard twin of this line is killed",
    MutantId(
        "kernel", "attend", 50, "drop invalid='ignore'"
    ): "the invalid it silenced is -inf - (-inf) only under the planted softmax-without-max; no NaN otherwise",
    MutantId(
        "kernel", "attend", 51, "dtype=np.float32 → dtype=None"
    ): "float32 operands give a float32 einsum; the dtype only states it",
    MutantId(
        "kernel", "attend", 51, "drop dtype=np.float32"
    ): "float32 operands give a float32 einsum; the dtype only states it",
    MutantId(
        "kernel", "attend", 51, "'kgqn,nkd->kgqd' → 'KGQN,NKD->KGQD'"
    ): "einsum labels are letters of either case: the same contraction renamed",
    MutantId("kernel", "attend", 57, "1 → 2 (2nd)"): "NumPy takes any negative reshape size as the one to infer",
    MutantId("kernel", "attend", 57, "1 → 2 (4th)"): "NumPy takes any negative reshape size as the one to infer",
    MutantId(
        "kernel", "merge", 8, "0 → 1"
    ): "only when both parts' LSEs are -inf: the weights are exp(-inf) = 0 whatever the peak, out 0, lse -inf",
    MutantId(
        "kernel", "merge", 15, "over='ignore' → over=None"
    ): "exp of LSEs minus their maximum cannot overflow; only the planted merge-without-max overflows there",
    MutantId(
        "kernel", "merge", 18, "over='ignore' → over=None (3rd)"
    ): "o·w and lse cannot overflow once the weights are ≤ 1; only the planted merge-without-max does",
    MutantId(
        "kernel", "merge", 18, "drop over='ignore'"
    ): "o·w and lse cannot overflow once the weights are ≤ 1; only the planted merge-without-max does",
    MutantId(
        "kernel",
        "dequantize",
        4,
        "spec.k_scale is None or spec.v_scale is None → spec.k_scale is None and spec.v_scale is None",
    ): "AttnSpec refuses one scale without the other, so `or` and `and` agree on every spec",
    MutantId("pool", "FreeBlockQueue.__init__", 1, "-1 → None"): "the free queue's sentinel ids are never read",
    MutantId("pool", "FreeBlockQueue.__init__", 1, "-1 → +1"): "the free queue's sentinel ids are never read",
    MutantId("pool", "FreeBlockQueue.__init__", 1, "1 → 2"): "the free queue's sentinel ids are never read",
    MutantId("pool", "FreeBlockQueue.__init__", 2, "-2 → None"): "the free queue's sentinel ids are never read",
    MutantId("pool", "FreeBlockQueue.__init__", 2, "-2 → +2"): "the free queue's sentinel ids are never read",
    MutantId("pool", "FreeBlockQueue.__init__", 2, "2 → 3"): "the free queue's sentinel ids are never read",
    MutantId(
        "pool",
        "FreeBlockQueue.remove",
        1,
        "block.prev is None or block.next is None → block.prev is None and block.next is None",
    ): "a block is linked on both sides or on neither (append, appendleft and remove set both), so and/or agree",
    MutantId("pool", "hash_block", 8, "b',' → b'XX,XX'"): "any separator that is not a digit keeps token lists apart",
    MutantId(
        "pool", "BlockPool._new_block", 6, "None → ''"
    ): "a fresh block's hash is only tested against None before it is set",
    MutantId(
        "pool", "BlockPool.cached_prefix", 3, "0 → 1"
    ): "differs only for an empty prompt at block size 1, where no cached block has no tokens",
    MutantId(
        "pool", "BlockPool.append", 21, "1 → 2"
    ): "the tokens list ends at the block's last token when its hash is taken, so a longer slice stops there",
    MutantId("pool", "BlockPool.free", 4, "[] → None"): "the request has left the pool; nothing reads its table again",
    MutantId(
        "layouts",
        "Layout.first_key",
        5,
        "entry.q_start - self.spec.sliding_window + 1 - slack → entry.q_start - self.spec.sliding_window + 1 + slack",
    ): "slack is 0 unless the planted window-off-by-one is on; there + narrows the window instead of widening it, and the planted bug's case still catches it",
    MutantId("layouts", "PagedTable.attend", 3, "1 → 2"): "NumPy takes any negative reshape size as the one to infer",
    MutantId("layouts", "PagedTable.attend", 4, "1 → 2"): "NumPy takes any negative reshape size as the one to infer",
    MutantId(
        "layouts", "PagedTable.attend", 14, "dtype=np.int64 → dtype=None"
    ): "np.arange of Python ints is int64 already; the dtype only states it",
    MutantId(
        "layouts", "PagedTable.attend", 14, "drop dtype=np.int64"
    ): "np.arange of Python ints is int64 already; the dtype only states it",
    MutantId(
        "layouts", "csr_seq_len", 2, "pages == 0 → pages == 0 and False"
    ): "to_csr gives a request with no pages kv_last_page_len = block size, so the formula gives 0 too",
    MutantId(
        "layouts", "CompactSpans.attend", 16, "hi <= lo → hi < lo"
    ): "unreachable: the runs start at the window's first page and end at seq_len's, so every run has hi > lo",
    MutantId(
        "layouts", "CompactSpans.attend", 17, "continue → break"
    ): "unreachable: the runs start at the window's first page and end at seq_len's, so every run has hi > lo",
    MutantId(
        "layouts", "CompactSpans.attend", 19, "span.physical_block + span.num_blocks → None"
    ): "the run's rows past its last block are cut off by the [lo - base : hi - base] slice",
    MutantId(
        "layouts", "CompactSpans.attend", 20, "1 → 2"
    ): "NumPy takes any negative reshape size as the one to infer",
    MutantId(
        "layouts", "CompactSpans.attend", 21, "1 → 2"
    ): "NumPy takes any negative reshape size as the one to infer",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "([store.k[0, :0]], [store.v[0, :0]], [np.arange(0)]) → None"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → 1 (1st)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → 1 (2nd)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → 1 (3rd)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → 1 (4th)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → None (5th)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "CompactSpans.attend", 24, "0 → 1 (5th)"
    ): "unreachable: a query sees at least its own key, in a live block at or after the window's first page, so a request has a run",
    MutantId(
        "layouts", "VirtualContiguous._sync", 6, "0 → 1 (2nd)"
    ): "a first buffer is max(capacity, 2) rows, capacity ≥ 1 block: only a one-block buffer at block size 1 differs, and the attention reads [first:seq_len] either way",
    MutantId(
        "layouts", "VirtualContiguous._sync", 7, "np.nan → None (1st)"
    ): "None written into a float32 array is NaN",
    MutantId(
        "layouts", "VirtualContiguous._sync", 7, "np.nan → None (2nd)"
    ): "None written into a float32 array is NaN",
    MutantId("layouts", "VirtualContiguous._sync", 20, "np.nan → None"): "None written into a float32 array is NaN",
    MutantId("layouts", "VirtualContiguous._sync", 21, "np.nan → None"): "None written into a float32 array is NaN",
    MutantId(
        "layouts", "VirtualContiguous._sync", 24, "buffer.mapped.get(logical) != physical → None"
    ): "a block already synced never moves in the lab (only the window changes one, to the null block, handled above), so `grew` decides every copy",
    MutantId(
        "layouts", "HybridPrefixShared._groups", 6, "entry.block_ids → entry.block_ids or True (2nd)"
    ): "every entry has a query, so at least one token and one block",
    MutantId(
        "layouts", "HybridPrefixShared._groups", 16, "0 → 1"
    ): "a group's members share their first block by construction; starting the count at 1 skips a comparison that holds",
    MutantId(
        "layouts", "HybridPrefixShared._groups", 18, "0 → 1"
    ): "evaluated only when every table holds the same block there, so tables[1] and tables[0] agree",
    MutantId(
        "layouts", "HybridPrefixShared._gather", 3, "0 → 1 (1st)"
    ): "an empty slice of block 1 is the same empty array as one of block 0",
    MutantId(
        "layouts", "HybridPrefixShared._gather", 3, "0 → 1 (3rd)"
    ): "an empty slice of block 1 is the same empty array as one of block 0",
    MutantId(
        "layouts", "HybridPrefixShared._gather", 3, "0 → 1 (4th)"
    ): "no keys, so no weights: einsum broadcasts V's one row to the weights' empty key axis and sums nothing",
    MutantId(
        "layouts", "HybridPrefixShared._gather", 6, "1 → 2"
    ): "a slice past the block's end stops at the block size: only the last block's stop can be below b, and there (l + 1)·b ≥ hi",
    MutantId(
        "layouts", "HybridPrefixShared.attend", 12, "0 → 1"
    ): "the shared prefix is the same blocks in every member's table; a group with a prefix has two members or more",
    MutantId(
        "layouts", "HybridPrefixShared.attend", 15, "entries[0] → None"
    ): "_kernel reads the entry only for the query and positions, which the prefix call passes itself",
    MutantId(
        "layouts", "HybridPrefixShared.attend", 15, "0 → 1"
    ): "the shared prefix is the same blocks in every member's table; a group with a prefix has two members or more",
}


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """One mutant as its source shows it: identity, the changed line after the change, and whether the change
    sits in planted-bug harness code (an `if` arm that only runs with a planted bug switched on)."""

    name: str
    id: MutantId
    change: str
    harness: bool


def function_name(mangled: str) -> str:
    """mutmut's `xǁHybridLayoutǁ_groups` → `HybridLayout._groups`; `x_spans_of` → `spans_of`."""
    if mangled.startswith("xǁ"):
        return ".".join(mangled[2:].split("ǁ"))
    return mangled.removeprefix("x_")


def _show(node: ast.AST) -> str:
    return ast.unparse(node) if isinstance(node, ast.AST) else repr(node)


# Operators and contexts carry no line of their own: a change to one is shown as the expression holding it.
_NO_LINE = (ast.operator, ast.boolop, ast.cmpop, ast.unaryop, ast.expr_context)
_Path = tuple[tuple[ast.AST, str], ...]


def _differences(a: ast.AST, b: ast.AST, path: _Path) -> list[tuple[ast.AST, str, _Path]]:
    """The smallest differing nodes of two trees: (node of a, `before → after`, its ancestors with the field each
    child sits in)."""
    if type(a) is not type(b) or (isinstance(a, ast.Constant) and repr(a.value) != repr(getattr(b, "value", None))):
        return [(a, f"{_show(a)} → {_show(b)}", path)]
    found: list[tuple[ast.AST, str, _Path]] = []
    for name, left in ast.iter_fields(a):
        right = getattr(b, name, None)
        inner = (*path, (a, name))
        if isinstance(left, _NO_LINE) or isinstance(right, _NO_LINE):
            if type(left) is not type(right):
                return [(a, f"{_show(a)} → {_show(b)}", path)]
        elif isinstance(left, ast.AST) and isinstance(right, ast.AST):
            found += _differences(left, right, inner)
        elif isinstance(left, list) and isinstance(right, list):
            if len(left) == len(right):
                for x, y in zip(left, right, strict=True):
                    if isinstance(x, _NO_LINE) or isinstance(y, _NO_LINE):
                        if type(x) is not type(y):  # a comparison's operator: `is not` → `is`
                            found.append((a, f"{_show(a)} → {_show(b)}", path))
                    elif isinstance(x, ast.AST) and isinstance(y, ast.AST):
                        found += _differences(x, y, inner)
                    elif x != y:
                        found.append((a, f"{_show(a)} → {_show(b)}", path))
            else:
                # An argument dropped (or added): named by itself, located at itself.
                kept = [ast.dump(y) for y in right]
                dropped = [x for x in left if isinstance(x, ast.AST) and ast.dump(x) not in kept]
                if len(dropped) == 1 and len(left) == len(right) + 1:
                    found.append((dropped[0], f"drop {_show(dropped[0])}", inner))
                else:
                    found.append((a, f"{_show(a)} → {_show(b)}", path))
        elif left != right:
            found.append((a, f"{_show(a)} → {_show(b)}", path))
    return found


def _implies_a_planted_bug(test: ast.expr) -> bool:
    """The condition holds only with a planted bug switched on: `S == "name"`, a bare switch (`bugs.tile_heads`,
    `merge_any_ascending`), an `or` of such conditions, or an `and` with one among its operands."""
    if isinstance(test, ast.BoolOp):
        parts = [_implies_a_planted_bug(v) for v in test.values]
        return any(parts) if isinstance(test.op, ast.And) else all(parts)
    if isinstance(test, ast.Compare):
        return (
            len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and _is_switch(test.left)
            and isinstance(test.comparators[0], ast.Constant)
            and isinstance(test.comparators[0].value, str)
        )
    return _is_switch(test)


def _is_switch(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SWITCHES
    if isinstance(node, ast.Attribute):
        return node.attr in SWITCHES or _is_switch(node.value)
    return False


def _in_harness(path: _Path) -> bool:
    """Whether a node under these ancestors runs only in a planted bug's branch (an `if`'s or a conditional
    expression's true arm whose condition implies a planted bug)."""
    return any(
        isinstance(node, ast.If | ast.IfExp) and field == "body" and _implies_a_planted_bug(node.test)
        for node, field in path
    )


def _operator(node: ast.AST, text: str, path: _Path, function: ast.AST) -> str:
    """The change as it reads in the source: a keyword's value with its keyword (`over='ignore' → over=None`), and
    an ordinal where the same text occurs more than once on its line (`1 → 2 (2nd)`), so that two sites on one line
    never share an identity."""
    if path and isinstance(path[-1][0], ast.keyword) and path[-1][0].arg:
        word = path[-1][0].arg
        before, _, after = text.partition(" → ")
        text = f"{word}={before} → {word}={after}"
    line = getattr(node, "lineno", None)
    if line is None:
        return text
    shown = _show(node)
    same = sorted(
        getattr(n, "col_offset", 0)
        for n in ast.walk(function)
        if type(n) is type(node) and getattr(n, "lineno", None) == line and _show(n) == shown
    )
    if len(same) < 2:
        return text
    place = same.index(getattr(node, "col_offset", 0)) + 1
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(place if place < 20 else place % 10, "th")
    return f"{text} ({place}{suffix})"


def read_mutants(source: str, module: str) -> dict[str, Mutant]:
    """Every mutant in a mutmut 3 mutants file (`mutants/builders/kvlab/<module>.py`), by its name as mutmut's
    meta keys it (`builders.kvlab.<module>.xǁClassǁmethod__mutmut_7`)."""
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            functions[node.name] = node
    lines = source.splitlines()
    found: dict[str, Mutant] = {}
    for name, mutant in functions.items():
        mangled, _, number = name.rpartition("__mutmut_")
        orig = functions.get(f"{mangled}__mutmut_orig")
        if number == "orig" or orig is None:
            continue
        # The whole definition, its signature's defaults included; the names differ by construction.
        renamed = ast.parse(ast.unparse(mutant)).body[0]
        assert isinstance(renamed, ast.FunctionDef | ast.AsyncFunctionDef)
        renamed.name = orig.name
        diffs = _differences(orig, renamed, ())
        if not diffs:
            continue
        node = diffs[0][0]
        line = getattr(node, "lineno", orig.lineno) - orig.lineno
        changed = mutant.lineno + line
        found[f"builders.kvlab.{module}.{name}"] = Mutant(
            name=name,
            id=MutantId(module, function_name(mangled), line, "; ".join(_operator(n, t, p, orig) for n, t, p in diffs)),
            change=lines[changed - 1].strip() if 0 < changed <= len(lines) else "",
            harness=all(_in_harness(p) for _, _, p in diffs),
        )
    return found


@dataclass
class ModuleResult:
    """One module's run. Every mutant mutmut made and checked is in `total - not_checked` (the raw count); of
    those, `harness` (planted-bug branches, left out by where they sit, whatever their verdict) and `equivalent`
    (survivors argued equivalent by identity in EQUIVALENT) are left out of the score; `killed` and `survived`
    are the rest's."""

    module: str
    total: int = 0
    killed: int = 0
    survived: list[dict[str, str | int]] = field(default_factory=list)
    equivalent: list[dict[str, str | int]] = field(default_factory=list)
    harness: list[dict[str, str | int]] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    not_checked: int = 0
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def checked(self) -> int:
        return self.total - self.not_checked

    @property
    def raw_killed(self) -> int:
        return self.killed + sum(1 for h in self.harness if h["status"] in ("killed", "timeout"))

    def judge(self, equivalent: Mapping[MutantId, str] | None = None) -> None:
        """Sort the survivors again by today's EQUIVALENT: an argument added since moves its mutant, one whose
        mutant moved to another line or changed no longer excuses it."""
        table = EQUIVALENT if equivalent is None else equivalent
        entries = self.survived + self.equivalent
        self.survived, self.equivalent = [], []
        for entry in entries:
            entry = {k: v for k, v in entry.items() if k != "why"}
            why = table.get(identity(entry))
            (self.equivalent if why else self.survived).append({**entry, "why": why} if why else entry)


def identity(entry: dict[str, str | int]) -> MutantId:
    """A kept result's entry as the identity EQUIVALENT is keyed by."""
    return MutantId(str(entry["module"]), str(entry["function"]), int(entry["line"]), str(entry["operator"]))


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


def collect(work: Path, module: str, result: ModuleResult, *, equivalent: Mapping[MutantId, str] | None = None) -> None:
    """Every verdict of a mutmut run in `work`, each mutant read from the mutants file for its identity."""
    folder = work / "mutants" / "builders" / "kvlab"
    meta = folder / f"{module}.py.meta"
    if not meta.exists():
        return
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    mutants = read_mutants((folder / f"{module}.py").read_text(), module)
    result.total = len(codes)
    for name, code in sorted(codes.items()):
        if code is None:
            result.not_checked += 1
            continue
        status = STATUS.get(code, "suspicious")
        mutant = mutants.get(name)
        if mutant is None:  # mutmut's meta names a mutant its file lacks: a broken run, never a kill
            result.other["unreadable"] = result.other.get("unreadable", 0) + 1
            continue
        entry: dict[str, str | int] = {
            "mutant": name.split(".")[-1],
            **mutant.id._asdict(),
            "change": mutant.change,
        }
        if mutant.harness:
            result.harness.append({**entry, "status": status})
        elif status in ("killed", "timeout"):
            result.killed += 1
            if status == "timeout":
                result.other["timeout (killed)"] = result.other.get("timeout (killed)", 0) + 1
        elif status == "survived":
            result.survived.append(entry)
        else:
            result.other[status] = result.other.get(status, 0) + 1
    result.judge(equivalent)


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


@dataclass(frozen=True)
class Score:
    """The run's counts: raw (every checked mutant), the two kinds left out, and the share killed of the rest."""

    checked: int
    raw_killed: int
    harness: int
    equivalent: int
    killed: int

    @property
    def scored(self) -> int:
        return self.checked - self.harness - self.equivalent

    @property
    def share(self) -> float:
        return self.killed / max(1, self.scored)


def score(results: list[ModuleResult]) -> Score:
    return Score(
        checked=sum(r.checked for r in results),
        raw_killed=sum(r.raw_killed for r in results),
        harness=sum(len(r.harness) for r in results),
        equivalent=sum(len(r.equivalent) for r in results),
        killed=sum(r.killed for r in results),
    )


def render(results: list[ModuleResult]) -> str:
    total = score(results)
    lines = [
        "| module | mutants | checked | raw killed | harness-excluded | equivalent-excluded | killed | survived "
        "| other | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        other = ", ".join(f"{n} {s}" for s, n in r.other.items()) or "-"
        cut = " (time limit)" if r.timed_out else ""
        lines.append(
            f"| {r.module} | {r.total} | {r.checked}{cut} | {r.raw_killed} | {len(r.harness)} | "
            f"{len(r.equivalent)} | {r.killed} | {len(r.survived)} | {other} | {r.seconds:g} |"
        )
    lines += [
        "",
        f"raw: {total.raw_killed} of {total.checked} checked mutants killed ({total.raw_killed / max(1, total.checked):.1%})",
        f"left out: {total.harness} in planted-bug harness code, {total.equivalent} argued equivalent (EQUIVALENT)",
        f"score: killed {total.killed} of the other {total.scored}: {total.share:.1%}",
        "",
    ]
    for r in results:
        for s in r.survived:
            lines.append(f"- survived {identity(s)}: `{s['change']}`")
    return "\n".join(lines) + "\n"


def save(results: list[ModuleResult], args: argparse.Namespace, watch: LoadWatch) -> Path:
    """The run as results/kvlab-mutation.json: per module and in all, the raw, left-out and scored counts."""
    figures: dict[str, Figure | tuple[int | float, str]] = {}
    for r in [*results, None]:
        prefix, counted = (r.module, [r]) if r else ("all", results)
        total = score(counted)
        figures |= {
            f"{prefix}.mutants": (sum(x.total for x in counted), "count"),
            f"{prefix}.checked": (total.checked, "count"),
            f"{prefix}.raw_killed": (total.raw_killed, "count"),
            f"{prefix}.raw_share": (round(total.raw_killed / max(1, total.checked), 4), "ratio"),
            f"{prefix}.harness_excluded": (total.harness, "count"),
            f"{prefix}.equivalent_excluded": (total.equivalent, "count"),
            f"{prefix}.killed": (total.killed, "count"),
            f"{prefix}.scored": (total.scored, "count"),
            f"{prefix}.survived": (sum(len(x.survived) for x in counted), "count"),
            f"{prefix}.score": (round(total.share, 4), "ratio"),
            f"{prefix}.seconds": (round(sum(x.seconds for x in counted), 1), "s"),
        }
    return Result.capture(
        "kvlab-mutation",
        command=f"nox -s kvlab-mutation -- --children {args.children} --save",
        figures=figures,
        versions={"python": platform.python_version(), "mutmut": version("mutmut"), "numpy": version("numpy")},
        load=watch,
        source="reports/kvlab-mutation/summary.json",
        note=f"--children {args.children}, --timeout {args.timeout:g} s per module",
    ).save(ROOT)


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
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the score to results/kvlab-mutation.json (with every module run in this invocation)",
    )
    args = parser.parse_args(argv)
    watch = LoadWatch.start()
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
    results = []
    for module in MODULES:
        kept, work = report / f"{module}.json", ROOT / "build" / "kvlab-mutation" / module
        if args.report_only and (work / "mutants" / "builders" / "kvlab" / f"{module}.py.meta").exists():
            # The kept copy's verdicts, read again: today's identities and today's EQUIVALENT.
            before = json.loads(kept.read_text()) if kept.exists() else {}
            result = ModuleResult(module, seconds=before.get("seconds", 0.0), timed_out=before.get("timed_out", False))
            collect(work, module, result)
            kept.write_text(json.dumps(asdict(result), indent=2) + "\n")
        elif kept.exists():
            result = ModuleResult(**json.loads(kept.read_text()))
            result.judge()
        else:
            continue
        results.append(result)
    text = render(results)
    (report / "summary.md").write_text(text)
    total = score(results)
    summary = {"modules": [asdict(r) for r in results], "score": asdict(total) | {"share": total.share}}
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(text)
    if args.save:
        if args.report_only or sorted(args.modules) != sorted(MODULES):
            print("kvlab-mutation: --save needs a run of every module in this invocation", file=sys.stderr)
            return 2
        print(f"kvlab-mutation: wrote {save(results, args, watch)}", file=sys.stderr)
    return 0 if total.checked and total.share >= args.min_killed else 1


if __name__ == "__main__":
    raise SystemExit(main())

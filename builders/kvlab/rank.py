"""Ranking the layouts for hardware profiling, from what each one reads and how long it takes here.

One run measures, per layout, on decode steps (one new token per request per step):
- metadata bytes per request the attention reads (tables, spans, pointers);
- KV bytes read per step (a prefix attended once per group counts once) and KV bytes copied outside attention;
- indirections per request (one per token through a table, one per run of blocks, one per buffer);
- attention time per step against sequence length, fragmentation (fresh vs shuffled pool) and the share of
  each context that is a prefix common to the whole batch.

The rank follows the study's criteria, in this order of weight: a layout must pass every oracle case with each
of its planted bugs caught (a gate); then less metadata per request at the worst scenario, fewer KV bytes read
per step with a shared prefix, and fewer indirections, each ranked; the times measured here only break ties,
because NumPy on a CPU says little about a GPU kernel's speed. This ranks what each layout reads, not how fast it
runs: the speed ranking is `forge kvlab rank --device cuda` (gpu_bench.py), the Triton kernels on a GPU.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builders.kvlab.lab import Lab
from builders.kvlab.layouts import LAYOUTS, Layout
from builders.kvlab.pool import Request
from builders.kvlab.spec import AttnSpec

BATCH = 8
BLOCK_SIZE = 16


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    axis: str
    """"length", "fragmentation" or "sharing": which plot it belongs to."""
    seq_len: int
    fragment: str | None = None
    shared: float = 0.0
    """Fraction of each request's context that is a prefix common to the whole batch."""

    @property
    def label(self) -> str:
        if self.axis == "fragmentation":
            return self.fragment or "fresh"
        if self.axis == "sharing":
            return f"{self.shared:.0%}"
        return str(self.seq_len)


def scenarios(quick: bool = False) -> list[Scenario]:
    lengths = (64, 256) if quick else (128, 512, 2048)
    mid = lengths[-2]
    out = [Scenario(name=f"len-{n}", axis="length", seq_len=n, fragment="shuffled") for n in lengths]
    out += [
        Scenario(name=f"frag-{f or 'fresh'}", axis="fragmentation", seq_len=mid, fragment=f)
        for f in (None, "gapped", "shuffled")
    ]
    out += [Scenario(name=f"share-{int(s * 100)}", axis="sharing", seq_len=mid, shared=s) for s in (0.0, 0.5, 0.9)]
    return out


@dataclass
class Measure:
    ms_per_step: float
    metadata_bytes_per_request: float
    kv_bytes_read_per_step: float
    kv_bytes_copied_per_step: float
    indirections_per_request: float
    runs_per_request: float
    """Runs of physically contiguous blocks per table: the pool's fragmentation, the same for every layout."""
    blocks_per_request: float
    shared_fraction: float
    """Share of the batch's KV token slots held in blocks more than one request references."""


@dataclass
class LayoutResult:
    layout: str
    measures: dict[str, Measure] = field(default_factory=dict)


def _build(spec: AttnSpec, scenario: Scenario, seed: int) -> tuple[Lab, list[Request]]:
    blocks_needed = BATCH * (scenario.seq_len // BLOCK_SIZE + 4) + 8
    # The gapped pattern holds a third of the blocks, so give the pool room for it.
    lab = Lab(spec, block_size=BLOCK_SIZE, num_blocks=int(blocks_needed * 1.6), seed=seed, fragment=scenario.fragment)
    # V1 shares only full blocks, so the common prefix is whole blocks.
    shared_tokens = int(scenario.seq_len * scenario.shared) // BLOCK_SIZE * BLOCK_SIZE
    prefix = lab.prompt(shared_tokens)
    requests = []
    for i in range(BATCH):
        # Lengths differ a little, as in a real batch, so partial last blocks differ too.
        length = max(shared_tokens + 1, scenario.seq_len - 3 * i)
        requests.append(lab.admit(f"r{i}", prefix + lab.prompt(length - shared_tokens)))
    return lab, requests


def measure(layout_name: str, spec: AttnSpec, scenario: Scenario, *, steps: int, seed: int = 0) -> Measure:
    lab, requests = _build(spec, scenario, seed)
    layout: Layout = LAYOUTS[layout_name](BLOCK_SIZE, spec)
    layout.attend([lab.entry(r) for r in requests], lab.store)  # warm: the virtual layout maps its buffers here
    before = _snapshot(layout)
    times = []
    runs = 0.0
    for _ in range(steps):
        for request in requests:
            lab.compute(request, lab.prompt(1))
        entries = [lab.entry(r) for r in requests]
        # CPU time of this process, not wall time: on a machine shared with other work, wall time measures them.
        start = time.process_time()
        layout.attend(entries, lab.store)
        times.append(time.process_time() - start)
        runs += sum(_runs(r.block_ids) for r in requests) / len(requests)
    after = _snapshot(layout)
    calls = steps * len(requests)
    width = lab.store.bytes_per_token
    referenced = [lab.pool.blocks[b] for r in requests for b in r.block_ids]
    return Measure(
        # The fastest step: the slower ones measure cache and scheduler noise more than the layout.
        ms_per_step=min(times) * 1000,
        metadata_bytes_per_request=(after[0] - before[0]) / calls,
        kv_bytes_read_per_step=(after[1] - before[1]) * width / steps,
        kv_bytes_copied_per_step=(after[2] - before[2]) / steps,
        indirections_per_request=(after[3] - before[3]) / calls,
        runs_per_request=runs / steps,
        blocks_per_request=len(referenced) / len(requests),
        shared_fraction=sum(1 for b in referenced if b.ref_cnt > 1) / len(referenced),
    )


def _snapshot(layout: Layout) -> tuple[int, int, int, int]:
    s = layout.stats
    return s.metadata_bytes, s.kv_tokens_read, s.copy_bytes, s.index_lookups


def _runs(block_ids: Sequence[int]) -> int:
    return 1 + sum(1 for a, b in itertools.pairwise(block_ids) if b != a + 1)


def run_ranking(
    *, quick: bool = False, steps: int | None = None, progress: Callable[[str], None] | None = None
) -> list[LayoutResult]:
    """Every layout on every scenario, measured with `measure` (NumPy on the CPU)."""
    spec = AttnSpec(num_heads=16, num_kv_heads=4, head_size=128)
    steps = steps or (3 if quick else 16)
    results = []
    for name in LAYOUTS:
        result = LayoutResult(name)
        # Scenarios on two axes can be the same setting (the middle length on a shuffled pool): measured once.
        done: dict[tuple[int, str | None, float], Measure] = {}
        for scenario in scenarios(quick):
            setting = (scenario.seq_len, scenario.fragment, scenario.shared)
            if setting not in done:
                if progress:
                    progress(f"{name} · {scenario.name}")
                done[setting] = measure(name, spec, scenario, steps=steps)
            result.measures[scenario.name] = done[setting]
        results.append(result)
    return results


def _ranks(values: dict[str, float]) -> dict[str, float]:
    """1 for the smallest; ties share the mean of their places."""
    ordered = sorted(values, key=lambda k: values[k])
    ranks: dict[str, float] = {}
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and abs(values[ordered[j + 1]] - values[ordered[i]]) <= 1e-9 * max(
            1.0, abs(values[ordered[i]])
        ):
            j += 1
        for k in ordered[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


CRITERIA = (
    ("metadata", "metadata bytes per request, worst scenario"),
    ("kv_read", "KV bytes read per step at the highest prefix share"),
    ("indirections", "indirections per request, worst scenario"),
)


def rank(results: Sequence[LayoutResult], gate: dict[str, bool], *, quick: bool = False) -> list[dict[str, Any]]:
    """One row per layout, best first: its criteria values, their ranks, the score and the place."""
    names = [r.layout for r in results]
    top_share = next(s.name for s in reversed(scenarios(quick)) if s.axis == "sharing")
    longest = next(s.name for s in reversed(scenarios(quick)) if s.axis == "length")
    values = {
        "metadata": {r.layout: max(m.metadata_bytes_per_request for m in r.measures.values()) for r in results},
        "kv_read": {r.layout: r.measures[top_share].kv_bytes_read_per_step for r in results},
        "indirections": {r.layout: max(m.indirections_per_request for m in r.measures.values()) for r in results},
    }
    per_criterion = {key: _ranks(v) for key, v in values.items()}
    time_at_longest = {r.layout: r.measures[longest].ms_per_step for r in results}
    rows = []
    for name in names:
        score = sum(per_criterion[key][name] for key, _ in CRITERIA)
        rows.append(
            {
                "layout": name,
                "gate": gate.get(name, False),
                "values": {key: values[key][name] for key, _ in CRITERIA},
                "ranks": {key: per_criterion[key][name] for key, _ in CRITERIA},
                "score": score,
                "ms_at_longest": time_at_longest[name],
            }
        )
    rows.sort(key=lambda row: (not row["gate"], row["score"], row["ms_at_longest"]))
    for place, row in enumerate(rows, 1):
        row["place"] = place if row["gate"] else None
    return rows


def write_plots(results: Sequence[LayoutResult], directory: Path, *, quick: bool = False) -> Path:
    """rank.png: attention time per step against length, fragmentation and prefix share; KV bytes read vs share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    groups = [("length", "sequence length (tokens)"), ("fragmentation", "pool"), ("sharing", "shared prefix")]
    for panel, (axis, xlabel) in zip(axes, groups, strict=False):
        chosen = [s for s in scenarios(quick) if s.axis == axis]
        for result in results:
            panel.plot(
                [s.label for s in chosen],
                [result.measures[s.name].ms_per_step for s in chosen],
                marker="o",
                label=result.layout,
            )
        panel.set_xlabel(xlabel)
        panel.set_ylabel("attention ms per decode step (CPU, NumPy: not a GPU speed)")
        panel.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    sharing = [s for s in scenarios(quick) if s.axis == "sharing"]
    for result in results:
        axes[3].plot(
            [s.label for s in sharing],
            [result.measures[s.name].kv_bytes_read_per_step / 2**20 for s in sharing],
            marker="o",
            label=result.layout,
        )
    axes[3].set_xlabel("shared prefix")
    axes[3].set_ylabel("KV MiB read per step (fp16 width)")
    axes[3].grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"KV layouts: batch {BATCH}, block {BLOCK_SIZE}, 16 heads / 4 KV heads × 128; decode steps")
    fig.tight_layout()
    path = directory / "rank.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def as_json(results: Sequence[LayoutResult]) -> dict[str, Any]:
    return {r.layout: {name: vars(m) for name, m in r.measures.items()} for r in results}

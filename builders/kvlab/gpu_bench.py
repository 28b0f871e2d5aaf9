"""Timing the Triton layouts at sizes where memory bandwidth binds, against the GPU's ceiling and two anchors.

A decode step of one layer reads every request's K and V once: at batch 64 × 8K tokens, 8 KV heads × 128 in fp16,
that is 2 GiB, and nothing else the kernel does comes close. So each layout's time is printed beside the bytes it
moved, the GB/s that makes, and the share of the GPU's peak bandwidth (from PEAK_TBPS by product name, with a
measured device-to-device copy beside it). Anchors in the same run: PyTorch's scaled_dot_product_attention on
contiguous KV (what the virtual layout's range is), and FlashInfer's paged decode and cascade where the package
imports.

Timed: the layout's launches for one decode step of one layer, its metadata already on the device (vLLM builds
it once per step for every layer), with CUDA events, the L2 cache overwritten before each repetition, the median
of the repetitions. Each layout's output for sampled requests is checked against the NumPy oracle first, so a
wrong read cannot look fast. The same code runs on a CPU under Triton's interpreter at tiny sizes (a dry run of
the plumbing: its times mean nothing and it says so).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NotRequired, TypedDict

import numpy as np

from builders.kvlab.layouts import Entry
from builders.kvlab.oracle import reference_attention
from builders.kvlab.pool import BlockPool, Request
from builders.kvlab.spec import AttnSpec
from builders.kvlab.triton_layouts import TRITON_LAYOUTS, Cache, empty_cache, make_layout

PEAK_TBPS: tuple[tuple[str, float, str], ...] = (
    # (substring of torch.cuda.get_device_name(), TB/s, memory): vendors' datasheets. Most specific first.
    ("GH200", 4.0, "HBM3 96 GB (the 144 GB HBM3e part: 4.9)"),
    ("H200", 4.8, "HBM3e 141 GB"),
    ("H100 NVL", 3.9, "HBM3 94 GB"),
    ("H100 PCIe", 2.0, "HBM2e 80 GB"),
    ("H100", 3.35, "HBM3 80 GB (SXM5)"),
    ("H800", 3.35, "HBM3 80 GB"),
    ("H20", 4.0, "HBM3 96 GB"),
    ("B200", 8.0, "HBM3e 180 GB"),
    ("A100 80GB PCIe", 1.935, "HBM2e 80 GB"),
    ("A100-SXM4-80GB", 2.039, "HBM2e 80 GB"),
    ("A100", 1.555, "HBM2 40 GB"),
    ("L40S", 0.864, "GDDR6 48 GB"),
    ("L40", 0.864, "GDDR6 48 GB"),
    ("L4", 0.3, "GDDR6 24 GB"),
    ("A10", 0.6, "GDDR6 24 GB"),
    ("RTX 4090", 1.008, "GDDR6X 24 GB"),
    ("V100", 0.9, "HBM2 16/32 GB"),
    ("T4", 0.32, "GDDR6 16 GB"),
)
"""Peak memory bandwidth by product name, from the vendors' datasheets (TB/s = 10^12 bytes a second)."""

SPEC = AttnSpec(num_heads=32, num_kv_heads=8, head_size=128)
"""8 KV heads × 128 with 32 query heads (GQA 4), as Llama-3-8B's attention."""
PAGE = 16


@dataclass(frozen=True)
class GpuScenario:
    name: str
    batch: int
    context: int
    shared: float
    """Fraction of each context that is one prefix common to the whole batch (whole blocks)."""


SCENARIOS = (
    # The two the bars are judged on first, so a run cut short by its budget still has them.
    GpuScenario("b64-8k", 64, 8192, 0.0),
    GpuScenario("b64-8k-90", 64, 8192, 0.9),
    GpuScenario("b64-8k-50", 64, 8192, 0.5),
    GpuScenario("b1-16k", 1, 16384, 0.0),
    GpuScenario("b8-16k", 8, 16384, 0.0),
    GpuScenario("b64-2k", 64, 2048, 0.0),
)
HEADLINE = "b64-8k"
"""The issue's bar: the best layout reads KV at >= 60 % of peak here."""
CASCADE_AT = ("b64-8k-90",)
"""Cascade against paged on the same batch at 90 % shared prefix: >= 3x faster per step."""

DRY_SPEC = AttnSpec(num_heads=8, num_kv_heads=2, head_size=64)
DRY_SCENARIOS = (
    GpuScenario("dry-b2-48", 2, 48, 0.0),
    GpuScenario("dry-b3-64-50", 3, 64, 0.5),
)


class DeviceInfo(TypedDict):
    """What ran: the versions, the CPU, and on a GPU its name, driver, size and datasheet peak."""

    torch: str
    torch_cuda: str | None
    triton: str
    numpy: str
    python: str
    cpu: str
    cpu_cores: int | None
    gpu: NotRequired[str | None]
    driver: NotRequired[str | None]
    multiprocessors: NotRequired[int]
    memory_gib: NotRequired[float]
    peak_tbps: NotRequired[float | None]
    peak_source: NotRequired[str]


class CopyRow(TypedDict):
    bytes_moved: int
    ms: float
    gbps: float


class Row(TypedDict, total=False):
    """One layout's or anchor's row: its oracle check, what it moved and how fast, or why it was not timed."""

    oracle_max_error: float
    oracle_checked: list[str]
    splits: int
    launches: int
    kv_bytes: int
    metadata_bytes_per_request: float
    indirections_per_request: float
    copy_bytes_setup: int
    ms: float
    bytes_moved: int
    gbps: float
    share_of_peak: float | None
    effective_gbps: float
    failed: str
    skipped: str


class Layouts(TypedDict):
    """What the bars and the rank read of a scenario."""

    layouts: dict[str, Row]


class ScenarioRow(Layouts):
    name: str
    batch: int
    context: int
    shared: float
    logical_kv_bytes: int
    shared_slots: float
    anchors: dict[str, Row]


class HeadlineVerdict(TypedDict):
    layout: str
    share_of_peak: float | None
    bar: float
    met: bool


class CascadeVerdict(TypedDict):
    speedup: float
    bar: float
    met: bool


class Verdicts(TypedDict, total=False):
    best_layout_at_headline: HeadlineVerdict
    cascade_vs_paged_at_90: CascadeVerdict


class RankRow(TypedDict):
    layout: str
    geomean_ms: float | None
    scenarios: int
    gate: bool
    place: NotRequired[int | None]


class KernelRun(TypedDict):
    case: str
    layout: str
    passed: bool
    detail: str


class CaughtRun(TypedDict):
    bug: str
    layout: str
    caught_by: str | None
    detail: str


class CaseRuns(TypedDict):
    runs: list[KernelRun]
    skipped: list[str]


class MutantRuns(TypedDict):
    runs: list[CaughtRun]


class BenchReport(TypedDict):
    """run_bench's report; the prepared GPU run (gpu_check.py) adds the kernel cases, the planted bugs and when."""

    device: DeviceInfo
    spec: dict[str, object]
    page: int
    scenarios: dict[str, ScenarioRow]
    skipped: list[str]
    copy: NotRequired[CopyRow]
    verdicts: NotRequired[Verdicts]
    ranking: NotRequired[list[RankRow]]
    cases: NotRequired[CaseRuns]
    mutants: NotRequired[MutantRuns]
    when: NotRequired[str]
    seconds: NotRequired[float]
    mode: NotRequired[str]


def unavailable() -> str | None:
    """Why the GPU timing cannot run here, or None when it can."""
    try:
        import torch
    except ModuleNotFoundError:
        return "PyTorch is not installed (a CUDA build of torch, and triton)"
    # Looked up, not imported: importing triton fixes whether its helpers are built for the interpreter.
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def peak_for(name: str) -> tuple[float, str] | None:
    """(TB/s, what memory) for a device name, or None when the table has no row for it."""
    for key, tbps, memory in PEAK_TBPS:
        if key.lower() in name.lower():
            return tbps, memory
    return None


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
        return out.splitlines()[0] if out else "unknown (nvidia-smi printed nothing)"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown (nvidia-smi: {type(exc).__name__})"


def device_info(device: str) -> DeviceInfo:
    import torch
    import triton

    info: DeviceInfo = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
    }
    if device == "cpu":
        info["gpu"], info["driver"], info["peak_tbps"] = None, None, None
        info["peak_source"] = "no GPU: a dry run under Triton's interpreter"
        return info
    props = torch.cuda.get_device_properties(torch.device(device))
    name = torch.cuda.get_device_name(torch.device(device))
    peak = peak_for(name)
    info["gpu"], info["driver"] = name, _driver()
    info["multiprocessors"] = props.multi_processor_count
    info["memory_gib"] = round(props.total_memory / 2**30, 1)
    info["peak_tbps"] = peak[0] if peak else None
    info["peak_source"] = f"datasheet, {peak[1]}" if peak else f"no row for {name!r} in PEAK_TBPS"
    return info


class Timer:
    """Milliseconds of a callable: CUDA events on a GPU (the L2 cache overwritten before each repetition),
    perf_counter under the interpreter."""

    def __init__(self, device: str, *, reps: int, warmup: int = 3) -> None:
        import torch

        self.torch, self.device, self.reps, self.warmup = torch, device, reps, warmup
        # Larger than any L2 so far (H200: 60 MB): each repetition reads its KV from HBM, as a real step does.
        self.flush = None if device == "cpu" else torch.empty(256 * 2**20, dtype=torch.uint8, device=device)

    def __call__(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            if self.flush is None:
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1000)
                continue
            self.flush.zero_()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end))
        return float(statistics.median(times))


def measure_copy(device: str, timer: Timer, nbytes: int) -> CopyRow:
    """A device-to-device copy: bytes read plus bytes written, over the median time."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return {"bytes_moved": 2 * nbytes, "ms": ms, "gbps": 2 * nbytes / ms / 1e6}


@dataclass
class Batch:
    pool: BlockPool
    requests: list[Request]
    entries: list[Entry]
    cache: Cache
    tokens: dict[str, list[int]]


def build(scenario: GpuScenario, spec: AttnSpec, device: str, *, seed: int = 0) -> Batch:
    """The batch through the lab's own pool (prefix hits give the shared blocks), random fp16 KV in every block
    on the device, and one random query per request."""
    import torch

    rng = np.random.default_rng(seed)
    shared = int(scenario.context * scenario.shared) // PAGE * PAGE
    blocks = scenario.batch * (scenario.context // PAGE + 2) + 4
    pool = BlockPool(blocks, PAGE)
    prefix = [int(t) for t in rng.integers(0, 50_000, shared)]
    requests = []
    for i in range(scenario.batch):
        prompt = prefix + [int(t) for t in rng.integers(0, 50_000, scenario.context - shared)]
        request = pool.add_request(f"r{i}", prompt)
        pool.append(request, prompt[request.num_tokens :])
        requests.append(request)
    cache, _ = empty_cache(blocks, PAGE, spec, "fp16", device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for tensor in (cache.k, cache.v):
        tensor.copy_(torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.float32).half())
    entries = [
        Entry(
            req_id=r.req_id,
            block_ids=r.block_ids,
            seq_len=r.num_tokens,
            query=rng.standard_normal((1, spec.num_heads, spec.head_size)).astype(np.float32),
        )
        for r in requests
    ]
    return Batch(pool, requests, entries, cache, {r.req_id: list(r.tokens) for r in requests})


def logical_kv(batch: Batch, entry: Entry) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A request's K and V in token order, gathered through its block table with torch indexing on the host's
    side of the check (not the kernels' address arithmetic)."""
    import torch

    page = batch.cache.page
    pos = torch.arange(entry.seq_len)
    blocks = torch.as_tensor(entry.block_ids, dtype=torch.int64)[pos // page]
    k = batch.cache.k[blocks.to(batch.cache.k.device), (pos % page).to(batch.cache.k.device)]
    v = batch.cache.v[blocks.to(batch.cache.v.device), (pos % page).to(batch.cache.v.device)]
    return k.float().cpu().numpy(), v.float().cpu().numpy()


def oracle_error(batch: Batch, outs: Sequence[np.ndarray[Any, Any]], picks: Sequence[int]) -> float:
    worst = 0.0
    for i in picks:
        entry = batch.entries[i]
        k, v = logical_kv(batch, entry)
        expected = reference_attention(entry.query, k, v, precision="fp16")
        error = np.abs(outs[i].astype(np.float64) - expected)
        if not np.isfinite(error).all():
            return math.inf
        worst = max(worst, float(error.max()))
    return worst


FP16_TOLERANCE = 1e-3 + 1e-3
"""atol + rtol·|o| at |o| <= 1, as the CI cases hold fp16 (kernel_cases.TOLERANCE)."""


def bench_layouts(
    batch: Batch, scenario: GpuScenario, spec: AttnSpec, device: str, timer: Timer, peak_tbps: float | None
) -> dict[str, Row]:
    out: dict[str, Row] = {}
    picks = sorted({0, len(batch.entries) - 1})
    logical = sum(e.seq_len for e in batch.entries) * 2 * spec.num_kv_heads * spec.head_size * 2
    for name in TRITON_LAYOUTS:
        layout = make_layout(
            name,
            spec,
            capacity=scenario.context + PAGE,
            device=device,
            block_n=64 if device != "cpu" else 16,
            prefix_rows=64 if device != "cpu" else 16,
        )
        plan = layout.plan(batch.entries, batch.cache)
        result = layout.run(plan).float().cpu().numpy()
        outs = [result[f : f + n] for f, n in zip(plan.q_first, plan.q_count, strict=True)]
        error = oracle_error(batch, outs, picks)
        row: Row = {
            "oracle_max_error": error,
            "oracle_checked": [batch.entries[i].req_id for i in picks],
            "splits": plan.splits,
            "launches": len(plan.launches),
            "kv_bytes": plan.kv_bytes,
            "metadata_bytes_per_request": plan.metadata_bytes / plan.requests,
            "indirections_per_request": plan.index_lookups / plan.requests,
            "copy_bytes_setup": plan.copy_bytes,
        }
        if not error <= FP16_TOLERANCE:
            row["failed"] = f"differs from the oracle by {error:.3g} (> {FP16_TOLERANCE:g}): not timed"
            out[name] = row
            continue
        ms = timer(functools.partial(layout.run, plan))
        q_out = 2 * sum(e.query.size for e in batch.entries) * (2 + 4)
        moved = plan.kv_bytes + plan.metadata_bytes + q_out
        row["ms"], row["bytes_moved"], row["gbps"] = ms, moved, moved / ms / 1e6
        row["share_of_peak"] = (moved / ms / 1e6) / (peak_tbps * 1000) if peak_tbps else None
        row["effective_gbps"] = logical / ms / 1e6
        out[name] = row
    return out


def bench_sdpa(batch: Batch, spec: AttnSpec, device: str, timer: Timer, peak_tbps: float | None) -> Row:
    """torch's scaled_dot_product_attention on each request's K and V laid out contiguously (built outside the
    timing), every request as long as the longest."""
    import torch
    import torch.nn.functional as F

    length = max(e.seq_len for e in batch.entries)
    if any(e.seq_len != length for e in batch.entries):
        return {"skipped": "requests of different lengths: SDPA needs one length or a mask"}
    page = batch.cache.page
    pos = torch.arange(length, device=device)
    tables = torch.as_tensor(np.asarray([e.block_ids[: -(-length // page)] for e in batch.entries]), device=device)
    blocks = tables[:, pos // page]
    # [batch, KV heads, length, head]: each request's keys in one contiguous run, as SDPA reads them.
    k = batch.cache.k[blocks, pos % page].transpose(1, 2).contiguous()
    v = batch.cache.v[blocks, pos % page].transpose(1, 2).contiguous()
    q = torch.as_tensor(np.stack([e.query for e in batch.entries])).to(device, torch.float16).transpose(1, 2)
    try:
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except (TypeError, RuntimeError) as exc:
        return {"skipped": f"scaled_dot_product_attention(enable_gqa=True) failed: {exc}"[:300]}
    outs = [out[i].transpose(0, 1).float().cpu().numpy() for i in range(out.shape[0])]
    error = oracle_error(batch, outs, sorted({0, len(outs) - 1}))
    moved = k.numel() * 2 + v.numel() * 2 + q.numel() * 2 * 2
    ms = timer(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    return {
        "ms": ms,
        "bytes_moved": moved,
        "gbps": moved / ms / 1e6,
        "share_of_peak": (moved / ms / 1e6) / (peak_tbps * 1000) if peak_tbps else None,
        "oracle_max_error": error,
    }


def bench_flashinfer(
    batch: Batch, scenario: GpuScenario, spec: AttnSpec, device: str, timer: Timer, peak_tbps: float | None
) -> dict[str, Row]:
    """FlashInfer's paged decode on the same block tables and cache, and its two-level cascade where the batch
    shares a prefix. Untested here: written from FlashInfer's documented API, run where the package imports."""
    if device == "cpu":
        return {"flashinfer": {"skipped": "FlashInfer runs only on a GPU"}}
    try:
        import flashinfer  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return {
            "flashinfer": {
                "skipped": f"flashinfer does not import ({exc}): it is not in this host's image, and its wheel "
                "(flashinfer-python 0.7.4: 101 MB, with apache-tvm-ffi, cuda-tile and nvidia-cutlass-dsl) is "
                "larger than the 64 MiB a device call can carry"
            }
        }
    import torch

    results: dict[str, Row] = {}
    page = batch.cache.page
    q = torch.as_tensor(np.concatenate([e.query for e in batch.entries])).to(device, torch.float16)
    logical = sum(e.seq_len for e in batch.entries) * 2 * spec.num_kv_heads * spec.head_size * 2
    kv = (batch.cache.k, batch.cache.v)

    def record(name: str, run: Callable[[], Any], kv_bytes: int) -> None:
        out = run().float().cpu().numpy()
        outs = [out[i : i + 1] for i in range(len(batch.entries))]
        error = oracle_error(batch, outs, sorted({0, len(outs) - 1}))
        ms = timer(run)
        results[name] = {
            "ms": ms,
            "bytes_moved": kv_bytes,
            "gbps": kv_bytes / ms / 1e6,
            "share_of_peak": (kv_bytes / ms / 1e6) / (peak_tbps * 1000) if peak_tbps else None,
            "effective_gbps": logical / ms / 1e6,
            "oracle_max_error": error,
        }

    def i32(values: Sequence[int] | np.ndarray[Any, Any]) -> Any:
        return torch.as_tensor(np.asarray(values, np.int32), device=device)

    workspace = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    tables = [list(e.block_ids[: -(-e.seq_len // page)]) for e in batch.entries]
    indptr = np.cumsum([0, *(len(t) for t in tables)])
    last = [e.seq_len - (len(t) - 1) * page for e, t in zip(batch.entries, tables, strict=True)]
    try:
        decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        decode.plan(
            i32(indptr), i32([b for t in tables for b in t]), i32(last), spec.num_heads, spec.num_kv_heads,
            spec.head_size, page, data_type=torch.float16, q_data_type=torch.float16,
        )  # fmt: skip
        record("flashinfer-paged", lambda: decode.run(q, kv), logical)
    except Exception as exc:  # an API that moved, a JIT compile that failed: the row says which
        results["flashinfer-paged"] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
    shared_pages = int(scenario.context * scenario.shared) // page
    if shared_pages == 0:
        results["flashinfer-cascade"] = {"skipped": "no shared prefix in this scenario"}
        return results
    try:
        cascade = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
        prefix = tables[0][:shared_pages]
        suffixes = [t[shared_pages:] for t in tables]
        n = len(batch.entries)
        cascade.plan(
            [i32([0, n]), i32(list(range(n + 1)))],
            [i32([0, len(prefix)]), i32(np.cumsum([0, *(len(s) for s in suffixes)]))],
            [i32(prefix), i32([b for s in suffixes for b in s])],
            [i32([page]), i32(last)],
            spec.num_heads, spec.num_kv_heads, spec.head_size, page,
        )  # fmt: skip
        row_bytes = 2 * spec.num_kv_heads * spec.head_size * 2
        read = (len(prefix) * page + sum(e.seq_len - len(prefix) * page for e in batch.entries)) * row_bytes
        record("flashinfer-cascade", lambda: cascade.run(q, kv), read)
    except Exception as exc:  # as above
        results["flashinfer-cascade"] = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
    return results


def verdicts(scenarios: Mapping[str, Layouts], peak_tbps: float | None) -> Verdicts:
    """The issue's two bars, from the measured rows (None where a row is missing)."""
    out: Verdicts = {}
    head = scenarios[HEADLINE]["layouts"] if HEADLINE in scenarios else {}
    timed = {name: row for name, row in head.items() if "ms" in row}
    if timed and peak_tbps:
        best = max(timed, key=lambda n: timed[n]["gbps"])
        share = timed[best]["share_of_peak"]
        met = share is not None and share >= 0.6
        out["best_layout_at_headline"] = {"layout": best, "share_of_peak": share, "bar": 0.6, "met": met}
    shared = scenarios[CASCADE_AT[0]]["layouts"] if CASCADE_AT[0] in scenarios else {}
    if "ms" in shared.get("hybrid", {}) and "ms" in shared.get("paged", {}):
        speedup = shared["paged"]["ms"] / shared["hybrid"]["ms"]
        out["cascade_vs_paged_at_90"] = {"speedup": speedup, "bar": 3.0, "met": speedup >= 3.0}
    return out


def ranking(scenarios: Mapping[str, Layouts]) -> list[RankRow]:
    """Layouts by the geometric mean of their step times over every scenario where all four were timed; a
    layout that failed a check anywhere has no place."""
    complete = [s for s in scenarios.values() if all("ms" in r for r in s["layouts"].values())]
    failed = {n for s in scenarios.values() for n, r in s["layouts"].items() if "failed" in r}
    rows: list[RankRow] = []
    for name in TRITON_LAYOUTS:
        times = [s["layouts"][name]["ms"] for s in complete]
        mean = math.exp(sum(math.log(t) for t in times) / len(times)) if times else None
        rows.append({"layout": name, "geomean_ms": mean, "scenarios": len(times), "gate": name not in failed})
    rows.sort(key=lambda r: (not r["gate"], r["geomean_ms"] if r["geomean_ms"] is not None else math.inf))
    for place, row in enumerate(rows, 1):
        row["place"] = place if row["gate"] and row["geomean_ms"] is not None else None
    return rows


def run_bench(
    device: str,
    *,
    scenarios: Sequence[GpuScenario],
    spec: AttnSpec,
    reps: int,
    copy_bytes: int,
    deadline: float,
    progress: Callable[[str], None],
) -> BenchReport:
    """Every scenario until the deadline (time.monotonic()); those left are listed as skipped."""
    import torch

    info = device_info(device)
    peak = info.get("peak_tbps")
    # Under the interpreter a run takes seconds and its time means nothing: no warm-up.
    timer = Timer(device, reps=reps, warmup=0 if device == "cpu" else 3)
    report: BenchReport = {"device": info, "spec": asdict(spec), "page": PAGE, "scenarios": {}, "skipped": []}
    if device != "cpu":
        report["copy"] = measure_copy(device, timer, copy_bytes)
        progress(f"device-to-device copy: {report['copy']['gbps']:.0f} GB/s (datasheet peak {peak} TB/s)")
    for scenario in scenarios:
        if time.monotonic() > deadline:
            report["skipped"].append(f"{scenario.name}: the time budget ran out")
            continue
        progress(f"scenario {scenario.name}: building the pool and the cache")
        batch = build(scenario, spec, device)
        logical = sum(e.seq_len for e in batch.entries) * 2 * spec.num_kv_heads * spec.head_size * 2
        slots = sum(1 for r in batch.requests for b in r.blocks if b.ref_cnt > 1) / max(
            1, sum(len(r.blocks) for r in batch.requests)
        )
        layouts = bench_layouts(batch, scenario, spec, device, timer, peak)
        anchors = {"sdpa": bench_sdpa(batch, spec, device, timer, peak)}
        anchors.update(bench_flashinfer(batch, scenario, spec, device, timer, peak))
        row: ScenarioRow = {
            "name": scenario.name,
            "batch": scenario.batch,
            "context": scenario.context,
            "shared": scenario.shared,
            "logical_kv_bytes": logical,
            "shared_slots": slots,
            "layouts": layouts,
            "anchors": anchors,
        }
        report["scenarios"][scenario.name] = row
        timed = ", ".join(f"{n} {r['ms']:.3f} ms" for n, r in row["layouts"].items() if "ms" in r)
        progress(f"scenario {scenario.name}: {timed}")
        del batch
        if device != "cpu":
            torch.cuda.empty_cache()
    report["verdicts"] = verdicts(report["scenarios"], peak)
    report["ranking"] = ranking(report["scenarios"])
    return report


def render(report: BenchReport) -> str:
    """Markdown: the device, the copy, each scenario's layouts and anchors, the verdicts and the ranking."""
    info = report["device"]
    dry = info.get("gpu") is None
    lines = [
        f"Device: {info.get('gpu') or 'none (dry run under the interpreter: times mean nothing)'}; driver "
        f"{info.get('driver')}; torch {info['torch']} (CUDA {info.get('torch_cuda')}); Triton {info['triton']}; "
        f"peak {info.get('peak_tbps')} TB/s ({info.get('peak_source')}).",
    ]
    if "copy" in report:
        copy = report["copy"]
        lines.append(
            f"Measured device-to-device copy: {copy['gbps']:.0f} GB/s ({copy['bytes_moved'] / 2**30:.1f} GiB "
            f"read + written in {copy['ms']:.3f} ms)."
        )
    lines += [
        "",
        "| scenario | batch × context, shared | layout | ms/step | MB moved | GB/s | share of peak | effective GB/s "
        "| oracle max err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in report["scenarios"].items():
        where = f"{s['batch']} × {s['context']}, {s['shared']:.0%}"
        for layout, r in [*s["layouts"].items(), *s["anchors"].items()]:
            if "ms" not in r:
                reason = r.get("failed") or r.get("skipped")
                lines.append(f"| {name} | {where} | {layout} | — | | | | | {reason} |")
                continue
            share = f"{r['share_of_peak']:.0%}" if r.get("share_of_peak") is not None else "—"
            eff = f"{r['effective_gbps']:.0f}" if "effective_gbps" in r else ""
            lines.append(
                f"| {name} | {where} | {layout} | {r['ms']:.3f} | {r['bytes_moved'] / 1e6:.1f} | {r['gbps']:.0f} | "
                f"{share} | {eff} | {r.get('oracle_max_error', float('nan')):.1e} |"
            )
    lines += ["", "Rank (geometric mean of the step times over the scenarios every layout ran):", ""]
    lines += ["| place | layout | geomean ms/step | scenarios |", "| --- | --- | --- | --- |"]
    for row in report["ranking"]:
        mean = f"{row['geomean_ms']:.3f}" if row["geomean_ms"] is not None else "—"
        lines.append(f"| {row['place'] or '—'} | {row['layout']} | {mean} | {row['scenarios']} |")
    if report["verdicts"]:
        lines += ["", "Bars:"]
        for key, v in report["verdicts"].items():
            lines.append(f"- {key}: {v}")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"])]
    if dry:
        lines += ["", "A dry run: the kernels ran under Triton's interpreter on the CPU; no figure here is a speed."]
    return "\n".join(lines) + "\n"

"""The host side of the Triton kernels: each layout's metadata built from a batch, the launches, and the counters.

A layout's `plan(entries, cache)` builds its metadata as device tensors and returns the launches; `run(plan)`
only launches them (that is what a timing measures: vLLM builds its metadata once per step and every layer
reuses it). `attend(entries, cache)` does both and returns one output per entry, like the NumPy layouts.

On a machine without CUDA the same kernels run under Triton's interpreter (`TRITON_INTERPRET=1`) on CPU tensors;
`load_kernels` decides which before the kernels module is imported, once per process.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from builders.kvlab.layouts import Entry, HybridPrefixShared, spans_of, to_csr
from builders.kvlab.pool import NULL_BLOCK_ID
from builders.kvlab.spec import AttnSpec
from builders.kvlab.store import KVStore

Tensor = Any
"""A torch.Tensor: torch is imported where the kernels run, never at this module's import."""

KERNEL_BUGS: dict[str, tuple[int, str]] = {
    "kv-head-index": (1, "gives query head h the KV head h % num_kv_heads (a tile) instead of h // group"),
    "block-stride-assumed": (2, "addresses a block as page × token stride, right only for a packed cache"),
    "missed-partial-block": (3, "stops the keys at the last full page, so a partial final block is never read"),
    "merge-without-max": (4, "merges parts by exp(lse) without subtracting the largest LSE"),
}
"""Planted Triton kernel bugs, for every layout: name → (the kernels' BUG code, what it gets wrong)."""

KV_DTYPES = ("fp16", "bf16", "fp8")

_MODE: dict[str, bool] = {}


def load_kernels(*, interpret: bool) -> ModuleType:
    """The kernels module, built as GPU kernels or as interpreter functions. `triton.jit` reads
    TRITON_INTERPRET when each function is decorated, triton.language's own at `import triton`, so the choice is
    made here, before either import, and holds for the process."""
    name = "builders.kvlab.triton_kernels"
    if name in sys.modules:
        if _MODE.get("interpret", os.environ.get("TRITON_INTERPRET") == "1") != interpret:
            raise RuntimeError(
                "the Triton kernels are already built " + ("for the GPU" if interpret else "for the interpreter")
            )
        return sys.modules[name]
    if interpret:
        _check_interpreter()
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            # triton.language's own helpers (tl.cdiv, …) were built at `import triton` for the GPU then.
            raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set: set it before importing triton")
        os.environ["TRITON_INTERPRET"] = "1"
    elif not interpret and os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: unset it to build the kernels for the GPU")
    _MODE["interpret"] = interpret
    # A literal name, so that the import graph (tests/pipeline/test_imports.py) sees this module load it.
    return importlib.import_module("builders.kvlab.triton_kernels")


def _check_interpreter() -> None:
    """Triton before 3.8 reads a loop bound as int(array of one element), which NumPy 2.4 refuses."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("triton")
    except PackageNotFoundError:
        raise RuntimeError("triton is not installed: pip install -e '.[kernels]'") from None
    major_minor = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    if major_minor < (3, 8) and tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4):
        raise RuntimeError(
            f"Triton {found}'s interpreter fails on NumPy {np.__version__}: use triton 3.8 (pip install -e '.[kernels]')"
        )


def _torch() -> Any:
    import torch

    return torch


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Cache:
    """The paged KV cache on the device: k, v [blocks, page, KV heads, head size], any strides with the head
    dimension's stride 1. `generation[b]` counts how often block b was handed out (the virtual layout remaps a
    block whose generation changed)."""

    k: Tensor
    v: Tensor
    kind: str
    k_scale: float = 1.0
    v_scale: float = 1.0
    generation: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def page(self) -> int:
        return int(self.k.shape[1])

    @property
    def elem_bytes(self) -> int:
        return 1 if self.kind == "fp8" else 2

    def query_dtype(self) -> Any:
        torch = _torch()
        return torch.bfloat16 if self.kind == "bf16" else torch.float16

    def cache_dtype(self) -> Any:
        torch = _torch()
        return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[self.kind]


def empty_cache(
    num_blocks: int, page: int, spec: AttnSpec, kind: str, *, device: str, strided: bool = False
) -> tuple[Cache, Tensor]:
    """A NaN-filled cache. strided: K and V interleaved per block in one allocation ([blocks, 2, page, KV, head
    + 8], as vLLM's caches are laid out), so no stride of K or V is the packed one. Returns the cache and the
    whole allocation (which a caller may fill through k and v)."""
    if kind not in KV_DTYPES:
        raise ValueError(f"KV dtype {kind!r}: use one of {', '.join(KV_DTYPES)}")
    torch = _torch()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[kind]
    dims = (page, spec.num_kv_heads, spec.head_size)

    def nan(shape: tuple[int, ...]) -> Tensor:
        # fp8 has no fill kernel on every build: fill in fp16 and convert; NaN stays NaN.
        return torch.full(shape, float("nan"), dtype=torch.float16, device=device).to(dtype)

    whole = None
    if strided:
        whole = nan((num_blocks, 2, page, spec.num_kv_heads, spec.head_size + 8))
        k, v = whole[:, 0, :, :, : spec.head_size], whole[:, 1, :, :, : spec.head_size]
    else:
        k, v = nan((num_blocks, *dims)), nan((num_blocks, *dims))
    scales = (spec.k_scale or 1.0, spec.v_scale or 1.0)
    return Cache(k, v, kind, *scales, generation=np.zeros(num_blocks, np.int64)), whole


def cache_from_store(store: KVStore, kind: str, *, device: str, strided: bool = False) -> Cache:
    """The lab's KV store (float32, NaN where nothing was written) as a device cache of `kind`. Under fp8 the store
    already holds e4m3 values of k / k_scale, which convert exactly."""
    if (kind == "fp8") != store.spec.fp8:
        raise ValueError(f"KV dtype {kind} for a store {'with' if store.spec.fp8 else 'without'} fp8 scales")
    torch = _torch()
    cache, _ = empty_cache(store.k.shape[0], store.k.shape[1], store.spec, kind, device=device, strided=strided)
    cache.k.copy_(torch.from_numpy(store.k).to(device).to(cache.k.dtype))
    cache.v.copy_(torch.from_numpy(store.v).to(device).to(cache.v.dtype))
    cache.generation = store.generation.copy()
    return cache


@dataclass
class Launch:
    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constants: dict[str, Any]


@dataclass
class Plan:
    """What one batch needs on the device, and what its launches read."""

    launches: list[Launch]
    out: Tensor
    q_first: list[int]
    q_count: list[int]
    requests: int
    metadata_bytes: int = 0
    """Bytes of layout metadata the kernels read (tables, runs, bases, lengths, tiles)."""
    kv_bytes: int = 0
    """Bytes of K and V the kernels read: a prefix read once per query tile counts once per tile."""
    index_lookups: int = 0
    """Indirections: one per key for a block table, one per run for spans, one per request for virtual."""
    copy_bytes: int = 0
    """KV bytes copied outside the kernels (the virtual layout's ranges kept up to date)."""
    splits: int = 1


class TritonLayout:
    name: ClassVar[str]

    def __init__(
        self,
        spec: AttnSpec,
        *,
        device: str,
        bug: str | None = None,
        splits: int | None = None,
        block_n: int = 64,
        prefix_rows: int = 64,
        num_warps: int = 4,
        num_stages: int = 2,
    ) -> None:
        """splits: how many parts a request's keys are cut into (split-K); None lets the layout choose from the
        device's multiprocessor count. prefix_rows: query rows (queries × heads of a KV head) per cascade tile."""
        if bug is not None and bug not in KERNEL_BUGS:
            raise ValueError(f"no planted Triton kernel bug {bug!r}; known: {', '.join(KERNEL_BUGS)}")
        self.spec = spec
        self.device = device
        self.bug = bug
        self.bug_code = KERNEL_BUGS[bug][0] if bug else 0
        self.splits = splits
        self.block_n = block_n
        self.prefix_rows = prefix_rows
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.kernels = load_kernels(interpret=device == "cpu")

    # -- shared pieces ------------------------------------------------------------------------------------------

    def _choose_splits(self, programs: int, longest: int) -> int:
        if self.splits is not None:
            return self.splits
        if self.device == "cpu":
            return 1
        torch = _torch()
        sms = torch.cuda.get_device_properties(torch.device(self.device)).multi_processor_count
        # Four programs per multiprocessor, each split at least 256 keys long: a decode step is bound by memory,
        # and more loads in flight is what hides its latency.
        wanted = _pow2(_cdiv(4 * sms, max(1, programs)))
        return max(1, min(wanted, _pow2(max(1, longest // 256)), 64))

    def _queries(self, entries: Sequence[Entry], cache: Cache, strided: bool) -> tuple[Tensor, list[int], list[int]]:
        torch = _torch()
        spec = self.spec
        q = np.concatenate([e.query for e in entries]).astype(np.float32)
        dtype = cache.query_dtype()
        if strided:
            whole = torch.zeros((q.shape[0], spec.num_heads, spec.head_size + 8), dtype=dtype, device=self.device)
            tensor = whole[:, :, : spec.head_size]
            tensor.copy_(torch.from_numpy(q).to(self.device).to(dtype))
        else:
            tensor = torch.from_numpy(q).to(self.device).to(dtype).contiguous()
        counts = [int(e.query.shape[0]) for e in entries]
        firsts = [int(x) for x in np.cumsum([0, *counts[:-1]])]
        return tensor, firsts, counts

    def _i32(self, values: Sequence[int] | npt.NDArray[Any]) -> Tensor:
        torch = _torch()
        return torch.as_tensor(np.asarray(values, dtype=np.int32), device=self.device)

    def _common(self, cache: Cache) -> dict[str, Any]:
        spec, torch = self.spec, _torch()
        slopes = spec.slopes
        return {
            "slopes": torch.as_tensor(slopes if slopes is not None else np.zeros(1, np.float32), device=self.device),
            "qk_scale": float(spec.scale * (cache.k_scale if cache.kind == "fp8" else 1.0)),
            "v_scale": float(cache.v_scale if cache.kind == "fp8" else 1.0),
            "window": int(spec.sliding_window or 0),
        }

    def _constants(self, block_m: int, page: int, splits: int, cache: Cache) -> dict[str, Any]:
        spec = self.spec
        return {
            "NUM_HEADS": spec.num_heads,
            "NUM_KV": spec.num_kv_heads,
            "GROUP": spec.group,
            "HEAD": spec.head_size,
            "BLOCK_D": max(16, _pow2(spec.head_size)),
            "BLOCK_M": block_m,
            "BLOCK_N": self.block_n,
            "PAGE": page,
            "SPLITS": splits,
            "ALIBI": spec.alibi,
            "WINDOW": spec.sliding_window is not None,
            "BUG": self.bug_code,
            "WIDE_DOT": self.device == "cpu" and cache.kind == "bf16",
        }

    def _block_m(self, rows: int) -> int:
        return max(16, _pow2(rows))

    def _partials(self, rows: int, parts: int) -> tuple[Tensor, Tensor]:
        torch = _torch()
        po = torch.zeros((rows, parts, self.spec.head_size), dtype=torch.float32, device=self.device)
        pl = torch.full((rows, parts), float("-inf"), dtype=torch.float32, device=self.device)
        return po, pl

    def _merge(self, po: Tensor, pl: Tensor, out: Tensor, parts: int) -> Launch:
        return Launch(
            self.kernels.merge_parts,
            (po.shape[0],),
            (po, pl, out, po.stride(0), po.stride(1), pl.stride(0), out.stride(0)),
            {
                "NUM_PARTS": parts,
                "PARTS_PAD": _pow2(parts),
                "HEAD": self.spec.head_size,
                "BLOCK_D": max(16, _pow2(self.spec.head_size)),
                "BUG": self.bug_code,
            },
        )

    def _first_key(self, entry: Entry) -> int:
        window = self.spec.sliding_window
        return 0 if window is None else max(0, entry.q_start - window + 1)

    def _kv_row_bytes(self, cache: Cache) -> int:
        """K and V of one token over all KV heads, at the cache's width."""
        return 2 * self.spec.num_kv_heads * self.spec.head_size * cache.elem_bytes

    # -- the interface ------------------------------------------------------------------------------------------

    def plan(self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False) -> Plan:
        raise NotImplementedError

    def run(self, plan: Plan) -> Tensor:
        for launch in plan.launches:
            # A cascade tile of 64 query rows holds a 64 × head fp32 accumulator: twice the warps to hold it.
            warps = self.num_warps * (2 if launch.constants.get("BLOCK_M", 0) >= 64 else 1)
            extra = {} if self.device == "cpu" else {"num_warps": warps, "num_stages": self.num_stages}
            launch.kernel[launch.grid](*launch.args, **launch.constants, **extra)
        return plan.out

    def attend(
        self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False
    ) -> list[npt.NDArray[np.float32]]:
        plan = self.plan(entries, cache, strided_queries=strided_queries)
        out = self.run(plan).cpu().numpy()
        return [out[f : f + n] for f, n in zip(plan.q_first, plan.q_count, strict=True)]


class TritonPaged(TritonLayout):
    """Every key through the block table: `table[pos // page]`, then the offset in the block."""

    name = "paged"

    def plan(self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False) -> Plan:
        return self._paged_plan(entries, cache, [0] * len(entries), strided_queries=strided_queries)

    def _paged_plan(
        self,
        entries: Sequence[Entry],
        cache: Cache,
        kv_start: Sequence[int],
        *,
        strided_queries: bool,
        extra_parts: int = 0,
        partials: tuple[Tensor, Tensor] | None = None,
        queries: tuple[Tensor, list[int], list[int]] | None = None,
    ) -> Plan:
        torch, spec, page = _torch(), self.spec, cache.page
        q, firsts, counts = queries or self._queries(entries, cache, strided_queries)
        width = max(1, max(len(e.block_ids) for e in entries))
        table = np.zeros((len(entries), width), dtype=np.int32)
        for i, e in enumerate(entries):
            table[i, : len(e.block_ids)] = e.block_ids
        meta = {
            "table": self._i32(table),
            "seq_len": self._i32([e.seq_len for e in entries]),
            "kv_start": self._i32(kv_start),
            "q_first": self._i32(firsts),
            "q_count": self._i32(counts),
        }
        longest = max(e.seq_len for e in entries)
        splits = self._choose_splits(len(entries) * spec.num_kv_heads, longest)
        parts = extra_parts + splits
        po, pl = partials or self._partials(q.shape[0] * spec.num_heads, parts)
        out = torch.empty((q.shape[0], spec.num_heads, spec.head_size), dtype=torch.float32, device=self.device)
        common = self._common(cache)
        args = (
            q, cache.k, cache.v, meta["table"], meta["seq_len"], meta["kv_start"], meta["q_first"], meta["q_count"],
            common["slopes"], po, pl, common["qk_scale"], common["v_scale"], common["window"], extra_parts,
            q.stride(0), q.stride(1), *cache.k.stride()[:3], *cache.v.stride()[:3], meta["table"].stride(0),
            po.stride(0), po.stride(1), pl.stride(0),
        )  # fmt: skip
        block_m = self._block_m(max(counts) * spec.group)
        launches = [
            Launch(
                self.kernels.paged_decode,
                (len(entries), spec.num_kv_heads, splits),
                args,
                self._constants(block_m, page, splits, cache),
            )
        ]
        keys = [max(0, e.seq_len - max(s, self._first_key(e))) for e, s in zip(entries, kv_start, strict=True)]
        plan = Plan(
            launches,
            out,
            firsts,
            counts,
            len(entries),
            metadata_bytes=sum(t.numel() * t.element_size() for t in meta.values()),
            kv_bytes=sum(keys) * self._kv_row_bytes(cache),
            index_lookups=sum(keys),
            splits=splits,
        )
        if not extra_parts:
            plan.launches.append(self._merge(po, pl, out.view(-1, spec.head_size), parts))
        return plan


class TritonSpans(TritonLayout):
    """Runs of consecutive blocks: one table read per run, then address arithmetic along it."""

    name = "spans"

    def plan(self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False) -> Plan:
        torch, spec, page = _torch(), self.spec, cache.page
        q, firsts, counts = self._queries(entries, cache, strided_queries)
        csr = to_csr(entries, page)
        indptr, first_pages, blocks, lengths = [0], [], [], []
        for i, e in enumerate(entries):
            pages = csr.kv_indices[csr.kv_indptr[i] : csr.kv_indptr[i + 1]].tolist()
            for span in spans_of(pages, first_page=self._first_key(e) // page):
                first_pages.append(span.logical_block)
                blocks.append(span.physical_block)
                lengths.append(span.num_blocks)
            indptr.append(len(blocks))
        meta = {
            "indptr": self._i32(indptr),
            "page": self._i32(first_pages),
            "block": self._i32(blocks),
            "pages": self._i32(lengths),
            "last_len": self._i32(csr.kv_last_page_len),
            "q_first": self._i32(firsts),
            "q_count": self._i32(counts),
        }
        splits = self._choose_splits(len(entries) * spec.num_kv_heads, max(e.seq_len for e in entries))
        po, pl = self._partials(q.shape[0] * spec.num_heads, splits)
        out = torch.empty((q.shape[0], spec.num_heads, spec.head_size), dtype=torch.float32, device=self.device)
        common = self._common(cache)
        args = (
            q, cache.k, cache.v, meta["indptr"], meta["page"], meta["block"], meta["pages"], meta["last_len"],
            meta["q_first"], meta["q_count"], common["slopes"], po, pl, common["qk_scale"], common["v_scale"],
            common["window"], q.stride(0), q.stride(1), *cache.k.stride()[:3], *cache.v.stride()[:3],
            po.stride(0), po.stride(1), pl.stride(0),
        )  # fmt: skip
        block_m = self._block_m(max(counts) * spec.group)
        keys = [e.seq_len - self._first_key(e) for e in entries]
        return Plan(
            [
                Launch(
                    self.kernels.spans_decode,
                    (len(entries), spec.num_kv_heads, splits),
                    args,
                    self._constants(block_m, page, splits, cache),
                ),
                self._merge(po, pl, out.view(-1, spec.head_size), splits),
            ],
            out,
            firsts,
            counts,
            len(entries),
            metadata_bytes=sum(t.numel() * t.element_size() for t in meta.values()),
            kv_bytes=sum(keys) * self._kv_row_bytes(cache),
            index_lookups=len(blocks),
            splits=splits,
        )


class TritonVirtual(TritonLayout):
    """One contiguous range per request in an arena: the kernel reads a base and a length. The ranges are kept
    up to date by copying each block that changed (on a GPU, vAttention maps the pages instead); those copies are
    counted apart and are not part of a timed step."""

    name = "virtual"

    def __init__(self, spec: AttnSpec, *, capacity: int, **options: Any) -> None:
        """capacity: tokens reserved per request (vAttention reserves a request's whole virtual range)."""
        super().__init__(spec, **options)
        self.capacity = capacity
        self.slots: dict[str, int] = {}
        self.mapped: dict[str, dict[int, tuple[int, int]]] = {}
        self.synced: dict[str, int] = {}
        self.arena: tuple[Tensor, Tensor] | None = None
        self.strided = False

    def _arena(self, cache: Cache, slots: int) -> tuple[Tensor, Tensor]:
        torch, spec = _torch(), self.spec
        if self.arena is not None and self.arena[0].shape[0] >= slots * self.capacity:
            return self.arena
        rows = max(slots, 2 * (self.arena[0].shape[0] // self.capacity if self.arena else 0)) * self.capacity
        pad = 8 if cache.k.stride(2) != spec.head_size else 0
        shape = (rows, spec.num_kv_heads, spec.head_size + pad)
        grown = tuple(
            torch.full(shape, float("nan"), dtype=torch.float16, device=self.device).to(cache.k.dtype)[
                :, :, : spec.head_size
            ]
            for _ in range(2)
        )
        if self.arena is not None:
            # The emulation's arena outgrew its slots; vAttention reserves address space instead, so not counted.
            old = self.arena[0].shape[0]
            grown[0][:old].copy_(self.arena[0])
            grown[1][:old].copy_(self.arena[1])
        self.arena = (grown[0], grown[1])
        return self.arena

    def _sync(self, entries: Sequence[Entry], cache: Cache) -> int:
        """Copy the blocks each range lacks; the bytes copied."""
        torch, page = _torch(), cache.page
        for e in entries:
            if e.seq_len > self.capacity:
                raise ValueError(f"request {e.req_id} has {e.seq_len} tokens, beyond the {self.capacity} reserved")
            self.slots.setdefault(e.req_id, len(self.slots))
        arena_k, arena_v = self._arena(cache, len(self.slots))
        dst: list[int] = []
        src: list[int] = []
        for e in entries:
            base = self.slots[e.req_id] * self.capacity
            mapped = self.mapped.setdefault(e.req_id, {})
            grown_from = self.synced.get(e.req_id, 0) // page
            for logical, physical in enumerate(e.block_ids[: _cdiv(e.seq_len, page)]):
                if physical == NULL_BLOCK_ID:
                    if mapped.pop(logical, None) is not None:
                        # vAttention unmaps a page no query may see again: reading it shows.
                        arena_k[base + logical * page : base + (logical + 1) * page] = float("nan")
                        arena_v[base + logical * page : base + (logical + 1) * page] = float("nan")
                    continue
                key = (physical, int(cache.generation[physical]) if len(cache.generation) else 0)
                if mapped.get(logical) != key or logical >= grown_from:
                    dst.append(base + logical * page)
                    src.append(physical)
                    mapped[logical] = key
            self.synced[e.req_id] = e.seq_len
        if not src:
            return 0
        rows = torch.as_tensor(np.add.outer(np.asarray(dst), np.arange(page)).reshape(-1), device=self.device)
        blocks = torch.as_tensor(np.asarray(src, dtype=np.int64), device=self.device)
        arena_k[rows] = cache.k[blocks].reshape(-1, *cache.k.shape[2:])
        arena_v[rows] = cache.v[blocks].reshape(-1, *cache.v.shape[2:])
        return len(src) * page * self._kv_row_bytes(cache)

    def plan(self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False) -> Plan:
        torch, spec, page = _torch(), self.spec, cache.page
        copied = self._sync(entries, cache)
        assert self.arena is not None
        arena_k, arena_v = self.arena
        q, firsts, counts = self._queries(entries, cache, strided_queries)
        meta = {
            "base": self._i32([self.slots[e.req_id] * self.capacity for e in entries]),
            "seq_len": self._i32([e.seq_len for e in entries]),
            "q_first": self._i32(firsts),
            "q_count": self._i32(counts),
        }
        splits = self._choose_splits(len(entries) * spec.num_kv_heads, max(e.seq_len for e in entries))
        po, pl = self._partials(q.shape[0] * spec.num_heads, splits)
        out = torch.empty((q.shape[0], spec.num_heads, spec.head_size), dtype=torch.float32, device=self.device)
        common = self._common(cache)
        args = (
            q, arena_k, arena_v, meta["base"], meta["seq_len"], meta["q_first"], meta["q_count"], common["slopes"],
            po, pl, common["qk_scale"], common["v_scale"], common["window"], q.stride(0), q.stride(1),
            arena_k.stride(0), arena_k.stride(1), arena_v.stride(0), arena_v.stride(1),
            po.stride(0), po.stride(1), pl.stride(0),
        )  # fmt: skip
        keys = [e.seq_len - self._first_key(e) for e in entries]
        return Plan(
            [
                Launch(
                    self.kernels.virtual_decode,
                    (len(entries), spec.num_kv_heads, splits),
                    args,
                    self._constants(self._block_m(max(counts) * spec.group), page, splits, cache),
                ),
                self._merge(po, pl, out.view(-1, spec.head_size), splits),
            ],
            out,
            firsts,
            counts,
            len(entries),
            metadata_bytes=sum(t.numel() * t.element_size() for t in meta.values()),
            kv_bytes=sum(keys) * self._kv_row_bytes(cache),
            index_lookups=len(entries),
            copy_bytes=copied,
            splits=splits,
        )


class TritonCascade(TritonPaged):
    """Cascade attention: a group's shared prefix attended by tiles of the group's queries, then each request's
    suffix through its block table from the prefix's end, the parts merged by their LSE."""

    name = "hybrid"

    def plan(self, entries: Sequence[Entry], cache: Cache, *, strided_queries: bool = False) -> Plan:
        spec, page = self.spec, cache.page
        queries = self._queries(entries, cache, strided_queries)
        q, firsts, counts = queries
        groups = [(m, p) for m, p in HybridPrefixShared(page, spec)._groups(entries) if p > 0]
        kv_start = [0] * len(entries)
        tile_group: list[int] = []
        tile_first: list[int] = []
        tile_count: list[int] = []
        group_queries: list[int] = []
        prefix_lens: list[int] = []
        prefix_tables: list[tuple[int, ...]] = []
        tile_q = max(1, self.prefix_rows // spec.group)
        prefix_keys = 0
        for g, (members, prefix) in enumerate(groups):
            prefix_lens.append(prefix)
            prefix_tables.append(entries[members[0]].block_ids[: _cdiv(prefix, page)])
            mine = [firsts[i] + j for i in members for j in range(counts[i])]
            for i in members:
                kv_start[i] = prefix
            for t in range(0, len(mine), tile_q):
                tile_group.append(g)
                tile_first.append(len(group_queries) + t)
                tile_count.append(min(tile_q, len(mine) - t))
                lo = min(self._first_key(entries[i]) for i in members)
                prefix_keys += max(0, prefix - lo)
            group_queries.extend(mine)
        width = max([1, *(len(t) for t in prefix_tables)])
        table = np.zeros((max(1, len(groups)), width), dtype=np.int32)
        for g, blocks in enumerate(prefix_tables):
            table[g, : len(blocks)] = blocks
        q_pos = [e.q_start + j for e in entries for j in range(e.query.shape[0])]
        longest_prefix = max([0, *prefix_lens])
        prefix_splits = self._choose_splits(max(1, len(tile_group)) * spec.num_kv_heads, longest_prefix)
        suffix = self._paged_plan(
            entries,
            cache,
            kv_start,
            strided_queries=strided_queries,
            extra_parts=prefix_splits,
            queries=queries,
        )
        parts = prefix_splits + suffix.splits
        # The suffix kernel writes parts prefix_splits… of these; the prefix kernel writes the first ones.
        po, pl = suffix.launches[0].args[9], suffix.launches[0].args[10]
        launches: list[Launch] = []
        meta: dict[str, Tensor] = {}
        if tile_group:
            meta = {
                "table": self._i32(table),
                "prefix_len": self._i32(prefix_lens),
                "tile_group": self._i32(tile_group),
                "tile_first": self._i32(tile_first),
                "tile_count": self._i32(tile_count),
                "group_queries": self._i32(group_queries),
                "q_pos": self._i32(q_pos),
            }
            common = self._common(cache)
            args = (
                q, cache.k, cache.v, meta["table"], meta["prefix_len"], meta["tile_group"], meta["tile_first"],
                meta["tile_count"], meta["group_queries"], meta["q_pos"], common["slopes"], po, pl,
                common["qk_scale"], common["v_scale"], common["window"], q.stride(0), q.stride(1),
                *cache.k.stride()[:3], *cache.v.stride()[:3], meta["table"].stride(0),
                po.stride(0), po.stride(1), pl.stride(0),
            )  # fmt: skip
            launches.append(
                Launch(
                    self.kernels.cascade_prefix,
                    (len(tile_group), spec.num_kv_heads, prefix_splits),
                    args,
                    self._constants(self._block_m(tile_q * spec.group), page, prefix_splits, cache),
                )
            )
        launches.append(suffix.launches[0])
        launches.append(self._merge(po, pl, suffix.out.view(-1, spec.head_size), parts))
        return Plan(
            launches,
            suffix.out,
            firsts,
            counts,
            len(entries),
            metadata_bytes=suffix.metadata_bytes + sum(t.numel() * t.element_size() for t in meta.values()),
            kv_bytes=suffix.kv_bytes + prefix_keys * self._kv_row_bytes(cache),
            index_lookups=suffix.index_lookups + prefix_keys,
            splits=suffix.splits,
        )


TRITON_LAYOUTS: dict[str, type[TritonLayout]] = {
    cls.name: cls for cls in (TritonPaged, TritonSpans, TritonVirtual, TritonCascade)
}


def make_layout(name: str, spec: AttnSpec, *, capacity: int, **options: Any) -> TritonLayout:
    """A Triton layout by name; capacity is the virtual layout's reserved tokens per request."""
    if name == "virtual":
        return TritonVirtual(spec, capacity=capacity, **options)
    return TRITON_LAYOUTS[name](spec, **options)

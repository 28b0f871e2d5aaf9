"""The ranking's timed call on a GPU: each layout's read path and the attention as PyTorch CUDA kernels.

Written for a machine with PyTorch and CUDA, and never run where it was written (no PyTorch, no GPU there):
treat its first run as its test. It keeps the pool, the block tables and the oracle on the CPU, mirrors the KV
store on the device in fp16, and per decode step times, with CUDA events: uploading the layout's metadata,
reading the KV through it, and attention in fp32 (the same arithmetic for every layout, so the difference
is the read path). Each step's outputs are checked against the oracle, so a wrong read cannot look fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from builders.kvlab.layouts import LAYOUTS, Entry, HybridPrefixShared, spans_of
from builders.kvlab.spec import AttnSpec

FP16_TOLERANCE = 2e-2
"""fp16 KV against the fp32 oracle: 11 mantissa bits on values of magnitude ≤ ~4."""


def unavailable() -> str | None:
    """Why the CUDA ranking cannot run here, or None when it can."""
    try:
        import torch
    except ModuleNotFoundError:
        return "PyTorch is not installed (pip install torch, a CUDA build)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} sees no CUDA device"
    return None


def _attend(torch: Any, q: Any, q_pos: Any, k: Any, v: Any, k_pos: Any, spec: AttnSpec) -> tuple[Any, Any]:
    group = spec.group
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * spec.scale
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    out = torch.einsum("hqk,khd->qhd", weights, v)
    return out, lse.transpose(0, 1)


def _merge(torch: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> Any:
    (o1, l1), (o2, l2) = a, b
    peak = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - peak)[..., None], torch.exp(l2 - peak)[..., None]
    return (o1 * w1 + o2 * w2) / (w1 + w2)


class DeviceStore:
    def __init__(self, torch: Any, k: np.ndarray[Any, Any], v: np.ndarray[Any, Any]) -> None:
        self.torch = torch
        self.k = torch.from_numpy(k).to("cuda", torch.float16)
        self.v = torch.from_numpy(v).to("cuda", torch.float16)

    def refresh(self, host_k: np.ndarray[Any, Any], host_v: np.ndarray[Any, Any], blocks: Sequence[int]) -> None:
        index = self.torch.as_tensor(list(blocks), device="cuda")
        self.k[index] = self.torch.from_numpy(host_k[list(blocks)]).to("cuda", self.torch.float16)
        self.v[index] = self.torch.from_numpy(host_v[list(blocks)]).to("cuda", self.torch.float16)


class Reader:
    """One layout's read path on the device; `read(entries)` → one output per entry."""

    def __init__(self, torch: Any, name: str, store: DeviceStore, block_size: int, spec: AttnSpec) -> None:
        self.torch, self.name, self.store, self.b, self.spec = torch, name, store, block_size, spec
        self.buffers: dict[str, tuple[Any, Any, int]] = {}

    def _q(self, entry: Entry) -> tuple[Any, Any]:
        t = self.torch
        return t.from_numpy(entry.query).to("cuda"), t.arange(entry.q_start, entry.seq_len, device="cuda")

    def read(self, entries: Sequence[Entry]) -> list[Any]:
        return getattr(self, f"_{self.name}")(entries)  # type: ignore[no-any-return]

    def _paged(self, entries: Sequence[Entry]) -> list[Any]:
        t, b = self.torch, self.b
        width = max(len(e.block_ids) for e in entries)
        table = np.zeros((len(entries), width), dtype=np.int64)
        for i, e in enumerate(entries):
            table[i, : len(e.block_ids)] = e.block_ids
        tables = t.from_numpy(table).to("cuda", non_blocking=True)
        flat_k = self.store.k.reshape(-1, *self.store.k.shape[2:])
        flat_v = self.store.v.reshape(-1, *self.store.v.shape[2:])
        outs = []
        for i, e in enumerate(entries):
            pos = t.arange(e.seq_len, device="cuda")
            slots = tables[i, pos // b] * b + pos % b
            q, q_pos = self._q(e)
            outs.append(_attend(t, q, q_pos, flat_k[slots], flat_v[slots], pos, self.spec)[0])
        return outs

    def _runs(self, e: Entry, lo: int, hi: int) -> tuple[Any, Any]:
        b, k, v = self.b, self.store.k, self.store.v
        ks, vs = [], []
        for span in spans_of(e.block_ids[: -(-hi // b)], first_page=lo // b):
            base = span.logical_block * b
            start, stop = max(lo, base) - base, min(hi, base + span.num_blocks * b) - base
            if stop > start:
                run = slice(span.physical_block, span.physical_block + span.num_blocks)
                ks.append(k[run].reshape(-1, *k.shape[2:])[start:stop])
                vs.append(v[run].reshape(-1, *v.shape[2:])[start:stop])
        return self.torch.cat(ks), self.torch.cat(vs)

    def _spans(self, entries: Sequence[Entry]) -> list[Any]:
        t = self.torch
        outs = []
        for e in entries:
            k, v = self._runs(e, 0, e.seq_len)
            q, q_pos = self._q(e)
            outs.append(_attend(t, q, q_pos, k, v, t.arange(e.seq_len, device="cuda"), self.spec)[0])
        return outs

    def _virtual(self, entries: Sequence[Entry]) -> list[Any]:
        t, b = self.torch, self.b
        outs = []
        for e in entries:
            k_buf, v_buf, synced = self.buffers.get(e.req_id, (None, None, 0))
            if k_buf is None or k_buf.shape[0] < len(e.block_ids) * b:
                shape = (2 * len(e.block_ids) * b, *self.store.k.shape[2:])
                k_buf, v_buf, synced = (
                    t.empty(shape, dtype=t.float16, device="cuda"),
                    t.empty(shape, dtype=t.float16, device="cuda"),
                    0,
                )
            # The blocks written since the last step; a GPU with vAttention maps pages instead of copying.
            for logical in range(synced // b, -(-e.seq_len // b)):
                physical = e.block_ids[logical]
                k_buf[logical * b : (logical + 1) * b] = self.store.k[physical]
                v_buf[logical * b : (logical + 1) * b] = self.store.v[physical]
            self.buffers[e.req_id] = (k_buf, v_buf, e.seq_len)
            q, q_pos = self._q(e)
            pos = t.arange(e.seq_len, device="cuda")
            outs.append(_attend(t, q, q_pos, k_buf[: e.seq_len], v_buf[: e.seq_len], pos, self.spec)[0])
        return outs

    def _hybrid(self, entries: Sequence[Entry]) -> list[Any]:
        t = self.torch
        outs: list[Any] = [None] * len(entries)
        groups = HybridPrefixShared(self.b, self.spec)._groups(entries)
        for members, prefix in groups:
            group = [entries[i] for i in members]
            parts = None
            if prefix:
                k, v = self._runs(group[0], 0, prefix)
                qs = [self._q(e) for e in group]
                out, lse = _attend(
                    t,
                    t.cat([q for q, _ in qs]),
                    t.cat([p for _, p in qs]),
                    k,
                    v,
                    t.arange(prefix, device="cuda"),
                    self.spec,
                )
                cuts = np.cumsum([0, *(e.query.shape[0] for e in group)])
                parts = [(out[cuts[j] : cuts[j + 1]], lse[cuts[j] : cuts[j + 1]]) for j in range(len(group))]
            for j, e in enumerate(group):
                q, q_pos = self._q(e)
                if e.seq_len > prefix:
                    k, v = self._runs(e, prefix, e.seq_len)
                    part = _attend(t, q, q_pos, k, v, t.arange(prefix, e.seq_len, device="cuda"), self.spec)
                    outs[members[j]] = part[0] if parts is None else _merge(t, parts[j], part)
                else:
                    assert parts is not None
                    outs[members[j]] = parts[j][0]
        return outs


def measure_cuda(layout_name: str, spec: AttnSpec, scenario: Any, *, steps: int, seed: int = 0) -> Any:
    """rank.measure's counterpart: the same scenario and counters, the time from CUDA events."""
    import torch

    from builders.kvlab import rank

    if spec.alibi or spec.sliding_window is not None or spec.fp8:
        raise ValueError("the CUDA ranking times plain causal attention; ALiBi, windows and fp8 are the oracle's")
    lab, requests = rank._build(spec, scenario, seed)
    layout = LAYOUTS[layout_name](rank.BLOCK_SIZE, spec)
    store = DeviceStore(torch, lab.store.k, lab.store.v)
    reader = Reader(torch, layout_name, store, rank.BLOCK_SIZE, spec)
    reader.read([lab.entry(r) for r in requests])
    before = rank._snapshot(layout)
    times, runs, worst = [], 0.0, 0.0
    for _ in range(steps):
        for request in requests:
            lab.compute(request, lab.prompt(1))
        store.refresh(lab.store.k, lab.store.v, sorted({r.block_ids[-1] for r in requests}))
        entries = [lab.entry(r) for r in requests]
        layout.attend(entries, lab.store)  # on the CPU, for the counters only
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        outs = reader.read(entries)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        for request, entry, out in zip(requests, entries, outs, strict=True):
            worst = max(worst, float(np.abs(out.cpu().numpy() - lab.expected(request, entry)).max()))
        runs += sum(rank._runs(r.block_ids) for r in requests) / len(requests)
    if worst > FP16_TOLERANCE:
        raise AssertionError(f"{layout_name} on CUDA differs from the oracle by {worst:.3g} (> {FP16_TOLERANCE})")
    after = rank._snapshot(layout)
    calls = steps * len(requests)
    referenced = [lab.pool.blocks[b] for r in requests for b in r.block_ids]
    return rank.Measure(
        ms_per_step=min(times),
        metadata_bytes_per_request=(after[0] - before[0]) / calls,
        kv_bytes_read_per_step=(after[1] - before[1]) * lab.store.bytes_per_token / steps,
        kv_bytes_copied_per_step=(after[2] - before[2]) / steps,
        indirections_per_request=(after[3] - before[3]) / calls,
        runs_per_request=runs / steps,
        blocks_per_request=len(referenced) / len(requests),
        shared_fraction=sum(1 for b in referenced if b.ref_cnt > 1) / len(referenced),
    )

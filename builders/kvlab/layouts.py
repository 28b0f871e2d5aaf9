"""Four layouts of the same KV, each a view the attention reads through, each with the bugs it could plausibly have.

- `paged`: a block table per request, each token found through it (vLLM's PagedAttention, the reference);
- `spans`: runs of physically contiguous blocks, exchanged in FlashInfer's CSR form
  (`kv_indptr`, `kv_indices`, `kv_last_page_len`) and read one contiguous slice per run;
- `virtual`: one logical buffer per request (vAttention); on a GPU the pages are mapped into a contiguous virtual
  range, here each block is copied into the request's buffer once it changes, and that copy is counted;
- `hybrid`: requests whose tables start with the same blocks form a group; the group's queries attend the
  shared prefix once, each request its own suffix, and the two parts merge by log-sum-exp (cascade attention).

A layout's `attend(batch, store)` returns one output per batch entry and adds what it read to `stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from builders.kvlab import kernel
from builders.kvlab.kernel import KernelBugs
from builders.kvlab.pool import NULL_BLOCK_ID
from builders.kvlab.spec import Array, AttnSpec
from builders.kvlab.store import KVStore

Part = tuple[Array, Array]


@dataclass(frozen=True, kw_only=True, eq=False)
class Entry:
    """One request in a batch: its block table, context length, and queries for its last len(query) positions."""

    req_id: str
    block_ids: tuple[int, ...]
    seq_len: int
    query: Array

    @property
    def q_start(self) -> int:
        return self.seq_len - int(self.query.shape[0])

    @property
    def q_pos(self) -> npt.NDArray[np.int64]:
        return np.arange(self.q_start, self.seq_len, dtype=np.int64)


@dataclass
class Stats:
    """What a layout read to answer its batches, summed over calls."""

    requests: int = 0
    metadata_bytes: int = 0
    """Bytes of layout metadata the attention reads (tables, spans, pointers), besides the KV itself."""
    kv_tokens_read: int = 0
    """Token rows of K and V the attention read; a shared prefix read once counts once."""
    index_lookups: int = 0
    """Indirections the attention followed: one per token for a token table, one per run for spans."""
    copy_bytes: int = 0
    """KV bytes copied outside the attention (the virtual layout's buffer upkeep)."""
    kernel_calls: int = 0


class Layout:
    name: ClassVar[str]
    bugs: ClassVar[dict[str, str]]
    """Planted bugs this layout can carry: name → what it gets wrong."""

    def __init__(
        self, block_size: int, spec: AttnSpec, *, bug: str | None = None, kernel_bug: str | None = None
    ) -> None:
        """kernel_bug: one of kernel.KERNEL_BUGS, planted in the kernel this layout calls."""
        if bug is not None and bug not in self.bugs:
            raise ValueError(f"layout {self.name} has no planted bug {bug!r}; known: {', '.join(self.bugs)}")
        if kernel_bug is not None and kernel_bug not in kernel.KERNEL_BUGS:
            raise ValueError(f"no planted kernel bug {kernel_bug!r}; known: {', '.join(kernel.KERNEL_BUGS)}")
        self.block_size = block_size
        self.spec = spec
        self.bug = bug
        self.stats = Stats()
        self.kernel_bugs = KernelBugs(
            tile_heads=bug == "kv-head-tiled",
            alibi_by_kv_head=bug == "alibi-by-kv-head",
            window_slack=1 if bug == "window-off-by-one" else 0,
            **({kernel.KERNEL_BUGS[kernel_bug][0]: True} if kernel_bug else {}),
        )

    def attend(self, batch: Sequence[Entry], store: KVStore) -> list[Array]:
        raise NotImplementedError

    def first_key(self, entry: Entry) -> int:
        """The first position any query of the entry may attend to."""
        if self.spec.sliding_window is None:
            return 0
        slack = 1 if self.bug == "window-off-by-one" else 0
        return max(0, entry.q_start - self.spec.sliding_window + 1 - slack)

    def _kernel(
        self,
        entry: Entry,
        k: Array,
        v: Array,
        k_pos: npt.NDArray[np.int64],
        query: Array | None = None,
        q_pos: npt.NDArray[np.int64] | None = None,
    ) -> Part:
        self.stats.kernel_calls += 1
        self.stats.kv_tokens_read += k.shape[0]
        k, v = kernel.dequantize(
            k, v, self.spec, k_scale_twice=self.bug == "k-scale-twice", v_by_k_scale=self.bug == "v-scale-is-k-scale"
        )
        return kernel.attend(
            entry.query if query is None else query,
            entry.q_pos if q_pos is None else q_pos,
            k,
            v,
            k_pos,
            self.spec,
            self.kernel_bugs,
        )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PagedTable(Layout):
    """vLLM's reference: `block_table[t // block_size] * block_size + t % block_size` for every token t."""

    name = "paged"
    bugs: ClassVar[dict[str, str]] = {
        "last-block-dropped": "counts blocks as seq_len // block_size, so a partial last block is never read",
        "reads-whole-last-block": "reads the last block to its end, unused (poisoned) slots included",
        "window-off-by-one": "lets a query see one key before its sliding window (q - k <= window)",
        "kv-head-tiled": "maps query head h to KV head h % kv_heads (tile) instead of h // group (repeat)",
    }

    def attend(self, batch: Sequence[Entry], store: KVStore) -> list[Array]:
        b = self.block_size
        width = max(len(e.block_ids) for e in batch)
        flat_k = store.k.reshape(-1, *store.k.shape[2:])
        flat_v = store.v.reshape(-1, *store.v.shape[2:])
        outs = []
        for entry in batch:
            table = np.zeros(width, dtype=np.int32)
            table[: len(entry.block_ids)] = entry.block_ids
            # The table is padded to the batch's longest, as vLLM's block_tables tensor is.
            self.stats.metadata_bytes += table.nbytes + 4
            self.stats.requests += 1
            n_blocks = entry.seq_len // b if self.bug == "last-block-dropped" else _cdiv(entry.seq_len, b)
            end = n_blocks * b if self.bug == "reads-whole-last-block" else min(entry.seq_len, n_blocks * b)
            positions = np.arange(self.first_key(entry), end, dtype=np.int64)
            slots = table[positions // b].astype(np.int64) * b + positions % b
            self.stats.index_lookups += len(positions)
            out, _ = self._kernel(entry, flat_k[slots], flat_v[slots], positions)
            outs.append(out)
        return outs


@dataclass(frozen=True)
class Span:
    logical_block: int
    physical_block: int
    num_blocks: int


@dataclass(frozen=True, kw_only=True)
class CSR:
    """FlashInfer's paged-KV index: request i's pages are kv_indices[kv_indptr[i]:kv_indptr[i+1]], its last page
    holding kv_last_page_len[i] tokens. Window-freed pages stay in it as the null page, so positions hold."""

    kv_indptr: npt.NDArray[np.int32]
    kv_indices: npt.NDArray[np.int32]
    kv_last_page_len: npt.NDArray[np.int32]


def to_csr(entries: Sequence[Entry], block_size: int, *, last_page_mod: bool = False) -> CSR:
    indptr = np.zeros(len(entries) + 1, dtype=np.int32)
    indices: list[int] = []
    last = np.zeros(len(entries), dtype=np.int32)
    for i, entry in enumerate(entries):
        pages = entry.block_ids[: _cdiv(entry.seq_len, block_size)]
        indices.extend(pages)
        indptr[i + 1] = len(indices)
        last[i] = entry.seq_len % block_size if last_page_mod else entry.seq_len - (len(pages) - 1) * block_size
    return CSR(kv_indptr=indptr, kv_indices=np.asarray(indices, dtype=np.int32), kv_last_page_len=last)


def csr_seq_len(csr: CSR, i: int, block_size: int) -> int:
    pages = int(csr.kv_indptr[i + 1] - csr.kv_indptr[i])
    return 0 if pages == 0 else (pages - 1) * block_size + int(csr.kv_last_page_len[i])


def spans_of(pages: Sequence[int], *, first_page: int = 0, merge_any_ascending: bool = False) -> list[Span]:
    """Runs of pages whose physical blocks follow each other, from first_page on, the null page left out."""
    spans: list[Span] = []
    for logical in range(first_page, len(pages)):
        physical = int(pages[logical])
        if physical == NULL_BLOCK_ID:
            continue
        if spans:
            last = spans[-1]
            follows = last.logical_block + last.num_blocks == logical
            end = last.physical_block + last.num_blocks
            if follows and (physical > end - 1 if merge_any_ascending else physical == end):
                spans[-1] = Span(last.logical_block, last.physical_block, last.num_blocks + 1)
                continue
        spans.append(Span(logical, physical, 1))
    return spans


class CompactSpans(Layout):
    """A request as a few (logical block, physical block, length) runs, each read as one contiguous slice.

    The runs are read in one pass, as one kernel launch would walk them; how many there are depends on how
    fragmented the pool is, which is what the ranking measures."""

    name = "spans"
    bugs: ClassVar[dict[str, str]] = {
        "merge-across-gap": "merges the next block into a run whenever its id is higher, not only when it follows",
        "last-page-len-mod": "sets kv_last_page_len to seq_len % block_size, 0 for a full last page",
        "positions-from-zero": "numbers keys by their place in the runs read, not by each run's logical start",
        "v-scale-is-k-scale": "dequantizes fp8 V with k_scale",
    }

    def attend(self, batch: Sequence[Entry], store: KVStore) -> list[Array]:
        b = self.block_size
        csr = to_csr(batch, b, last_page_mod=self.bug == "last-page-len-mod")
        outs = []
        for i, entry in enumerate(batch):
            pages = csr.kv_indices[csr.kv_indptr[i] : csr.kv_indptr[i + 1]]
            seq_len = csr_seq_len(csr, i, b)
            first = self.first_key(entry)
            spans = spans_of(pages.tolist(), first_page=first // b, merge_any_ascending=self.bug == "merge-across-gap")
            self.stats.metadata_bytes += 12 * len(spans) + 8
            self.stats.requests += 1
            self.stats.index_lookups += len(spans)
            ks, vs, positions = [], [], []
            for span in spans:
                lo = max(first, span.logical_block * b)
                hi = min(seq_len, (span.logical_block + span.num_blocks) * b)
                if hi <= lo:
                    continue
                base = span.logical_block * b
                run = slice(span.physical_block, span.physical_block + span.num_blocks)
                ks.append(store.k[run].reshape(-1, *store.k.shape[2:])[lo - base : hi - base])
                vs.append(store.v[run].reshape(-1, *store.v.shape[2:])[lo - base : hi - base])
                positions.append(np.arange(lo, hi))
            if not ks:
                ks, vs, positions = [store.k[0, :0]], [store.v[0, :0]], [np.arange(0)]
            k_pos = np.concatenate(positions)
            if self.bug == "positions-from-zero":
                k_pos = np.arange(len(k_pos))
            out, _ = self._kernel(entry, np.concatenate(ks), np.concatenate(vs), k_pos)
            outs.append(out)
        return outs


@dataclass
class _Buffer:
    k: Array
    v: Array
    mapped: dict[int, tuple[int, int]] = field(default_factory=dict)
    """logical block → (physical block, its generation) whose KV the buffer holds there. The generation tells a
    block handed out again (to a request that reuses a finished one's id) from the one copied before."""
    synced_tokens: int = 0


class VirtualContiguous(Layout):
    """One contiguous buffer per request; the attention reads buffer[first:seq_len] and nothing else."""

    name = "virtual"
    bugs: ClassVar[dict[str, str]] = {
        "stale-tail": "copies only newly mapped blocks, so tokens appended to an already mapped block are missing",
        "grow-drops-contents": "reallocates a longer buffer without carrying the blocks already mapped over",
        "seq-len-minus-one": "reads the buffer up to seq_len - 1, dropping the newest token",
        "k-scale-twice": "multiplies fp8 K by k_scale twice",
    }

    def __init__(
        self, block_size: int, spec: AttnSpec, *, bug: str | None = None, kernel_bug: str | None = None
    ) -> None:
        super().__init__(block_size, spec, bug=bug, kernel_bug=kernel_bug)
        self.buffers: dict[str, _Buffer] = {}

    def _sync(self, entry: Entry, store: KVStore) -> _Buffer:
        b = self.block_size
        capacity = len(entry.block_ids) * b
        buffer = self.buffers.get(entry.req_id)
        if buffer is None or buffer.k.shape[0] < capacity:
            # A new or longer reservation; on a GPU the virtual range is reserved once, here it grows.
            shape = (max(capacity, 2 * (buffer.k.shape[0] if buffer else 0)), *store.k.shape[2:])
            grown = _Buffer(np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32))
            if buffer is not None and self.bug != "grow-drops-contents":
                grown.k[: buffer.k.shape[0]] = buffer.k
                grown.v[: buffer.v.shape[0]] = buffer.v
            if buffer is not None:
                grown.mapped, grown.synced_tokens = buffer.mapped, buffer.synced_tokens
            buffer = self.buffers[entry.req_id] = grown
        written_from = buffer.synced_tokens // b
        for logical, physical in enumerate(entry.block_ids[: _cdiv(entry.seq_len, b)]):
            region = slice(logical * b, (logical + 1) * b)
            if physical == NULL_BLOCK_ID:
                if logical in buffer.mapped:
                    # vAttention unmaps pages no longer needed, so reading them is a bug that shows.
                    buffer.k[region] = np.nan
                    buffer.v[region] = np.nan
                    del buffer.mapped[logical]
                continue
            held = (physical, int(store.generation[physical]))
            moved = buffer.mapped.get(logical) != held
            grew = logical >= written_from and self.bug != "stale-tail"
            if moved or grew:
                buffer.k[region] = store.k[physical]
                buffer.v[region] = store.v[physical]
                buffer.mapped[logical] = held
                self.stats.copy_bytes += b * store.bytes_per_token
        buffer.synced_tokens = entry.seq_len
        return buffer

    def attend(self, batch: Sequence[Entry], store: KVStore) -> list[Array]:
        outs = []
        for entry in batch:
            buffer = self._sync(entry, store)
            # The kernel sees a base pointer and a length; the page mapping lives in the page table.
            self.stats.metadata_bytes += 8 + 4
            self.stats.requests += 1
            self.stats.index_lookups += 1
            end = entry.seq_len - 1 if self.bug == "seq-len-minus-one" else entry.seq_len
            first = self.first_key(entry)
            out, _ = self._kernel(entry, buffer.k[first:end], buffer.v[first:end], np.arange(first, end))
            outs.append(out)
        return outs


class HybridPrefixShared(Layout):
    """Cascade attention: a group's shared prefix attended once for all its queries, suffixes per request."""

    name = "hybrid"
    bugs: ClassVar[dict[str, str]] = {
        "merge-mean": "averages the prefix and suffix outputs instead of weighting them by their LSE",
        "lse-base2-merge": "merges prefix and suffix with 2^(lse) weights although the kernel's LSE is natural log",
        "prefix-assumes-full-blocks": "takes every shared block as full, reading a shared partial block to its end",
        "group-window-from-longest": "starts the group's prefix keys at the longest request's window",
        "alibi-by-kv-head": "gives each query head the ALiBi slope of its KV head",
    }

    def _groups(self, batch: Sequence[Entry]) -> list[tuple[list[int], int]]:
        """(entry indices, shared prefix tokens) per group; a lone request is a group with no prefix."""
        b = self.block_size
        by_first: dict[int, list[int]] = {}
        groups: list[tuple[list[int], int]] = []
        for i, entry in enumerate(batch):
            head = entry.block_ids[0] if entry.block_ids else NULL_BLOCK_ID
            if head == NULL_BLOCK_ID:
                groups.append(([i], 0))
            else:
                by_first.setdefault(head, []).append(i)
        for members in by_first.values():
            if len(members) == 1:
                groups.append((members, 0))
                continue
            tables = [batch[i].block_ids for i in members]
            common = 0
            while all(len(t) > common and t[common] == tables[0][common] for t in tables) and (
                tables[0][common] != NULL_BLOCK_ID
            ):
                common += 1
            if self.bug == "prefix-assumes-full-blocks":
                groups.append((members, common * b))
            else:
                # Under copy-on-write the last shared block may be partial: the prefix ends with its tokens.
                groups.append((members, min(common * b, *(batch[i].seq_len for i in members))))
        return groups

    def _gather(self, store: KVStore, block_ids: Sequence[int], lo: int, hi: int) -> tuple[Array, Array]:
        b = self.block_size
        if hi <= lo:
            return store.k[0, :0], store.v[0, :0]
        ks, vs = [], []
        for logical in range(lo // b, _cdiv(hi, b)):
            start, stop = max(lo, logical * b) - logical * b, min(hi, (logical + 1) * b) - logical * b
            ks.append(store.k[block_ids[logical], start:stop])
            vs.append(store.v[block_ids[logical], start:stop])
            self.stats.index_lookups += 1
        return np.concatenate(ks), np.concatenate(vs)

    def attend(self, batch: Sequence[Entry], store: KVStore) -> list[Array]:
        b = self.block_size
        outs: list[Array | None] = [None] * len(batch)
        for members, prefix in self._groups(batch):
            entries = [batch[i] for i in members]
            prefix_parts: list[Part] | None = None
            if prefix:
                firsts = [self.first_key(e) for e in entries]
                if self.bug == "group-window-from-longest":
                    longest = max(range(len(entries)), key=lambda j: entries[j].seq_len)
                    firsts = [firsts[longest]] * len(entries)
                lo = min(firsts)
                k, v = self._gather(store, entries[0].block_ids, lo, prefix)
                queries = np.concatenate([e.query for e in entries])
                q_pos = np.concatenate([e.q_pos for e in entries])
                out, lse = self._kernel(entries[0], k, v, np.arange(lo, max(lo, prefix)), queries, q_pos)
                cuts = np.cumsum([0, *(e.query.shape[0] for e in entries)])
                prefix_parts = [(out[cuts[j] : cuts[j + 1]], lse[cuts[j] : cuts[j + 1]]) for j in range(len(entries))]
                # The prefix's table is read once for the group: each member carries its share.
                self.stats.metadata_bytes += 4 * _cdiv(prefix, b)
            for j, entry in enumerate(entries):
                lo = max(prefix, self.first_key(entry))
                k, v = self._gather(store, entry.block_ids, lo, entry.seq_len)
                self.stats.metadata_bytes += 4 * (_cdiv(entry.seq_len, b) - prefix // b) + 8
                self.stats.requests += 1
                part = self._kernel(entry, k, v, np.arange(lo, max(lo, entry.seq_len)))
                if prefix_parts is not None:
                    if self.bug == "merge-mean":
                        part = (((part[0] + prefix_parts[j][0]) / 2).astype(np.float32), part[1])
                    else:
                        part = kernel.merge(
                            prefix_parts[j], part, base2=self.bug == "lse-base2-merge", bugs=self.kernel_bugs
                        )
                outs[members[j]] = part[0]
        return [o for o in outs if o is not None]


LAYOUTS: dict[str, type[Layout]] = {
    cls.name: cls for cls in (PagedTable, CompactSpans, VirtualContiguous, HybridPrefixShared)
}

"""A lab bench: one pool, its KV store, and KV that depends only on each token and its position.

Because a token's KV is a function of (token id, position) alone, the same prefix gives the same KV whichever
request computed it, as in a real model; so the oracle rebuilds any request's KV from its token ids without
looking at the pool, and a prefix hit, a copy-on-write or an eviction that went wrong shows as a difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from builders.kvlab.layouts import Entry
from builders.kvlab.oracle import Wide, reference_attention, softmax_scale
from builders.kvlab.pool import BlockPool, Request
from builders.kvlab.spec import Array, AttnSpec
from builders.kvlab.store import KVStore

VOCAB = 512


def aim_logits(query: Array, k: Array, target: float) -> Array:
    """query[n_q, H, D] rescaled per query and head so its largest |q·k·scale| over the keys it may see (the
    queries are the last positions of k[L, KV, D]) is `target`: cases reach logits of ~0, ±50 or ±200 on purpose.
    Small logits hide a softmax or merge that skips its maximum; exp overflows fp32 past ~88."""
    n_q, heads, head_size = query.shape
    group = heads // k.shape[1]
    logits = np.einsum("qhd,nhd->qhn", query, np.repeat(k, group, axis=1)) * softmax_scale(head_size)
    visible = np.arange(k.shape[0])[None, :] <= np.arange(k.shape[0] - n_q, k.shape[0])[:, None]
    peak = np.where(visible[:, None, :], np.abs(logits), 0).max(axis=2)
    aimed: Array = (query * (target / peak)[:, :, None]).astype(np.float32)
    return aimed


class TokenKV:
    def __init__(self, spec: AttnSpec, seed: int, *, gain: float = 1.0) -> None:
        rng = np.random.default_rng(seed)
        shape = (VOCAB, spec.num_kv_heads, spec.head_size)
        self.k_table = (rng.standard_normal(shape) * gain).astype(np.float32)
        self.v_table = (rng.standard_normal(shape) * gain).astype(np.float32)
        self.freq = rng.uniform(0.01, 1.0, shape[1:]).astype(np.float32)
        self.phase = rng.uniform(0, 2 * np.pi, shape[1:]).astype(np.float32)

    def __call__(self, tokens: Sequence[int], start: int) -> tuple[Array, Array]:
        ids = np.asarray(tokens, dtype=np.int64)
        angle = np.arange(start, start + len(ids), dtype=np.float32)[:, None, None] * self.freq + self.phase
        k = self.k_table[ids] + 0.5 * np.sin(angle)
        v = self.v_table[ids] + 0.5 * np.cos(angle)
        return k.astype(np.float32), v.astype(np.float32)


class Lab:
    def __init__(
        self,
        spec: AttnSpec,
        *,
        block_size: int = 16,
        num_blocks: int = 64,
        seed: int = 0,
        cow: bool = False,
        fragment: str | None = None,
        pool_bug: str | None = None,
        gain: float = 1.0,
        logits: float | None = None,
    ) -> None:
        """fragment: None (a fresh pool hands out ascending ids), "shuffled" (any order) or "gapped" (ascending
        runs of two with a held block between runs). logits: each query's largest |logit|, see aim_logits."""
        self.spec = spec
        self.logits = logits
        self.block_size = block_size
        self.store = KVStore(num_blocks, block_size, spec)
        self.pool = BlockPool(
            num_blocks,
            block_size,
            cow=cow,
            sliding_window=spec.sliding_window,
            bug=pool_bug,
            on_new_block=self.store.poison,
        )
        self.kv = TokenKV(spec, seed, gain=gain)
        self.rng = np.random.default_rng(seed + 1)
        self.held: list[Request] = []
        if fragment is not None:
            self._fragment(fragment)

    def _fragment(self, kind: str) -> None:
        """Take every block through one-block requests, then give them back in the order `kind` asks for."""
        b = self.block_size
        singles = []
        for i in range(self.pool.free_queue.num_free):
            request = self.pool.add_request(f"fragment-{i}", [])
            # Token ids outside the vocabulary: these blocks' hashes can never match a real prompt.
            self.pool.append(request, [-1 - i] * b)
            singles.append(request)
        if kind == "shuffled":
            order = [singles[int(i)] for i in self.rng.permutation(len(singles))]
        elif kind == "gapped":
            self.held = singles[2::3]
            order = [r for i, r in enumerate(singles) if i % 3 != 2]
        else:
            raise ValueError(f"fragment {kind!r}: use 'shuffled' or 'gapped'")
        for request in order:
            self.pool.free(request)

    def prompt(self, n: int) -> list[int]:
        return [int(t) for t in self.rng.integers(0, VOCAB, n)]

    def compute(self, request: Request, tokens: Sequence[int]) -> None:
        """One scheduler step for the request: free what its window left behind, take slots, write the KV."""
        self.pool.remove_skipped_blocks(request, request.num_tokens)
        start = request.num_tokens
        copies_before = len(self.pool.copies)
        slots = self.pool.append(request, tokens)
        for source, destination in self.pool.copies[copies_before:]:
            self.store.copy_block(source, destination)
        k, v = self.kv(tokens, start)
        self.store.write(slots, k, v)

    def admit(self, req_id: str, prompt: Sequence[int], *, chunk: int | None = None) -> Request:
        """A request with its cached prefix taken and (the first chunk of) the rest computed."""
        request = self.pool.add_request(req_id, prompt)
        hit = request.num_tokens
        end = len(prompt) if chunk is None else min(len(prompt), hit + chunk)
        self.compute(request, prompt[hit:end])
        return request

    def entry(self, request: Request, n_query: int = 1) -> Entry:
        spec = self.spec
        query = self.rng.standard_normal((n_query, spec.num_heads, spec.head_size)).astype(np.float32)
        if self.logits is not None:
            query = aim_logits(query, self.kv(request.tokens, 0)[0], self.logits)
        return Entry(req_id=request.req_id, block_ids=request.block_ids, seq_len=request.num_tokens, query=query)

    def expected(self, request: Request, entry: Entry) -> Wide:
        """The oracle's answer, from the request's token ids and the layer's plain settings alone: the entry gives
        only the queries, the positions follow from the request's tokens (its queries are the last ones), and
        scale, slopes and fp8 rounding are the oracle's own."""
        k, v = self.kv(request.tokens, 0)
        spec = self.spec
        return reference_attention(
            entry.query,
            k,
            v,
            alibi=spec.alibi,
            sliding_window=spec.sliding_window,
            k_scale=spec.k_scale,
            v_scale=spec.v_scale,
        )

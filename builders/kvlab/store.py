"""The physical KV cache: [blocks, block size, KV heads, head size] for K and for V, poisoned with NaN.

Every block is NaN when the pool hands it out, so an unused slot of a partial block, a freed window block or the
null block reads as NaN: a layout that reads one shows it in its output instead of passing by luck.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from builders.kvlab.pool import Slot
from builders.kvlab.spec import Array, AttnSpec, fp8_e4m3


class KVStore:
    def __init__(self, num_blocks: int, block_size: int, spec: AttnSpec) -> None:
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_size)
        self.spec = spec
        self.block_size = block_size
        self.k: Array = np.full(shape, np.nan, dtype=np.float32)
        self.v: Array = np.full(shape, np.nan, dtype=np.float32)
        self.generation = np.zeros(num_blocks, dtype=np.int64)
        """How often each block was handed out: a layout that keeps a copy of a block can tell a reused id."""

    def poison(self, block_id: int) -> None:
        self.k[block_id] = np.nan
        self.v[block_id] = np.nan
        self.generation[block_id] += 1

    def write(self, slots: Sequence[Slot], k: Array, v: Array) -> None:
        """KV of consecutive tokens into their slots; under fp8, as e4m3(x / scale), saturated."""
        if not slots:
            return
        if self.spec.k_scale is not None and self.spec.v_scale is not None:
            k = fp8_e4m3(k / self.spec.k_scale)
            v = fp8_e4m3(v / self.spec.v_scale)
        blocks = np.fromiter((s[0] for s in slots), dtype=np.int64, count=len(slots))
        offsets = np.fromiter((s[1] for s in slots), dtype=np.int64, count=len(slots))
        self.k[blocks, offsets] = k
        self.v[blocks, offsets] = v

    def copy_block(self, source: int, destination: int) -> None:
        self.k[destination] = self.k[source]
        self.v[destination] = self.v[source]

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token, at the width the cache would hold it (1 byte under fp8, 2 for fp16/bf16)."""
        width = 1 if self.spec.fp8 else 2
        return 2 * self.spec.num_kv_heads * self.spec.head_size * width

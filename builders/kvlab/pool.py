"""A KV block pool with vLLM V1's semantics, and V0's copy-on-write as an explicit option.

What it keeps from vLLM V1 (`vllm/v1/core/block_pool.py`, `kv_cache_utils.py`, `kv_cache_manager.py`,
`single_type_kv_cache_manager.py`):
- block 0 is the null block: taken at start, never freed, never handed out, its reference count not kept;
- each full block has a hash chained over its parent's hash and its token ids; a partial block has none;
- blocks whose reference count falls to zero go to the tail of an LRU free queue (a doubly linked list with
  O(1) removal), a request's blocks in reverse order so its tail is evicted first; a new block comes from the
  head and, if it was cached, leaves the hash map then (eviction is lazy, as in V1);
- every copy of a block is cached under its hash (V1's `cached_block_hash_to_block` maps a hash to every block id
  holding it: a block is never de-duplicated, so block tables stay append-only); a hit takes the copy cached first,
  and evicting one copy leaves the others findable;
- a prefix hit is capped so at least one token is computed (`num_tokens - 1`);
- under a sliding window, blocks wholly before the window become the null block and are freed.

V1 shares only full blocks. `cow=True` allows what V0's `CopyOnWriteTracker` did: a request forked with a
partial last block shares it, and the first write to it copies it to a new block for the writer.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from builders.errors import ForgeError

NULL_BLOCK_ID = 0

POOL_BUGS = (
    "no-hit-cap",
    "mru-eviction",
    "window-frees-extra",
    "append-not-atomic",
    "parentless-hash",
    "one-copy-per-hash",
    "stale-hash-after-eviction",
    "hash-without-separator",
    "free-keeps-request",
    "hit-skips-hole",
)
"""Planted pool bugs for `forge kvlab check --mutants`: each must fail a case."""


class PoolError(ForgeError):
    """An operation the pool's semantics forbid: the message names the rule."""

    exit_code = 2
    kind = "kv pool error"


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    is_null: bool = False
    prev: KVBlock | None = field(default=None, repr=False)
    next: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """LRU order of the free blocks: pop from the head, append at the tail, remove anywhere in O(1)."""

    def __init__(self, blocks: Sequence[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-2)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next
        if block is None or block is self._tail:
            raise PoolError("no free KV block left", hint="give the pool more blocks or free a request")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        if block.prev is None or block.next is None:
            raise PoolError(f"block {block.block_id} is not in the free queue")
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None
        last.next, block.prev, block.next, self._tail.prev = block, last, self._tail, block
        self.num_free += 1

    def appendleft(self, block: KVBlock) -> None:
        first = self._head.next
        assert first is not None
        self._head.next, block.prev, block.next, first.prev = block, self._head, first, block
        self.num_free += 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next
        while block is not None and block is not self._tail:
            yield block
            block = block.next

    def __len__(self) -> int:
        return self.num_free


def hash_block(
    parent: bytes | None, tokens: Sequence[int], *, drop_parent: bool = False, no_separator: bool = False
) -> bytes:
    """The chained hash of a full block: equal hashes mean equal tokens *and* equal prefixes before them.

    drop_parent: the planted "parentless-hash" bug, a hash of the block's own tokens only. no_separator: the
    planted "hash-without-separator" bug, token ids joined with nothing between them, so [1, 23] and [12, 3]
    hash alike."""
    root = b"kvlab-root" if parent is None else parent
    separator = b","
    if drop_parent or no_separator:  # pragma: no mutate block
        root = b"kvlab-root" if drop_parent else root
        separator = b"" if no_separator else separator
    digest = hashlib.sha256(root)
    digest.update(separator.join(str(t).encode() for t in tokens))
    return digest.digest()


@dataclass(eq=False)
class Request:
    req_id: str
    tokens: list[int] = field(default_factory=list)
    """Tokens whose KV is in the request's blocks, in order."""
    blocks: list[KVBlock] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    """Chained hashes of the full blocks so far."""

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def block_ids(self) -> tuple[int, ...]:
        return tuple(b.block_id for b in self.blocks)


Slot = tuple[int, int]
"""(block id, offset in the block) where one token's KV lives."""


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        cow: bool = False,
        sliding_window: int | None = None,
        bug: str | None = None,
        on_new_block: Callable[[int], None] | None = None,
    ) -> None:
        """on_new_block: told each block id handed out, so a KV store can poison its old contents."""
        if num_blocks < 2 or block_size < 1:
            raise PoolError(f"a pool needs at least 2 blocks of at least 1 token, not {num_blocks} × {block_size}")
        if bug is not None and bug not in POOL_BUGS:
            raise PoolError(f"unknown pool bug {bug!r}; known: {', '.join(POOL_BUGS)}")
        self.block_size = block_size
        self.cow = cow
        self.sliding_window = sliding_window
        self.bug = bug
        self.on_new_block = on_new_block
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.null_block.is_null = True
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, dict[int, KVBlock]] = {}
        """hash → {block id: block}, every copy, in the order they were cached (V1's cached_block_hash_to_block)."""
        self.requests: dict[str, Request] = {}
        self.evictions = 0
        self.copies: list[tuple[int, int]] = []
        """Every copy-on-write (source, destination) so far; the caller copies the KV."""

    # -- blocks ---------------------------------------------------------------------------------------------

    def _new_block(self) -> KVBlock:
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            if self.bug != "stale-hash-after-eviction":
                self._evict(block, block.block_hash)
            block.block_hash = None
        block.ref_cnt = 1
        if self.on_new_block:
            self.on_new_block(block.block_id)
        return block

    def _evict(self, block: KVBlock, block_hash: bytes) -> None:
        """Drop this copy from the cache map, the hash with it once no copy is left (V1's
        `_maybe_evict_cached_block`)."""
        copies = self.cached.get(block_hash, {})
        if copies.pop(block.block_id, None) is not None:
            self.evictions += 1
        if not copies:
            self.cached.pop(block_hash, None)

    def _touch(self, block: KVBlock) -> None:
        if block.is_null:
            return
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        block.ref_cnt += 1

    def _release(self, block: KVBlock) -> None:
        if block.is_null:
            return
        block.ref_cnt -= 1
        if block.ref_cnt < 0:
            raise PoolError(f"block {block.block_id} freed more often than it was taken")
        if block.ref_cnt == 0:
            if self.bug == "mru-eviction":  # pragma: no mutate block
                self.free_queue.appendleft(block)
                return
            self.free_queue.append(block)

    # -- requests -------------------------------------------------------------------------------------------

    def cached_prefix(self, tokens: Sequence[int]) -> list[KVBlock]:
        """The longest run of cached full blocks that starts the prompt, leaving at least one token to compute."""
        b = self.block_size
        limit = max(0, len(tokens) - 1) // b
        if self.bug == "no-hit-cap":  # pragma: no mutate block
            limit = len(tokens) // b
        hits: list[KVBlock] = []
        parent: bytes | None = None
        for i in range(limit):
            parent = self._hash(parent, tokens[i * b : (i + 1) * b])
            copies = self.cached.get(parent)
            if not copies:
                if self.bug == "hit-skips-hole":  # pragma: no mutate block
                    continue
                break
            hits.append(next(iter(copies.values())))
        return hits

    def _hash(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        return hash_block(
            parent,
            tokens,
            drop_parent=self.bug == "parentless-hash",
            no_separator=self.bug == "hash-without-separator",
        )

    def add_request(self, req_id: str, prompt: Sequence[int]) -> Request:
        """Admit a request: its cached prefix blocks are taken; the rest is for `append` to compute."""
        if req_id in self.requests:
            raise PoolError(f"request {req_id!r} is already in the pool")
        request = Request(req_id)
        for block in self.cached_prefix(prompt):
            self._touch(block)
            request.blocks.append(block)
            assert block.block_hash is not None
            request.hashes.append(block.block_hash)
        request.tokens = list(prompt[: len(request.blocks) * self.block_size])
        self.requests[req_id] = request
        return request

    def append(self, request: Request, tokens: Sequence[int]) -> list[Slot]:
        """Slots for `tokens` after the request's last one; new blocks as needed, full ones cached."""
        b = self.block_size
        if self.bug != "append-not-atomic":
            self._check_room(request, len(tokens))
        slots: list[Slot] = []
        for token in tokens:
            position = request.num_tokens
            index, offset = divmod(position, b)
            if index == len(request.blocks):
                request.blocks.append(self._new_block())
            block = request.blocks[index]
            if block.is_null:
                raise PoolError(f"request {request.req_id!r}: position {position} falls in a freed window block")
            if block.ref_cnt > 1:
                block = self._copy_on_write(request, index)
            slots.append((block.block_id, offset))
            request.tokens.append(token)
            if offset == b - 1:
                parent = request.hashes[-1] if request.hashes else None
                block_hash = self._hash(parent, request.tokens[index * b : (index + 1) * b])
                request.hashes.append(block_hash)
                block.block_hash = block_hash
                # Two requests that computed the same block: both copies are cached, the first is the one a hit
                # takes, as in V1 (which keeps block tables append-only rather than de-duplicate).
                copies = self.cached.setdefault(block_hash, {})
                if self.bug != "one-copy-per-hash" or not copies:  # pragma: no mutate
                    copies[block.block_id] = block
        return slots

    def _check_room(self, request: Request, count: int) -> None:
        """Refuse an append before changing anything, as V1's `allocate_slots` returns None when the free blocks
        do not cover it. Failing half way would leave the request with tokens whose slots the caller never got,
        so never wrote, and full blocks of them in the prefix cache for another request to hit."""
        if count == 0:
            return
        b = self.block_size
        first, last = request.num_tokens // b, (request.num_tokens + count - 1) // b
        if first < len(request.blocks) and request.blocks[first].is_null:
            raise PoolError(f"request {request.req_id!r}: position {request.num_tokens} falls in a freed window block")
        needed = max(0, last + 1 - len(request.blocks))
        if first < len(request.blocks) and request.blocks[first].ref_cnt > 1 and self.cow:
            needed += 1
        if needed > self.free_queue.num_free:
            raise PoolError(
                f"no free KV block left: request {request.req_id!r} needs {needed} for {count} tokens, "
                f"{self.free_queue.num_free} are free",
                hint="give the pool more blocks or free a request",
            )

    def _copy_on_write(self, request: Request, index: int) -> KVBlock:
        shared = request.blocks[index]
        if not self.cow:
            raise PoolError(
                f"request {request.req_id!r} writes block {shared.block_id}, which {shared.ref_cnt} requests share",
                hint="vLLM V1 shares only full blocks; create the pool with cow=True for V0's copy-on-write",
            )
        fresh = self._new_block()
        self.copies.append((shared.block_id, fresh.block_id))
        self._release(shared)
        request.blocks[index] = fresh
        return fresh

    def fork(self, request: Request, child_id: str) -> Request:
        """A child that shares every block of `request` (beam search, parallel sampling in V0)."""
        if request.num_tokens % self.block_size and not self.cow:
            raise PoolError(
                f"request {request.req_id!r} ends in a partial block, which V1 does not share",
                hint="create the pool with cow=True for V0's copy-on-write",
            )
        if child_id in self.requests:
            raise PoolError(f"request {child_id!r} is already in the pool")
        child = Request(child_id, list(request.tokens), list(request.blocks), list(request.hashes))
        for block in child.blocks:
            self._touch(block)
        self.requests[child_id] = child
        return child

    def free(self, request: Request) -> None:
        """Release a request's blocks, its tail first, so its tail is evicted before its prefix."""
        for block in reversed(request.blocks):
            self._release(block)
        request.blocks = []
        if self.bug == "free-keeps-request":  # pragma: no mutate block
            return
        del self.requests[request.req_id]

    def remove_skipped_blocks(self, request: Request, num_computed: int) -> list[int]:
        """Under a sliding window, before computing the token at position num_computed: free the blocks that
        neither it nor any later token can attend to; they become the null block."""
        if self.sliding_window is None:
            return []
        first_useful = num_computed - self.sliding_window + 1
        if self.bug == "window-frees-extra":  # pragma: no mutate block
            first_useful += self.block_size
        freed: list[int] = []
        for index in range(first_useful // self.block_size - 1, -1, -1):
            block = request.blocks[index]
            if block.is_null:
                break
            freed.append(block.block_id)
            request.blocks[index] = self.null_block
            self._release(block)
        return freed

    # -- checks ---------------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first invariant that does not hold."""
        holders: dict[int, int] = {}
        for request in self.requests.values():
            for block in request.blocks:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
            assert len(request.hashes) == request.num_tokens // self.block_size, f"{request.req_id}: hash count"
        queue = list(self.free_queue)
        in_queue = {b.block_id for b in queue}
        assert len(queue) == len(in_queue) == self.free_queue.num_free, "free queue has duplicates or a bad count"
        assert NULL_BLOCK_ID not in in_queue, "the null block is in the free queue"
        for block in self.blocks[1:]:
            assert block.ref_cnt == holders.get(block.block_id, 0), f"block {block.block_id}: ref_cnt != holders"
            assert (block.ref_cnt == 0) == (block.block_id in in_queue), f"block {block.block_id}: free iff ref 0"
            if block.ref_cnt > 1 and not self.cow:
                assert block.block_hash is not None, f"block {block.block_id}: shared but not full"
        for block_hash, copies in self.cached.items():
            assert copies, "a hash is cached with no block"
            for block_id, block in copies.items():
                assert block.block_id == block_id, f"cached block {block.block_id} is filed under id {block_id}"
                assert block.block_hash == block_hash, f"cached block {block.block_id} has another hash"
        filed = {block_id for copies in self.cached.values() for block_id in copies}
        for block in self.blocks[1:]:
            # Every full block keeps its hash until it is handed out again, and is cached until then.
            assert (block.block_hash is not None) == (block.block_id in filed), (
                f"block {block.block_id}: hashed but not cached, or cached without its hash"
            )
        assert len(queue) + sum(1 for b in self.blocks[1:] if b.ref_cnt > 0) == len(self.blocks) - 1, "lost blocks"
        for prev, nxt in itertools.pairwise(queue):
            assert prev.next is nxt and nxt.prev is prev, "free queue links broken"

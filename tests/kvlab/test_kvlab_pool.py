"""The pool's contract where no case looks: the exact text of each refusal and broken invariant (a user reads
them, and `forge kvlab check` reports them), the smallest pool, the callback a KV store poisons reused blocks
through, the ids a sliding window frees, and the invariant checks each shown failing on the corruption they name.
`nox -s kvlab-mutation` runs these against every pool mutant, beside the cases."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders.kvlab import fuzz
from builders.kvlab.pool import POOL_BUGS, BlockPool, FreeBlockQueue, KVBlock, PoolError, Request, hash_block

COW_HINT = "vLLM V1 shares only full blocks; create the pool with cow=True for V0's copy-on-write"
ROOM_HINT = "give the pool more blocks or free a request"


def _refusal(action: Callable[[], object]) -> PoolError:
    with pytest.raises(PoolError) as caught:
        action()
    return caught.value


def test_each_refusal_says_which_rule_and_what_to_do() -> None:
    err = _refusal(lambda: BlockPool(1, 4))
    assert (err.message, err.hint) == ("a pool needs at least 2 blocks of at least 1 token, not 1 × 4", None)
    assert _refusal(lambda: BlockPool(4, 0)).message == "a pool needs at least 2 blocks of at least 1 token, not 4 × 0"
    assert _refusal(lambda: BlockPool(4, 4, bug="nope")).message == (
        f"unknown pool bug 'nope'; known: {', '.join(POOL_BUGS)}"
    )
    assert POOL_BUGS[:5] == ("no-hit-cap", "mru-eviction", "window-frees-extra", "append-not-atomic", "parentless-hash")

    pool = BlockPool(4, 4)
    r = pool.add_request("r", [])
    pool.append(r, [1, 2, 3])
    assert _refusal(lambda: pool.add_request("r", [])).message == "request 'r' is already in the pool"
    err = _refusal(lambda: pool.fork(r, "c"))
    assert (err.message, err.hint) == (
        "request 'r' ends in a partial block, which V1 does not share",
        "create the pool with cow=True for V0's copy-on-write",
    )
    err = _refusal(lambda: pool.append(r, list(range(20))))
    assert (err.message, err.hint) == (
        "no free KV block left: request 'r' needs 5 for 20 tokens, 2 are free",
        ROOM_HINT,
    )
    pool.append(r, [4])
    assert _refusal(lambda: pool.fork(r, "r")).message == "request 'r' is already in the pool"
    child = pool.fork(r, "c")
    err = _refusal(lambda: pool._copy_on_write(child, 0))
    assert (err.message, err.hint) == (f"request 'c' writes block {r.block_ids[0]}, which 2 requests share", COW_HINT)
    pool.free(child)
    block = pool.blocks[r.block_ids[0]]
    pool._release(block)
    err = _refusal(lambda: pool._release(block))
    assert (err.message, err.hint) == (f"block {block.block_id} freed more often than it was taken", None)


def test_the_free_queue_refuses_an_empty_pop_and_a_block_it_does_not_hold() -> None:
    err = _refusal(FreeBlockQueue([]).popleft)
    assert (err.message, err.hint) == ("no free KV block left", ROOM_HINT)
    queue = FreeBlockQueue([KVBlock(1), KVBlock(2)])
    assert [queue.popleft().block_id, queue.popleft().block_id] == [1, 2]
    err = _refusal(queue.popleft)
    assert err.message == "no free KV block left"
    assert _refusal(lambda: queue.remove(KVBlock(7))).message == "block 7 is not in the free queue"
    # A block taken out is unlinked: taking it out again is refused, not a corrupted queue.
    first, second, third = KVBlock(1), KVBlock(2), KVBlock(3)
    queue = FreeBlockQueue([first, second])
    queue.remove(first)
    assert _refusal(lambda: queue.remove(first)).message == "block 1 is not in the free queue"
    # appendleft (the planted mru-eviction's way back in) puts a block at the head, counted.
    queue.appendleft(third)
    queue.append(first)
    assert [b.block_id for b in queue] == [3, 2, 1] and len(queue) == queue.num_free == 3
    assert queue.popleft() is third


def test_a_write_into_a_freed_window_block_is_refused_before_and_inside_the_loop() -> None:
    for bug, where in ((None, "the up-front check"), ("append-not-atomic", "the per-token loop")):
        pool = BlockPool(6, 4, sliding_window=1, bug=bug)
        r = pool.add_request("r", [])
        pool.append(r, list(range(7)))
        table = r.block_ids
        # The token at 8 sees only itself: blocks 0 and 1 (positions 0-7) go, though position 7 is still unwritten.
        assert pool.remove_skipped_blocks(r, 8) == [table[1], table[0]] and r.block_ids == (0, 0)
        with pytest.raises(PoolError) as caught:
            pool.append(r, [7])
        assert caught.value.message == "request 'r': position 7 falls in a freed window block", where


def test_the_smallest_pool_is_two_blocks_of_one_token() -> None:
    pool = BlockPool(2, 1)
    r = pool.add_request("r", [])
    assert pool.append(r, [9]) == [(1, 0)]
    assert _refusal(lambda: pool.append(r, [10])).message == (
        "no free KV block left: request 'r' needs 1 for 1 tokens, 0 are free"
    )
    pool.check_invariants()


def test_the_room_check_counts_exactly_the_blocks_an_append_takes() -> None:
    # With no block free, tokens that fit the last block's free slots are taken, and an empty append is a no-op.
    for cow in (False, True):
        pool = BlockPool(2, 2, cow=cow)
        r = pool.add_request("r", [])
        assert pool.append(r, [9]) == [(1, 0)]
        assert pool.append(r, []) == []
        assert pool.append(r, [10]) == [(1, 1)]
        err = _refusal(lambda pool=pool, r=r: pool.append(r, [11]))  # type: ignore[misc]
        assert (err.message, err.hint) == (
            "no free KV block left: request 'r' needs 1 for 1 tokens, 0 are free",
            ROOM_HINT,
        )
        assert r.num_tokens == 2
    # Copy-on-write of a shared partial block takes exactly one block: with one free, the write goes through.
    pool = BlockPool(4, 4, cow=True)
    r = pool.add_request("r", [])
    pool.append(r, list(range(6)))
    child = pool.fork(r, "c")
    assert pool.free_queue.num_free == 1
    assert pool.append(child, [6]) == [(3, 2)]
    err = _refusal(lambda: pool.append(r, [6, 7, 8]))
    assert err.message == "no free KV block left: request 'r' needs 1 for 3 tokens, 0 are free"


def test_a_block_computed_after_a_prefix_hit_chains_its_hash_to_the_hit() -> None:
    pool = BlockPool(16, 4)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    a = pool.add_request("a", [])
    pool.append(a, x + y)
    b = pool.add_request("b", [*x, *z, 0])
    assert b.num_tokens == 4
    pool.append(b, z)
    assert b.hashes == [hash_block(None, x), hash_block(hash_block(None, x), z)]
    # z cached at position 4 after x: a prompt starting with z does not hit it; one starting x + z does.
    assert pool.add_request("c", [*z, 0]).num_tokens == 0
    assert pool.add_request("d", [*x, *z, 0]).num_tokens == 8


def test_the_planted_pool_bugs_reach_append_and_the_lookup() -> None:
    # append-not-atomic skips the room check: the append runs out half way, keeping the tokens it placed.
    pool = BlockPool(3, 4, bug="append-not-atomic")
    r = pool.add_request("r", [])
    err = _refusal(lambda: pool.append(r, list(range(12))))
    assert err.message == "no free KV block left" and r.num_tokens == 8
    # parentless-hash hashes each full block on its own tokens, in append as in the prefix lookup.
    tokens = list(range(8))
    for bug, parent in ((None, hash_block(None, tokens[:4])), ("parentless-hash", None)):
        pool = BlockPool(4, 4, bug=bug)
        r = pool.add_request("r", [])
        pool.append(r, tokens)
        assert r.hashes[1] == hash_block(parent, tokens[4:])
    # And in the prefix lookup: under the bug, blocks 2 and 3 of a request hit at positions 0 and 1.
    pool = BlockPool(8, 4, bug="parentless-hash")
    r = pool.add_request("r", [])
    pool.append(r, list(range(12)))
    assert pool.add_request("h", [*range(4, 12), 99]).num_tokens == 8


def test_every_block_handed_out_is_announced_so_the_store_can_poison_it() -> None:
    handed: list[int] = []
    pool = BlockPool(8, 4, cow=True, on_new_block=handed.append)
    r = pool.add_request("r", [])
    pool.append(r, list(range(6)))
    child = pool.fork(r, "c")
    pool.append(child, [6])  # the shared partial block is copied: the copy is handed out too
    assert handed == [*r.block_ids, child.block_ids[1]] and len(handed) == 3
    assert pool.copies == [(r.block_ids[1], child.block_ids[1])]


def test_the_window_returns_the_ids_it_freed_tail_first() -> None:
    pool = BlockPool(8, 4, sliding_window=6)
    r = pool.add_request("r", [])
    pool.append(r, list(range(21)))
    table = r.block_ids
    assert pool.remove_skipped_blocks(r, 21) == [table[3], table[2], table[1], table[0]]
    assert pool.remove_skipped_blocks(r, 21) == []
    assert BlockPool(4, 4).remove_skipped_blocks(Request("x"), 100) == []


def test_a_planted_bug_reaches_the_pool() -> None:
    # The switch `forge kvlab check --mutants` plants pool bugs through: without the cap a whole prompt hits.
    for bug, hit in ((None, 4), ("no-hit-cap", 8)):
        pool = BlockPool(6, 4, bug=bug)
        r = pool.add_request("r", [])
        pool.append(r, list(range(8)))
        assert pool.bug == bug
        assert pool.add_request("h", list(range(8))).num_tokens == hit


def _pool() -> tuple[BlockPool, Request]:
    pool = BlockPool(8, 4)
    request = pool.add_request("r", [])
    pool.append(request, list(range(9)))
    pool.check_invariants()
    return pool, request


def _shared_partial(pool: BlockPool, r: Request) -> None:
    # A second holder of the partial block, made behind the pool's back (fork refuses it without cow).
    pool.requests["s"] = Request("s", [8], [r.blocks[2]], [])
    r.blocks[2].ref_cnt += 1


def _broken_link(pool: BlockPool, r: Request) -> None:
    first, second = list(pool.free_queue)[:2]
    second.prev = pool.blocks[r.block_ids[0]]
    assert first.next is second


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda p, r: setattr(p.blocks[r.block_ids[0]], "ref_cnt", 2), "block {0}: ref_cnt != holders"),
        (lambda p, r: r.hashes.append(b"x"), "r: hash count"),
        (lambda p, r: p.free_queue.append(p.null_block), "the null block is in the free queue"),
        (lambda p, r: setattr(p.free_queue, "num_free", 99), "free queue has duplicates or a bad count"),
        (
            lambda p, r: p.cached.__setitem__(b"other", {r.block_ids[0]: p.blocks[r.block_ids[0]]}),
            "cached block {0} has another hash",
        ),
        (lambda p, r: p.cached.__setitem__(b"other", {}), "a hash is cached with no block"),
        (
            lambda p, r: p.cached[r.hashes[0]].__setitem__(5, p.blocks[r.block_ids[0]]),
            "cached block {0} is filed under id 5",
        ),
        (lambda p, r: p.cached[r.hashes[1]].clear(), "a hash is cached with no block"),
        (lambda p, r: p.cached.pop(r.hashes[1]), "block {1}: hashed but not cached, or cached without its hash"),
        (lambda p, r: p.free_queue.remove(p.blocks[7]), "block 7: free iff ref 0"),
        (lambda p, r: p.free_queue.append(KVBlock(99)), "lost blocks"),
        (_shared_partial, "block {2}: shared but not full"),
        (_broken_link, "free queue links broken"),
    ],
)
def test_each_invariant_fails_on_the_corruption_it_names(
    corrupt: Callable[[BlockPool, Request], object], message: str
) -> None:
    pool, request = _pool()
    corrupt(pool, request)
    with pytest.raises(AssertionError) as caught:
        pool.check_invariants()
    assert str(caught.value) == message.format(*request.block_ids)


# -- the pool's state after sequences its first fuzz never built (issue 51) ----------------------------------------


def test_every_copy_of_a_block_is_cached_and_a_hit_takes_the_first() -> None:
    # vLLM V1 keeps {hash: {block id: block}} and never de-duplicates, so block tables stay append-only.
    pool = BlockPool(8, 4)
    prompt = list(range(8))
    a = pool.add_request("a", prompt)
    pool.append(a, prompt)
    b = pool.add_request("b", prompt)  # the hit is capped at 7 tokens: b computes the second block again
    pool.append(b, prompt[b.num_tokens :])
    assert list(pool.cached[a.hashes[1]]) == [a.block_ids[1], b.block_ids[1]]
    assert pool.cached_prefix([*prompt, 0])[1] is pool.blocks[a.block_ids[1]]
    # Evicting a's copy leaves b's findable; evicting both drops the hash.
    second, a_copy, b_copy = a.hashes[1], a.block_ids[1], b.block_ids[1]
    pool.free(a)
    pool._evict(pool.blocks[a_copy], second)
    assert list(pool.cached[second]) == [b_copy]
    pool._evict(pool.blocks[b_copy], second)
    assert second not in pool.cached


def test_the_hash_separates_token_ids_whose_digits_run_together() -> None:
    assert hash_block(None, [1, 23, 4]) != hash_block(None, [12, 3, 4])
    assert hash_block(None, [1, 23, 4], no_separator=True) == hash_block(None, [12, 3, 4], no_separator=True)


@settings(max_examples=200, derandomize=True, database=None)
@given(st.text("0123456789", min_size=2, max_size=12), st.data())
def test_two_splits_of_the_same_digits_never_hash_alike(digits: str, data: st.DataObject) -> None:
    # The collision a separator-free join allows: the same digits cut into token ids at other places.
    def split(cuts: list[int]) -> list[int]:
        edges = [0, *sorted(set(cuts)), len(digits)]
        return [int(digits[i:j]) for i, j in itertools.pairwise(edges) if j > i]

    cut = st.lists(st.integers(1, len(digits) - 1), max_size=len(digits))
    first, second = split(data.draw(cut)), split(data.draw(cut))
    assert (hash_block(None, first) == hash_block(None, second)) == (first == second)
    parent = hash_block(None, [7])
    assert (hash_block(parent, first) == hash_block(parent, second)) == (first == second)


@pytest.mark.parametrize(
    ("bug", "message"),
    [
        ("one-copy-per-hash", "hashed but not cached"),
        ("stale-hash-after-eviction", "has another hash"),
        ("hash-without-separator", "prefix hit of"),
        ("free-keeps-request", "a new request with its id is refused"),
        ("hit-skips-hole", "prefix hit of"),
        ("parentless-hash", "prefix hit of"),
    ],
)
def test_each_state_property_fails_when_its_bug_is_put_back(bug: str, message: str) -> None:
    # The fuzz's seeded sequences (the path without Hypothesis) against the pool with the bug planted: the
    # property that names it fails, on a shrunk sequence. Without the bug every sequence passes.
    with pytest.raises(AssertionError, match=message):
        fuzz.check_seeded(bug)
    fuzz.check_seeded(None)

"""The oracle's cases: each names the features it covers, its tolerance and why that tolerance.

A case with target "layouts" runs once per layout, against the dense fp32 oracle; "pool", "oracle" and
"format" cases check the block pool, the oracle's own arithmetic and the CSR exchange format. Every feature of
the study's list (REQUIRED_FEATURES) must be covered by at least one case, or `forge kvlab check` fails.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from builders.kvlab import kernel, oracle
from builders.kvlab.casebook import CASES as CASES
from builders.kvlab.casebook import EXACT, FP8, POOL, case
from builders.kvlab.casebook import FP32 as FP32
from builders.kvlab.casebook import REQUIRED_FEATURES as REQUIRED_FEATURES
from builders.kvlab.casebook import Case as Case
from builders.kvlab.casebook import CaseFailed as CaseFailed
from builders.kvlab.casebook import Ctx as Ctx
from builders.kvlab.casebook import coverage as coverage
from builders.kvlab.lab import Lab, aim_logits
from builders.kvlab.layouts import Entry, spans_of, to_csr
from builders.kvlab.oracle import reference_attention
from builders.kvlab.pool import NULL_BLOCK_ID, BlockPool, PoolError, Request
from builders.kvlab.spec import FP8_E4M3_MAX, AttnSpec, alibi_slopes, fp8_e4m3


def _spec(heads: int = 4, kv_heads: int = 4, head_size: int = 64, **options: Any) -> AttnSpec:
    return AttnSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size, **options)


def _single(ctx: Ctx, spec: AttnSpec, length: int, *, block_size: int = 16, **lab_options: Any) -> Lab:
    lab = ctx.lab(spec, block_size=block_size, **lab_options)
    request = lab.admit("r0", lab.prompt(length))
    ctx.verify(lab, ctx.layout(lab), [request])
    return lab


# -- lengths and slots ----------------------------------------------------------------------------------------


@case("len-1", ["odd-lengths", "partial-final-block"], length=1, block_size=16)
def _len_1(ctx: Ctx) -> None:
    _single(ctx, _spec(), 1)


@case("len-17", ["odd-lengths", "partial-final-block"], length=17, block_size=16)
def _len_17(ctx: Ctx) -> None:
    _single(ctx, _spec(), 17)


@case("len-kB", ["odd-lengths"], length=48, block_size=16)
def _len_kb(ctx: Ctx) -> None:
    _single(ctx, _spec(), 48)


@case("len-kB-plus-1", ["odd-lengths", "partial-final-block"], length=49, block_size=16)
def _len_kb_plus_1(ctx: Ctx) -> None:
    _single(ctx, _spec(), 49)


@case("nan-poisoned-unused-slots", ["nan-poison", "partial-final-block"], length=37, block_size=16)
def _nan_poison(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=16)
    request = lab.admit("r0", lab.prompt(37))
    tail = request.block_ids[-1]
    ctx.require(bool(np.isnan(lab.store.k[tail, 37 % 16 :]).all()), "the last block's unused slots are not NaN")
    ctx.require(bool(np.isnan(lab.store.k[NULL_BLOCK_ID]).all()), "the null block is not NaN")
    ctx.verify(lab, ctx.layout(lab), [request])


@case("decode-across-block-boundary", ["partial-final-block", "odd-lengths"], block_size=8)
def _decode_steps(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=8)
    layout = ctx.layout(lab)
    requests = [lab.admit("a", lab.prompt(13)), lab.admit("b", lab.prompt(6))]
    for step in range(12):
        ctx.verify(lab, layout, requests, label=f"step {step}")
        for request in requests:
            lab.compute(request, lab.prompt(1))


# -- tables -----------------------------------------------------------------------------------------------------


@case("contiguous-table", ["contiguous"], length=80, block_size=16)
def _contiguous(ctx: Ctx) -> None:
    lab = _single(ctx, _spec(), 80)
    ids = lab.pool.requests["r0"].block_ids
    ctx.require(list(ids) == list(range(ids[0], ids[0] + len(ids))), f"table {ids} is not contiguous")


def _fragmented(ctx: Ctx, kind: str, *, block_size: int, lengths: Sequence[int]) -> None:
    lab = ctx.lab(_spec(), block_size=block_size, num_blocks=96, fragment=kind)
    requests = [lab.admit(f"r{i}", lab.prompt(n)) for i, n in enumerate(lengths)]
    ids = requests[0].block_ids
    ctx.require(any(b != a + 1 for a, b in itertools.pairwise(ids)), f"table {ids} is not fragmented")
    ctx.verify(lab, ctx.layout(lab), requests)


@case("fragmented-shuffled", ["fragmented"], block_size=16, lengths=[70, 33, 100])
def _fragmented_shuffled(ctx: Ctx) -> None:
    _fragmented(ctx, "shuffled", block_size=16, lengths=[70, 33, 100])


@case("fragmented-gapped-runs", ["fragmented"], block_size=8, lengths=[61, 40])
def _fragmented_gapped(ctx: Ctx) -> None:
    _fragmented(ctx, "gapped", block_size=8, lengths=[61, 40])


# -- heads ------------------------------------------------------------------------------------------------------


@case("mha-32", ["mha"], heads=32, kv_heads=32, head_size=64, length=40)
def _mha(ctx: Ctx) -> None:
    _single(ctx, _spec(32, 32, 64), 40)


@case("gqa-32-8", ["gqa", "head-size"], heads=32, kv_heads=8, head_size=128, lengths=[70, 19])
def _gqa(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(32, 8, 128), block_size=16)
    requests = [lab.admit("r0", lab.prompt(70)), lab.admit("r1", lab.prompt(19))]
    ctx.verify(lab, ctx.layout(lab), requests)


@case("mqa-8-1", ["mqa", "head-size"], heads=8, kv_heads=1, head_size=128, length=45)
def _mqa(ctx: Ctx) -> None:
    _single(ctx, _spec(8, 1, 128), 45)


@case("head-size-96", ["head-size", "gqa"], heads=8, kv_heads=2, head_size=96, length=33)
def _head_96(ctx: Ctx) -> None:
    _single(ctx, _spec(8, 2, 96), 33)


@case("head-size-256", ["head-size", "gqa"], heads=8, kv_heads=4, head_size=256, length=29)
def _head_256(ctx: Ctx) -> None:
    _single(ctx, _spec(8, 4, 256), 29)


# -- block sizes ------------------------------------------------------------------------------------------------


@case("block-size-1", ["block-size", "fragmented"], block_size=1, length=23)
def _block_1(ctx: Ctx) -> None:
    _single(ctx, _spec(), 23, block_size=1, fragment="shuffled")


@case("block-size-8", ["block-size", "partial-final-block"], block_size=8, length=35)
def _block_8(ctx: Ctx) -> None:
    _single(ctx, _spec(), 35, block_size=8)


@case("block-size-32", ["block-size", "partial-final-block"], block_size=32, length=70)
def _block_32(ctx: Ctx) -> None:
    _single(ctx, _spec(), 70, block_size=32, num_blocks=16)


# -- ALiBi ------------------------------------------------------------------------------------------------------


@case("alibi-pow2-gqa", ["alibi", "gqa"], heads=8, kv_heads=2, length=50)
def _alibi_pow2(ctx: Ctx) -> None:
    _single(ctx, _spec(8, 2, 64, alibi=True), 50)


@case("alibi-non-pow2-gqa", ["alibi-non-pow2", "gqa"], heads=12, kv_heads=4, length=50)
def _alibi_non_pow2(ctx: Ctx) -> None:
    _single(ctx, _spec(12, 4, 64, alibi=True), 50)


# vLLM's `_get_alibi_slopes` (fp32) for 6, 8 and 12 heads, written out: 2^(-8i/p) for the largest power of two
# p ≤ n, then the odd terms of the sequence for 2p.
VLLM_ALIBI_SLOPES = {
    6: (0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125),
    8: (0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625),
    12: (
        *(0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625),
        *(0.70710677, 0.35355338, 0.17677669, 0.088388346),
    ),
}


@case("alibi-slopes-as-vllm", ["alibi", "alibi-non-pow2"], target="oracle", tolerance=EXACT)
def _alibi_slopes(ctx: Ctx) -> None:
    # The implementation's slopes and the oracle's, each against vLLM's values: a slope wrong on both sides fails.
    for heads, values in VLLM_ALIBI_SLOPES.items():
        pinned = np.asarray(values, dtype=np.float32)
        ctx.close(f"{heads} heads, implementation", alibi_slopes(heads), pinned)
        ctx.close(f"{heads} heads, oracle", oracle.alibi_slopes(heads).astype(np.float32), pinned)
    for heads in (1, 2, 5, 24, 40, 64):
        ctx.close(f"{heads} heads", alibi_slopes(heads), oracle.alibi_slopes(heads).astype(np.float32))


# -- sliding window ---------------------------------------------------------------------------------------------


def _window_decode(ctx: Ctx, window: int, *, block_size: int, prompt: int, steps: int) -> None:
    lab = ctx.lab(_spec(8, 2, 64, sliding_window=window), block_size=block_size)
    layout = ctx.layout(lab)
    requests = [lab.admit("a", lab.prompt(prompt)), lab.admit("b", lab.prompt(prompt - 7))]
    free_before = lab.pool.free_queue.num_free
    for step in range(steps):
        for request in requests:
            lab.compute(request, lab.prompt(1))
        ctx.verify(lab, layout, requests, label=f"step {step}")
    table = requests[0].block_ids
    first_needed = (requests[0].num_tokens - 1 - window + 1) // block_size
    ctx.require(NULL_BLOCK_ID in table, f"no out-of-window block was freed: table {table}")
    ctx.require(all(b != NULL_BLOCK_ID for b in table[first_needed:]), f"a block in the window was freed: {table}")
    ctx.require(lab.pool.free_queue.num_free > free_before - 2 * steps, "freed window blocks did not return")
    lab.pool.check_invariants()


@case("sliding-window-edge-mid-block", ["sliding-window", "window-free", "gqa"], window=20, block_size=16)
def _window_mid(ctx: Ctx) -> None:
    _window_decode(ctx, 20, block_size=16, prompt=60, steps=6)


@case("sliding-window-edge-on-boundary", ["sliding-window", "window-free"], window=16, block_size=8)
def _window_boundary(ctx: Ctx) -> None:
    _window_decode(ctx, 16, block_size=8, prompt=41, steps=9)


@case("sliding-window-chunked-prefill", ["sliding-window", "chunked-prefill", "window-free"], window=24, chunk=13)
def _window_chunked(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(4, 4, 64, sliding_window=24), block_size=8)
    layout = ctx.layout(lab)
    prompt = lab.prompt(75)
    request = lab.admit("r0", prompt, chunk=13)
    ctx.verify(lab, layout, [request], n_query=13, label="chunk 0")
    done = 13
    while done < len(prompt):
        chunk = prompt[done : done + 13]
        lab.compute(request, chunk)
        done += len(chunk)
        ctx.verify(lab, layout, [request], n_query=len(chunk), label=f"chunk at {done}")
    ctx.require(NULL_BLOCK_ID in request.block_ids, "no block left the window")


# -- prefix caching ---------------------------------------------------------------------------------------------


@case("chunked-prefill-after-prefix-hit", ["chunked-prefill", "prefix-hit", "prefix-reuse"], block_size=16, chunk=11)
def _chunked_after_hit(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=16)
    first = lab.prompt(70)
    lab.pool.free(lab.admit("a", first))
    prompt = first[:50] + lab.prompt(30)
    request = lab.admit("b", prompt, chunk=11)
    ctx.require(request.num_tokens == 48 + 11, f"expected a 48-token hit then 11 computed, have {request.num_tokens}")
    layout = ctx.layout(lab)
    ctx.verify(lab, layout, [request], n_query=11, label="first chunk")
    while request.num_tokens < len(prompt):
        chunk = prompt[request.num_tokens : request.num_tokens + 11]
        lab.compute(request, chunk)
        ctx.verify(lab, layout, [request], n_query=len(chunk), label=f"chunk to {request.num_tokens}")


@case("prefix-hit-capped", ["prefix-hit", "prefix-reuse"], block_size=16, length=64)
def _prefix_capped(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=16)
    prompt = lab.prompt(64)
    lab.pool.free(lab.admit("a", prompt))
    request = lab.pool.add_request("b", prompt)
    # All 4 blocks are cached, but the last token must be computed to have logits: the hit stops at 48.
    ctx.require(request.num_tokens == 48, f"prefix hit of {request.num_tokens} tokens for a 64-token prompt, not 48")
    lab.compute(request, prompt[48:])
    ctx.verify(lab, ctx.layout(lab), [request])


@case("prefix-reuse-live", ["prefix-reuse", "cascade-merge", "partial-final-block"], block_size=16, sharers=4)
def _prefix_live(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=16)
    shared = lab.prompt(40)
    requests = [lab.admit(f"r{i}", shared + lab.prompt(n)) for i, n in enumerate((3, 17, 30, 1))]
    blocks = requests[0].block_ids[:2]
    ctx.require(all(r.block_ids[:2] == blocks for r in requests), "the 2 full prefix blocks are not shared")
    ctx.require(all(lab.pool.blocks[b].ref_cnt == 4 for b in blocks), "shared blocks do not have ref_cnt 4")
    ctx.require(len({r.block_ids[2] for r in requests}) == 4, "the partial third block was shared")
    layout = ctx.layout(lab)
    for step in range(3):
        ctx.verify(lab, layout, requests, label=f"step {step}")
        for request in requests:
            lab.compute(request, lab.prompt(1))
    lab.pool.check_invariants()


@case("prefix-reuse-after-eviction", ["prefix-reuse", "prefix-hit"], block_size=8, num_blocks=12)
def _prefix_evicted(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=8, num_blocks=12)
    prompt = lab.prompt(30)
    lab.pool.free(lab.admit("a", prompt))
    survivor = lab.admit("b", prompt[:17] + lab.prompt(5))
    ctx.require(survivor.num_tokens == 22 and lab.pool.blocks[survivor.block_ids[0]].ref_cnt == 1, "no 16-token hit")
    filler = lab.admit("filler", lab.prompt(8 * 8))
    ctx.require(lab.pool.evictions > 0, "nothing was evicted")
    lab.pool.free(filler)
    again = lab.admit("c", prompt)
    # Block 0 and 1 stay cached (b holds them); the evicted third block has to be recomputed.
    ctx.require(again.block_ids[:2] == survivor.block_ids[:2], "c did not reuse the prefix b holds")
    ctx.verify(lab, ctx.layout(lab), [survivor, again])


@case("request-id-reused-across-steps", ["request-id-reuse", "prefix-reuse", "partial-final-block"], block_size=8)
def _request_id_reused(ctx: Ctx) -> None:
    # x finishes; another request takes x's last block, and a new request with x's id gets x's first block
    # back at the same logical place with other tokens in it, while the layout still remembers x's 12 tokens. A layout that keys what it keeps by request id
    # (the virtual layout's buffer) must see the block was handed out again.
    lab = ctx.lab(_spec(), block_size=8, num_blocks=4)
    layout = ctx.layout(lab)
    first = lab.admit("x", lab.prompt(12))
    ctx.verify(lab, layout, [first], label="first x")
    old = first.block_ids
    lab.pool.free(first)
    # The free queue is now [3, 2, 1] (x's tail first): d takes 3 and 2, the new x gets 1.
    other = lab.admit("d", lab.prompt(9))
    again = lab.admit("x", lab.prompt(8))
    ctx.require(again.block_ids[0] == old[0], f"x's first block {old[0]} was not handed back ({again.block_ids})")
    ctx.verify(lab, layout, [again, other], label="x again")
    lab.pool.check_invariants()


@case("pool-evicted-duplicate", ["evicted-duplicate", "prefix-hit"], target="pool", tolerance=POOL)
def _evicted_duplicate(ctx: Ctx) -> None:
    # b's hit is capped below its 16-token prompt, so b computes a's second block again: two copies of one hash.
    pool = BlockPool(8, 8, bug=ctx.pool_bug)
    prompt = list(range(16))
    a = pool.add_request("a", prompt)
    pool.append(a, prompt)
    b = pool.add_request("b", prompt)
    pool.append(b, prompt[b.num_tokens :])
    second = a.hashes[1]
    copies = sorted(pool.cached.get(second, {}))
    ctx.require(copies == sorted([a.block_ids[1], b.block_ids[1]]), f"copies cached under one hash: {copies}")
    pool.check_invariants()
    pool.free(a)
    filler = pool.add_request("filler", [])
    pool.append(filler, [-1] * 8 * pool.free_queue.num_free)
    ctx.require(a.hashes[1] == second and pool.evictions >= 1, "a's copy was not evicted")
    # b's copy still holds the block: a prompt that starts with it hits both blocks.
    hit = pool.add_request("c", [*prompt, 99]).num_tokens
    ctx.require(hit == 16, f"{hit}-token hit after a's copy was evicted; b's copy holds all 16")
    pool.check_invariants()


@case("pool-hash-token-boundaries", ["hash-boundaries", "prefix-hit"], target="pool", tolerance=POOL)
def _hash_boundaries(ctx: Ctx) -> None:
    pool = BlockPool(6, 4, bug=ctx.pool_bug)
    a = pool.add_request("a", [1, 23, 4, 5, 6])
    pool.append(a, [1, 23, 4, 5, 6])
    # Digits that run together: "1,23,4,5" and "12,3,4,5" differ, "12345" and "12345" do not.
    hit = pool.add_request("b", [12, 3, 4, 5, 6]).num_tokens
    ctx.require(hit == 0, f"[12, 3, 4, 5] hit the block holding [1, 23, 4, 5] ({hit} tokens)")
    ctx.require(pool.add_request("c", [1, 23, 4, 5, 7]).num_tokens == 4, "the same tokens must still hit")


@case("pool-chain-with-hole", ["chain-hole", "window-free", "prefix-hit"], target="pool", tolerance=POOL)
def _chain_hole(ctx: Ctx) -> None:
    # Blocks 1 2 3 of a prompt are cached; b holds block 1, a sliding window frees a's blocks 1 and 2, and
    # allocation evicts 2: block 3 is still cached (a holds it) behind a hole. A hit stops at the hole.
    pool = BlockPool(8, 8, sliding_window=8, bug=ctx.pool_bug)
    prompt = list(range(100, 124))
    a = pool.add_request("a", prompt)
    pool.append(a, prompt)
    b = pool.add_request("b", [*prompt[:8], 1, 2, 3])
    pool.append(b, [1, 2, 3])
    freed = pool.remove_skipped_blocks(a, 24)
    ctx.require(len(freed) == 2, f"the window freed {freed}, not a's first two blocks")
    filler = pool.add_request("filler", [])
    pool.append(filler, [-1] * 8 * pool.free_queue.num_free)
    third = pool.cached.get(a.hashes[2], {})
    ctx.require(bool(third) and a.hashes[1] not in pool.cached, "no hole: block 2 cached or block 3 gone")
    hit = len(pool.cached_prefix([*prompt, 7]))
    ctx.require(hit == 1, f"a hit of {hit} blocks over a chain whose second block was evicted, not 1")
    pool.check_invariants()


@case("prefix-hash-at-shifted-positions", ["prefix-hit", "prefix-reuse"], block_size=8, num_blocks=10)
def _prefix_shifted(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=8, num_blocks=10)
    pool = lab.pool
    x, y = lab.prompt(8), lab.prompt(8)

    def hit(req_id: str, prompt: list[int], expected: int, why: str) -> Request:
        request = pool.add_request(req_id, prompt)
        ctx.require(request.num_tokens == expected, f"{req_id}: {request.num_tokens}-token hit, not {expected}: {why}")
        lab.compute(request, prompt[request.num_tokens :])
        return request

    pool.free(lab.admit("a", x + y + lab.prompt(3)))
    # y is cached as a's second block, after x: at position 0, or after another block, its prefix differs.
    shifted = hit("shifted", y + lab.prompt(5), 0, "y at position 0 is not y after x")
    pool.free(hit("other", lab.prompt(8) + y + lab.prompt(2), 0, "y after another block is not y after x"))
    pool.free(hit("probe", x + y + [1], 16, "the whole prefix x + y matches"))
    # Evict every cached block that no request holds, so their ids come back holding other tokens.
    filler = lab.admit("filler", lab.prompt(8 * pool.free_queue.num_free))
    ctx.require(pool.evictions >= 2, f"{pool.evictions} evictions: a's blocks were not reused")
    pool.free(filler)
    # shifted still holds y at position 0: y + y hits that block once, and its second y (after y) misses.
    again = hit("again", y + y + lab.prompt(1), 8, "only the first y has a matching prefix")
    whole = hit("whole", x + y + lab.prompt(4), 0, "x + y was evicted")
    ctx.verify(lab, ctx.layout(lab), [shifted, again, whole])


@case("window-with-shared-prefix", ["sliding-window", "prefix-reuse", "cascade-merge"], window=30, block_size=8)
def _window_shared(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(4, 4, 64, sliding_window=30), block_size=8, num_blocks=32)
    shared = lab.prompt(32)
    # Each computed in one step, so no block has left the window yet and the two keep their common prefix.
    requests = [lab.admit("long", shared + lab.prompt(28)), lab.admit("short", shared + lab.prompt(8))]
    ctx.require(requests[0].block_ids[:4] == requests[1].block_ids[:4], "the 4 prefix blocks are not shared")
    ctx.verify(lab, ctx.layout(lab), requests)


# -- copy-on-write ----------------------------------------------------------------------------------------------


@case("cow-write-to-shared-partial-block", ["cow", "partial-final-block", "prefix-reuse"], block_size=16)
def _cow(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(8, 2, 64), block_size=16, cow=True)
    layout = ctx.layout(lab)
    parent = lab.admit("parent", lab.prompt(37))
    child = lab.pool.fork(parent, "child")
    shared_tail = parent.block_ids[2]
    ctx.require(lab.pool.blocks[shared_tail].ref_cnt == 2, "the partial block is not shared after fork")
    ctx.verify(lab, layout, [parent, child], label="after fork")
    child_entry = lab.entry(child)
    before = layout.attend([child_entry], lab.store)[0]
    lab.compute(parent, lab.prompt(20))
    ctx.require(lab.pool.copies[-1][0] == shared_tail, "the write to the shared block was not copied")
    ctx.require(parent.block_ids[2] != shared_tail and child.block_ids[2] == shared_tail, "tables after the copy")
    after = layout.attend([child_entry], lab.store)[0]
    ctx.require(bool(np.array_equal(before, after)), "the other sharer's output changed after the write")
    ctx.verify(lab, layout, [parent, child], label="after write")
    lab.pool.check_invariants()


@case("cow-refused-without-option", ["cow"], target="pool", tolerance=POOL)
def _cow_refused(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(), block_size=16)
    request = lab.admit("a", lab.prompt(37))
    try:
        lab.pool.fork(request, "b")
    except PoolError:
        pass
    else:
        raise CaseFailed("V1 semantics: forking a partial block must be refused without cow=True")
    lab.compute(request, lab.prompt(11))
    child = lab.pool.fork(request, "b")
    ctx.require(child.block_ids == request.block_ids, "a fork at a block boundary shares every block")
    try:
        lab.compute(child, lab.prompt(1))
        lab.compute(request, lab.prompt(1))
    except PoolError:
        raise CaseFailed("writing a new block after a boundary fork needs no copy") from None
    lab.pool.check_invariants()


# -- fp8 --------------------------------------------------------------------------------------------------------


@case("fp8-e4m3-per-tensor-scales", ["fp8", "gqa"], tolerance=FP8, k_scale=0.02, v_scale=0.035)
def _fp8(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(8, 2, 64, k_scale=0.02, v_scale=0.035), block_size=16, fragment="gapped", num_blocks=48)
    requests = [lab.admit("a", lab.prompt(45)), lab.admit("b", lab.prompt(16))]
    ctx.verify(lab, ctx.layout(lab), requests)


@case("fp8-saturation", ["fp8", "fp8-saturation"], tolerance=FP8, k_scale=2 / 448, v_scale=3 / 448)
def _fp8_saturation(ctx: Ctx) -> None:
    spec = _spec(4, 4, 64, k_scale=2 / 448, v_scale=3 / 448)
    lab = ctx.lab(spec, block_size=8, gain=1.5)
    request = lab.admit("a", lab.prompt(40))
    k, _ = lab.kv(request.tokens, 0)
    saturated = int(np.sum(np.abs(k) / (2 / 448) > FP8_E4M3_MAX))
    ctx.require(saturated > 100, f"only {saturated} K values beyond ±448 · k_scale: no saturation tested")
    ctx.require(float(np.nanmax(np.abs(lab.store.k))) == FP8_E4M3_MAX, "the cache holds values beyond ±448")
    ctx.verify(lab, ctx.layout(lab), [request])


@case("fp8-e4m3-grid", ["fp8", "fp8-saturation"], target="oracle", tolerance=EXACT)
def _fp8_grid(ctx: Ctx) -> None:
    # The store's quantiser (log2 and rounding) against the oracle's (nearest value of the bit-field grid).
    grid = oracle.e4m3_values()
    ctx.require(len(grid) == 127 and grid[-1] == FP8_E4M3_MAX and grid[8] == 2.0**-6, "e4m3fn has 126 positive values")
    signed = np.concatenate([grid, -grid])
    ctx.close("grid values are fixed points", fp8_e4m3(signed), signed)
    mids = (grid[:-1] + grid[1:]) / 2
    # A tie goes to the even mantissa; in e4m3 mantissas alternate, so every other midpoint rounds down.
    even = np.where(np.arange(len(mids)) % 2 == 0, grid[:-1], grid[1:])
    ctx.close("midpoints round to even", fp8_e4m3(mids), even)
    ctx.close("beyond 448 saturates", fp8_e4m3(np.asarray([449.0, 1e6, -500.0])), np.asarray([448.0, 448.0, -448.0]))
    ctx.require(bool(np.isnan(fp8_e4m3(np.asarray([np.nan])))[0]), "NaN must stay NaN")
    rng = np.random.default_rng(11)
    sample = np.concatenate(
        [rng.standard_normal(4000) * 100, rng.uniform(-500, 500, 2000), rng.uniform(-0.02, 0.02, 2000)]
    )
    ctx.close("random values, both quantisers", fp8_e4m3(sample), oracle.e4m3_round_trip(sample))


# -- cascade ----------------------------------------------------------------------------------------------------


@case("cascade-merge-equals-monolithic", ["cascade-merge", "alibi-non-pow2", "gqa"], target="oracle", splits="1-5")
def _cascade(ctx: Ctx) -> None:
    spec = _spec(12, 4, 64, alibi=True, sliding_window=40)
    rng = np.random.default_rng(7)
    for trial in range(6):
        length, n_q = int(rng.integers(2, 90)), int(rng.integers(1, 6))
        n_q = min(n_q, length)
        q = rng.standard_normal((n_q, 12, 64)).astype(np.float32)
        k = rng.standard_normal((length, 4, 64)).astype(np.float32)
        v = rng.standard_normal((length, 4, 64)).astype(np.float32)
        q_pos = np.arange(length - n_q, length)
        cuts = sorted({0, length, *(int(c) for c in rng.integers(0, length, int(rng.integers(0, 5))))})
        part = None
        for lo, hi in itertools.pairwise(cuts):
            piece = kernel.attend(q, q_pos, k[lo:hi], v[lo:hi], np.arange(lo, hi), spec, ctx.kernel_bugs)
            part = piece if part is None else kernel.merge(part, piece, bugs=ctx.kernel_bugs)
        assert part is not None
        expected = reference_attention(q, k, v, alibi=True, sliding_window=40)
        ctx.close(f"trial {trial}: {len(cuts) - 1} parts", part[0], expected)


# Logit range: every other case sits near |logit| 4, where a softmax or LSE merge that skips its maximum is exact.
LOGIT_TARGETS = {"logits-near-0": 1e-3, "logits-50": 50.0, "logits-200": 200.0}
WIDE = (
    2e-4,
    2e-4,
    "fp32 logits of |200| carry ~200·2^-24·sqrt(d) of rounding into exp: ~1e-4 relative in the weights",
)


def _logit_range(ctx: Ctx, target: float) -> None:
    """A shared-prefix batch (so hybrid merges), GQA and a fragmented table, its queries aimed at `target`."""
    lab = ctx.lab(_spec(8, 2, 64), block_size=8, num_blocks=48, fragment="shuffled", logits=target)
    shared = lab.prompt(24)
    requests = [
        lab.admit("a", shared + lab.prompt(13)),
        lab.admit("b", shared + lab.prompt(5)),
        lab.admit("c", lab.prompt(9)),
    ]
    entry = lab.entry(requests[0], 2)
    k, _ = lab.kv(requests[0].tokens, 0)
    reached = float(
        np.abs(np.einsum("qhd,nhd->qhn", entry.query, np.repeat(k, 4, axis=1))).max()
    ) * oracle.softmax_scale(64)
    ctx.require(abs(reached - target) <= 1e-3 * target, f"largest |logit| {reached:.4g}, not {target:g}")
    ctx.verify(lab, ctx.layout(lab), requests, n_query=2)


for _name, _target in LOGIT_TARGETS.items():

    def _run(ctx: Ctx, target: float = _target) -> None:
        _logit_range(ctx, target)

    case(
        _name,
        ["cascade-merge", "prefix-reuse", "gqa", "fragmented"],
        tolerance=WIDE if _target > 10 else FP32,
        logits=_target,
    )(_run)


@case(
    "fp8-saturation-edge-logits-200",
    ["fp8", "fp8-saturation", "cascade-merge", "prefix-reuse"],
    tolerance=WIDE,
    logits=200.0,
)
def _fp8_edge(ctx: Ctx) -> None:
    # Scales that put the largest K and V right at the top of e4m3: some values saturate, their neighbours round
    # to 416 or 448, the codes a saturation bug would get wrong; and the logits reach 200.
    probe = Lab(_spec(4, 4, 64), block_size=8, seed=3)
    prompt = probe.prompt(40)
    k, v = probe.kv(prompt, 0)
    k_scale, v_scale = float(np.abs(k).max()) / 460, float(np.abs(v).max()) / 452
    lab = ctx.lab(_spec(4, 4, 64, k_scale=k_scale, v_scale=v_scale), block_size=8, seed=3, logits=200.0)
    ctx.require(lab.prompt(40) == prompt, "the probe drew another prompt")
    top = np.abs(k) / k_scale
    ctx.require(
        int(np.sum(top > FP8_E4M3_MAX)) >= 1 and int(np.sum((top > 400) & (top <= FP8_E4M3_MAX))) >= 1,
        "no K at the saturation edge",
    )
    requests = [lab.admit("a", prompt), lab.admit("b", prompt[:32] + lab.prompt(3))]
    ctx.verify(lab, ctx.layout(lab), requests, n_query=2)


@case(
    "cascade-merge-extreme-logits",
    ["cascade-merge", "alibi", "gqa"],
    target="oracle",
    tolerance=WIDE,
    logits="0, ±50, ±200",
)
def _cascade_extreme(ctx: Ctx) -> None:
    spec = _spec(8, 2, 64, alibi=True)
    rng = np.random.default_rng(13)
    for target in LOGIT_TARGETS.values():
        for trial in range(4):
            length, n_q = int(rng.integers(8, 70)), int(rng.integers(1, 5))
            k = rng.standard_normal((length, 2, 64)).astype(np.float32)
            v = rng.standard_normal((length, 2, 64)).astype(np.float32)
            q = aim_logits(rng.standard_normal((n_q, 8, 64)).astype(np.float32), k, target)
            q_pos = np.arange(length - n_q, length)
            cuts = sorted({0, length, *(int(c) for c in rng.integers(1, length, 3))})
            whole = kernel.attend(q, q_pos, k, v, np.arange(length), spec, ctx.kernel_bugs)
            part = None
            for lo, hi in itertools.pairwise(cuts):
                piece = kernel.attend(q, q_pos, k[lo:hi], v[lo:hi], np.arange(lo, hi), spec, ctx.kernel_bugs)
                part = piece if part is None else kernel.merge(part, piece, bugs=ctx.kernel_bugs)
            assert part is not None
            expected = reference_attention(q, k, v, alibi=True)
            ctx.close(f"|logit| {target:g}, trial {trial}: monolithic", whole[0], expected)
            ctx.close(f"|logit| {target:g}, trial {trial}: {len(cuts) - 1} parts merged", part[0], expected)


@case("cascade-nested-prefixes", ["cascade-merge", "prefix-reuse", "alibi-non-pow2", "gqa"], heads=12, kv_heads=4)
def _cascade_groups(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(12, 4, 64, alibi=True), block_size=8, num_blocks=48)
    system = lab.prompt(24)
    topic = lab.prompt(16)
    requests = [lab.admit("a", system + topic + lab.prompt(5)), lab.admit("b", system + topic + lab.prompt(12))]
    requests += [lab.admit("c", system + lab.prompt(9)), lab.admit("d", lab.prompt(20))]
    ctx.require(requests[0].block_ids[:5] == requests[1].block_ids[:5], "a and b do not share 5 blocks")
    ctx.require(requests[0].block_ids[:3] == requests[2].block_ids[:3], "a and c do not share 3 blocks")
    ctx.verify(lab, ctx.layout(lab), requests, n_query=2)


@case("mixed-batch", ["odd-lengths", "fragmented", "gqa", "alibi", "partial-final-block"], heads=16, kv_heads=4)
def _mixed(ctx: Ctx) -> None:
    lab = ctx.lab(_spec(16, 4, 64, alibi=True), block_size=16, fragment="shuffled", num_blocks=40)
    requests = [lab.admit(f"r{n}", lab.prompt(n)) for n in (1, 17, 32, 33, 64, 65)]
    ctx.verify(lab, ctx.layout(lab), requests)


# -- the pool ---------------------------------------------------------------------------------------------------


@case("pool-lru-eviction-order", ["prefix-reuse"], target="pool", tolerance=POOL)
def _lru(ctx: Ctx) -> None:
    pool = BlockPool(10, 4, bug=ctx.pool_bug)
    a = pool.add_request("a", [])
    pool.append(a, list(range(16)))
    b = pool.add_request("b", [])
    pool.append(b, list(range(100, 108)))
    a_ids, b_ids = a.block_ids, b.block_ids
    pool.free(a)
    pool.free(b)
    # Free blocks never used come first; then a's blocks (freed first), tail first; then b's.
    order = [blk.block_id for blk in pool.free_queue][-6:]
    ctx.require(order == [*reversed(a_ids), *reversed(b_ids)], f"LRU order {order}, expected a's tail first then b's")
    c = pool.add_request("c", [])
    pool.append(c, list(range(200, 220)))
    ctx.require(c.block_ids[-2:] == tuple(reversed(a_ids))[:2], f"took {c.block_ids}, not a's tail blocks first")
    ctx.require(pool.evictions == 2, f"{pool.evictions} evictions, expected 2 (a's cached tail blocks)")
    hit = pool.add_request("a2", list(range(16)))
    ctx.require(hit.num_tokens == 8, f"a's first two blocks should still hit, got {hit.num_tokens} tokens")
    pool.check_invariants()


@case("pool-null-block", ["window-free"], target="pool", tolerance=POOL)
def _null(ctx: Ctx) -> None:
    pool = BlockPool(8, 4, sliding_window=6, bug=ctx.pool_bug)
    r = pool.add_request("r", [])
    pool.append(r, list(range(21)))
    freed = pool.remove_skipped_blocks(r, 21)
    # The token at 21 sees 16…21: blocks 0-3 hold 0…15, so blocks 0-3 go (block 4 holds 16…19).
    ctx.require(len(freed) == 4 and r.block_ids[:4] == (NULL_BLOCK_ID,) * 4, f"freed {freed}, table {r.block_ids}")
    ctx.require(r.block_ids[4] != NULL_BLOCK_ID, "the block holding the window's first key was freed")
    ctx.require(pool.null_block.ref_cnt == 0 and not pool.null_block.block_hash, "the null block was counted")
    for i in range(pool.free_queue.num_free):
        q = pool.add_request(f"q{i}", [])
        pool.append(q, [1000 + i] * 4)
        ctx.require(NULL_BLOCK_ID not in q.block_ids, "the null block was handed out")
    pool.free(r)
    ctx.require(NULL_BLOCK_ID not in {b.block_id for b in pool.free_queue}, "the null block entered the free queue")
    pool.check_invariants()


@case("pool-refused-append-changes-nothing", ["cow", "prefix-reuse"], target="pool", tolerance=POOL)
def _append_atomic(ctx: Ctx) -> None:
    pool = BlockPool(6, 4, cow=True, bug=ctx.pool_bug)
    parent = pool.add_request("parent", [])
    pool.append(parent, list(range(10)))
    child = pool.fork(parent, "child")
    hog = pool.add_request("hog", [])
    pool.append(hog, list(range(100, 104)))
    # One block is free: the child's next 6 tokens need a copy of the shared partial block and one more block.
    before = (list(child.tokens), child.block_ids, len(pool.cached), pool.free_queue.num_free)
    try:
        pool.append(child, list(range(10, 16)))
    except PoolError:
        pass
    else:
        raise CaseFailed("6 tokens needing 2 blocks were given slots with 1 block free")
    after = (list(child.tokens), child.block_ids, len(pool.cached), pool.free_queue.num_free)
    ctx.require(after == before, f"the refused append changed the pool: {before} -> {after}")
    ctx.require(pool.add_request("probe", list(range(13))).num_tokens == 8, "a refused append cached a block")
    pool.check_invariants()


@case(
    "pool-invariants-hypothesis",
    ["pool-invariants", "prefix-reuse", "cow", "window-free"],
    target="pool",
    tolerance=POOL,
)
def _pool_invariants(ctx: Ctx) -> None:
    from builders.kvlab.fuzz import check_pool_invariants

    check_pool_invariants(ctx.pool_bug)


# -- the exchange format ----------------------------------------------------------------------------------------


@case("csr-round-trip", ["fragmented", "partial-final-block"], target="format", tolerance=EXACT)
def _csr(ctx: Ctx) -> None:
    rng = random.Random(3)
    for trial in range(20):
        b = rng.choice([1, 8, 16, 32])
        entries = []
        for i in range(rng.randint(1, 5)):
            seq_len = rng.randint(1, 6 * b)
            ids = tuple(rng.sample(range(1, 400), -(-seq_len // b)))
            entries.append(Entry(req_id=str(i), block_ids=ids, seq_len=seq_len, query=np.zeros((1, 1, 1), np.float32)))
        csr = to_csr(entries, b)
        for i, entry in enumerate(entries):
            pages = [int(p) for p in csr.kv_indices[csr.kv_indptr[i] : csr.kv_indptr[i + 1]]]
            ctx.require(pages == list(entry.block_ids), f"trial {trial}: pages {pages} != table {entry.block_ids}")
            last = int(csr.kv_last_page_len[i])
            ctx.require(1 <= last <= b, f"trial {trial}: kv_last_page_len {last} outside 1…{b}")
            expanded = [s.physical_block + j for s in spans_of(pages) for j in range(s.num_blocks)]
            ctx.require(expanded == pages, f"trial {trial}: spans expand to {expanded}, not {pages}")

"""Decode attention in Triton, one kernel per KV layout, each reading only its own layout's metadata.

- `paged_decode`: a block table per request; every key's slot is found through it (vLLM's PagedAttention).
- `spans_decode`: runs of physically consecutive blocks (logical page, physical block, pages) per request and
  FlashInfer's `kv_last_page_len`; a run is walked by address arithmetic, one table read per run.
- `virtual_decode`: one contiguous range per request (vAttention): a base offset and a length.
- `cascade_prefix` + `paged_decode` from the prefix's end: the queries of a group that share a prefix attend it
  together, a tile of queries reading each prefix key once; each request then attends its own suffix.

Every kernel writes a partial state per (query row, part): the output normalised over the keys it saw and their
log-sum-exp. `merge_parts` folds the parts of a row into the output by their LSE, so split-K (a request's keys
cut into parts that run on separate programs) and the cascade's prefix/suffix split are the same merge.

Grid: one program per (request or query tile, KV head, split). A program holds all query heads of its KV head
(GQA/MQA) times its queries as the rows of one tile, so each K/V tile is loaded once for the whole group.
The scale is applied after the dot products: fp8 e4m3 values are exact in fp16, so an fp8 cache costs no
rounding beyond the e4m3 codes themselves.

Planted bugs (`BUG`, a compile-time constant): see `triton_layouts.KERNEL_BUGS`. Importing this module
compiles nothing; whether `triton.jit` builds GPU kernels or interpreter functions is decided at import by
`TRITON_INTERPRET`, which `triton_layouts.load_kernels` sets before importing it.
"""

# mypy: disable-error-code="no-untyped-def,no-untyped-call,name-defined,misc,untyped-decorator,unused-ignore"
# Triton kernels are typed by Triton's own front end; `tl.constexpr` annotations are not Python types.

from __future__ import annotations

import triton
import triton.language as tl

BUG_NONE = 0
BUG_KV_HEAD_INDEX = 1
"""Query head h reads KV head h % num_kv_heads (a tile) instead of h // group (a repeat)."""
BUG_BLOCK_STRIDE = 2
"""A block's address taken as page × token stride: right for a packed cache, wrong for any other stride."""
BUG_MISSED_PARTIAL = 3
"""The keys stop at the last full page: a partial final block is never read."""
BUG_MERGE_NO_MAX = 4
"""The merge weights parts by exp(lse) without subtracting the largest LSE: inf/inf past lse ~88."""


@triton.jit
def _rows(kvh, q_count, GROUP: tl.constexpr, NUM_KV: tl.constexpr, BLOCK_M: tl.constexpr, BUG: tl.constexpr):
    """Row r of a tile is query r // GROUP, query head `head` of KV head kvh."""
    rows = tl.arange(0, BLOCK_M)
    j = rows // GROUP
    g = rows % GROUP
    row_ok = j < q_count
    # A compile-time branch (Triton drops the other side), kept as a statement for Triton's front end.
    if BUG == 1:  # noqa: SIM108
        head = g * NUM_KV + kvh
    else:
        head = kvh * GROUP + g
    return j, head, row_ok


@triton.jit
def _slopes(slopes_ptr, head, row_ok, ALIBI: tl.constexpr, BLOCK_M: tl.constexpr):
    if ALIBI:  # noqa: SIM108
        slopes = tl.load(slopes_ptr + head, mask=row_ok, other=0.0)
    else:
        slopes = tl.zeros([BLOCK_M], tl.float32)
    return slopes


@triton.jit
def _tile(
    q,
    k,
    v,
    pos,
    valid,
    q_pos,
    row_ok,
    slopes,
    m_i,
    l_i,
    acc,
    qk_scale,
    window,
    ALIBI: tl.constexpr,
    WINDOW: tl.constexpr,
    WIDE_DOT: tl.constexpr,
):
    """One tile of keys folded into the running (max, sum, weighted V) of each row: online softmax."""
    if WIDE_DOT:
        # Triton 3.8's interpreter multiplies bf16 operands as integers: widen them (exactly) to fp32 there.
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(q.dtype).to(tl.float32)), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale
    if ALIBI:
        s += slopes[:, None] * (pos[None, :] - q_pos[:, None]).to(tl.float32)
    seen = valid[None, :] & row_ok[:, None] & (pos[None, :] <= q_pos[:, None])
    if WINDOW:
        seen = seen & (q_pos[:, None] - pos[None, :] < window)
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with no key seen yet keeps -inf as its maximum; subtract 0 there so exp gives 0, not NaN.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_use)
    p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if WIDE_DOT:
        pv = tl.dot(p.to(q.dtype).to(tl.float32), v.to(q.dtype).to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _store_part(po_ptr, pl_ptr, out_rows, part, m_i, l_i, acc, v_scale, row_ok, d, d_ok, s_po_row, s_po_part, s_pl_row):
    seen = l_i > 0
    safe = tl.where(seen, l_i, 1.0)
    o = tl.where(seen[:, None], acc / safe[:, None], 0.0) * v_scale
    lse = tl.where(seen, m_i + tl.log(safe), float("-inf"))
    rows64 = out_rows.to(tl.int64)
    tl.store(
        po_ptr + rows64[:, None] * s_po_row + part * s_po_part + d[None, :], o, mask=row_ok[:, None] & d_ok[None, :]
    )
    tl.store(pl_ptr + rows64 * s_pl_row + part, lse, mask=row_ok)


@triton.jit
def _split(lo, end, split, SPLITS, BLOCK_N: tl.constexpr):
    """This program's share [s_lo, s_hi) of the keys [lo, end): whole tiles, the last split takes the rest."""
    n = tl.maximum(end - lo, 0)
    chunk = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_N) * BLOCK_N
    s_lo = lo + split * chunk
    s_hi = tl.minimum(end, s_lo + chunk)
    return s_lo, s_hi


@triton.jit
def paged_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    seq_len_ptr,
    kv_start_ptr,
    q_first_ptr,
    q_count_ptr,
    slopes_ptr,
    po_ptr,
    pl_ptr,
    qk_scale,
    v_scale,
    window,
    part0,
    s_q_tok,
    s_q_head,
    s_k_blk,
    s_k_tok,
    s_k_head,
    s_v_blk,
    s_v_tok,
    s_v_head,
    s_table,
    s_po_row,
    s_po_part,
    s_pl_row,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLITS,
    ALIBI: tl.constexpr,
    WINDOW: tl.constexpr,
    BUG: tl.constexpr,
    WIDE_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_len_ptr + seq)
    kv_start = tl.load(kv_start_ptr + seq)
    q_first = tl.load(q_first_ptr + seq)
    q_count = tl.load(q_count_ptr + seq)
    j, head, row_ok = _rows(kvh, q_count, GROUP, NUM_KV, BLOCK_M, BUG)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD
    q_pos = seq_len - q_count + j
    qi = (q_first + j).to(tl.int64)
    q = tl.load(
        q_ptr + qi[:, None] * s_q_tok + head[:, None] * s_q_head + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    slopes = _slopes(slopes_ptr, head, row_ok, ALIBI, BLOCK_M)
    end = seq_len
    if BUG == 3:
        end = seq_len // PAGE * PAGE
    lo = kv_start
    if WINDOW:
        lo = tl.maximum(lo, seq_len - q_count - window + 1)
    s_lo, s_hi = _split(lo, end, split, SPLITS, BLOCK_N)
    block_k = s_k_blk
    block_v = s_v_blk
    if BUG == 2:
        block_k = PAGE * s_k_tok
        block_v = PAGE * s_v_tok
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = table_ptr + seq.to(tl.int64) * s_table
    for start in range(s_lo, s_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < s_hi
        phys = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        off = pos % PAGE
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + phys[:, None] * block_k + off[:, None] * s_k_tok + kvh * s_k_head + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + phys[:, None] * block_v + off[:, None] * s_v_tok + kvh * s_v_head + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        m_i, l_i, acc = _tile(
            q, k, v, pos, valid, q_pos, row_ok, slopes, m_i, l_i, acc, qk_scale, window, ALIBI, WINDOW, WIDE_DOT
        )
    out_rows = qi * NUM_HEADS + head
    _store_part(
        po_ptr, pl_ptr, out_rows, part0 + split, m_i, l_i, acc, v_scale, row_ok, d, d_ok, s_po_row, s_po_part, s_pl_row
    )


@triton.jit
def spans_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    run_indptr_ptr,
    run_page_ptr,
    run_block_ptr,
    run_pages_ptr,
    last_len_ptr,
    q_first_ptr,
    q_count_ptr,
    slopes_ptr,
    po_ptr,
    pl_ptr,
    qk_scale,
    v_scale,
    window,
    s_q_tok,
    s_q_head,
    s_k_blk,
    s_k_tok,
    s_k_head,
    s_v_blk,
    s_v_tok,
    s_v_head,
    s_po_row,
    s_po_part,
    s_pl_row,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLITS,
    ALIBI: tl.constexpr,
    WINDOW: tl.constexpr,
    BUG: tl.constexpr,
    WIDE_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    first_run = tl.load(run_indptr_ptr + seq)
    end_run = tl.load(run_indptr_ptr + seq + 1)
    # The length follows from the last run's end and kv_last_page_len, as FlashInfer's CSR gives it.
    last_len = tl.load(last_len_ptr + seq)
    pages = tl.load(run_page_ptr + end_run - 1) + tl.load(run_pages_ptr + end_run - 1)
    seq_len = (pages - 1) * PAGE + last_len
    q_first = tl.load(q_first_ptr + seq)
    q_count = tl.load(q_count_ptr + seq)
    j, head, row_ok = _rows(kvh, q_count, GROUP, NUM_KV, BLOCK_M, BUG)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD
    q_pos = seq_len - q_count + j
    qi = (q_first + j).to(tl.int64)
    q = tl.load(
        q_ptr + qi[:, None] * s_q_tok + head[:, None] * s_q_head + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    slopes = _slopes(slopes_ptr, head, row_ok, ALIBI, BLOCK_M)
    end = seq_len
    if BUG == 3:
        end = seq_len // PAGE * PAGE
    lo = seq_len * 0
    if WINDOW:
        lo = tl.maximum(lo, seq_len - q_count - window + 1)
    s_lo, s_hi = _split(lo, end, split, SPLITS, BLOCK_N)
    block_k = s_k_blk
    block_v = s_v_blk
    if BUG == 2:
        block_k = PAGE * s_k_tok
        block_v = PAGE * s_v_tok
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for run in range(first_run, end_run):
        run_lo = tl.load(run_page_ptr + run) * PAGE
        base = tl.load(run_block_ptr + run).to(tl.int64)
        run_hi = run_lo + tl.load(run_pages_ptr + run) * PAGE
        a = tl.maximum(s_lo, run_lo)
        b = tl.minimum(s_hi, run_hi)
        for start in range(a, b, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            valid = pos < b
            off = pos - run_lo
            kv_mask = valid[:, None] & d_ok[None, :]
            k = tl.load(
                k_ptr
                + (base + off // PAGE)[:, None] * block_k
                + (off % PAGE)[:, None] * s_k_tok
                + kvh * s_k_head
                + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            v = tl.load(
                v_ptr
                + (base + off // PAGE)[:, None] * block_v
                + (off % PAGE)[:, None] * s_v_tok
                + kvh * s_v_head
                + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            m_i, l_i, acc = _tile(
                q, k, v, pos, valid, q_pos, row_ok, slopes, m_i, l_i, acc, qk_scale, window, ALIBI, WINDOW, WIDE_DOT
            )
    out_rows = qi * NUM_HEADS + head
    _store_part(po_ptr, pl_ptr, out_rows, split, m_i, l_i, acc, v_scale, row_ok, d, d_ok, s_po_row, s_po_part, s_pl_row)


@triton.jit
def virtual_decode(
    q_ptr,
    k_ptr,
    v_ptr,
    base_ptr,
    seq_len_ptr,
    q_first_ptr,
    q_count_ptr,
    slopes_ptr,
    po_ptr,
    pl_ptr,
    qk_scale,
    v_scale,
    window,
    s_q_tok,
    s_q_head,
    s_k_tok,
    s_k_head,
    s_v_tok,
    s_v_head,
    s_po_row,
    s_po_part,
    s_pl_row,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLITS,
    ALIBI: tl.constexpr,
    WINDOW: tl.constexpr,
    BUG: tl.constexpr,
    WIDE_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    base = tl.load(base_ptr + seq).to(tl.int64)
    seq_len = tl.load(seq_len_ptr + seq)
    q_first = tl.load(q_first_ptr + seq)
    q_count = tl.load(q_count_ptr + seq)
    j, head, row_ok = _rows(kvh, q_count, GROUP, NUM_KV, BLOCK_M, BUG)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD
    q_pos = seq_len - q_count + j
    qi = (q_first + j).to(tl.int64)
    q = tl.load(
        q_ptr + qi[:, None] * s_q_tok + head[:, None] * s_q_head + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    slopes = _slopes(slopes_ptr, head, row_ok, ALIBI, BLOCK_M)
    end = seq_len
    if BUG == 3:
        end = seq_len // PAGE * PAGE
    lo = seq_len * 0
    if WINDOW:
        lo = tl.maximum(lo, seq_len - q_count - window + 1)
    s_lo, s_hi = _split(lo, end, split, SPLITS, BLOCK_N)
    tok_k = s_k_tok
    tok_v = s_v_tok
    if BUG == 2:
        tok_k = NUM_KV * HEAD
        tok_v = NUM_KV * HEAD
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(s_lo, s_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < s_hi
        row = base + pos
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + row[:, None] * tok_k + kvh * s_k_head + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + row[:, None] * tok_v + kvh * s_v_head + d[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _tile(
            q, k, v, pos, valid, q_pos, row_ok, slopes, m_i, l_i, acc, qk_scale, window, ALIBI, WINDOW, WIDE_DOT
        )
    out_rows = qi * NUM_HEADS + head
    _store_part(po_ptr, pl_ptr, out_rows, split, m_i, l_i, acc, v_scale, row_ok, d, d_ok, s_po_row, s_po_part, s_pl_row)


@triton.jit
def cascade_prefix(
    q_ptr,
    k_ptr,
    v_ptr,
    prefix_table_ptr,
    prefix_len_ptr,
    tile_group_ptr,
    tile_first_ptr,
    tile_count_ptr,
    group_queries_ptr,
    q_pos_ptr,
    slopes_ptr,
    po_ptr,
    pl_ptr,
    qk_scale,
    v_scale,
    window,
    s_q_tok,
    s_q_head,
    s_k_blk,
    s_k_tok,
    s_k_head,
    s_v_blk,
    s_v_tok,
    s_v_head,
    s_prefix,
    s_po_row,
    s_po_part,
    s_pl_row,
    NUM_HEADS: tl.constexpr,
    NUM_KV: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLITS,
    ALIBI: tl.constexpr,
    WINDOW: tl.constexpr,
    BUG: tl.constexpr,
    WIDE_DOT: tl.constexpr,
):
    """A tile of one group's queries (any of its requests) against the group's shared prefix: each prefix key is
    loaded once per tile, not once per request."""
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    grp = tl.load(tile_group_ptr + tile)
    first = tl.load(tile_first_ptr + tile)
    count = tl.load(tile_count_ptr + tile)
    prefix_len = tl.load(prefix_len_ptr + grp)
    j, head, row_ok = _rows(kvh, count, GROUP, NUM_KV, BLOCK_M, BUG)
    qi = tl.load(group_queries_ptr + first + j, mask=row_ok, other=0).to(tl.int64)
    q_pos = tl.load(q_pos_ptr + qi, mask=row_ok, other=0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD
    q = tl.load(
        q_ptr + qi[:, None] * s_q_tok + head[:, None] * s_q_head + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    slopes = _slopes(slopes_ptr, head, row_ok, ALIBI, BLOCK_M)
    end = prefix_len
    if BUG == 3:
        end = prefix_len // PAGE * PAGE
    lo = prefix_len * 0
    if WINDOW:
        # The earliest key any query of the tile may see; later queries mask the rest themselves.
        lo = tl.maximum(lo, tl.min(tl.where(row_ok, q_pos - window + 1, prefix_len), axis=0))
    s_lo, s_hi = _split(lo, end, split, SPLITS, BLOCK_N)
    block_k = s_k_blk
    block_v = s_v_blk
    if BUG == 2:
        block_k = PAGE * s_k_tok
        block_v = PAGE * s_v_tok
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = prefix_table_ptr + grp.to(tl.int64) * s_prefix
    for start in range(s_lo, s_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < s_hi
        phys = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        off = pos % PAGE
        kv_mask = valid[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + phys[:, None] * block_k + off[:, None] * s_k_tok + kvh * s_k_head + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + phys[:, None] * block_v + off[:, None] * s_v_tok + kvh * s_v_head + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        m_i, l_i, acc = _tile(
            q, k, v, pos, valid, q_pos, row_ok, slopes, m_i, l_i, acc, qk_scale, window, ALIBI, WINDOW, WIDE_DOT
        )
    out_rows = qi * NUM_HEADS + head
    _store_part(po_ptr, pl_ptr, out_rows, split, m_i, l_i, acc, v_scale, row_ok, d, d_ok, s_po_row, s_po_part, s_pl_row)


@triton.jit
def merge_parts(
    po_ptr,
    pl_ptr,
    out_ptr,
    s_po_row,
    s_po_part,
    s_pl_row,
    s_out_row,
    NUM_PARTS,
    PARTS_PAD: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BUG: tl.constexpr,
):
    """One output row from its parts: each part's output weighted by exp(its LSE - the largest LSE)."""
    row = tl.program_id(0).to(tl.int64)
    parts = tl.arange(0, PARTS_PAD)
    part_ok = parts < NUM_PARTS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD
    lse = tl.load(pl_ptr + row * s_pl_row + parts, mask=part_ok, other=float("-inf"))
    peak = tl.max(lse, axis=0)
    peak = tl.where(peak == float("-inf"), 0.0, peak)
    if BUG == 4:
        peak = 0.0
    w = tl.exp(lse - peak)
    o = tl.load(
        po_ptr + row * s_po_row + parts[:, None] * s_po_part + d[None, :],
        mask=part_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * s_out_row + d, out, mask=d_ok)

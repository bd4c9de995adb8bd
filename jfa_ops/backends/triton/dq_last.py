"""The TLX backward's dQ finalized by its last contributor (``tlx.configs.BACKWARD_DQ_LAST``, issue 11): the
arrival counts the TLX kernel counts down, made before it runs.

The TLX backward reduce-adds each query tile's dQ (BLOCK_M rows of one q head, one column half per consumer) into
the fp32 accumulator once per key tile that walks it. With DQ_LAST, after each work item the consumer decrements the
counter of every (query tile, q head, its column half) it added to; the one that takes a counter from 1 to 0 reads
the tile's fp32 half back (L2-hot) and writes scale * dQ in q's dtype, so no finalize pass reads the whole
accumulator again. This kernel writes each counter's start: the number of key tiles whose walk visits the tile,
derived with the walk's own rules (``common.stage_bounds``: a key tile at n0 walks the query tiles starting in
[lead_begin, hi_any); block-sparse: only those of the Q blocks that selected its KV block, from the transposed
selection the kernel reads), and zeroes dQ where a tile has none (no walk writes it).

Counter slots: query tile k (rows k * BLOCK_M ..) of sequence s is slot ``q_off[s] // BLOCK_M + k + s`` (one-to-one:
a sequence's slots start past the previous one's last; fewer than cdiv(T, BLOCK_M) + B slots). Layout [slots, Hq,
2] int32. Runs under the interpreter (CPU tests compare the counts with a brute force over the mask and selection).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import loop_bound, stage_bounds

# key tiles (dense) or KV blocks (block-sparse: x the kv heads, at most 1024 lanes) per step
COUNT_CHUNK = 64


def dq_slots(total_rows: int, num_seqs: int, block_m: int) -> int:
    """Counter slots for ``total_rows`` packed query rows in ``num_seqs`` sequences (see the module docstring)."""
    return triton.cdiv(total_rows, block_m) + num_seqs


@triton.jit
def _walks(n0, m0, len_k, len_q, window_left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Whether each key tile at n0 (a tensor) walks the query tile at m0: the TLX backward's bounds
    (``stage_bounds`` with its arguments: keys stationary), tiles inside the sequence."""
    lead_begin, _, _, _, _, hi_any = stage_bounds(n0, len_k, len_q, -right, window_left, HAS_RIGHT, HAS_LEFT, BLOCK_N,
                                                  BLOCK_M)
    return (n0 < len_k) & (lead_begin <= m0) & (m0 < hi_any)


@triton.jit(do_not_specialize=["num_seqs", "search_steps", "num_heads", "heads_kv", "group", "n_kv_blocks",
                               "window_left", "right", "stride_tib", "stride_tih", "stride_tin", "stride_tcb",
                               "stride_tch", "row_steps", "rows_q"])
def dq_arrivals_kernel(Q_OFF, KV_OFF, COUNT, DQ, Q_BLOCK_INDEX, Q_BLOCK_COUNT, num_seqs, rows_q, search_steps,
                       num_heads, heads_kv, group, n_kv_blocks, window_left, right, stride_tib, stride_tih, stride_tin,
                       stride_tcb, stride_tch, row_steps, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr,
                       BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, KV_P2: tl.constexpr, CHUNK: tl.constexpr):
    """Program slot: the counters of the slot's query tile for every q head (kv head hk: q heads hk * group ..
    + group - 1; dense: heads_kv 1, group Hq, the counts follow from the offsets alone), both column halves; dQ
    zeroed there for the heads no key tile walks it with. Slots past a sequence's tiles are left alone (no walk
    reaches them). Block-sparse: whether a KV block's transposed row lists the tile's Q block by a binary search
    (the rows ascend; ``row_steps`` halvings of its NQB entries), every kv head x CHUNK KV blocks at once: a few
    dependent loads a program (a scan was one per KV block; a program per kv head, 16x the programs)."""
    slot = tl.program_id(0)
    first = 0  # the last sequence whose first slot is <= slot (first slots strictly increase)
    past = num_seqs
    for _ in range(search_steps + 1):
        if past - first > 1:
            mid = (first + past) // 2
            if tl.load(Q_OFF + mid) // BLOCK_M + mid <= slot:
                first = mid
            else:
                past = mid
    seq = first
    row0 = tl.load(Q_OFF + seq)
    len_q = tl.load(Q_OFF + seq + 1) - row0
    m0 = (slot - (row0 // BLOCK_M + seq)) * BLOCK_M
    # bad offsets (JFA_VALIDATE=deferred lets them reach the kernels): a sequence whose rows leave dQ's [0, rows_q)
    # is skipped (its rows keep garbage, as the TLX kernel, which skips it too), so no zeroing lands outside dQ
    inside = (m0 >= 0) & (row0 >= 0) & (row0.to(tl.int64) + len_q <= rows_q)
    if (m0 < len_q) & inside:
        kv0 = tl.load(KV_OFF + seq)
        len_k = tl.load(KV_OFF + seq + 1) - kv0
        hk = tl.arange(0, KV_P2)
        count = tl.zeros([KV_P2], tl.int32)
        if SPARSE:
            TILES: tl.constexpr = BLOCK_KV // BLOCK_N
            q_block = m0 // BLOCK_Q
            n_blocks = tl.minimum(tl.cdiv(len_k, BLOCK_KV), n_kv_blocks)  # the walk reads rows < n_kv_blocks only
            rows = Q_BLOCK_INDEX + seq.to(tl.int64) * stride_tib + (hk * stride_tih)[:, None]
            counts = Q_BLOCK_COUNT + seq.to(tl.int64) * stride_tcb + (hk * stride_tch)[:, None]
            for b0 in range(0, loop_bound(n_blocks), CHUNK):
                b = b0 + tl.arange(0, CHUNK)[None, :]
                listed = tl.load(counts + b, mask=(hk < heads_kv)[:, None] & (b < n_blocks), other=0)
                row = rows + b.to(tl.int64) * stride_tin
                lo = tl.zeros([KV_P2, CHUNK], tl.int32)  # the first entry >= q_block among the row's listed ones
                hi = listed
                for _ in range(row_steps):
                    open_ = lo < hi
                    mid = (lo + hi) // 2
                    below = tl.load(row + mid, mask=open_, other=0) < q_block
                    lo = tl.where(open_ & below, mid + 1, lo)
                    hi = tl.where(open_ & ~below, mid, hi)
                # each Q block at most once in a row (the transpose keeps one)
                found = (lo < listed) & (tl.load(row + lo, mask=lo < listed, other=-1) == q_block)
                for u in tl.static_range(TILES):
                    walked = _walks(b * BLOCK_KV + u * BLOCK_N, m0, len_k, len_q, window_left, right, HAS_LEFT,
                                    HAS_RIGHT, BLOCK_N, BLOCK_M)  # [1, CHUNK]
                    count += tl.sum((found & walked).to(tl.int32), 1)
        else:
            for c0 in range(0, loop_bound(tl.cdiv(len_k, BLOCK_N)), CHUNK):
                n0 = (c0 + tl.arange(0, CHUNK)) * BLOCK_N
                count += tl.sum(_walks(n0, m0, len_k, len_q, window_left, right, HAS_LEFT, HAS_RIGHT, BLOCK_N,
                                       BLOCK_M).to(tl.int32), 0)
        half = tl.arange(0, 2)
        for g in range(0, group):
            cells = (slot.to(tl.int64) * num_heads + hk * group + g)[:, None] * 2 + half[None, :]
            tl.store(COUNT + cells, count[:, None] + tl.zeros([KV_P2, 2], tl.int32), mask=(hk < heads_kv)[:, None])
        r = tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM)
        ok = (r < len_q - m0)[:, None]
        for h in range(0, heads_kv):
            if tl.sum(tl.where(hk == h, count, 0), 0) == 0:  # no key tile adds to this tile, none finalizes it
                for g in range(0, group):
                    ptrs = DQ + ((row0 + m0 + r).to(tl.int64) * num_heads + h * group + g)[:, None] * HEAD_DIM \
                        + d[None, :]
                    tl.store(ptrs, tl.zeros([BLOCK_M, HEAD_DIM], DQ.dtype.element_ty), mask=ok)


def dq_arrival_counts(q_off: torch.Tensor, kv_off: torch.Tensor, total_rows: int, num_heads: int, num_heads_kv: int,
                      head_dim: int, dq: torch.Tensor, block_m: int, block_n: int, bounds, selection=None,
                      launch=None) -> torch.Tensor:
    """The counters [slots, Hq, 2] int32 (``dq_arrivals_kernel``) of a call with int32 offsets ``q_off`` /
    ``kv_off`` (B + 1) and packed query rows ``total_rows``, dQ ``dq`` [T, Hq, D] (contiguous; tiles no key tile
    walks are zeroed); ``bounds``: ``common.window_bounds``; ``selection``: None (dense) or (q_block_index,
    q_block_count, block_q, block_kv), the transposed selection the TLX kernel walks. One launch, on the stream; no
    host sync. ``launch``: the backend's launcher (``launch.launch``), by default the triton backend's."""
    if launch is None:
        from .launch import launch
    num_seqs = kv_off.numel() - 1
    slots = dq_slots(total_rows, num_seqs, block_m)
    counts = torch.empty((slots, num_heads, 2), dtype=torch.int32, device=dq.device)
    has_left, window_left, has_right, right = bounds
    sparse = selection is not None
    if sparse:
        q_index, q_count, block_q, block_kv = selection
        heads, group = num_heads_kv, num_heads // num_heads_kv
        extra = dict(Q_BLOCK_INDEX=q_index, Q_BLOCK_COUNT=q_count, n_kv_blocks=q_index.shape[2],
                     row_steps=q_index.shape[3].bit_length(), stride_tib=q_index.stride(0),
                     stride_tih=q_index.stride(1), stride_tin=q_index.stride(2), stride_tcb=q_count.stride(0),
                     stride_tch=q_count.stride(1), BLOCK_Q=block_q, BLOCK_KV=block_kv)
    else:  # the counts follow from the offsets alone: one for every head
        heads, group = 1, num_heads
        extra = dict(Q_BLOCK_INDEX=q_off, Q_BLOCK_COUNT=q_off, n_kv_blocks=0, row_steps=0, stride_tib=0,
                     stride_tih=0, stride_tin=0, stride_tcb=0, stride_tch=0, BLOCK_Q=block_m, BLOCK_KV=block_n)
    kv_p2 = triton.next_power_of_2(heads)
    launch(dq_arrivals_kernel, (slots,), dict(
        Q_OFF=q_off, KV_OFF=kv_off, COUNT=counts, DQ=dq, num_seqs=num_seqs, rows_q=total_rows,
        search_steps=max(num_seqs - 1, 0).bit_length(), num_heads=num_heads, heads_kv=heads, group=group,
        window_left=window_left, right=right, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_LEFT=has_left, HAS_RIGHT=has_right, SPARSE=sparse, KV_P2=kv_p2,
        CHUNK=max(8, min(COUNT_CHUNK, 1024 // kv_p2)), **extra), num_warps=4, num_stages=1)
    return counts

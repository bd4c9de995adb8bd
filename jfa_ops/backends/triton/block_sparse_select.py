"""Stage 1 of block-sparse attention on the device, in two Triton kernels: block mean-pooling, then per row the
block scores and the top-k choice (by rank: the order of ``reference.block_sparse.top_blocks``' stable sort, without
sorting). No host sync: every size comes from shapes and the max_seqlen arguments.

    pooled_q [B or 1, Hkv, NQB, D] fp32   mean of a Q block's rows over the kv head's group of query heads
    pooled_k [B, Hkv, NKB, D] fp32        mean of a KV block's rows
    scores   [B, Hkv, NQB, NKB] fp32      scratch: pooled_q . pooled_k of each sequence's own blocks; -inf where the
                                          block pair is not visible, +inf for the local block (always_local);
                                          count = keep(visible blocks) from a table
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import meta_kernels
from ..base import BlockSelectParams
from .common import head_dim_consts, loop_bound, seq_extent, window_bounds
from .launch import launch

POOL_ROWS = 16  # rows summed per step of the pooling loop
SELECT_BLOCK_J = 64  # KV blocks per step of block_select_kernel (its rank step compares BLOCK_J x BLOCK_J scores)


@triton.jit(do_not_specialize=["group", "block_rows"])
def block_pool_kernel(X, OFFSETS, Pooled, stride_xt, stride_xh, stride_pb, stride_ph, stride_pn, group, block_rows,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, ROWS: tl.constexpr):
    """Pooled[seq, head, blk] = mean of rows [blk * block_rows, ...) of sequence ``seq`` (its real rows only) over
    heads head * group .. head * group + group - 1 of X [T, H, D]. Blocks past the sequence get 0."""
    blk = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    row0, length = seq_extent(tl.load(OFFSETS + seq), tl.load(OFFSETS + seq + 1))
    start = blk * block_rows
    end = tl.minimum(start + block_rows, length)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], tl.float32)
    for g in range(loop_bound(group)):
        h = head * group + g
        for r0 in range(loop_bound(start), loop_bound(end), ROWS):
            rows = r0 + tl.arange(0, ROWS)
            ptrs = X + (row0 + rows)[:, None] * stride_xt + h * stride_xh + d[None, :]
            x = tl.load(ptrs, mask=(rows < end)[:, None] & d_ok[None, :], other=0.0)
            acc += tl.sum(x.to(tl.float32), 0)
    n = tl.maximum(end - start, 0) * group
    pooled = acc / tl.maximum(n, 1).to(tl.float32)
    tl.store(Pooled + seq.to(tl.int64) * stride_pb + head * stride_ph + blk * stride_pn + d, pooled, mask=d_ok)


@triton.jit(do_not_specialize=["n_kv_blocks", "window_left", "right"])
def block_select_kernel(PQ, PK, Q_OFF, KV_OFF, KEEP, Scores, Index, Count, n_kv_blocks,
                        stride_pqb, stride_pqh, stride_pqn, stride_pkb, stride_pkh, stride_pkn,
                        stride_sb, stride_sh, stride_sq, stride_cb, stride_ch, window_left, right,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
                        BLOCK_KV: tl.constexpr, BLOCK_J: tl.constexpr, HAS_LEFT: tl.constexpr,
                        HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr):
    """One row (sequence, kv head, Q block i) of the selection: Count = KEEP[visible blocks] and Index = the Count
    best blocks in ascending order, then -1 (Index and Scores share strides: [B, Hkv, NQB, NKB]).

    1. Scores of the sequence's own blocks into the row of Scores (scratch): pooled_q . pooled_k, -inf where the
       pair is not visible (``meta_kernels.block_visible``: max(d0, first key - right) <= min(d1, last key + left)
       with d0..d1 the diagonals of block i's rows), +inf for the local block (ALWAYS_LOCAL).
    2. Block j's rank = how many blocks beat it (a higher score, or an equal one at a lower index): the position
       of a stable descending sort, so ties break toward the lower index as ``reference.block_sparse.top_blocks``.
       Kept: rank < Count; its slot in Index: how many kept blocks precede it (ascending ids, no sort).
    Blocks past the sequence are invisible (never kept) and never scored; rows past it keep nothing. PQ's batch
    stride is 0 for a broadcast Q."""
    i = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    _, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    _, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
    d = tl.arange(0, BLOCK_D)
    q_ok = i * BLOCK_Q < len_q
    n_own = tl.minimum(tl.where(q_ok, (len_k + BLOCK_KV - 1) // BLOCK_KV, 0), n_kv_blocks)  # blocks worth scoring
    d0 = i * BLOCK_Q + len_k - len_q
    d1 = tl.minimum((i + 1) * BLOCK_Q, len_q) - 1 + len_k - len_q
    local = tl.minimum(tl.maximum(d1, 0), tl.maximum(len_k - 1, 0)) // BLOCK_KV
    row_offset = seq.to(tl.int64) * stride_sb + head * stride_sh + i * stride_sq
    scores_row = Scores + row_offset
    n_visible = tl.full([], 0, tl.int32)
    if n_own > 0:
        pq = tl.load(PQ + seq.to(tl.int64) * stride_pqb + head * stride_pqh + i * stride_pqn + d, mask=d < HEAD_DIM,
                     other=0.0)
        for j0 in range(0, loop_bound(n_own), BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            j_ok = j < n_own
            pk = tl.load(PK + seq.to(tl.int64) * stride_pkb + head * stride_pkh + j[:, None] * stride_pkn
                         + d[None, :], mask=j_ok[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
            s = tl.sum(pk * pq[None, :], 1)
            first = j * BLOCK_KV
            last = tl.minimum(first + BLOCK_KV, len_k) - 1
            lo = d0 + j * 0
            hi = d1 + j * 0
            if HAS_RIGHT:
                lo = tl.maximum(lo, first - right)
            if HAS_LEFT:
                hi = tl.minimum(hi, last + window_left)
            vis = (lo <= hi) & j_ok
            s = tl.where(vis, s, float("-inf"))
            if ALWAYS_LOCAL:
                s = tl.where(vis & (j == local), float("inf"), s)
            n_visible += tl.sum(vis.to(tl.int32), 0)
            tl.store(scores_row + j, s, mask=j_ok)
    count = tl.load(KEEP + n_visible)
    tl.store(Count + seq.to(tl.int64) * stride_cb + head * stride_ch + i, count)
    index_row = Index + row_offset
    tl.debug_barrier()  # the row's scores, stored by all of this program's threads, are read back below
    slot0 = count * 0  # kept blocks before the current chunk
    for j0 in range(0, loop_bound(tl.where(count > 0, n_own, 0)), BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        s_j = tl.load(scores_row + j, mask=j < n_own, other=float("-inf"))
        rank = tl.zeros([BLOCK_J], tl.int32)
        for c0 in range(0, loop_bound(n_own), BLOCK_J):
            c = c0 + tl.arange(0, BLOCK_J)
            s_c = tl.load(scores_row + c, mask=c < n_own, other=float("-inf"))
            beats = (s_c[None, :] > s_j[:, None]) | ((s_c[None, :] == s_j[:, None]) & (c[None, :] < j[:, None]))
            rank += tl.sum((beats & (c < n_own)[None, :]).to(tl.int32), 1)
        kept = (rank < count) & (j < n_own)
        slot = slot0 + tl.cumsum(kept.to(tl.int32), 0) - 1
        tl.store(index_row + slot, j, mask=kept)
        slot0 += tl.sum(kept.to(tl.int32), 0)
    for p0 in range(0, loop_bound(n_kv_blocks), BLOCK_J):  # -1 after the count kept ids
        p = p0 + tl.arange(0, BLOCK_J)
        tl.store(index_row + p, tl.full([BLOCK_J], -1, tl.int32), mask=(p >= count) & (p < n_kv_blocks))


def select_kv_blocks(q, k, q_offsets, kv_offsets, params: BlockSelectParams):
    device, num_seqs, heads_kv = q.device, kv_offsets.shape[0] - 1, k.shape[1]
    group = q.shape[1] // heads_kv
    n_q, n_kv = params.n_q_blocks, params.n_kv_blocks
    hd = head_dim_consts(q.shape[2])
    count = torch.zeros((num_seqs, heads_kv, n_q), dtype=meta_kernels.INDEX_DTYPE, device=device)
    if num_seqs == 0 or n_q == 0 or n_kv == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        return torch.full((num_seqs, heads_kv, n_q, n_kv), -1, dtype=count.dtype, device=device), count
    kv_off = kv_offsets.to(torch.int32)
    if params.broadcast_q:
        q_off = torch.arange(2, dtype=torch.int32, device=device) * q.shape[0]  # [0, L_q] (no host copy)
        q_lengths_off = torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * q.shape[0]
    else:
        q_off = q_lengths_off = q_offsets.to(torch.int32)
    pooled_q = torch.empty((q_off.shape[0] - 1, heads_kv, n_q, q.shape[2]), dtype=torch.float32, device=device)
    pooled_k = torch.empty((num_seqs, heads_kv, n_kv, k.shape[2]), dtype=torch.float32, device=device)
    for x, off, pooled, block, g in ((q, q_off, pooled_q, params.block_q, group),
                                     (k, kv_off, pooled_k, params.block_kv, 1)):
        launch(block_pool_kernel, (pooled.shape[2], pooled.shape[0], heads_kv), dict(
            X=x, OFFSETS=off, Pooled=pooled, stride_xt=x.stride(0), stride_xh=x.stride(1),
            stride_pb=pooled.stride(0), stride_ph=pooled.stride(1), stride_pn=pooled.stride(2), group=g,
            block_rows=block, **hd, ROWS=POOL_ROWS), num_warps=4, num_stages=1)
    # keep[n] for n visible blocks, computed once per call on the device (float64 rule of meta_kernels.keep_count)
    keep = meta_kernels.keep_count(torch.arange(n_kv + 1, dtype=torch.int32, device=device), params.keep_ratio,
                                   params.top_k).to(torch.int32)
    # scratch for the rows' scores (only each sequence's own blocks are written and read: L2-resident)
    scores = torch.empty((num_seqs, heads_kv, n_q, n_kv), dtype=torch.float32, device=device)
    index = torch.empty(scores.shape, dtype=count.dtype, device=device)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    launch(block_select_kernel, (n_q, num_seqs, heads_kv), dict(
        PQ=pooled_q, PK=pooled_k, Q_OFF=q_lengths_off, KV_OFF=kv_off, KEEP=keep, Scores=scores, Index=index,
        Count=count, n_kv_blocks=n_kv, stride_pqb=0 if params.broadcast_q else pooled_q.stride(0),
        stride_pqh=pooled_q.stride(1), stride_pqn=pooled_q.stride(2), stride_pkb=pooled_k.stride(0),
        stride_pkh=pooled_k.stride(1), stride_pkn=pooled_k.stride(2), stride_sb=scores.stride(0),
        stride_sh=scores.stride(1), stride_sq=scores.stride(2), stride_cb=count.stride(0),
        stride_ch=count.stride(1), window_left=window_left, right=right, HEAD_DIM=hd["HEAD_DIM"],
        BLOCK_D=hd["BLOCK_D"], BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv,
        BLOCK_J=min(SELECT_BLOCK_J, triton.next_power_of_2(n_kv)), HAS_LEFT=has_left, HAS_RIGHT=has_right,
        ALWAYS_LOCAL=params.always_local), num_warps=4, num_stages=1)
    return index, count

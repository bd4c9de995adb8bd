"""Stage 2 forward on the device: each program owns BLOCK_M query rows of one (sequence, q head) and runs the dense
kernel's online-softmax step (``common.softmax_step``, masks by ``common.visible``) over the key tiles of the KV
blocks its Q block selected, in one flat loop, and nothing else: unselected blocks are never loaded.

Grid (query tiles, B, Hq): query tile t covers rows [t * BLOCK_M, ...) of Q block t * BLOCK_M // BLOCK_Q
(BLOCK_M divides BLOCK_Q); tiles past a sequence's end return at once, and Q blocks past the selection's rows
select nothing (out 0, lse -inf). A key tile skips the mask when the dense kernel's stage bounds say every row of
the query tile sees all of it (``common.stage_bounds``), else it is masked (diagonal, window edges, sequence end).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import common
from .attn_fwd import broadcast_offsets
from .common import (LN2, dot_precision, head_dim_consts, load_rows, loop_bound, packed_rows, row_source,
                     row_strides, seq_extent, softmax_step, stage_bounds, store_rows, visible, window_bounds)
from .configs import KNOBS, get_config
from .launch import launch


@triton.jit
def selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, head, block, n_blocks, stride_ib, stride_ih, stride_in, stride_cb,
                    stride_ch):
    """(pointer to the first selected id, count) of row (seq, head, block) of a selection (or of its transpose);
    rows past the index (block >= n_blocks) select nothing."""
    seq64 = (head * 0 + seq).to(tl.int64)  # seq may be a loop counter (a plain int under the interpreter)
    row = BLOCK_INDEX + seq64 * stride_ib + head * stride_ih + block * stride_in
    count = tl.load(BLOCK_COUNT + seq64 * stride_cb + head * stride_ch + block, mask=block < n_blocks, other=0)
    return row, count


@triton.jit(do_not_specialize=["total_out", "group", "window_left", "right", "n_q_blocks"])
def block_sparse_fwd_kernel(Q, K, V, Out, Lse, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, total_out, n_q_blocks,
                            stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                            stride_ib, stride_ih, stride_in, stride_cb, stride_ch, group, qk_scale, window_left,
                            right,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
                            BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                            BROADCAST_Q: tl.constexpr, DOT_PRECISION: tl.constexpr, FMA_SOFTMAX: tl.constexpr):
    tl.static_assert(BLOCK_Q % BLOCK_M == 0)
    tl.static_assert(BLOCK_KV % BLOCK_N == 0)
    TILES_PER_BLOCK: tl.constexpr = BLOCK_KV // BLOCK_N
    m0 = tl.program_id(0) * BLOCK_M
    seq = tl.program_id(1)
    head = tl.program_id(2)
    out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    if m0 < len_q:
        kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
        if BROADCAST_Q:
            q_row0 = out_row0 * 0  # every sequence reads the same dense Q
        else:
            q_row0 = out_row0
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        rows_ok = rows < len_q
        q = load_rows(Q + (q_row0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], rows_ok, d_ok, True,
                      PAD_D)
        kv_head = head // group
        k_src = row_source(K, kv_row0, cols, stride_kt, kv_head, stride_kh, d, False)
        v_src = row_source(V, kv_row0, cols, stride_vt, kv_head, stride_vh, d, False)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        _, _, bulk_begin, bulk_end, _, _ = stage_bounds(m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT,
                                                        BLOCK_M, BLOCK_N)
        ids, count = selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, kv_head, m0 // BLOCK_Q, n_q_blocks, stride_ib,
                                     stride_ih, stride_in, stride_cb, stride_ch)
        # One flat loop over the key tiles of all selected blocks (one software pipeline, one set of buffers); a
        # tile is masked only where the dense stage bounds say some row does not see all of it.
        for t in range(loop_bound(count * TILES_PER_BLOCK)):
            block = tl.load(ids + t // TILES_PER_BLOCK)
            n0 = block * BLOCK_KV + (t % TILES_PER_BLOCK) * BLOCK_N
            n0 = tl.where((block >= 0) & (n0 < len_k), n0, len_k)  # ids outside the sequence: a fully masked tile
            keys = n0 + cols
            keys_ok = keys < len_k
            k = load_rows(k_src + n0.to(tl.int64) * stride_kt, keys_ok, d_ok, True, PAD_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            if not FMA_SOFTMAX:
                s = s * qk_scale
            if (n0 < bulk_begin) | (n0 + BLOCK_N > bulk_end):
                s = tl.where(visible(rows[:, None], keys[None, :], len_q, len_k, -window_left, right, HAS_LEFT,
                                     HAS_RIGHT), s, float("-inf"))
            p, alpha, m_new, l_i = softmax_step(s, m_i, l_i, qk_scale, True, FMA_SOFTMAX)
            v = load_rows(v_src + n0.to(tl.int64) * stride_vt, keys_ok, d_ok, True, PAD_D)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
            m_i = m_new
        # Rows that saw no key: l = 0, acc = 0 -> out 0 and lse -inf (as the dense kernel).
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
        store_rows(Out + (out_row0 + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
                   out.to(Out.dtype.element_ty), rows_ok, d_ok, PAD_D)
        tl.store(Lse + head.to(tl.int64) * total_out + out_row0 + rows, lse, mask=rows_ok)


def tile_sizes(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, device, block_q: int, block_kv: int):
    """(config, BLOCK_M, BLOCK_N): the dense kernel's config, its tiles clamped to the selection's blocks."""
    cfg = get_config(kernel, head_dim, dtype, causal, device)
    return cfg, min(cfg.block_m, block_q), min(cfg.block_n, block_kv)


def sparse_offsets(q, q_offsets, kv_offsets, broadcast_q: bool):
    """(q_off, kv_off, total_out) as int32 the kernels read: a broadcast Q's output rows b * L_q + i."""
    num_seqs = kv_offsets.shape[0] - 1
    if broadcast_q:
        return broadcast_offsets(num_seqs, q.shape[0], q.device), kv_offsets.to(torch.int32), num_seqs * q.shape[0]
    return q_offsets.to(torch.int32), kv_offsets.to(torch.int32), q.shape[0]


def index_strides(index_name: str, count_name: str, index: torch.Tensor, count: torch.Tensor) -> dict:
    """The strides of a selection (index [B, H, N, W], count [B, H, N], both with unit last stride) as the kernels
    name them (``stride_<index_name>b/h/n``, ``stride_<count_name>b/h``), taken together."""
    return {f"stride_{index_name}b": index.stride(0), f"stride_{index_name}h": index.stride(1),
            f"stride_{index_name}n": index.stride(2), f"stride_{count_name}b": count.stride(0),
            f"stride_{count_name}h": count.stride(1)}


def longest_rows(x: torch.Tensor, max_seqlen: int, broadcast: bool = False) -> int:
    """A bound on any sequence's rows of ``x`` from shapes and hints only (it sizes the grid): a broadcast Q's rows,
    else the max_seqlen hint when given, else all rows."""
    if broadcast or max_seqlen < 0:
        return max(1, x.shape[0])
    return max(1, min(max_seqlen, x.shape[0]))


def block_sparse_forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params):
    q, k, v = packed_rows(q), packed_rows(k), packed_rows(v)
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    num_heads, head_dim = q.shape[1], q.shape[2]
    q_off, kv_off, total_out = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    out = common.alloc_output((total_out, num_heads, head_dim), q.dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    n_q_blocks = kv_block_index.shape[2]
    if total_out == 0 or num_seqs == 0:
        return out, lse
    cfg, block_m, block_n = tile_sizes("fwd", head_dim, q.dtype, params.causal, device, params.block_q,
                                       params.block_kv)
    q_rows = longest_rows(q, params.max_seqlen_q, params.broadcast_q)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    index, count = kv_block_index.contiguous(), kv_block_count.contiguous()
    launch(block_sparse_fwd_kernel, (triton.cdiv(q_rows, block_m), num_seqs, num_heads), dict(
        Q=q, K=k, V=v, Out=out, Lse=lse, Q_OFF=q_off, KV_OFF=kv_off, BLOCK_INDEX=index, BLOCK_COUNT=count,
        total_out=total_out, n_q_blocks=n_q_blocks, **row_strides("q", q), **row_strides("k", k),
        **row_strides("v", v), **row_strides("o", out), **index_strides("i", "c", index, count),
        group=num_heads // k.shape[1], qk_scale=params.scale * 1.4426950408889634,  # / ln 2
        window_left=window_left, right=right, **head_dim_consts(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        BROADCAST_Q=params.broadcast_q, DOT_PRECISION=dot_precision(q.dtype),
        FMA_SOFTMAX=KNOBS.fwd_fma_softmax and params.scale > 0), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse

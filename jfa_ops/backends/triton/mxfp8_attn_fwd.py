"""MXFP8 attention forward kernel (portable Triton): the numerics of ``backends/reference/mxfp8.py``'s forward.

Operands arrive quantized: Q, K as E4M3 with (1, 32) scales (along head_dim), V with (32, 1) scales (along each
sequence's keys). Per key block: S = ``tl.dot_scaled`` (Q, K^T) (fp32 accumulate; on sm_90 Triton lowers it to a
dequantize-to-bf16 + wgmma, on Blackwell to block-scaled MMA); online softmax in the log2 domain with an integer
running maximum (``ceil``), so the rescale factors are powers of two and P's MX blocks equal the reference's;
P = 2**(s2 - m) quantized in (1, 32) blocks along the keys (bits by ``_e4m3_bits``, "rceil" scales); O +=
``tl.dot_scaled`` (P, V). out = O / sum(Pq), lse from the unquantized sum.

Work items: (query tile, q head). Tiles use the padded layout of the MX row blocks: sequence b's tiles of BLOCK_M
rows start at ``out_offsets[b] // BLOCK_M + b``, so a grid of ``T_out // BLOCK_M + B`` tiles covers every batch
with no host sync and no tile list; a program finds its sequence by binary search and leaves if it owns no rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attn_fwd import broadcast_offsets
from .common import LN2, alloc_output, loop_bound, row_strides, stage_bounds, visible, window_bounds
from .launch import launch
from .mxfp8_quantize import _e4m3_bits, _shared_exponent, search_steps, sequence_of_tile

LOG2E_F: tl.constexpr = tl.constexpr(1.4426950408889634)  # 1/ln 2


@triton.jit
def _quantize_p(p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """P [BLOCK_M, BLOCK_N] (fp32 in [0, 1]) -> (E4M3 data, uint8 scales [BLOCK_M, BLOCK_N / 32], the quantized
    values in fp32) in (1, 32) blocks along the keys, "rceil"."""
    NB: tl.constexpr = BLOCK_N // 32
    p3 = tl.reshape(p, (BLOCK_M, NB, 32))
    shared = _shared_exponent(tl.max(p3, 2), True)  # [BLOCK_M, NB]
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)
    y = tl.minimum(p3 * inv_scale[:, :, None], 448.0)
    bits = _e4m3_bits(y)
    data = tl.reshape(bits, (BLOCK_M, BLOCK_N)).to(tl.float8e4nv, bitcast=True)
    scale = ((shared + 127) << 23).to(tl.float32, bitcast=True)  # 2**shared (shared >= -126 for p > 2**-118)
    values = tl.reshape(data.to(tl.float32), (BLOCK_M, NB, 32)) * scale[:, :, None]
    return data, (shared + 127).to(tl.uint8), tl.sum(tl.sum(values, 2), 1)


@triton.jit(do_not_specialize=["num_seqs", "group", "window_left", "right"])
def mxfp8_attn_fwd_kernel(Q, QS, K, KS, V, VS, Out, Lse, Q_OFF, OUT_OFF, KV_OFF, num_seqs, total_out,
                          stride_qt, stride_qh, stride_qst, stride_qsh, stride_kt, stride_kh, stride_kst, stride_ksh,
                          stride_vt, stride_vh, stride_vst, stride_vsh, stride_ot, stride_oh,
                          group, qk_scale, window_left, right,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
                          SEARCH_STEPS: tl.constexpr):
    """Program (tile, head): query rows [m0, m0 + BLOCK_M) of the sequence owning ``tile``, q head ``head``.
    qk_scale: softmax scale / ln 2 (scores in the log2 domain)."""
    tl.static_assert(BLOCK_N % 32 == 0)
    tl.static_assert(HEAD_DIM % 32 == 0)
    DC: tl.constexpr = HEAD_DIM // 32
    NB: tl.constexpr = BLOCK_N // 32
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = sequence_of_tile(OUT_OFF, tile, num_seqs, BLOCK_M, SEARCH_STEPS)
    out_row0 = tl.load(OUT_OFF + seq).to(tl.int64)
    len_q = (tl.load(OUT_OFF + seq + 1) - out_row0).to(tl.int32)
    m0 = (tile - (out_row0 // BLOCK_M + seq)).to(tl.int32) * BLOCK_M
    if m0 < len_q:
        if BROADCAST_Q:
            q_row0 = out_row0 * 0
        else:
            q_row0 = tl.load(Q_OFF + seq).to(tl.int64)
        kv_row0 = tl.load(KV_OFF + seq).to(tl.int64)
        len_k = (tl.load(KV_OFF + seq + 1) - kv_row0).to(tl.int32)
        kv_head = (head // group).to(tl.int64)
        head64 = head.to(tl.int64)
        rows = m0 + tl.arange(0, BLOCK_M)
        rows_ok = rows < len_q
        d = tl.arange(0, HEAD_DIM)
        dc = tl.arange(0, DC)
        q_rows = (q_row0 + rows)[:, None]
        q = tl.load(Q + q_rows * stride_qt + head64 * stride_qh + d[None, :], mask=rows_ok[:, None], other=0.0)
        q_scale = tl.load(QS + q_rows * stride_qst + head64 * stride_qsh + dc[None, :], mask=rows_ok[:, None],
                          other=0)
        # V's (32, 1) scale rows of this sequence start here (meta_kernels.mxfp8 layout)
        v_scale_row0 = kv_row0 // 32 + seq

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # integer-valued (ceil) running maximum, log2 domain
        l_i = tl.zeros([BLOCK_M], tl.float32)  # sum of P (unquantized): the lse
        lq_i = tl.zeros([BLOCK_M], tl.float32)  # sum of the quantized P: out's denominator
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
            m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
        cols = tl.arange(0, BLOCK_N)
        nb = tl.arange(0, NB)
        for n0 in range(loop_bound(lead_begin), loop_bound(tail_end), BLOCK_N):  # every block masked: a correctness path
            keys = n0 + cols
            keys_ok = keys < len_k
            k_rows = (kv_row0 + keys)[:, None]
            k = tl.load(K + k_rows * stride_kt + kv_head * stride_kh + d[None, :], mask=keys_ok[:, None], other=0.0)
            k_scale = tl.load(KS + k_rows * stride_kst + kv_head * stride_ksh + dc[None, :], mask=keys_ok[:, None],
                              other=0)
            s = tl.dot_scaled(q, q_scale, "e4m3", tl.trans(k), k_scale, "e4m3") * qk_scale
            ok = visible(rows[:, None], keys[None, :], len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT)
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.ceil(tl.max(s, 1)))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet: exp2 gives 0, not NaN
            p = tl.where(ok, tl.math.exp2(s - m_ref[:, None]), 0.0)
            alpha = tl.math.exp2(m_i - m_ref)  # a power of two: exact
            p_data, p_scale, p_sum_q = _quantize_p(p, BLOCK_M, BLOCK_N)
            l_i = l_i * alpha + tl.sum(p, 1)
            lq_i = lq_i * alpha + p_sum_q
            v = tl.load(V + k_rows * stride_vt + kv_head * stride_vh + d[None, :], mask=keys_ok[:, None], other=0.0)
            v_blocks = n0 // 32 + nb  # key blocks of 32 within the sequence
            v_scale = tl.load(VS + (v_scale_row0 + v_blocks)[:, None] * stride_vst + kv_head * stride_vsh + d[None, :],
                              mask=(v_blocks * 32 < len_k)[:, None], other=0)  # [NB, D]
            acc = acc * alpha[:, None] + tl.dot_scaled(p_data, p_scale, "e4m3", v, tl.trans(v_scale), "e4m3")
            m_i = m_new

        empty = l_i == 0.0  # no visible key: out 0, lse -inf
        out = acc / tl.where(empty, 1.0, lq_i)[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
        out_rows = (out_row0 + rows)[:, None]
        tl.store(Out + out_rows * stride_ot + head64 * stride_oh + d[None, :], out.to(Out.dtype.element_ty),
                 mask=rows_ok[:, None])
        tl.store(Lse + head64 * total_out + out_row0 + rows, lse, mask=rows_ok)


FWD_BLOCK_M = 64
FWD_BLOCK_N = 64


def attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype):
    """(out [T_out, Hq, D] in ``out_dtype``, lse [Hq, T_out] fp32) from quantized (data, scale) pairs."""
    (q, q_scale), (k, k_scale), (v, v_scale) = q_mx, k_mx, v_mx
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    heads_q, dim = q.shape[1], q.shape[2]
    total_out = num_seqs * q.shape[0] if params.broadcast_q else q.shape[0]
    out = alloc_output((total_out, heads_q, dim), out_dtype, device)  # every row belongs to a tile that writes it
    lse = alloc_output((heads_q, total_out), torch.float32, device)
    if total_out == 0 or num_seqs == 0:
        return out, lse
    kv_off = kv_offsets.to(torch.int32)
    if params.broadcast_q:
        out_off = broadcast_offsets(num_seqs, q.shape[0], device)
        q_off = out_off
    else:
        q_off = out_off = q_offsets.to(torch.int32)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    tiles = total_out // FWD_BLOCK_M + num_seqs
    q_scale_u8, k_scale_u8, v_scale_u8 = (s.view(torch.uint8) for s in (q_scale, k_scale, v_scale))
    launch(mxfp8_attn_fwd_kernel, (tiles, heads_q), dict(
        Q=q, QS=q_scale_u8, K=k, KS=k_scale_u8, V=v, VS=v_scale_u8, Out=out, Lse=lse, Q_OFF=q_off, OUT_OFF=out_off,
        KV_OFF=kv_off, num_seqs=num_seqs, total_out=total_out, **row_strides("q", q), **row_strides("qs", q_scale_u8),
        **row_strides("k", k), **row_strides("ks", k_scale_u8), **row_strides("v", v),
        **row_strides("vs", v_scale_u8), **row_strides("o", out), group=heads_q // k.shape[1],
        qk_scale=params.scale * 1.4426950408889634, window_left=window_left, right=right, HEAD_DIM=dim,
        BLOCK_M=FWD_BLOCK_M, BLOCK_N=FWD_BLOCK_N, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        BROADCAST_Q=params.broadcast_q, SEARCH_STEPS=search_steps(num_seqs)), num_warps=4, num_stages=1)
    return out, lse


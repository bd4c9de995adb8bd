"""MXFP8 attention backward kernels (portable Triton): the numerics of ``backends/reference/mxfp8.py``'s backward.

Operands: Q, K, dO as E4M3 with (32, 32) square scales (quantize kernel), V with (1, 32) scales; P and dS are
quantized in 32 x 32 blocks in registers. A square scale serves both orientations: for a dot operand it becomes
one scale per row and 32-column group by repeating each block's scale over its 32 rows (``_rows``), transposed
first when the operand is used transposed. Every dot goes through ``mxfp8_attn_fwd.mx_dot`` (fp32 accumulate) in
the variant ``configs.KNOBS.mxfp8_variant`` picks, as the forward's does (``tl.dot_scaled``, FP8 dots on 32-wide
chunks, exponent re-basing, bf16 dequantization).

Two kernels: dK/dV (program per (kv tile, kv head): loops over the group's q heads and the sequence's q blocks;
each kv row is written by one program) and dQ (program per (q tile, q head): loops over the kv blocks; fp32 atomic
adds into a zeroed dq, so broadcast-Q sums over the batch). Both recompute P and dS the same way. Tiles use the
padded layout of the MX row blocks (``mxfp8_attn_fwd``): no tile list, no host sync. Loops skip the blocks that
causal/window hide from the whole tile (their P and dS blocks are zero, so skipping them is exact); every visited
block is masked (a correctness path: no mask-free bulk stage).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import meta_kernels.mxfp8 as mx
from .block_sparse_fwd import sparse_offsets
from .common import loop_bound, row_strides, stage_bounds, visible, window_bounds
from .launch import launch
from .configs import KernelConfig, interpreting
from .mxfp8_attn_fwd import (LOG2E_F, _dequantize_rows, _e8m0_value, _scores, _to_e4m3, checked_variant,
                             mx_dot)
from .mxfp8_quantize import _shared_exponent, quantize
from .scheduling import fanout_search_steps, padded_tile, rows_inside

# Launch shapes, (q rows, kv rows, warps, stages) per kernel (sm_90 compile, Triton 3.6, D128, bf16smem; bench/NOTES.md
# "MXFP8 v3"; the kernels are issue-bound, so the fewest instructions per (q, k) pair wins). dK/dV 64 x 64, 4 warps,
# 1 stage: 98 KB, 255 registers, 220 B spills, two programs per SM; two stages (cp.async Q/dO) need 115 KB (one
# program per SM), eight warps issue ~75% more instructions in all, 128 kv rows spill 1-2.8 KB. dQ 128 x 64, 8 warps:
# 98 KB, 234 registers, no spills, ~22% fewer instructions per pair than 64 x 64 with 4 warps.
BWD_LAUNCH = {"dkdv": KernelConfig(64, 64, 4, 1), "dq": KernelConfig(128, 64, 8, 1)}


@triton.jit
def _rows(scale, R: tl.constexpr, C: tl.constexpr):
    """[R / 32, C] block scales -> [R, C]: each block's scale on its 32 rows (a dot operand's per-row scales)."""
    return tl.reshape(tl.broadcast_to(scale[:, None, :], (R // 32, 32, C)), (R, C))


@triton.jit
def _quantize_square(x, R: tl.constexpr, C: tl.constexpr, HW_CVT: tl.constexpr):
    """fp32 [R, C] -> (E4M3 data [R, C], uint8 scales [R / 32, C / 32]) in 32 x 32 blocks, "rceil"."""
    x4 = tl.reshape(x, (R // 32, 32, C // 32, 32))
    shared = _shared_exponent(tl.max(tl.max(tl.abs(x4), 3), 1), True)  # [R / 32, C / 32]
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)
    y = tl.minimum(tl.maximum(x4 * inv_scale[:, None, :, None], -448.0), 448.0)
    data = _to_e4m3(tl.reshape(y, (R, C)), HW_CVT)
    return data, (shared + 127).to(tl.uint8)


@triton.jit
def _square_scales(XS, first_block, m0, length, head, stride_st, stride_sh, BLOCK: tl.constexpr,
                   HEAD_DIM: tl.constexpr):
    """Square scales [BLOCK / 32, D / 32] of rows m0.. of a sequence of ``length`` rows whose row blocks start at
    ``first_block`` (past its end: 0, so a prefetch past the last block loads nothing)."""
    blocks = tl.arange(0, BLOCK // 32)
    dc = tl.arange(0, HEAD_DIM // 32)
    return tl.load(XS + (first_block + m0 // 32 + blocks)[:, None] * stride_st + head * stride_sh + dc[None, :],
                   mask=(m0 + blocks * 32 < length)[:, None], other=0)


@triton.jit
def _load_square(X, XS, row0, rows, rows_ok, length, first_block, m0, head, stride_t, stride_h, stride_st, stride_sh,
                 BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A tile's E4M3 rows [BLOCK, D] (rows m0.. of a sequence of ``length`` rows starting at ``row0``) and its
    square scales (``_square_scales``)."""
    d = tl.arange(0, HEAD_DIM)
    data = tl.load(X + (row0 + rows)[:, None] * stride_t + head * stride_h + d[None, :], mask=rows_ok[:, None],
                   other=0.0)
    return data, _square_scales(XS, first_block, m0, length, head, stride_st, stride_sh, BLOCK, HEAD_DIM)


@triton.jit
def _rows_scales(XS, row0, n0, length, head, stride_st, stride_sh, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """(1, 32) scales [BLOCK, D / 32] of rows n0.. of a sequence of ``length`` rows starting at ``row0`` (0 past
    its end)."""
    rows = n0 + tl.arange(0, BLOCK)
    dc = tl.arange(0, HEAD_DIM // 32)
    return tl.load(XS + (row0 + rows)[:, None] * stride_st + head * stride_sh + dc[None, :],
                   mask=(rows < length)[:, None], other=0)


@triton.jit
def _square_values(data, scale_bits, DOT_FP16: tl.constexpr):
    """E4M3 ``data [R, C]`` with square scale bits ``[R / 32, C / 32]`` -> bf16 (fp16 when DOT_FP16) values. One
    dequantized copy serves a dot in either orientation (bf16smem), as the quantized one does."""
    R: tl.constexpr = data.shape[0]
    C: tl.constexpr = data.shape[1]
    y = tl.reshape(tl.reshape(data.to(tl.float32), (R // 32, 32, C // 32, 32)) *
                   _e8m0_value(scale_bits)[:, None, :, None], (R, C))
    return y.to(tl.float16) if DOT_FP16 else y.to(tl.bfloat16)


@triton.jit
def _p_and_ds_from(s, dp, lse2, delta, rows, keys, len_q, len_k, qk_scale, window_left, right,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HW_CVT: tl.constexpr):
    """P [BM, BN] = 2**min(S/ln2 - lse2, 0) on visible pairs and dS = P (dP - delta), from S = Q K^T and dP = dO V^T.
    The scores rounded on their own (``_scores``), as the forward's lse was made from: a fused fma here gave P the
    unrounded product, off the forward's once |S| > 2**24."""
    s2 = _scores(s, qk_scale, HW_CVT)
    ok = visible(rows[:, None], keys[None, :], len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT)
    ok = ok & (lse2 > float("-inf"))[:, None]
    p = tl.where(ok, tl.math.exp2(tl.minimum(s2 - tl.where(ok, lse2[:, None], 0.0), 0.0)), 0.0)
    return p, p * (dp - delta[:, None])


@triton.jit
def _p_and_ds(q, q_rs, k, k_rs, v, v_rs, do, do_rs, lse2, delta, rows, keys, len_q, len_k, qk_scale, window_left,
              right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, D_LEVELS: tl.constexpr, VARIANT: tl.constexpr,
              HW_CVT: tl.constexpr, DOT_FP16: tl.constexpr):
    """``_p_and_ds_from`` with S and dP by ``mx_dot`` from the quantized operands (per-row scales)."""
    return _p_and_ds_from(mx_dot(q, q_rs, tl.trans(k), k_rs, D_LEVELS, VARIANT, HW_CVT, DOT_FP16),
                          mx_dot(do, do_rs, tl.trans(v), v_rs, D_LEVELS, VARIANT, HW_CVT, DOT_FP16), lse2, delta,
                          rows, keys, len_q, len_k, qk_scale, window_left, right, HAS_LEFT, HAS_RIGHT, HW_CVT)


@triton.jit
def _q_rows(Q_OFF, seq, out_row0, BROADCAST_Q: tl.constexpr):
    """(first row of Q, first (32, 32) scale row of Q) of sequence ``seq``: 0 and 0 for a broadcast Q (one shared
    sequence), else from Q's offsets (the padded scale layout: one scale row per 32 rows plus one per sequence)."""
    if BROADCAST_Q:
        q_row0 = out_row0 * 0
        q_first = out_row0 * 0
    else:
        q_row0 = tl.load(Q_OFF + seq).to(tl.int64)
        q_first = q_row0 // 32 + seq
    return q_row0, q_first


@triton.jit(do_not_specialize=["num_seqs", "group", "window_left", "right", "rows_q", "rows_kv"])
def mxfp8_attn_bwd_dkdv_kernel(Q, QS, K, KS, V, VS, DO, DOS, LSE, DELTA, DK, DV, Q_OFF, OUT_OFF, KV_OFF,
                               num_seqs, total_out, rows_q, rows_kv, scale,
                               stride_qt, stride_qh, stride_qst, stride_qsh, stride_kt, stride_kh, stride_kst,
                               stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh, stride_dot, stride_doh,
                               stride_dost, stride_dosh, stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                               group, qk_scale, window_left, right,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
                               SEARCH_STEPS: tl.constexpr, VARIANT: tl.constexpr, HW_CVT: tl.constexpr,
                               DOT_FP16: tl.constexpr):
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)  # Inductor passes fp64
    DC: tl.constexpr = HEAD_DIM // 32
    D_LEVELS: tl.constexpr = DC.bit_length() - 1  # log2 of the 32-wide chunks of head_dim (mx_dot's fp8dot)
    M_LEVELS: tl.constexpr = (BLOCK_M // 32).bit_length() - 1
    tile = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    seq, kv_row0, len_k, n0 = padded_tile(KV_OFF, tile, num_seqs, BLOCK_N, SEARCH_STEPS)
    out_row0 = tl.load(OUT_OFF + seq).to(tl.int64)
    len_q = (tl.load(OUT_OFF + seq + 1) - out_row0).to(tl.int32)
    q_row0, q_first = _q_rows(Q_OFF, seq, out_row0, BROADCAST_Q)
    # a sequence outside the tensors (bad offsets) is skipped: every access below stays in bounds
    inside = (n0 >= 0) & rows_inside(kv_row0, len_k, rows_kv) & rows_inside(out_row0, len_q, total_out) \
        & rows_inside(q_row0, len_q, rows_q)
    if (n0 < len_k) & inside:
        out_first = out_row0 // 32 + seq
        keys = n0 + tl.arange(0, BLOCK_N)
        keys_ok = keys < len_k
        d = tl.arange(0, HEAD_DIM)
        dc = tl.arange(0, DC)
        k, k_sq = _load_square(K, KS, kv_row0, keys, keys_ok, len_k, kv_row0 // 32 + seq, n0, kv_head, stride_kt,
                               stride_kh, stride_kst, stride_ksh, BLOCK_N, HEAD_DIM)
        k_rs = _rows(k_sq, BLOCK_N, DC)
        v = tl.load(V + (kv_row0 + keys)[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                    mask=keys_ok[:, None], other=0.0)
        v_rs = tl.load(VS + (kv_row0 + keys)[:, None] * stride_vst + kv_head * stride_vsh + dc[None, :],
                       mask=keys_ok[:, None], other=0)
        if VARIANT == "bf16smem":  # each operand dequantized once, used in both orientations (module docstring)
            k_val = _square_values(k, k_sq, DOT_FP16)
            v_val = _dequantize_rows(v, v_rs, DOT_FP16)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        # q blocks that see any key of this tile (keys stationary: the forward's bounds mirrored, common.py)
        q_begin, _, _, _, _, q_end = stage_bounds(n0, len_k, len_q, -right, window_left, HAS_RIGHT, HAS_LEFT,
                                                  BLOCK_N, BLOCK_M)
        for g in range(0, group):
            head = kv_head * group + g
            # the square scales one q block ahead (a register double buffer: Triton's pipeliner leaves these tiny
            # unaligned loads synchronous, a full memory latency per block; bench/NOTES.md "MXFP8 v3")
            q_sq_next = _square_scales(QS, q_first, q_begin, len_q, head, stride_qst, stride_qsh, BLOCK_M, HEAD_DIM)
            do_sq_next = _square_scales(DOS, out_first, q_begin, len_q, head, stride_dost, stride_dosh, BLOCK_M,
                                        HEAD_DIM)
            for m0 in range(loop_bound(q_begin), loop_bound(q_end), BLOCK_M):
                rows = m0 + tl.arange(0, BLOCK_M)
                rows_ok = rows < len_q
                q_sq, do_sq = q_sq_next, do_sq_next
                q_sq_next = _square_scales(QS, q_first, m0 + BLOCK_M, len_q, head, stride_qst, stride_qsh, BLOCK_M,
                                           HEAD_DIM)
                do_sq_next = _square_scales(DOS, out_first, m0 + BLOCK_M, len_q, head, stride_dost, stride_dosh,
                                            BLOCK_M, HEAD_DIM)
                q = tl.load(Q + (q_row0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :],
                            mask=rows_ok[:, None], other=0.0)
                do = tl.load(DO + (out_row0 + rows)[:, None] * stride_dot + head * stride_doh + d[None, :],
                             mask=rows_ok[:, None], other=0.0)
                lse2 = tl.load(LSE + head * total_out + out_row0 + rows, mask=rows_ok, other=float("-inf")) * LOG2E_F
                delta = tl.load(DELTA + head * total_out + out_row0 + rows, mask=rows_ok, other=0.0)
                if VARIANT == "bf16smem":
                    q_val = _square_values(q, q_sq, DOT_FP16)
                    do_val = _square_values(do, do_sq, DOT_FP16)
                    p, ds = _p_and_ds_from(tl.dot(q_val, tl.trans(k_val)), tl.dot(do_val, tl.trans(v_val)), lse2,
                                           delta, rows, keys, len_q, len_k, qk_scale, window_left, right, HAS_LEFT,
                                           HAS_RIGHT, HW_CVT)
                else:
                    p, ds = _p_and_ds(q, _rows(q_sq, BLOCK_M, DC), k, k_rs, v, v_rs, do, _rows(do_sq, BLOCK_M, DC),
                                      lse2, delta, rows, keys, len_q, len_k, qk_scale, window_left, right, HAS_LEFT,
                                      HAS_RIGHT, D_LEVELS, VARIANT, HW_CVT, DOT_FP16)
                p_q, p_sq = _quantize_square(p, BLOCK_M, BLOCK_N, HW_CVT)
                ds_q, ds_sq = _quantize_square(ds, BLOCK_M, BLOCK_N, HW_CVT)
                # dV += Pq^T dO; dK += dSq^T Q (contractions over the q rows: the transposed square scales)
                if VARIANT == "bf16smem":
                    dv += tl.dot(tl.trans(_square_values(p_q, p_sq, DOT_FP16)), do_val)
                    dk += tl.dot(tl.trans(_square_values(ds_q, ds_sq, DOT_FP16)), q_val)
                else:
                    dv += mx_dot(tl.trans(p_q), _rows(tl.trans(p_sq), BLOCK_N, BLOCK_M // 32),
                                 do, _rows(tl.trans(do_sq), HEAD_DIM, BLOCK_M // 32), M_LEVELS, VARIANT, HW_CVT,
                                 DOT_FP16)
                    dk += mx_dot(tl.trans(ds_q), _rows(tl.trans(ds_sq), BLOCK_N, BLOCK_M // 32),
                                 q, _rows(tl.trans(q_sq), HEAD_DIM, BLOCK_M // 32), M_LEVELS, VARIANT, HW_CVT,
                                 DOT_FP16)
        rows_out = (kv_row0 + keys)[:, None]
        tl.store(DK + rows_out * stride_dkt + kv_head * stride_dkh + d[None, :], (dk * scale).to(DK.dtype.element_ty),
                 mask=keys_ok[:, None])
        tl.store(DV + rows_out * stride_dvt + kv_head * stride_dvh + d[None, :], dv.to(DV.dtype.element_ty),
                 mask=keys_ok[:, None])


@triton.jit(do_not_specialize=["num_seqs", "group", "window_left", "right", "rows_q", "rows_kv"])
def mxfp8_attn_bwd_dq_kernel(Q, QS, K, KS, V, VS, DO, DOS, LSE, DELTA, DQ, Q_OFF, OUT_OFF, KV_OFF,
                             num_seqs, total_out, rows_q, rows_kv, scale,
                             stride_qt, stride_qh, stride_qst, stride_qsh, stride_kt, stride_kh, stride_kst,
                             stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh, stride_dot, stride_doh,
                             stride_dost, stride_dosh, stride_dqt, stride_dqh,
                             group, qk_scale, window_left, right,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
                             SEARCH_STEPS: tl.constexpr, VARIANT: tl.constexpr, HW_CVT: tl.constexpr,
                             DOT_FP16: tl.constexpr):
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)  # Inductor passes fp64
    DC: tl.constexpr = HEAD_DIM // 32
    D_LEVELS: tl.constexpr = DC.bit_length() - 1  # log2 of the 32-wide chunks of head_dim (mx_dot's fp8dot)
    N_LEVELS: tl.constexpr = (BLOCK_N // 32).bit_length() - 1
    tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq, out_row0, len_q, m0 = padded_tile(OUT_OFF, tile, num_seqs, BLOCK_M, SEARCH_STEPS)
    q_row0, q_first = _q_rows(Q_OFF, seq, out_row0, BROADCAST_Q)
    kv_row0 = tl.load(KV_OFF + seq).to(tl.int64)
    len_k = (tl.load(KV_OFF + seq + 1) - kv_row0).to(tl.int32)
    # as the dK/dV kernel: a sequence outside the tensors is skipped
    inside = (m0 >= 0) & rows_inside(out_row0, len_q, total_out) & rows_inside(q_row0, len_q, rows_q) \
        & rows_inside(kv_row0, len_k, rows_kv)
    if (m0 < len_q) & inside:
        kv_head = head // group
        rows = m0 + tl.arange(0, BLOCK_M)
        rows_ok = rows < len_q
        d = tl.arange(0, HEAD_DIM)
        q, q_sq = _load_square(Q, QS, q_row0, rows, rows_ok, len_q, q_first, m0, head, stride_qt, stride_qh,
                               stride_qst, stride_qsh, BLOCK_M, HEAD_DIM)
        do, do_sq = _load_square(DO, DOS, out_row0, rows, rows_ok, len_q, out_row0 // 32 + seq, m0, head,
                                 stride_dot, stride_doh, stride_dost, stride_dosh, BLOCK_M, HEAD_DIM)
        q_rs = _rows(q_sq, BLOCK_M, DC)
        do_rs = _rows(do_sq, BLOCK_M, DC)
        if VARIANT == "bf16smem":  # each operand dequantized once, used in both orientations (module docstring)
            q_val = _square_values(q, q_sq, DOT_FP16)
            do_val = _square_values(do, do_sq, DOT_FP16)
        lse2 = tl.load(LSE + head * total_out + out_row0 + rows, mask=rows_ok, other=float("-inf")) * LOG2E_F
        delta = tl.load(DELTA + head * total_out + out_row0 + rows, mask=rows_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        k_begin, _, _, _, _, k_end = stage_bounds(m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT,
                                                  BLOCK_M, BLOCK_N)
        k_first = kv_row0 // 32 + seq
        # the scales one kv block ahead (as the dK/dV kernel's q loop)
        k_sq_next = _square_scales(KS, k_first, k_begin, len_k, kv_head, stride_kst, stride_ksh, BLOCK_N, HEAD_DIM)
        v_rs_next = _rows_scales(VS, kv_row0, k_begin, len_k, kv_head, stride_vst, stride_vsh, BLOCK_N, HEAD_DIM)
        for n0 in range(loop_bound(k_begin), loop_bound(k_end), BLOCK_N):  # blocks nobody in the tile sees: skipped
            keys = n0 + tl.arange(0, BLOCK_N)
            keys_ok = keys < len_k
            k_sq, v_rs = k_sq_next, v_rs_next
            k_sq_next = _square_scales(KS, k_first, n0 + BLOCK_N, len_k, kv_head, stride_kst, stride_ksh, BLOCK_N,
                                       HEAD_DIM)
            v_rs_next = _rows_scales(VS, kv_row0, n0 + BLOCK_N, len_k, kv_head, stride_vst, stride_vsh, BLOCK_N,
                                     HEAD_DIM)
            k = tl.load(K + (kv_row0 + keys)[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                        mask=keys_ok[:, None], other=0.0)
            v = tl.load(V + (kv_row0 + keys)[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                        mask=keys_ok[:, None], other=0.0)
            if VARIANT == "bf16smem":
                k_val = _square_values(k, k_sq, DOT_FP16)
                p, ds = _p_and_ds_from(tl.dot(q_val, tl.trans(k_val)),
                                       tl.dot(do_val, tl.trans(_dequantize_rows(v, v_rs, DOT_FP16))), lse2, delta,
                                       rows, keys, len_q, len_k, qk_scale, window_left, right, HAS_LEFT, HAS_RIGHT,
                                       HW_CVT)
                ds_q, ds_sq = _quantize_square(ds, BLOCK_M, BLOCK_N, HW_CVT)
                dq += tl.dot(_square_values(ds_q, ds_sq, DOT_FP16), k_val)
            else:
                p, ds = _p_and_ds(q, q_rs, k, _rows(k_sq, BLOCK_N, DC), v, v_rs, do, do_rs, lse2, delta, rows, keys,
                                  len_q, len_k, qk_scale, window_left, right, HAS_LEFT, HAS_RIGHT, D_LEVELS, VARIANT,
                                  HW_CVT, DOT_FP16)
                ds_q, ds_sq = _quantize_square(ds, BLOCK_M, BLOCK_N, HW_CVT)
                dq += mx_dot(ds_q, _rows(ds_sq, BLOCK_M, BLOCK_N // 32),
                             k, _rows(tl.trans(k_sq), HEAD_DIM, BLOCK_N // 32), N_LEVELS, VARIANT, HW_CVT, DOT_FP16)
        tl.atomic_add(DQ + (q_row0 + rows)[:, None] * stride_dqt + head * stride_dqh + d[None, :], dq * scale,
                      mask=rows_ok[:, None], sem="relaxed")


def attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, rounding,
                       variant=None, empty_rows=True):
    """(dq, dk, dv) in the inputs' dtypes: the reference's MXFP8 backward, in two Triton kernels. variant: how the
    dots use the MX operands (``mxfp8_attn_fwd.VARIANTS``); None takes ``configs.KNOBS.mxfp8_variant``.
    empty_rows: dO's quantize reads NaN/inf on rows that see no key as 0 (``ops.mxfp8.MXFP8_BWD_EMPTY_ROWS``)."""
    variant = checked_variant(variant, q.device)
    if variant == "f16row":  # a forward-only variant: its backward is bf16smem's
        variant = "bf16smem"
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    heads_q, heads_kv, dim = q.shape[1], k.shape[1], q.shape[2]
    total_out = out.shape[0]
    q_off, kv_off, _ = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    out_off = q_off
    dq = torch.zeros(q.shape, dtype=torch.float32, device=device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=device)
    if num_seqs == 0 or total_out == 0 or k.shape[0] == 0:
        return dq.to(q.dtype), dk.zero_(), dv.zero_()
    qq = quantize(q, None if params.broadcast_q else q_off, mx.GRAD_BLOCK, rounding)
    kq = quantize(k, kv_off, mx.GRAD_BLOCK, rounding)
    vq = quantize(v, None, mx.K_BLOCK, rounding)
    doq = quantize(grad_out, out_off, mx.GRAD_BLOCK, rounding, empty_rows_lse=lse if empty_rows else None)
    lse = lse.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).T.contiguous()  # [Hq, T_out]
    if empty_rows:  # rows that see no key: out 0, so delta 0, not rowsum(NaN x 0) (P (dP - delta) with P = 0)
        delta.masked_fill_(torch.isneginf(lse), 0.0)
    if grad_lse is not None:
        delta = delta - grad_lse
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    (q8, qs), (k8, ks), (v8, vs), (do8, dos) = ((d_, s.view(torch.uint8)) for d_, s in (qq, kq, vq, doq))
    common = dict(
        Q=q8, QS=qs, K=k8, KS=ks, V=v8, VS=vs, DO=do8, DOS=dos, LSE=lse, DELTA=delta, Q_OFF=q_off, OUT_OFF=out_off,
        KV_OFF=kv_off, num_seqs=num_seqs, total_out=total_out, rows_q=q.shape[0], rows_kv=k.shape[0],
        scale=params.scale,
        **row_strides("q", q8), **row_strides("qs", qs), **row_strides("k", k8), **row_strides("ks", ks),
        **row_strides("v", v8), **row_strides("vs", vs), **row_strides("do", do8), **row_strides("dos", dos),
        group=heads_q // heads_kv, qk_scale=params.scale * 1.4426950408889634, window_left=window_left, right=right,
        HEAD_DIM=dim, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        BROADCAST_Q=params.broadcast_q, SEARCH_STEPS=fanout_search_steps(num_seqs), VARIANT=variant,
        HW_CVT=not interpreting(), DOT_FP16=interpreting())
    cfg = BWD_LAUNCH["dkdv"]
    launch(mxfp8_attn_bwd_dkdv_kernel, (k.shape[0] // cfg.block_n + num_seqs, heads_kv),
           dict(common, DK=dk, DV=dv, **row_strides("dk", dk), **row_strides("dv", dv), BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    cfg = BWD_LAUNCH["dq"]
    launch(mxfp8_attn_bwd_dq_kernel, (total_out // cfg.block_m + num_seqs, heads_q),
           dict(common, DQ=dq, **row_strides("dq", dq), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n),
           num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return dq.to(q.dtype), dk, dv

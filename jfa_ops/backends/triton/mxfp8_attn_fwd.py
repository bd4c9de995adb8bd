"""MXFP8 attention forward kernel (Triton): the numerics of ``backends/reference/mxfp8.py``'s forward, four ways.

Operands arrive quantized: Q, K as E4M3 with (1, 32) scales (along head_dim), V with (32, 1) scales (along each
sequence's keys). Per key block: S = Q K^T * scale / ln 2 (fp32 accumulate); online softmax in the log2 domain with
an integer running maximum (``ceil``), so the rescale factors are powers of two and P's MX blocks equal the
reference's; P = 2**(s2 - m) quantized in (1, 32) blocks along the keys ("rceil"); O += Pq V. out = O / sum(Pq), lse
from the unquantized sum.

How the two dots use the MX operands (``VARIANT``, ``configs.KNOBS.mxfp8_variant``; bench/NOTES.md compares them;
``mx_dot`` is the same choice in ``tl.dot_scaled``'s calling form, for the backward kernels):

    dot_scaled  ``tl.dot_scaled`` on every dot: block-scaled MMA on Blackwell; on sm_90 Triton dequantizes the E4M3
                operands to bf16 in registers and runs a bf16 wgmma (the portable correctness path).
    fp8dot      FP8 ``tl.dot`` (Hopper: E4M3 wgmma, fp32 accumulate) per 32-wide chunk of the contraction, each
                chunk's fp32 partial times the outer product of the two chunk scales (head_dim chunks for Q K^T,
                key chunks for P V). Same sums as the reference up to fp32 rounding order.
    rebase      each row of Q, K and P (and each column of a V tile) shifted to its largest block scale: block data
                times 2**(e_block - e_max), rounded to E4M3, then one full-width FP8 dot and the two per-row scales
                outside. Exact while no shifted element drops below E4M3's normal range (2**-6); below, it loses low
                bits (an element |x| < 2**(-6 - shift) keeps fewer than 3 mantissa bits; |x| < 2**(-10 - shift)
                becomes 0): an absolute error <= 2**(e_max - 10) per element, i.e. below 2**-10 of the row's
                largest block scale times 448, far under E4M3's own 2**-4 relative rounding.
    bf16smem    dequantize each loaded tile (data * 2**e) to bf16 (fp16 under the interpreter, whose bf16 dots are
                wrong), bf16 dots: half the HBM bytes of bf16 attention, bf16 MMA. Exact (E4M3 x 2**e fits bf16).
    f16row      fp16 dots with the scales' common part outside: each row of Q and K (each column of a V tile) is
                data * 2**(e_block - e_max) in fp16 (E4M3 -> f16x2 and one f16x2 multiply per two elements, where
                bf16smem converts through fp32), 2**e_max multiplies the dot's fp32 result (S by row x key factors,
                P V by column factors); P enters as data * 2**(e + 8) in fp16 and out's denominator sums those.
                Exact while a block sits at most 14 binades below its row's largest (fp16's normal range; below it
                loses low bits, an absolute error <= 2**(e_max - 16) per element) and for P >= 2**-32 of the row
                maximum (smaller P rounds to 0). Backward: as bf16smem.

Work items: (query tile, q head). Tiles use the padded layout of the MX row blocks: sequence b's tiles of BLOCK_M
rows start at ``out_offsets[b] // BLOCK_M + b``, so a grid of ``T_out // BLOCK_M + B`` tiles covers every batch
with no host sync and no tile list; a program finds its sequence by binary search and leaves if it owns no rows.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .attn_fwd import rows_descriptor, use_tma
from .block_sparse_fwd import sparse_offsets
from .common import LN2, alloc_output, loop_bound, row_strides, stage_bounds, visible, window_bounds
from .configs import KNOBS, KernelConfig, interpreting
from .launch import launch
from .mxfp8_quantize import (_e4m3_bits, _e8m0_value, _pow2, _rebase_cols, _rebase_rows,  # noqa: F401
                             _shared_exponent, _to_e4m3, _values_rows)
from .scheduling import fanout_search_steps, padded_tile, rows_inside

LOG2E_F: tl.constexpr = tl.constexpr(1.4426950408889634)  # 1/ln 2
VARIANTS = ("dot_scaled", "fp8dot", "rebase", "bf16smem", "f16row")


@triton.jit
def _chunk32(x, c: tl.constexpr, LEVELS: tl.constexpr):
    """Columns [32 c, 32 c + 32) of ``x [R, 32 * 2**LEVELS]``, by halving (reshape + split) LEVELS times."""
    for level in tl.static_range(LEVELS):
        lo, hi = tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2)), (0, 2, 1)))
        if (c >> (LEVELS - 1 - level)) & 1:
            x = hi
        else:
            x = lo
    return x


@triton.jit
def _column(x, c: tl.constexpr, N: tl.constexpr):
    """Column ``c`` of ``x [R, N]``."""
    return tl.sum(tl.where(tl.arange(0, N)[None, :] == c, x, 0.0), 1)


@triton.jit
def _row(x, r: tl.constexpr, N: tl.constexpr):
    """Row ``r`` of ``x [N, C]``."""
    return tl.sum(tl.where(tl.arange(0, N)[:, None] == r, x, 0.0), 0)


@triton.jit
def _dequantize_rows(data, scale_bits, DOT_FP16: tl.constexpr):
    """``data [R, C * 32]`` with (1, 32) scale bits ``[R, C]`` -> bf16 (fp16 when DOT_FP16) values."""
    return _scale_rows(data, _e8m0_value(scale_bits), DOT_FP16)


@triton.jit
def _scale_rows(data, factors, DOT_FP16: tl.constexpr):
    """``data [R, C * 32]`` times (1, 32) block factors ``[R, C]`` (fp32) -> bf16 (fp16 when DOT_FP16) values."""
    R: tl.constexpr = data.shape[0]
    C: tl.constexpr = factors.shape[1]
    y = tl.reshape(tl.reshape(data.to(tl.float32), (R, C, 32)) * factors[:, :, None], (R, C * 32))
    return y.to(tl.float16) if DOT_FP16 else y.to(tl.bfloat16)


@triton.jit
def _scale_cols(data, factors, DOT_FP16: tl.constexpr):
    """V tile ``data [NB * 32, D]`` times (32, 1) block factors ``[NB, D]`` (fp32) -> bf16 (fp16 when DOT_FP16)."""
    NB: tl.constexpr = factors.shape[0]
    D: tl.constexpr = factors.shape[1]
    y = tl.reshape(tl.reshape(data.to(tl.float32), (NB, 32, D)) * factors[:, None, :], (NB * 32, D))
    return y.to(tl.float16) if DOT_FP16 else y.to(tl.bfloat16)


@triton.jit
def _row_shifted_f16(data, scale_bits):
    """``data [R, C * 32]`` (E4M3) with (1, 32) scale bits ``[R, C]`` -> (fp16 data * 2**(e - e_max) [R, C * 32],
    fp32 2**e_max per row [R]; NaN where a block's scale is NaN): ``f16row``'s operand and its factor."""
    R: tl.constexpr = data.shape[0]
    C: tl.constexpr = scale_bits.shape[1]
    bits = scale_bits.to(tl.int32)
    top = tl.max(bits, 1)
    shift = _pow2(tl.maximum(bits - top[:, None], -30)).to(tl.float16)  # <= 2**-25 rounds to 0 in fp16
    y = tl.reshape(tl.reshape(data.to(tl.float16), (R, C, 32)) * shift[:, :, None], (R, C * 32))
    return y, _e8m0_value(top)


@triton.jit
def _col_shifted_f16(data, scale_bits):
    """V tile ``data [NB * 32, D]`` (E4M3) with (32, 1) scale bits ``[NB, D]`` -> (fp16 data * 2**(e - e_max)
    [NB * 32, D], fp32 2**e_max per column [D]; NaN where a block's scale is NaN)."""
    NB: tl.constexpr = scale_bits.shape[0]
    D: tl.constexpr = scale_bits.shape[1]
    bits = scale_bits.to(tl.int32)
    top = tl.max(bits, 0)
    shift = _pow2(tl.maximum(bits - top[None, :], -30)).to(tl.float16)
    y = tl.reshape(tl.reshape(data.to(tl.float16), (NB, 32, D)) * shift[:, None, :], (NB * 32, D))
    return y, _e8m0_value(top)


@triton.jit
def mx_dot(a, a_scale, b, b_scale, K_LEVELS: tl.constexpr, VARIANT: tl.constexpr, HW_CVT: tl.constexpr,
           DOT_FP16: tl.constexpr):
    """``tl.dot_scaled(a, a_scale, "e4m3", b, b_scale, "e4m3")`` (fp32 [M, N]) the way ``VARIANT`` says (module
    docstring): a [M, K] E4M3 with scale bits [M, K / 32] along K, b [K, N] E4M3 with scale bits [N, K / 32] (each
    column's blocks along K); K = 32 * 2**K_LEVELS. The backward kernels' dots go through here."""
    if VARIANT == "dot_scaled":
        return tl.dot_scaled(a, a_scale, "e4m3", b, b_scale, "e4m3")
    b_t = tl.trans(b)  # [N, K]: b's blocks run along its rows' K, like a's
    if VARIANT == "bf16smem":
        return tl.dot(_dequantize_rows(a, a_scale, DOT_FP16), tl.trans(_dequantize_rows(b_t, b_scale, DOT_FP16)))
    if VARIANT == "rebase":
        a_r, a_exp = _rebase_rows(_values_rows(a, a_scale), a_scale.to(tl.int32) - 127, HW_CVT)
        b_r, b_exp = _rebase_rows(_values_rows(b_t, b_scale), b_scale.to(tl.int32) - 127, HW_CVT)
        return tl.dot(a_r, tl.trans(b_r)) * (_pow2(a_exp)[:, None] * _pow2(b_exp)[None, :])
    # fp8dot: one FP8 dot per 32-wide chunk of K, scaled by the outer product of the chunk's scales
    KC: tl.constexpr = 1 << K_LEVELS
    a_factors = _e8m0_value(a_scale)
    b_factors = _e8m0_value(b_scale)
    out = tl.zeros([a.shape[0], b.shape[1]], tl.float32)
    for c in tl.static_range(KC):
        part = tl.dot(_chunk32(a, c, K_LEVELS), tl.trans(_chunk32(b_t, c, K_LEVELS)))
        out += part * (_column(a_factors, c, KC)[:, None] * _column(b_factors, c, KC)[None, :])
    return out


@triton.jit
def _scores(x, factor, HW_CVT: tl.constexpr):
    """The scores ``x * factor`` (fp32, ``factor`` broadcast against x) rounded on their own. On the GPU a
    ``mul.rn.f32``, which is never fused into a following add (PTX ISA): with a plain multiply the compiler turned
    ``exp2(s - m)`` into ``exp2(fma(x, factor, -m))`` in the mask-free blocks, the unrounded product, while m was
    taken from the rounded s. Once |s| > 2**31 their difference exceeds fp32's exponent range (half an ulp of s
    > 128): P = inf, then inf x alpha = 0 NaN in the lse (H200, 2**+-30 magnitudes: bench/NOTES.md "MXFP8 NaN on
    the GPU"). Same instruction count (the subtraction replaces the fma; the multiply was there for the maxima)."""
    if HW_CVT:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [x, tl.broadcast_to(factor, x.shape)],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return x * factor  # numpy never fuses


@triton.jit
def _p_blocks_scaled(p, p_max):
    """P [BLOCK_M, BLOCK_N] in (1, 32) blocks along the keys, divided by its blocks' "rceil" scales from their
    maxima ``p_max`` [BLOCK_M, BLOCK_N / 32]: (the scaled values [BLOCK_M, BLOCK_N / 32, 32] in fp32, the block
    exponents int32 [BLOCK_M, BLOCK_N / 32])."""
    BLOCK_M: tl.constexpr = p.shape[0]
    BLOCK_N: tl.constexpr = p.shape[1]
    NB: tl.constexpr = BLOCK_N // 32
    p3 = tl.reshape(p, (BLOCK_M, NB, 32))
    shared = _shared_exponent(p_max, True)  # [BLOCK_M, NB]
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)
    return p3 * inv_scale[:, :, None], shared


@triton.jit
def _quantize_p(p, p_max, HW_CVT: tl.constexpr):
    """P [BLOCK_M, BLOCK_N] (fp32 in [0, 1]) with block maxima ``p_max [BLOCK_M, BLOCK_N / 32]`` in (1, 32) blocks
    along the keys, "rceil" -> (E4M3 data, block exponents int32 [BLOCK_M, BLOCK_N / 32], the quantized values in
    fp32, their row sums)."""
    BLOCK_M: tl.constexpr = p.shape[0]
    BLOCK_N: tl.constexpr = p.shape[1]
    y, shared = _p_blocks_scaled(p, p_max)
    data = _to_e4m3(tl.minimum(y, 448.0), HW_CVT)
    scale = ((shared + 127) << 23).to(tl.float32, bitcast=True)  # 2**shared (shared >= -126 for p > 2**-118)
    values = data.to(tl.float32) * scale[:, :, None]
    return (tl.reshape(data, (BLOCK_M, BLOCK_N)), shared, tl.reshape(values, (BLOCK_M, BLOCK_N)),
            tl.sum(tl.sum(values, 2), 1))


@triton.jit
def _quantize_p_f16(p, p_max, HW_CVT: tl.constexpr):
    """``_quantize_p``'s P for ``f16row``: (the quantized values x 2**8 in fp16 [BLOCK_M, BLOCK_N], their row sums
    in fp32 divided by 2**8). The block scales are <= 2**-8 (P <= 1), so the values x 2**8 are <= 448 * 2**0;
    E4M3 -> f16x2 and one fp16 multiply by 2**(e + 8) instead of fp32 values and a bf16 conversion."""
    BLOCK_M: tl.constexpr = p.shape[0]
    BLOCK_N: tl.constexpr = p.shape[1]
    y, shared = _p_blocks_scaled(p, p_max)
    if not HW_CVT:  # the GPU's conversion saturates by itself ("rceil" keeps y <= 448 but for rounding)
        y = tl.minimum(y, 448.0)
    shift = _pow2(tl.maximum(shared + 8, -30)).to(tl.float16)  # 2**(e + 8) <= 1
    values = tl.reshape(_to_e4m3(y, HW_CVT).to(tl.float16) * shift[:, :, None], (BLOCK_M, BLOCK_N))
    return values, tl.sum(values.to(tl.float32), 1) * 0.00390625


@triton.jit
def _kv_scales(KS, VS, kv_row0, v_scale_row0, kv_head, n0, len_k, stride_kst, stride_ksh, stride_vst, stride_vsh,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DECODE: tl.constexpr):
    """Scale bits of key block [n0, n0 + BLOCK_N): K's (1, 32) [BLOCK_N, D / 32] and V's (32, 1) [BLOCK_N / 32, D];
    0 past the sequence (blocks n0 >= len_k load nothing: the prefetch past the last block). DECODE: their fp32
    values instead, decoded here in the loads' compact layout (where the tiles use them, each thread holds up to 16
    distinct V scales per 16 elements: decoding there cost ~400 instructions per block, 20% of the loop)."""
    keys = n0 + tl.arange(0, BLOCK_N)
    dc = tl.arange(0, HEAD_DIM // 32)
    k_scale = tl.load(KS + (kv_row0 + keys)[:, None] * stride_kst + kv_head * stride_ksh + dc[None, :],
                      mask=(keys < len_k)[:, None], other=0)
    v_blocks = n0 // 32 + tl.arange(0, BLOCK_N // 32)  # key blocks of 32 within the sequence
    v_scale = tl.load(VS + (v_scale_row0 + v_blocks)[:, None] * stride_vst + kv_head * stride_vsh +
                      tl.arange(0, HEAD_DIM)[None, :], mask=(v_blocks * 32 < len_k)[:, None], other=0)
    if DECODE:
        return _e8m0_value(k_scale), _e8m0_value(v_scale)
    else:
        return k_scale, v_scale


@triton.jit
def _mx_kv_blocks(acc, m_i, l_i, lq_i, q, q_aux, K, KS, V, VS, kv_row0, kv_head, kv_col, v_scale_row0,
                  stride_kt, stride_kh, stride_kst, stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh,
                  rows, len_q, len_k, lo_off, hi_off, qk_scale, n_begin, n_end,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                  MASKED: tl.constexpr, VARIANT: tl.constexpr, HW_CVT: tl.constexpr, DOT_FP16: tl.constexpr,
                  USE_TMA: tl.constexpr):
    """Online-softmax update over key blocks [n_begin, n_end) (scores in the log2 domain). MASKED: the causal /
    window / sequence-end mask applies; else every (row, key) pair is visible (the mask-free bulk). q_aux: what the
    variant's Q K^T needs besides q (fp8dot: Q's chunk factors; rebase: Q's row factors times qk_scale;
    dot_scaled: Q's scale bits; bf16smem: unused).

    The scales are loaded one block ahead (register double buffer): Triton's pipeliner leaves these small
    unaligned loads synchronous, and their latency then stalls every block (bench/NOTES.md "MXFP8 v3")."""
    DC: tl.constexpr = HEAD_DIM // 32
    NB: tl.constexpr = BLOCK_N // 32
    DC_LEVELS: tl.constexpr = DC.bit_length() - 1  # head_dim and BLOCK_N are powers of two
    NB_LEVELS: tl.constexpr = NB.bit_length() - 1
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    k_scale_next, v_scale_next = _kv_scales(KS, VS, kv_row0, v_scale_row0, kv_head, n_begin, len_k, stride_kst,
                                            stride_ksh, stride_vst, stride_vsh, BLOCK_N, HEAD_DIM,
                                            VARIANT == "bf16smem")
    for n0 in range(loop_bound(n_begin), loop_bound(n_end), BLOCK_N):
        k_scale, v_scale = k_scale_next, v_scale_next
        k_scale_next, v_scale_next = _kv_scales(KS, VS, kv_row0, v_scale_row0, kv_head, n0 + BLOCK_N, len_k,
                                                stride_kst, stride_ksh, stride_vst, stride_vsh, BLOCK_N, HEAD_DIM,
                                                VARIANT == "bf16smem")
        keys = n0 + cols
        keys_ok = keys < len_k
        k_rows = (kv_row0 + keys)[:, None]
        if USE_TMA:  # rows past the sequence (the next one's) are masked out of s below
            k = K.load([(kv_row0 + n0).to(tl.int32), kv_col])
        else:
            k = tl.load(K + k_rows * stride_kt + kv_head * stride_kh + d[None, :], mask=keys_ok[:, None], other=0.0)
        if VARIANT == "fp8dot":  # D/32 FP8 dots of K = 32, each scaled by q_scale[:, c] x k_scale[:, c]
            k_factors = _e8m0_value(k_scale)
            s = tl.zeros([q.shape[0], BLOCK_N], tl.float32)
            for c in tl.static_range(DC):
                s_c = tl.dot(_chunk32(q, c, DC_LEVELS), tl.trans(_chunk32(k, c, DC_LEVELS)))
                s += s_c * (_column(q_aux, c, DC)[:, None] * _column(k_factors, c, DC)[None, :])
            s = _scores(s, qk_scale, HW_CVT)
        elif VARIANT == "rebase":
            k_values = tl.reshape(tl.reshape(k.to(tl.float32), (BLOCK_N, DC, 32)) *
                                  _e8m0_value(k_scale)[:, :, None], (BLOCK_N, HEAD_DIM))
            k, k_exp = _rebase_rows(k_values, k_scale.to(tl.int32) - 127, HW_CVT)
            s = _scores(tl.dot(q, tl.trans(k)), q_aux[:, None] * _pow2(k_exp)[None, :], HW_CVT)
        elif VARIANT == "bf16smem":
            s = _scores(tl.dot(q, tl.trans(_scale_rows(k, k_scale, DOT_FP16))), qk_scale, HW_CVT)  # k_scale: factors
        elif VARIANT == "f16row":
            k16, k_factor = _row_shifted_f16(k, k_scale)
            # q_aux: Q's row factor x qk_scale
            s = _scores(tl.dot(q, tl.trans(k16)) * q_aux[:, None], k_factor[None, :], HW_CVT)
        else:
            s = _scores(tl.dot_scaled(q, q_aux, "e4m3", tl.trans(k), k_scale, "e4m3"), qk_scale, HW_CVT)
        if MASKED:
            ok = visible(rows[:, None], keys[None, :], len_q, len_k, lo_off, hi_off, HAS_LO, HAS_HI)
            s = tl.where(ok, s, float("-inf"))
        # maxima of the 32-key blocks first: the row maximum from them, and P's block maxima as exp2 of them
        # (exp2 is monotonic: the block's largest P is at its largest score), not a second pass over P
        s_max = tl.max(tl.reshape(s, (s.shape[0], NB, 32)), 2)  # [BLOCK_M, NB]
        m_new = tl.maximum(m_i, tl.ceil(tl.max(s_max, 1)))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet: exp2 gives 0, not NaN
        p = tl.math.exp2(s - m_ref[:, None])
        if MASKED:
            p = tl.where(ok, p, 0.0)
        alpha = tl.math.exp2(m_i - m_ref)  # a power of two: exact
        if VARIANT == "f16row":  # P as fp16 values x 2**8 (exact for P >= 2**-32), the sum from the same values
            p16, p_sum_q = _quantize_p_f16(p, tl.math.exp2(s_max - m_ref[:, None]), HW_CVT)
        else:
            p_data, p_exp, p_values, p_sum_q = _quantize_p(p, tl.math.exp2(s_max - m_ref[:, None]), HW_CVT)
        l_i = l_i * alpha + tl.sum(p, 1)
        lq_i = lq_i * alpha + p_sum_q
        if USE_TMA:
            v = V.load([(kv_row0 + n0).to(tl.int32), kv_col])
            if MASKED:  # the next sequence's rows: zero (p is 0 there, but they join V's column maxima)
                v = tl.where(keys_ok[:, None], v, tl.zeros_like(v))
        else:
            v = tl.load(V + k_rows * stride_vt + kv_head * stride_vh + d[None, :], mask=keys_ok[:, None], other=0.0)
        if VARIANT == "fp8dot":  # BLOCK_N/32 FP8 dots of K = 32, each scaled by p_scale[:, c] x v_scale[c, :]
            p_factors = _pow2(p_exp)
            v_factors = _e8m0_value(v_scale)
            v_t = tl.trans(v)  # key chunks of V are column chunks of V^T
            pv = tl.zeros([q.shape[0], HEAD_DIM], tl.float32)
            for c in tl.static_range(NB):
                pv_c = tl.dot(_chunk32(p_data, c, NB_LEVELS), tl.trans(_chunk32(v_t, c, NB_LEVELS)))
                pv += pv_c * (_column(p_factors, c, NB)[:, None] * _row(v_factors, c, NB)[None, :])
        elif VARIANT == "rebase":
            p_r, p_row_exp = _rebase_rows(p_values, p_exp, HW_CVT)
            v_r, v_col_exp = _rebase_cols(v, v_scale.to(tl.int32) - 127, HW_CVT)
            pv = tl.dot(p_r, v_r) * (_pow2(p_row_exp)[:, None] * _pow2(v_col_exp)[None, :])
        elif VARIANT == "bf16smem":
            p_dot = p_values.to(tl.float16) if DOT_FP16 else p_values.to(tl.bfloat16)
            pv = tl.dot(p_dot, _scale_cols(v, v_scale, DOT_FP16))  # v_scale: factors
        elif VARIANT == "f16row":
            v16, v_factor = _col_shifted_f16(v, v_scale)
            pv = tl.dot(p16, v16) * (v_factor * 0.00390625)[None, :]  # P entered as its values x 2**8
        else:
            pv = tl.dot_scaled(p_data, (p_exp + 127).to(tl.uint8), "e4m3", v, tl.trans(v_scale), "e4m3")
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i, lq_i


@triton.jit(do_not_specialize=["num_seqs", "group", "window_left", "right", "rows_q", "rows_kv"])
def mxfp8_attn_fwd_kernel(Q, QS, K, KS, V, VS, Out, Lse, Q_OFF, OUT_OFF, KV_OFF, num_seqs, total_out, rows_q, rows_kv,
                          stride_qt, stride_qh, stride_qst, stride_qsh, stride_kt, stride_kh, stride_kst, stride_ksh,
                          stride_vt, stride_vh, stride_vst, stride_vsh, stride_ot, stride_oh,
                          group, qk_scale, window_left, right,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
                          SEARCH_STEPS: tl.constexpr, VARIANT: tl.constexpr, HW_CVT: tl.constexpr,
                          DOT_FP16: tl.constexpr, USE_TMA: tl.constexpr, NAN_ROWS: tl.constexpr = False):
    """Program (tile, head): query rows [m0, m0 + BLOCK_M) of the sequence owning ``tile``, q head ``head``.
    qk_scale: softmax scale / ln 2 (scores in the log2 domain). VARIANT: one of ``VARIANTS`` (module docstring);
    HW_CVT: fp32 -> E4M3 by the GPU's instruction; DOT_FP16: bf16smem dequantizes to fp16 (interpreter); USE_TMA:
    K and V are tensor descriptors over [T_kv, Hkv * D] with blocks [BLOCK_N, D], else pointers. NAN_ROWS
    (``configs.KNOBS.mxfp8_nan_rows``): a row whose visible scores include NaN/+inf gets NaN out, not a finite one."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches it (a Python float): keep fp32 math
    tl.static_assert(BLOCK_N % 32 == 0)
    tl.static_assert(HEAD_DIM % 32 == 0)
    DC: tl.constexpr = HEAD_DIM // 32
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq, out_row0, len_q, m0 = padded_tile(OUT_OFF, tile, num_seqs, BLOCK_M, SEARCH_STEPS)
    if BROADCAST_Q:
        q_row0 = out_row0 * 0
    else:
        q_row0 = tl.load(Q_OFF + seq).to(tl.int64)
    kv_row0 = tl.load(KV_OFF + seq).to(tl.int64)
    len_k = (tl.load(KV_OFF + seq + 1) - kv_row0).to(tl.int32)
    # a sequence outside the tensors (bad offsets) is skipped: every access below stays in bounds
    inside = (m0 >= 0) & rows_inside(out_row0, len_q, total_out) & rows_inside(q_row0, len_q, rows_q) \
        & rows_inside(kv_row0, len_k, rows_kv)
    if (m0 < len_q) & inside:
        kv_head = (head // group).to(tl.int64)
        kv_col = (kv_head * HEAD_DIM).to(tl.int32)  # the head's first column in a [T, H * D] descriptor
        head64 = head.to(tl.int64)
        rows = m0 + tl.arange(0, BLOCK_M)
        rows_ok = rows < len_q
        d = tl.arange(0, HEAD_DIM)
        dc = tl.arange(0, DC)
        q_rows = (q_row0 + rows)[:, None]
        q = tl.load(Q + q_rows * stride_qt + head64 * stride_qh + d[None, :], mask=rows_ok[:, None], other=0.0)
        q_scale = tl.load(QS + q_rows * stride_qst + head64 * stride_qsh + dc[None, :], mask=rows_ok[:, None],
                          other=0)
        # Q in the form the variant's Q K^T dot takes, once per program (q_aux: _mx_kv_blocks)
        q_aux = q_scale
        if VARIANT == "fp8dot":
            q_aux = _e8m0_value(q_scale)  # [BLOCK_M, DC]
        elif VARIANT == "rebase":
            q_values = tl.reshape(tl.reshape(q.to(tl.float32), (BLOCK_M, DC, 32)) * _e8m0_value(q_scale)[:, :, None],
                                  (BLOCK_M, HEAD_DIM))
            q, q_exp = _rebase_rows(q_values, q_scale.to(tl.int32) - 127, HW_CVT)
            q_aux = _pow2(q_exp) * qk_scale
        elif VARIANT == "bf16smem":
            q = _dequantize_rows(q, q_scale, DOT_FP16)
        elif VARIANT == "f16row":
            q, q_factor = _row_shifted_f16(q, q_scale)
            q_aux = q_factor * qk_scale
        # V's (32, 1) scale rows of this sequence start here (meta_kernels.mxfp8 layout)
        v_scale_row0 = kv_row0 // 32 + seq

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # integer-valued (ceil) running maximum, log2 domain
        l_i = tl.zeros([BLOCK_M], tl.float32)  # sum of P (unquantized): the lse
        lq_i = tl.zeros([BLOCK_M], tl.float32)  # sum of the quantized P: out's denominator
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
            m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
        # masked leading edge (window start), mask-free bulk, masked trailing edge (diagonal, window end, last block)
        acc, m_i, l_i, lq_i = _mx_kv_blocks(
            acc, m_i, l_i, lq_i, q, q_aux, K, KS, V, VS, kv_row0, kv_head, kv_col, v_scale_row0, stride_kt, stride_kh,
            stride_kst, stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh, rows, len_q, len_k, -window_left,
            right, qk_scale, lead_begin, lead_end, HEAD_DIM, BLOCK_N, HAS_LEFT, HAS_RIGHT, True, VARIANT, HW_CVT,
            DOT_FP16, USE_TMA)
        acc, m_i, l_i, lq_i = _mx_kv_blocks(
            acc, m_i, l_i, lq_i, q, q_aux, K, KS, V, VS, kv_row0, kv_head, kv_col, v_scale_row0, stride_kt, stride_kh,
            stride_kst, stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh, rows, len_q, len_k, -window_left,
            right, qk_scale, bulk_begin, bulk_end, HEAD_DIM, BLOCK_N, HAS_LEFT, HAS_RIGHT, False, VARIANT, HW_CVT,
            DOT_FP16, USE_TMA)
        acc, m_i, l_i, lq_i = _mx_kv_blocks(
            acc, m_i, l_i, lq_i, q, q_aux, K, KS, V, VS, kv_row0, kv_head, kv_col, v_scale_row0, stride_kt, stride_kh,
            stride_kst, stride_ksh, stride_vt, stride_vh, stride_vst, stride_vsh, rows, len_q, len_k, -window_left,
            right, qk_scale, tail_begin, tail_end, HEAD_DIM, BLOCK_N, HAS_LEFT, HAS_RIGHT, True, VARIANT, HW_CVT,
            DOT_FP16, USE_TMA)

        empty = l_i == 0.0  # no visible key: out 0, lse -inf
        if NAN_ROWS:  # a NaN/+inf visible score made l_i NaN; P's E4M3 rounding saturated it (min(NaN, 448) = 448)
            lq_i = tl.where(l_i == l_i, lq_i, l_i)  # so out is NaN as the README says, not finite
        out = acc / tl.where(empty, 1.0, lq_i)[:, None]
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
        out_rows = (out_row0 + rows)[:, None]
        tl.store(Out + out_rows * stride_ot + head64 * stride_oh + d[None, :], out.to(Out.dtype.element_ty),
                 mask=rows_ok[:, None])
        tl.store(Lse + head64 * total_out + out_row0 + rows, lse, mask=rows_ok)


def launch_config(variant: str, head_dim: int, interpreter: Optional[bool] = None) -> KernelConfig:
    """Tile and launch sizes per variant on the GPU (under the interpreter 64 x 64, so chunking runs there too)."""
    if interpreting() if interpreter is None else interpreter:
        return KernelConfig(64, 64, 4, 1)
    # Compiled with Triton 3.6 for sm_90, D128, K/V through TMA (bench/NOTES.md "MXFP8 v3"): bf16smem 128 x 128 with
    # 3 stages: two K/V buffers, so the next block's TMA load runs under this block's work (with 2 stages the one
    # buffer was refilled only after both dots: no overlap); 131 KB, 255 registers, 8 B spills. rebase 128 x 128 and
    # dot_scaled / fp8dot 128 x 64 keep 2 stages (rebase spills 1.1 KB, fp8dot 1.8 KB; dot_scaled 0).
    # D256 (K/V pointers: attn_fwd.TMA_MAX_HEAD_DIM): 64 x 64 with 8 warps, still 1.0-2.7 KB of spills (128 x 64
    # spilled 2.4-4.9 KB); the bench is at D128. One stage: with 2, Triton 3.6 pipelined none of its loads
    # (no async copies in the sm_90 compile, test_arch_compile), so a second stage only claimed what it did not do.
    if head_dim > 128:
        return KernelConfig(64, 64, 8, 1)
    if variant in ("bf16smem", "f16row"):
        return KernelConfig(128, 128, 8, 3)
    if variant == "rebase":
        return KernelConfig(128, 128, 8, 2)
    return KernelConfig(128, 64, 8, 2)


# Variants whose GPU results are wrong (H200, triton 3.6, 2026-12-01: NaN and ~18% off in every forward case and
# the backward; right under the interpreter): refused on CUDA until fixed, never a silent wrong result.
BROKEN_ON_GPU = ("fp8dot",)


def checked_variant(variant, device: torch.device) -> str:
    """``variant`` (None: ``configs.KNOBS.mxfp8_variant``) if it may run on ``device``, else ValueError."""
    variant = KNOBS.mxfp8_variant if variant is None else variant
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant in BROKEN_ON_GPU and device.type == "cuda":
        raise ValueError(f"MXFP8 variant {variant!r} gives wrong results on the GPU (bench/NOTES.md v7): choose one "
                         f"of {[v for v in VARIANTS if v not in BROKEN_ON_GPU]} (JFA_MXFP8_VARIANT)")
    return variant


def attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype, variant=None):
    """(out [T_out, Hq, D] in ``out_dtype``, lse [Hq, T_out] fp32) from quantized (data, scale) pairs.
    variant: one of ``VARIANTS``; None takes ``configs.KNOBS.mxfp8_variant``."""
    variant = checked_variant(variant, q_mx[0].device)
    (q, q_scale), (k, k_scale), (v, v_scale) = q_mx, k_mx, v_mx
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    heads_q, dim = q.shape[1], q.shape[2]
    total_out = num_seqs * q.shape[0] if params.broadcast_q else q.shape[0]
    out = alloc_output((total_out, heads_q, dim), out_dtype, device)  # every row belongs to a tile that writes it
    lse = alloc_output((heads_q, total_out), torch.float32, device)
    if total_out == 0 or num_seqs == 0:
        return out, lse
    q_off, kv_off, _ = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    out_off = q_off
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    cfg = launch_config(variant, dim)
    tiles = total_out // cfg.block_m + num_seqs
    tma = use_tma(False, k, v)  # descriptors hold no pointer tensors: fewer registers (no spills, see above)
    k_arg, v_arg = (rows_descriptor(k, cfg.block_n), rows_descriptor(v, cfg.block_n)) if tma else (k, v)
    q_scale_u8, k_scale_u8, v_scale_u8 = (s.view(torch.uint8) for s in (q_scale, k_scale, v_scale))
    launch(mxfp8_attn_fwd_kernel, (tiles, heads_q), dict(
        Q=q, QS=q_scale_u8, K=k_arg, KS=k_scale_u8, V=v_arg, VS=v_scale_u8, Out=out, Lse=lse, Q_OFF=q_off, OUT_OFF=out_off,
        KV_OFF=kv_off, num_seqs=num_seqs, total_out=total_out, rows_q=q.shape[0], rows_kv=k.shape[0],
        **row_strides("q", q), **row_strides("qs", q_scale_u8),
        **row_strides("k", k), **row_strides("ks", k_scale_u8), **row_strides("v", v),
        **row_strides("vs", v_scale_u8), **row_strides("o", out), group=heads_q // k.shape[1],
        qk_scale=params.scale * 1.4426950408889634, window_left=window_left, right=right, HEAD_DIM=dim,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        BROADCAST_Q=params.broadcast_q, SEARCH_STEPS=fanout_search_steps(num_seqs), VARIANT=variant,
        HW_CVT=not interpreting(), DOT_FP16=interpreting(), USE_TMA=tma, NAN_ROWS=KNOBS.mxfp8_nan_rows),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse

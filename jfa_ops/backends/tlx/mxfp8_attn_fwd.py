"""TLX MXFP8 forward (sm_90): both matmuls as E4M3 wgmma, in the TLX forward's warp-specialized frame.

The TLX bf16 forward (``attn_fwd.py``) is the frame: persistent programs over the triton backend's tile list, a TMA
producer warpgroup (40 registers) and two consumer warpgroups (232) that own 64 rows each of a 128-row query tile and
issue their matmuls in turn (named barriers 9/10), so one's softmax and P quantization run while the other's wgmma
do (FA3's ping-pong: the overlap that non-warp-specialized Triton cannot get, bench/NOTES.md "MXFP8 v4").

Operands (``triton/mxfp8_rebase.py``, run before the kernel; Hopper has no block-scaled MMA):
- Q and K re-based per row to one power-of-two scale ("rebase"): S = Qr Kr^T is ONE E4M3 wgmma per tile
  (m64n128k32 x D/32), the row x key factors multiply the fp32 S (2 FMUL per score).
- P = 2**(s - m) with an integer (ceil) running maximum m, as the reference defines it, so P <= 1 and the rescale
  factors are exact powers of two; P enters the dot as E4M3(P * 2**8) (the 2**8 folded into exp2's argument, one
  saturating convert per two scores). One fixed scale instead of the reference's 32-key block scales gives the same
  values wherever P * 2**8 is an E4M3 normal (P >= 2**-14: E4M3's relative rounding does not depend on the scale);
  out's denominator is the sum of the same rounded values, as the reference's, taken by the tensor cores (P times a
  [BLOCK_N, 32] tile of ones in shared memory, a fresh accumulator per block added in fp32)
  (``jfa_ops.testing.rebased_mxfp8_attention_model``: equal to the oracle to 3e-16 on N(0, 1) inputs).
- V re-based per column per key tile and stored transposed, V^T [Hkv * D, tiles * 128] (keys contiguous): the
  K-major B operand an FP8 wgmma needs. Why in the input stage and not FA3's in-kernel shared-memory transpose: the
  per-column re-basing is ALU work per element either way (about one producer warpgroup's whole budget per tile at
  the MMA rate), the tile's keys past the sequence end come out zero (no value-row fix-up and no barrier between the
  consumers), and the stage is portable Triton, tested on CPU. Its cost is a read and a write of V's bytes (in the
  bench's timings). P V goes to its own fp32 accumulator; ``acc = acc * alpha + pv * vf`` applies the tile's
  column factors (vf includes 2**-8) before it joins the accumulator.

Consumers are v3's (each block's QK^T, softmax, PV in turn; no intra-warpgroup overlap): the column factors and the
separate P V accumulator cost 32 + 64 registers that v4's in-flight P V would need too (acc 64 + pv 64 + S 64 + P
16 + key factors 32 > 232).
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from ..triton import common
from ..triton.attn_fwd import broadcast_offsets
from ..triton.common import LN2, key_interval_mask, visible, window_bounds
from ..triton.launch import launch
from ..triton.mxfp8_attn_fwd import _scores
from ..triton.mxfp8_quantize import (quantize, quantize_rebased_key_tiles, quantize_rebased_rows,
                                     quantize_rebased_v_tiles)
from ..triton.mxfp8_rebase import (INV_P_SCALE, P_SCALE_LOG2, first_column, key_factor_tiles, p_in_v_key_order,
                                   permute_v_keys, rebase_key_tiles, rebase_rows, rebase_v_tiles)
from ..triton.scheduling import forward_tiles, tile_schedule
from .attn_fwd import (NUM_CONSUMERS, PINGPONG_A, _n_blocks, _pass_turn, _produce_q, _slot_phase, _tile_count,
                       _wait_turn, _work_tile)
from . import configs
from .configs import NUM_WARPS, mxfp8_fwd_config

CONSUMER_REGISTERS: tl.constexpr = tl.constexpr(232)
P_SCALE_LOG2_F: tl.constexpr = tl.constexpr(float(P_SCALE_LOG2))  # P enters the dot as P x 2**8
# ABLATE bits (``configs.MXFP8_ABLATE``): TIMING ONLY, THE RESULTS ARE WRONG when any is set. Each removes one stage
# of the consumer's key-block loop so the H200 can time what it costs (bench/NOTES.md "MXFP8 ceiling: ablations");
# every barrier, TMA load and the ping-pong turns stay, so the pipeline's shape does not change.
ABLATE_P_QUANT: tl.constexpr = tl.constexpr(configs.MXFP8_ABLATIONS["pquant"])  # P -> E4M3: a constant P tile
ABLATE_SOFTMAX: tl.constexpr = tl.constexpr(configs.MXFP8_ABLATIONS["softmax"])  # no max/exp2/sum/alpha: P = E4M3(S)
ABLATE_FACTORS: tl.constexpr = tl.constexpr(configs.MXFP8_ABLATIONS["factors"])  # key/column factors: none (1)
ABLATE_PV: tl.constexpr = tl.constexpr(configs.MXFP8_ABLATIONS["pv"])  # no P V wgmma (pv = 0)
ABLATE_ROWSUM: tl.constexpr = tl.constexpr(configs.MXFP8_ABLATIONS["rowsum"])  # no ones wgmma (denominator = l)


@triton.jit
def _mx_item(work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs, search_steps, rows_s,
             rows_o, window_left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
             HAS_RIGHT: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr, KV_MAJOR: tl.constexpr):
    """``attn_fwd._work_tile``'s item with the sequence's first V^T tile (the padded tile layout) in place of the
    sequence."""
    (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end, tail_begin,
     tail_end, seq) = _work_tile(work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                                 search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                 HAS_RIGHT, TILES_FROM_OFFSETS, KV_MAJOR)
    vtile0 = (kv_row0 // BLOCK_N + seq).to(tl.int32)
    return (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
            tail_begin, tail_end, vtile0)


@triton.jit
def _produce(desc_k, desc_vt, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties, kv_count, kv_row0, kv_col,
             vt_row, vtile0, n_begin, n_end, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
             NUM_BUFFERS_KV: tl.constexpr, desc_kf=None, desc_vf=None, kf_tiles=None, vf_tiles=None, kv_head=0,
             kv_heads=0, FACTORS_TMA: tl.constexpr = False):
    """TMA loads of key blocks [n_begin, n_end): K rows [BLOCK_N, D] and V^T [D, BLOCK_N] of the same keys.
    FACTORS_TMA: with K's the block's key factors, with V^T's its column factors (row tile x kv_heads + kv_head of
    the [tiles x Hkv, BLOCK_N] / [tiles x Hkv, D] factor tiles), each barrier counting both loads' bytes."""
    block_bytes: tl.constexpr = BLOCK_N * HEAD_DIM  # E4M3: one byte per element
    k_bytes: tl.constexpr = block_bytes + (BLOCK_N * 4 if FACTORS_TMA else 0)  # + the fp32 factors' box
    v_bytes: tl.constexpr = block_bytes + (HEAD_DIM * 4 if FACTORS_TMA else 0)
    for n0 in range(n_begin, n_end, BLOCK_N):
        buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
        tlx.barrier_wait(k_empties[buf], phase ^ 1)
        tlx.barrier_expect_bytes(k_fulls[buf], k_bytes)
        tlx.async_descriptor_load(desc_k, k_tiles[buf], [(kv_row0 + n0).to(tl.int32), kv_col], k_fulls[buf])
        if FACTORS_TMA:
            factor_row = ((vtile0 + n0 // BLOCK_N) * kv_heads + kv_head).to(tl.int32)
            tlx.async_descriptor_load(desc_kf, kf_tiles[buf], [factor_row, 0], k_fulls[buf])
        tlx.barrier_wait(v_empties[buf], phase ^ 1)
        tlx.barrier_expect_bytes(v_fulls[buf], v_bytes)
        tlx.async_descriptor_load(desc_vt, v_tiles[buf], [vt_row, (vtile0 + n0 // BLOCK_N) * BLOCK_N], v_fulls[buf])
        if FACTORS_TMA:
            tlx.async_descriptor_load(desc_vf, vf_tiles[buf], [factor_row, 0], v_fulls[buf])
        kv_count += 1
    return kv_count


@triton.jit
def _qk(q_tile, k_tile, CID: tl.constexpr, QK_CHUNKS: tl.constexpr):
    """S = Qr Kr^T (fp32 [rows, BLOCK_N]), issued in this consumer's turn. QK_CHUNKS 2: over the two halves of
    head_dim, each a fresh wgmma accumulator (issued together), added in fp32: Hopper's FP8 wgmma sums a chain with
    a ~13-bit accumulator, and S's error flips P's E4M3 rounding (``configs.MXFP8_QK_CHUNKS``)."""
    if QK_CHUNKS == 1:
        s = tlx.async_dot(q_tile, tlx.local_trans(k_tile))
        _pass_turn(CID)
        s = tlx.async_dot_wait(0, s)
    else:  # two halves of head_dim (four: 3.2 KB of spills per thread at D128)
        tl.static_assert(QK_CHUNKS == 2)
        ROWS: tl.constexpr = q_tile.shape[0]
        KEYS: tl.constexpr = k_tile.shape[0]
        CH: tl.constexpr = q_tile.shape[1] // 2
        s = tlx.async_dot(tlx.local_slice(q_tile, [0, 0], [ROWS, CH]),
                          tlx.local_trans(tlx.local_slice(k_tile, [0, 0], [KEYS, CH])))
        s1 = tlx.async_dot(tlx.local_slice(q_tile, [0, CH], [ROWS, CH]),
                           tlx.local_trans(tlx.local_slice(k_tile, [0, CH], [KEYS, CH])))
        _pass_turn(CID)
        s1 = tlx.async_dot_wait(0, s1)
        s = tlx.async_dot_wait(0, s) + s1
    return s


@triton.jit
def _consume(acc, m_i, l_i, lq_i, ones_tile, kv_count, q_tile, q_factor, k_tiles, v_tiles, k_fulls, k_empties,
             v_fulls, v_empties, KF_HEAD, VF_HEAD, vtile0, kv_heads, row0, len_q, len_k, lo_off, hi_off, n_begin, n_end,
             CID: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
             HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, MASKED: tl.constexpr, FMA_SOFTMAX: tl.constexpr,
             QK_CHUNKS: tl.constexpr, ABLATE: tl.constexpr, kf_tiles=None, vf_tiles=None,
             FACTORS_TMA: tl.constexpr = False, PERMUTED_V_KEYS: tl.constexpr = False,
             ROWSUM_ONE_COLUMN: tl.constexpr = False):
    """Key blocks [n_begin, n_end): S = Qr Kr^T (E4M3 wgmma) x row x key factors, the online softmax with an integer
    running maximum, P -> E4M3(P * 2**8), P V (E4M3 wgmma) x the tile's column factors into acc; l and lq in units
    of 2**-8. q_factor: Q's row factors x softmax scale / ln 2 (FMA_SOFTMAX: > 0); KF_HEAD: the kv head's key
    factors at the sequence's first key; VF_HEAD: its column factors of tile 0 (tile t at + t * kv_heads * D).
    ABLATE != 0: TIMING ONLY, WRONG RESULTS (the ABLATE_* bits above). FACTORS_TMA (``configs.MXFP8_FACTORS_TMA``):
    the key and column factors from the ring slot's ``kf_tiles`` / ``vf_tiles`` (the producer's TMA loads, landed
    with K and V^T) instead of global loads: the same values, so the same results bit for bit. PERMUTED_V_KEYS
    (``configs.MXFP8_PERMUTED_V_KEYS``): V^T's keys in ``mxfp8_rebase.v_key_slot`` order, P's columns renamed to
    it (``p_in_v_key_order``): P enters the wgmma without a layout conversion. ROWSUM_ONE_COLUMN
    (``configs.MXFP8_ROWSUM_ONE_COLUMN``): lq's block term from one column of P x ones (``first_column``) instead of
    their row max: the same value, as every column is."""
    NO_P_QUANT: tl.constexpr = (ABLATE & ABLATE_P_QUANT) != 0
    NO_SOFTMAX: tl.constexpr = (ABLATE & ABLATE_SOFTMAX) != 0
    NO_FACTORS: tl.constexpr = (ABLATE & ABLATE_FACTORS) != 0
    NO_PV: tl.constexpr = (ABLATE & ABLATE_PV) != 0
    NO_ROWSUM: tl.constexpr = (ABLATE & ABLATE_ROWSUM) != 0
    # with both, nothing reads S and ptxas drops S's wgmma (checked in the SASS: an empty asm reading S does not
    # keep it), which would time a kernel without QK^T
    tl.static_assert(not (NO_P_QUANT and NO_SOFTMAX), "MXFP8 ablations pquant and softmax exclude each other")
    keys = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    for n0 in range(n_begin, n_end, BLOCK_N):
        buf, phase = _slot_phase(kv_count, NUM_BUFFERS_KV)
        # the factors' loads are issued before the wait for K: their latency hides behind it
        kf_ptr = KF_HEAD + n0 + keys
        vf_ptr = VF_HEAD + (vtile0 + n0 // BLOCK_N).to(tl.int64) * kv_heads * HEAD_DIM + d
        if QK_CHUNKS == 1 and not NO_FACTORS and not FACTORS_TMA:
            k_factor = tl.load(kf_ptr, mask=n0 + keys < len_k, other=0.0)
            v_factor = tl.load(vf_ptr)
        tlx.barrier_wait(k_fulls[buf], phase)
        if FACTORS_TMA and not NO_FACTORS and QK_CHUNKS == 1:  # read before the slot is released; the shared
            # load's latency hides behind the turn's wait
            k_factor = tl.reshape(tlx.local_load(kf_tiles[buf]), (BLOCK_N,))
        _wait_turn(CID)
        s = _qk(q_tile, k_tiles[buf], CID, QK_CHUNKS)
        if FACTORS_TMA and not NO_FACTORS and QK_CHUNKS > 1:  # after S's extra accumulators (read early: 416 / 288
            # B of spills at D128 instead of 28 / 56)
            k_factor = tl.reshape(tlx.local_load(kf_tiles[buf]), (BLOCK_N,))
        tlx.barrier_arrive(k_empties[buf], 1)
        if QK_CHUNKS > 1 and not NO_FACTORS and not FACTORS_TMA:  # their registers are S's extra accumulators'
            # until here (spills)
            k_factor = tl.load(kf_ptr, mask=n0 + keys < len_k, other=0.0)
            v_factor = tl.load(vf_ptr)
        if not NO_FACTORS:
            s = s * k_factor[None, :]  # before masking: a factor may be 0 (keys past the end) or NaN
        if not FMA_SOFTMAX:  # rounded on its own (``_scores``): fused into exp2's argument it was not the s of m
            s = _scores(s, q_factor[:, None], True)
        if MASKED:
            if HAS_LO:  # block-relative key interval per row (attn_fwd v4's form): with a left window the
                # absolute positions of ``visible`` were hoisted as registers and spilled (380 / 420 B, D128);
                # without one ``visible`` spills nothing and the interval form 16-24 B
                ok = key_interval_mask(tl.arange(0, q_tile.shape[0]), keys, len_q - row0, len_k - n0, lo_off,
                                       hi_off, HAS_LO, HAS_HI)
            else:
                ok = visible((row0 + tl.arange(0, q_tile.shape[0]))[:, None], (n0 + keys)[None, :], len_q, len_k,
                             lo_off, hi_off, HAS_LO, HAS_HI)
            s = tl.where(ok, s, float("-inf"))
        if NO_SOFTMAX:  # ablation: S itself becomes P (no row max, exp2, row sum or rescale)
            m_new = m_i
            p = s
        else:
            if FMA_SOFTMAX:  # q_factor > 0: the row maximum of s x key factors, times q_factor once per row
                m_new = tl.maximum(m_i, tl.ceil(tl.max(s, 1) * q_factor))
            else:
                m_new = tl.maximum(m_i, tl.ceil(tl.max(s, 1)))  # integer: P <= 1 and alpha a power of two
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet: exp2 gives 0, not NaN
            # P x 2**8 straight from exp2 (the fixed scale folded into the subtracted maximum): <= 256, no saturation
            if FMA_SOFTMAX:  # the product rounded as m's (``_scores``), not an FMA: past |s| = 2**31 the unrounded
                # product exceeds m by > 128, P = inf and the lse NaN (bench/NOTES.md "MXFP8 NaN on the GPU")
                p = tl.math.exp2(_scores(s, q_factor[:, None], True) - (m_ref - P_SCALE_LOG2_F)[:, None])
            else:
                p = tl.math.exp2(s - (m_ref - P_SCALE_LOG2_F)[:, None])
            alpha = tl.math.exp2(m_i - m_ref)
            l_i = l_i * alpha + tl.sum(p, 1)  # units of 2**-8, as lq
        if NO_P_QUANT:  # ablation: a constant E4M3 tile (loop-invariant) in place of the converted P
            p8 = tl.full(p.shape, 1.0, tl.float32).to(tl.float8e4nv)
        else:
            p8 = p.to(tl.float8e4nv)  # round to nearest even
            if PERMUTED_V_KEYS:  # the accumulator's registers as the A operand's (V^T's keys stored to match)
                p8 = p_in_v_key_order(p8)
        tlx.barrier_wait(v_fulls[buf], phase)
        if FACTORS_TMA and not NO_FACTORS:  # live from here only (the global load's were live all iteration)
            v_factor = tl.reshape(tlx.local_load(vf_tiles[buf]), (HEAD_DIM,))
        if NO_PV:  # ablation: no P V wgmma
            pv = tl.zeros([q_tile.shape[0], HEAD_DIM], tl.float32)
        else:
            pv = tlx.async_dot(p8, tlx.local_trans(v_tiles[buf]))  # outside the turn, as the bf16 v3 consumer's P V
        # out's denominator, the row sums of the rounded P, from the tensor cores: P x a [BLOCK_N, 32] tile of ones
        # (TLX's smallest wgmma N), a fresh accumulator per block (every column the sum; added in fp32 below, as
        # P V: Hopper's FP8 wgmma accumulates with reduced precision). 709 SASS per block instead of 844
        # (converting P back to fp32 and summing it)
        if not NO_ROWSUM:
            lq_t = tlx.async_dot(p8, tlx.local_trans(ones_tile))
        if not NO_PV:
            pv = tlx.async_dot_wait(0, pv)
        if NO_ROWSUM:  # ablation: the denominator is l's
            lq_i = l_i
        else:
            lq_t = tlx.async_dot_wait(0, lq_t)
            if NO_SOFTMAX:
                lq_i = lq_i + tl.max(lq_t, 1)
            elif ROWSUM_ONE_COLUMN:  # every column is the row sum (the ones' columns are equal): read one
                lq_i = lq_i * alpha + first_column(lq_t)
            else:
                lq_i = lq_i * alpha + tl.max(lq_t, 1)
        if NO_SOFTMAX:  # l (no row sums now) from lq: else every row looks empty and the ones wgmma is dropped
            l_i = lq_i
        tlx.barrier_arrive(v_empties[buf], 1)
        if NO_FACTORS:
            pv_scaled = pv
        else:
            pv_scaled = pv * v_factor[None, :]
        if NO_SOFTMAX:
            acc = acc + pv_scaled
        else:
            acc = acc * alpha[:, None] + pv_scaled
        m_i = m_new
        kv_count += 1
    return acc, m_i, l_i, lq_i, kv_count


@triton.jit(do_not_specialize=["num_heads", "kv_heads", "total_out", "group", "window_left", "right", "n_slots",
                               "search_steps", "num_seqs", "rows_s", "rows_o", "q_rows", "k_rows"])
def mxfp8_attn_fwd_tlx_kernel(desc_q, desc_k, desc_vt, QF, KF, VF, Out, Lse, Q_OFF, KV_OFF, TILE_SEQ, TILE_START,
                              TILE_COUNT, WORK_COUNTER, num_heads, kv_heads, total_out, n_slots, search_steps,
                              num_seqs, rows_s, rows_o, q_rows, k_rows, stride_ot, stride_oh, group, qk_scale,
                              window_left, right, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, KV_MAJOR: tl.constexpr,
                              BROADCAST_Q: tl.constexpr, FMA_SOFTMAX: tl.constexpr, ATOMIC_WORK: tl.constexpr,
                              TILES_FROM_OFFSETS: tl.constexpr, QK_CHUNKS: tl.constexpr, ABLATE: tl.constexpr = 0,
                              desc_kf=None, desc_vf=None, FACTORS_TMA: tl.constexpr = False,
                              PERMUTED_V_KEYS: tl.constexpr = False, ROWSUM_ONE_COLUMN: tl.constexpr = False):
    """Work items (query tile of BLOCK_M rows, q head), as ``attn_fwd_tlx_kernel``. desc_q: re-based Q [T_q (or
    L_q), Hq*D] E4M3, block [BLOCK_M/2, D]; desc_k: re-based K [T_kv, Hkv*D], block [BLOCK_N, D]; desc_vt: V^T
    [Hkv*D, tiles*BLOCK_N], block [D, BLOCK_N]; QF [Hq, q_rows], KF [Hkv, k_rows] row factors; VF [tiles, Hkv, D]
    column factors / 2**8 (``mxfp8_rebase``). qk_scale: softmax scale / ln 2. ABLATE (``configs.MXFP8_ABLATE``):
    0, or TIMING ONLY with WRONG RESULTS (the ABLATE_* bits: one stage of the key-block loop removed each).
    FACTORS_TMA (``configs.MXFP8_FACTORS_TMA``): desc_kf over K's factors in V's tile layout [tiles x Hkv, BLOCK_N]
    (``mxfp8_rebase.key_factor_tiles``), desc_vf over VF as [tiles x Hkv, D], each block [1, *]: the producer
    loads a key block's factors with its K and V^T tiles; KF and VF are not read. PERMUTED_V_KEYS
    (``configs.MXFP8_PERMUTED_V_KEYS``): desc_vt's tiles hold their keys in ``mxfp8_rebase.v_key_slot`` order.
    ROWSUM_ONE_COLUMN (``configs.MXFP8_ROWSUM_ONE_COLUMN``): the consumers' ``_consume`` reads one column of P x ones."""
    tl.static_assert(not ATOMIC_WORK, "the TLX forward uses static persistent striding")
    HALF_M: tl.constexpr = BLOCK_M // NUM_CONSUMERS
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    n_tiles = _tile_count(TILE_COUNT, n_slots, TILES_FROM_OFFSETS)
    n_work = n_tiles * num_heads
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    my_items = (n_work - pid + programs - 1) // programs

    q_tiles = tlx.local_alloc((HALF_M, HEAD_DIM), dtype, NUM_CONSUMERS * NUM_BUFFERS_Q)
    k_tiles = tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS_KV)
    v_tiles = tlx.local_alloc((HEAD_DIM, BLOCK_N), dtype, NUM_BUFFERS_KV)  # V^T: keys contiguous
    if FACTORS_TMA:  # per ring slot the key block's key factors and column factors (fp32)
        kf_tiles = tlx.local_alloc((1, BLOCK_N), tl.float32, NUM_BUFFERS_KV)
        vf_tiles = tlx.local_alloc((1, HEAD_DIM), tl.float32, NUM_BUFFERS_KV)
    else:
        kf_tiles = None
        vf_tiles = None
    # [32, BLOCK_N] ones: P times it gives the row sums of the rounded P (out's denominator) from the tensor cores;
    # written by every thread before the tasks split (the warp-specialized region starts with a CTA barrier)
    ones_tile = tlx.local_alloc((32, BLOCK_N), dtype, 1)[0]
    tlx.local_store(ones_tile, tl.full((32, BLOCK_N), 1.0, tl.float32).to(dtype))
    tlx.fence_async_shared()  # generic-proxy writes seen by wgmma (async proxy)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS * NUM_BUFFERS_Q, arrive_count=1)
    k_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    k_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=NUM_CONSUMERS)
    v_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1)
    v_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=NUM_CONSUMERS)

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer: TMA loads only
            kv_count = 0
            q_count = 0
            for i in range(0, my_items):
                (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                 tail_begin, tail_end, vtile0) = _mx_item(
                    pid + i * programs, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                    search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                    TILES_FROM_OFFSETS, KV_MAJOR)
                n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) + _n_blocks(bulk_begin, bulk_end, BLOCK_N) \
                    + _n_blocks(tail_begin, tail_end, BLOCK_N)
                if real & (n_blocks > 0):
                    q_count = _produce_q(desc_q, q_tiles, q_fulls, q_empties, q_count, m0, out_row0, head, HALF_M,
                                         HEAD_DIM, 1, NUM_BUFFERS_Q, BROADCAST_Q)  # E4M3: one byte
                    kv_head = head // group
                    kv_col = kv_head * HEAD_DIM
                    kv_count = _produce(desc_k, desc_vt, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                                        kv_count, kv_row0, kv_col, kv_col, vtile0, lead_begin, lead_end, BLOCK_N,
                                        HEAD_DIM, NUM_BUFFERS_KV, desc_kf, desc_vf, kf_tiles, vf_tiles, kv_head,
                                        kv_heads, FACTORS_TMA)
                    kv_count = _produce(desc_k, desc_vt, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                                        kv_count, kv_row0, kv_col, kv_col, vtile0, bulk_begin, bulk_end, BLOCK_N,
                                        HEAD_DIM, NUM_BUFFERS_KV, desc_kf, desc_vf, kf_tiles, vf_tiles, kv_head,
                                        kv_heads, FACTORS_TMA)
                    kv_count = _produce(desc_k, desc_vt, k_tiles, v_tiles, k_fulls, k_empties, v_fulls, v_empties,
                                        kv_count, kv_row0, kv_col, kv_col, vtile0, tail_begin, tail_end, BLOCK_N,
                                        HEAD_DIM, NUM_BUFFERS_KV, desc_kf, desc_vf, kf_tiles, vf_tiles, kv_head,
                                        kv_heads, FACTORS_TMA)

        with tlx.async_task(num_warps=4, registers=CONSUMER_REGISTERS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if cid == 1:  # bootstrap the ping-pong: consumer 0 issues first
                tlx.named_barrier_arrive(PINGPONG_A, 256)
            kv_count = 0
            q_count = 0
            for i in range(0, my_items):
                (real, head, m0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                 tail_begin, tail_end, vtile0) = _mx_item(
                    pid + i * programs, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads, group, num_seqs,
                    search_steps, rows_s, rows_o, window_left, right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                    TILES_FROM_OFFSETS, KV_MAJOR)
                if real:
                    n_blocks = _n_blocks(lead_begin, lead_end, BLOCK_N) \
                        + _n_blocks(bulk_begin, bulk_end, BLOCK_N) + _n_blocks(tail_begin, tail_end, BLOCK_N)
                    row0 = m0 + cid * HALF_M
                    rows = row0 + tl.arange(0, HALF_M)
                    m_i = tl.full([HALF_M], float("-inf"), tl.float32)
                    l_i = tl.zeros([HALF_M], tl.float32)
                    lq_i = tl.zeros([HALF_M], tl.float32)
                    acc = tl.zeros([HALF_M, HEAD_DIM], tl.float32)
                    if n_blocks > 0:
                        if BROADCAST_Q:
                            q_row0 = out_row0 * 0
                        else:
                            q_row0 = out_row0
                        q_factor = tl.load(QF + head.to(tl.int64) * q_rows + q_row0 + rows, mask=rows < len_q,
                                           other=1.0) * qk_scale
                        if FMA_SOFTMAX:  # > 0 (a subnormal would flush to 0: -inf x 0 is NaN); NaN stays in Q's data
                            q_factor = tl.maximum(q_factor, 1.1754943508222875e-38)
                        kv_head = head // group
                        kf_head = KF + kv_head.to(tl.int64) * k_rows + kv_row0
                        vf_head = VF + kv_head * HEAD_DIM
                        q_slot, q_phase = _slot_phase(q_count, NUM_BUFFERS_Q)
                        qb = q_slot * NUM_CONSUMERS + cid
                        tlx.barrier_wait(q_fulls[qb], q_phase)
                        q_tile = q_tiles[qb]
                        acc, m_i, l_i, lq_i, kv_count = _consume(
                            acc, m_i, l_i, lq_i, ones_tile, kv_count, q_tile, q_factor, k_tiles, v_tiles, k_fulls,
                            k_empties, v_fulls, v_empties, kf_head, vf_head, vtile0, kv_heads, row0, len_q, len_k,
                            -window_left, right, lead_begin, lead_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT,
                            HAS_RIGHT, True, FMA_SOFTMAX, QK_CHUNKS, ABLATE, kf_tiles, vf_tiles, FACTORS_TMA,
                            PERMUTED_V_KEYS, ROWSUM_ONE_COLUMN)
                        acc, m_i, l_i, lq_i, kv_count = _consume(
                            acc, m_i, l_i, lq_i, ones_tile, kv_count, q_tile, q_factor, k_tiles, v_tiles, k_fulls,
                            k_empties, v_fulls, v_empties, kf_head, vf_head, vtile0, kv_heads, row0, len_q, len_k,
                            -window_left, right, bulk_begin, bulk_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT,
                            HAS_RIGHT, False, FMA_SOFTMAX, QK_CHUNKS, ABLATE, kf_tiles, vf_tiles, FACTORS_TMA,
                            PERMUTED_V_KEYS, ROWSUM_ONE_COLUMN)
                        acc, m_i, l_i, lq_i, kv_count = _consume(
                            acc, m_i, l_i, lq_i, ones_tile, kv_count, q_tile, q_factor, k_tiles, v_tiles, k_fulls,
                            k_empties, v_fulls, v_empties, kf_head, vf_head, vtile0, kv_heads, row0, len_q, len_k,
                            -window_left, right, tail_begin, tail_end, cid, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, HAS_LEFT,
                            HAS_RIGHT, True, FMA_SOFTMAX, QK_CHUNKS, ABLATE, kf_tiles, vf_tiles, FACTORS_TMA,
                            PERMUTED_V_KEYS, ROWSUM_ONE_COLUMN)
                        tlx.barrier_arrive(q_empties[qb], 1)  # every QK^T of this tile has completed
                        q_count += 1
                    # out = Pq V / sum(Pq) (lq in units of 2**-8, acc's V factors carry the 2**-8), lse from the
                    # unquantized P; rows that saw no key: out 0, lse -inf
                    empty = l_i == 0.0
                    out = acc / tl.where(empty, 1.0, lq_i * INV_P_SCALE)[:, None]
                    lse = tl.where(empty, float("-inf"),
                                   (m_i - P_SCALE_LOG2_F + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
                    rows_ok = rows < len_q
                    out_rows = out_row0 + rows
                    d = tl.arange(0, HEAD_DIM)
                    tl.store(Out + out_rows[:, None] * stride_ot + head * stride_oh + d[None, :],
                             out.to(Out.dtype.element_ty), mask=rows_ok[:, None])
                    tl.store(Lse + head.to(tl.int64) * total_out + out_rows, lse, mask=rows_ok)


# ---------------------------------------------------------------------------------------------------------- host side
def _descriptor(t: torch.Tensor, block_shape):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, shape=list(t.shape), strides=list(t.stride()), block_shape=list(block_shape))


def _k_factors_tiled(tiled_k_factors) -> bool:
    """Whether K's re-basing writes its factors in V's tile layout (``configs.MXFP8_TILED_KEY_FACTORS``, which
    only the FACTORS_TMA kernel reads), unless the caller says."""
    if tiled_k_factors is None:
        return configs.MXFP8_FACTORS_TMA and configs.MXFP8_TILED_KEY_FACTORS
    return tiled_k_factors


def rebase_operands(q_mx, k_mx, v_mx, kv_offsets, permuted_v_keys=None, tiled_k_factors=None):
    """The kernel's operands (qr, q_factors, kr, k_factors, vt, v_factors) from (data, scale) pairs
    (``triton/mxfp8_rebase.py``); vt's keys in ``v_key_slot`` order when ``permuted_v_keys`` (None:
    ``configs.MXFP8_PERMUTED_V_KEYS``, as the kernel launched now reads them); k_factors [tiles, Hkv, block_n]
    (``rebase_key_tiles``: ``key_factor_tiles``' layout, from K's one launch) when ``tiled_k_factors`` (None:
    ``configs.MXFP8_TILED_KEY_FACTORS`` with FACTORS_TMA), else [Hkv, T]."""
    cfg = mxfp8_fwd_config(q_mx[0].shape[2])
    permuted = configs.MXFP8_PERMUTED_V_KEYS if permuted_v_keys is None else permuted_v_keys
    kv_off = kv_offsets.to(torch.int32)
    k_operands = (rebase_key_tiles(*k_mx, kv_off, cfg.block_n) if _k_factors_tiled(tiled_k_factors)
                  else rebase_rows(*k_mx))
    return (*rebase_rows(*q_mx), *k_operands,
            *rebase_v_tiles(*v_mx, kv_off, cfg.block_n, permuted_keys=permuted))


def tiled_key_factors(k_factors: torch.Tensor, kv_offsets: torch.Tensor, block_n: int) -> torch.Tensor:
    """K's factors as ``configs.MXFP8_FACTORS_TMA``'s kernel loads them: [Hkv, T] (``rebase_rows``) to V's tile
    layout [tiles, Hkv, block_n] (``key_factor_tiles``); already tiled (3-d): as given (tools/tlx_check.py tiles
    them once to time the kernel alone)."""
    if k_factors.dim() == 3:
        return k_factors
    return key_factor_tiles(k_factors, kv_offsets.to(torch.int32), block_n)


def quantize_operands(q, k, v, kv_offsets, rounding):
    """``rebase_operands`` of the MX pairs of high-precision q, k, v, bit for bit, in one pass over each (the
    quantize kernel writes the re-based layout itself: bf16 read once, E4M3 written once); V through the pair and
    the re-basing stage unless ``configs.MXFP8_FUSED_V``); K's factors tiled as ``rebase_operands``' are
    (``quantize_rebased_key_tiles``) under ``configs.MXFP8_TILED_KEY_FACTORS`` with FACTORS_TMA."""
    cfg = mxfp8_fwd_config(q.shape[2])
    kv_off = kv_offsets.to(torch.int32)
    permuted = configs.MXFP8_PERMUTED_V_KEYS
    if configs.MXFP8_FUSED_V:
        vt, vf = quantize_rebased_v_tiles(v, kv_off, cfg.block_n, rounding)
        # (both off-by-default knobs together: the fused kernel writes the natural order, a copy permutes it)
        v_operands = (permute_v_keys(vt, cfg.block_n) if permuted else vt, vf)
    else:
        v_operands = rebase_v_tiles(*quantize(v, kv_off, (32, 1), rounding), kv_off, cfg.block_n,
                                    permuted_keys=permuted)
    k_operands = (quantize_rebased_key_tiles(k, kv_off, cfg.block_n, rounding) if _k_factors_tiled(None)
                  else quantize_rebased_rows(k, rounding))
    return (*quantize_rebased_rows(q, rounding), *k_operands, *v_operands)


def attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, out_dtype, rebased=None):
    """(out [T_out, Hq, D] in ``out_dtype``, lse [Hq, T_out] fp32) from (data, scale) pairs: the triton MXFP8
    forward's contract (``triton.mxfp8_attn_fwd.attention_forward``). ``rebased``: ``rebase_operands``'s result
    for these pairs, to time the kernel alone (tools/tlx_check.py); its vt in the key order
    ``configs.MXFP8_PERMUTED_V_KEYS`` says (the kernel cannot tell)."""
    operands = (lambda kv_off: rebase_operands(q_mx, k_mx, v_mx, kv_off)) if rebased is None else (lambda _: rebased)
    return _forward(operands, q_mx[0].shape, k_mx[0].shape, q_offsets, kv_offsets, params, out_dtype)


def attention_forward_quantizing(q, k, v, q_offsets, kv_offsets, params, rounding):
    """``attention_forward`` of the MX pairs of high-precision q, k, v (out in q's dtype), their operands made by
    ``quantize_operands``: the same result bit for bit, without the pairs' round trip through memory."""
    return _forward(lambda kv_off: quantize_operands(q, k, v, kv_off, rounding), q.shape, k.shape, q_offsets,
                    kv_offsets, params, q.dtype)


def _forward(operands, q_shape, k_shape, q_offsets, kv_offsets, params, out_dtype):
    """The kernel's launch; ``operands(kv_offsets int32)`` makes (qr, q_factors, kr, k_factors, vt, v_factors)
    unless the call has no work."""
    device, num_seqs = kv_offsets.device, kv_offsets.shape[0] - 1
    num_heads, head_dim = q_shape[1], q_shape[2]
    cfg = mxfp8_fwd_config(head_dim)
    if params.broadcast_q:
        q_off = broadcast_offsets(num_seqs, q_shape[0], device)
        total_out = num_seqs * q_shape[0]
    else:
        q_off = q_offsets.to(torch.int32)
        total_out = q_shape[0]
    kv_off = kv_offsets.to(torch.int32)
    out = common.alloc_output((total_out, num_heads, head_dim), out_dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    if total_out == 0 or num_seqs == 0 or k_shape[0] == 0:  # no kernel (a descriptor needs positive extents)
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    qr, q_factors, kr, k_factors, vt, v_factors = operands(kv_off)
    factors_tma = configs.MXFP8_FACTORS_TMA
    if factors_tma:  # K's factors in V's tile layout (TMA boxes start 16-byte aligned), made here unless given so
        k_factors = tiled_key_factors(k_factors, kv_off, cfg.block_n)
        tma_factors = dict(
            desc_kf=_descriptor(k_factors.view(-1, cfg.block_n), (1, cfg.block_n)),
            desc_vf=_descriptor(v_factors.view(-1, head_dim), (1, head_dim)), FACTORS_TMA=True)
    elif k_factors.dim() == 3:  # the loads read [Hkv, T]: tiled factors there would be the wrong keys' (review48)
        raise ValueError("rebased: K's factors are tiled [tiles, Hkv, block_n] (configs.MXFP8_FACTORS_TMA's layout) "
                         "but configs.MXFP8_FACTORS_TMA is off; pass rebase_operands' [Hkv, T] factors")
    else:  # launch binds every parameter by name, the defaults too
        tma_factors = dict(desc_kf=None, desc_vf=None, FACTORS_TMA=False)
    ablate = configs.MXFP8_ABLATE
    if ablate:
        warnings.warn(f"tlx MXFP8 forward with ablations {configs.mxfp8_ablation_names(ablate)} "
                      "(JFA_TLX_MXFP8_ABLATE / configs.MXFP8_ABLATE): TIMING ONLY, the results are WRONG")
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    uniform = params.max_seqlen_kv > 0 and params.max_seqlen_kv * num_seqs == k_shape[0] and (
        params.broadcast_q or (params.max_seqlen_q > 0 and params.max_seqlen_q * num_seqs == total_out))
    kv_major = uniform or not (has_left or has_right or params.broadcast_q)  # as configs.fwd_choices
    programs, schedule = tile_schedule(
        lambda: forward_tiles(q_off, kv_off, total_out, k_shape[0], cfg.block_m, window_left, right, has_left,
                              has_right),
        q_off, kv_off, total_out, k_shape[0], cfg.block_m, num_heads, "static", 1, device)
    heads_kv = k_shape[1]
    launch(mxfp8_attn_fwd_tlx_kernel, (programs,), dict(
        desc_q=_descriptor(qr.view(qr.shape[0], -1), (cfg.block_m // 2, head_dim)),
        desc_k=_descriptor(kr.view(kr.shape[0], -1), (cfg.block_n, head_dim)),
        desc_vt=_descriptor(vt, (head_dim, cfg.block_n)), QF=q_factors, KF=k_factors, VF=v_factors, Out=out, Lse=lse,
        Q_OFF=q_off, KV_OFF=kv_off, **schedule, num_heads=num_heads, kv_heads=heads_kv, total_out=total_out,
        q_rows=q_shape[0], k_rows=k_shape[0], stride_ot=out.stride(0), stride_oh=out.stride(1),
        group=num_heads // heads_kv, qk_scale=params.scale * 1.4426950408889634, window_left=window_left,
        right=right, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        NUM_BUFFERS_KV=cfg.num_buffers_kv, NUM_BUFFERS_Q=cfg.num_buffers_q, HAS_LEFT=has_left, HAS_RIGHT=has_right,
        KV_MAJOR=kv_major, BROADCAST_Q=params.broadcast_q, FMA_SOFTMAX=params.scale > 0,
        QK_CHUNKS=configs.MXFP8_QK_CHUNKS, ABLATE=ablate, **tma_factors,
        PERMUTED_V_KEYS=configs.MXFP8_PERMUTED_V_KEYS,
        ROWSUM_ONE_COLUMN=configs.MXFP8_ROWSUM_ONE_COLUMN), num_warps=NUM_WARPS,
        num_stages=1)
    return out, lse

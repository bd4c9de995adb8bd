"""TLX backward (sm_90, D64/D128): warp-specialized dK/dV, key-stationary, with dQ fused as fp32 TMA reduce-adds.

One persistent program per SM, 12 warps:
- the producer (4 warps) loads, per work item (key tile of BLOCK_N keys, kv head), the K and V tiles once, then for
  every q head of the kv head's group the query blocks (Q and dO, BLOCK_M rows each) the keys can see, through a
  double-buffered ring (full/empty mbarriers);
- two consumer warpgroups each own BLOCK_N / 2 keys (``_consume_rows_v2``: FA3's order, wgmma overlapped;
  bench/NOTES.md "TLX backward v2"): per query block they recompute P = exp2(Q K^T * scale - lse), dV += P^T dO,
  dP = dO V^T, dS = P (dP - delta), dK += dS^T Q, and dQ_block = dS K, which goes to an fp32 accumulator by a TMA
  bulk reduce-add (so the two consumers, every key tile and, for broadcast Q, every sequence add into it without
  atomics in registers); with DQ_SHARED (the default) each consumer computes one column half of dQ over both
  consumers' keys. dK, dV stay in registers over the group.

Work items and block ranges come from the triton backend's key tile lists (``scheduling.kv_tiles``) and
``common.stage_bounds`` (keys stationary: masked lead, mask-free bulk, masked tail; the producer loads them in
three loops, each consumer walks them in one, the mask under a runtime branch, which is what keeps its registers
within 240 at D128). Jagged TMA, as in the forward:
key/value rows of the tile past the sequence end are zeroed in shared memory by their consumer (a zero key adds
nothing to dQ); query/dO rows of a masked block past the end are zeroed by consumer 0 before both use them (named
barrier 11), so 0 * NaN never reaches dK/dV and dQ gets exact zeros there. The delta pre-pass (which also zeroes the
dQ accumulator) and the dQ finalize (scale, cast) are the triton backend's kernels. (The first consumers, v1: S^T
and dS^T transposed, 0.64-0.84x the triton backward, were removed; their code is in git history, e.g. 05f76bf.)
"""
from __future__ import annotations

import contextlib
import warnings
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from ..triton import attn_bwd as triton_bwd
from ..triton import common
from ..triton import launch as launcher
from ..triton.attn_bwd import (DELTA_BLOCK_T, FINALIZE_BLOCK, FINALIZE_WARPS, _log2_lse, _packed_any_rows, _row_stats,
                               attn_bwd_delta_kernel, attn_bwd_dq_finalize_kernel, launch_delta)
from ..triton.attn_fwd import TensorDescriptor, broadcast_offsets, descriptor_layout, rebase, rows_descriptor
from ..triton.block_sparse_bwd import (causal_item_list, causal_item_list_device, item_list, sectioned_item_list,
                                      sectioned_item_list_device, transposed_selection, uniform_causal_item_list)
from ..triton.block_sparse_fwd import (index_strides, longest_rows, selected_cost_args, selected_tile_start,
                                        selected_walk)
from ..triton.common import (cdiv, key_interval_mask, launch_schedule, num_sms, snake_items, snake_work,
                             stage_block_start, stage_bounds, window_bounds, work_item)
from ..triton.configs import Knobs
from ..triton.launch import launch_planned
from ..triton.mxfp8_quantize import _shared_exponent
from ..gqa_split import plan as gqa_split_plan
from ..triton.scheduling import (binary_search_steps, capacity_of, kv_tiles, schedule_arguments, tile_schedule,
                                 tiles_from_offsets)
from . import configs
from .attn_fwd import (NUM_CONSUMERS, VFIX_BARRIER, _n_blocks, _slot_phase, _tile_count, _tile_sequence, _tma_ready,
                       _uniform_walk, _zero_rows_past_end, uniform_lengths)
from .configs import NUM_WARPS, bwd_config_v2

OWN_BARRIER: tl.constexpr = tl.constexpr(12)  # + consumer id: one warpgroup's shared-memory writes are done
DS_BARRIER: tl.constexpr = tl.constexpr(14)  # DQ_SHARED: both consumers' dS are in shared memory (or: done with K)
# ABLATE bits (``configs.BACKWARD_ABLATE``; the v2 consumers with the dQ split, dense): TIMING ONLY, THE
# RESULTS ARE WRONG when any is set. Each removes one stage of the query-block loop so the H200 can time what it
# costs (bench/NOTES.md "TLX backward ablations (helper bwdablate)"); every barrier and the work order stay.
ABLATE_DQ: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["dq"])  # no dQ wgmma, no reduce-add
ABLATE_DQ_ADD: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["dqadd"])  # dQ wgmma kept, no reduce-add
ABLATE_EXP2: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["exp2"])  # P = S * scale - lse (no MUFU)
ABLATE_DS: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["ds"])  # dS = dP (no P (dP - delta))
ABLATE_DK: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["dk"])  # no dK += dS^T Q wgmma
ABLATE_DV: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["dv"])  # no dV += P^T dO wgmma
ABLATE_LOADS: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["loads"])  # Q/dO loaded for the first slots only
# An added stage, not a removal: P and dS rounded to their MXFP8 values before their bf16 stores (the CUDA-core cost
# of an MXFP8 backward on Hopper: bench/NOTES.md "MXFP8 backward on Hopper, helper mxbwd, stop 26").
ABLATE_MX_QUANT: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["mxquant"])
# S = Q K^T and dP = dO V^T over the first half of head_dim: the tensor time and shared-memory operand bytes of FP8
# (E4M3) S and dP wgmma over all of it (a bf16 k-step of 16 reads what an E4M3 k-step of 32 reads, at the same rate)
ABLATE_HALF_SDP: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["sdphalf"])
# Not a block-loop stage: the item's dK/dV epilogue stores skipped (dK, dV kept alive): what the epilogue costs an
# item (helper bcastbwd39: broadcast-Q's items are 2 blocks, ~42% of their time outside the blocks)
ABLATE_DKV_STORE: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["dkvstore"])
# Design (A)'s register stand-in (helper mxbcast48; an added stage): dV += P^T dO and dK += dS^T Q each into a fresh
# wgmma accumulator per query block, folded into dV / dK by an FFMA with a runtime factor (an FP8 dV / dK's promotion
# of its MX scale products, bench/NOTES.md "MXFP8 backward on Hopper": 276 registers counted, never compiled)
ABLATE_PROMOTE: tl.constexpr = tl.constexpr(configs.BACKWARD_ABLATIONS["promote"])


@triton.jit
def _columns(tile, n: tl.constexpr):
    """The first ``n`` columns of a shared-memory tile."""
    return tlx.local_slice(tile, [0, 0], [tile.shape[0], n])


@triton.jit
def _mx_fixed_scale_values(p):
    """P in [0, 1] -> its MXFP8 values at the one scale 2**-8 (P x 2**8 to E4M3, round to nearest even, and back):
    the 32 x 32 block's MX value wherever P >= 2**-14 (rceil never puts a block of P <= 1 above 2**-8, and E4M3's
    relative rounding does not depend on the scale between normals: the forward's argument, bench/NOTES.md "TLX
    MXFP8 forward v1"); smaller P round coarser than their block's scale would. fp32."""
    return (p * 256.0).to(tl.float8e4nv).to(tl.float32) * (1.0 / 256.0)


@triton.jit
def _mx_square_values(x):
    """fp32 [R, C] -> its MXFP8 values in 32 x 32 blocks ("rceil" E8M0 scales; the blocks of a consumer's 64-row
    block and 64 keys start at multiples of 32 from the sequences' starts, as the reference's): block maxima,
    scales, x / scale to E4M3 (round to nearest even) and back times the scale. fp32."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    x4 = tl.reshape(x, (R // 32, 32, C // 32, 32))
    shared = _shared_exponent(tl.max(tl.max(tl.abs(x4), 3), 1), True)  # [R / 32, C / 32]
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)
    scale = ((127 + shared) << 23).to(tl.float32, bitcast=True)  # 2**shared (0 for all-zero blocks: -127)
    # rceil keeps |x| / scale <= 448, and sm_90's conversion saturates anyway (cvt.rn.satfinite): no clamp
    y = (x4 * inv_scale[:, None, :, None]).to(tl.float8e4nv)
    return tl.reshape(y.to(tl.float32) * scale[:, None, :, None], (R, C))


@triton.jit
def _bwd_item(work, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles, num_heads_kv, num_seqs, search_steps, rows_s,
              rows_o, window_left, right, head_group, TILE_HEAD, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr,
              HEAD_GROUPED: tl.constexpr, ITEM_LIST: tl.constexpr):
    """What producer and consumers both derive from a work item (key tile, kv head), tile-major (HEAD_GROUPED: in
    groups of head_group kv heads, ``configs.BACKWARD_HEAD_GROUP``; ITEM_LIST: TILE_SEQ, TILE_START and TILE_HEAD
    list the items themselves, ``block_sparse_bwd.item_list``); the sequence last."""
    if ITEM_LIST:
        tile = work
        kv_head = tl.load(TILE_HEAD + work)
    elif HEAD_GROUPED:
        tile, kv_head = work_item(work, n_tiles, num_heads_kv, head_group, True)
    else:
        tile, kv_head = work_item(work, n_tiles, num_heads_kv, 1, False)
    seq, n0, real, out_row0, len_q, kv_row0, len_k = _tile_sequence(
        tile, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, num_seqs, search_steps, rows_s, rows_o, BLOCK_N, TILES_FROM_OFFSETS,
        True)
    # Keys stationary: key j is seen by rows i with -right <= i - j - (L_q - L_k) <= window_left.
    lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
        n0, len_k, len_q, -right, window_left, HAS_RIGHT, HAS_LEFT, BLOCK_N, BLOCK_M)
    return (real, kv_head, n0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
            tail_begin, tail_end, seq)


@triton.jit
def _fix_rows_past_end(q_tiles, do_tiles, buf, m0, len_q, CID: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_M: tl.constexpr):
    """If query block m0 runs into the next sequence's rows: consumer 0 zeroes them in both tiles of slot buf (Q and
    dO), then both consumers meet at VFIX_BARRIER."""
    if m0 + BLOCK_M > len_q:
        if CID == 0:
            _zero_rows_past_end(q_tiles[buf], m0, len_q, BLOCK_M, HEAD_DIM, 32)
            _zero_rows_past_end(do_tiles[buf], m0, len_q, BLOCK_M, HEAD_DIM, 32)
        tlx.named_barrier_wait(VFIX_BARRIER, 256)


@triton.jit
def _selected_rows(item, Q_BLOCK_INDEX, Q_BLOCK_COUNT, n_kv_blocks, stride_tib, stride_tih, stride_tin, stride_tcb,
                   stride_tch, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                   UNIFORM_WALK: tl.constexpr = False):
    """SPARSE: (first, n) of a work item (``_bwd_item``'s tuple): it walks the BLOCK_M-row query tiles first ..
    first + n - 1 of Q_BLOCK_INDEX (the transposed selection: per KV block, the Q blocks that selected it,
    ascending), those of its KV block's row that overlap the rows any of its keys sees (``stage_bounds``' [lead_begin,
    hi_any)): the forward's walk with the roles swapped (``block_sparse_fwd.selected_walk``). Producer and consumers
    derive the same.

    UNIFORM_WALK (``configs.SPARSE_BACKWARD_UNIFORM_WALK``): (first, n) through ``_warp_uniform``. They come out of
    the walk's cross-lane reductions, which ptxas cannot see are uniform, so the consumers' block loop counter, the
    Q/dO slot and the opaque tile index were per-lane registers, and every wgmma descriptor of the loop was built in
    vector registers and moved by 4 R2UR (sm_90 SASS, consumer 1's block loop: 928 instructions, 664 with it, the
    dense loop's 646; 130 R2UR in it vs 0); the dense walk's bounds come from loads at uniform addresses, which
    ptxas does see."""
    real, kv_head, n0, _, _, _, _, lead_begin, _, _, _, _, tail_end, seq = item
    first, n = selected_walk(Q_BLOCK_INDEX, Q_BLOCK_COUNT, real, seq, kv_head, n0, n_kv_blocks, stride_tib,
                             stride_tih, stride_tin, stride_tcb, stride_tch, lead_begin, tail_end, BLOCK_KV, BLOCK_Q,
                             BLOCK_M)
    return _uniform_walk(first, n, UNIFORM_WALK)


@triton.jit
def _q_rows(out_row0, BROADCAST_Q: tl.constexpr):
    """A sequence's first packed Q row: its output row, or 0 for broadcast Q (one shared Q)."""
    if BROADCAST_Q:
        return out_row0 * 0
    else:
        return out_row0


@triton.jit
def _load_row_block(desc_q, desc_do, q_tile, do_tile, q_full, q_row, out_row, col, BLOCK_M: tl.constexpr,
                    HEAD_DIM: tl.constexpr, desc_lse=None, desc_delta=None, lse_tile=None, delta_tile=None,
                    stat_row=0, STATS_SMEM: tl.constexpr = False):
    """TMA loads of the Q and dO block at packed rows q_row / out_row into one ring slot (q_full counts the bytes).
    STATS_SMEM: also the block's lse and delta (BLOCK_M fp32 each from row ``stat_row`` of the flat [Hq * rows]
    vectors; past their end zeros) into the slot's ``lse_tile`` / ``delta_tile``, from the shifted copy
    ``stat_row % 4`` at the column ``stat_row`` rounded down to 4 (``_stats_descriptor``: a TMA box's inner start must
    be 16-byte aligned, else the load is an illegal instruction)."""
    block_bytes: tl.constexpr = BLOCK_M * HEAD_DIM * tlx.size_of(tlx.dtype_of(desc_q))
    if STATS_SMEM:
        tlx.barrier_expect_bytes(q_full, 2 * block_bytes + 2 * BLOCK_M * 4)
    else:
        tlx.barrier_expect_bytes(q_full, 2 * block_bytes)
    tlx.async_descriptor_load(desc_q, q_tile, [q_row.to(tl.int32), col], q_full)
    tlx.async_descriptor_load(desc_do, do_tile, [out_row.to(tl.int32), col], q_full)
    if STATS_SMEM:
        shift = stat_row.to(tl.int32) & 3
        column = stat_row.to(tl.int32) - shift
        tlx.async_descriptor_load(desc_lse, lse_tile, [shift, column], q_full)
        tlx.async_descriptor_load(desc_delta, delta_tile, [shift, column], q_full)


@triton.jit
def _produce_row_block(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count, q_row, out_row, col,
                       BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                       NO_LOADS: tl.constexpr = False, desc_lse=None, desc_delta=None, stat_tiles=None, stat_row=0,
                       STATS_SMEM: tl.constexpr = False):
    """TMA loads of the Q and dO block at packed rows q_row / out_row into the next ring slot; returns q_count + 1.
    NO_LOADS (the "loads" ablation: TIMING ONLY): only the first NUM_BUFFERS_Q blocks load; later slots are signalled
    full without a load (the consumers read the stale tiles). STATS_SMEM: with the block's lse and delta
    (``_load_row_block``; stat_tiles: lse of slot i at i, delta at NUM_BUFFERS_Q + i)."""
    buf, phase = _slot_phase(q_count, NUM_BUFFERS_Q)
    tlx.barrier_wait(q_empties[buf], phase ^ 1)
    if STATS_SMEM:
        lse_tile = stat_tiles[buf]
        delta_tile = stat_tiles[NUM_BUFFERS_Q + buf]
    else:
        lse_tile = None
        delta_tile = None
    if NO_LOADS:
        if q_count < NUM_BUFFERS_Q:
            _load_row_block(desc_q, desc_do, q_tiles[buf], do_tiles[buf], q_fulls[buf], q_row, out_row, col, BLOCK_M,
                            HEAD_DIM, desc_lse, desc_delta, lse_tile, delta_tile, stat_row, STATS_SMEM)
        else:
            tlx.barrier_arrive(q_fulls[buf], 1)
    else:
        _load_row_block(desc_q, desc_do, q_tiles[buf], do_tiles[buf], q_fulls[buf], q_row, out_row, col, BLOCK_M,
                        HEAD_DIM, desc_lse, desc_delta, lse_tile, delta_tile, stat_row, STATS_SMEM)
    return q_count + 1


@triton.jit
def _produce_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count, q_row0, out_row0, col, m_begin,
                  m_end, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                  NO_LOADS: tl.constexpr = False, desc_lse=None, desc_delta=None, stat_tiles=None, stat_row0=0,
                  STATS_SMEM: tl.constexpr = False):
    for m0 in range(m_begin, m_end, BLOCK_M):
        q_count = _produce_row_block(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count, q_row0 + m0,
                                     out_row0 + m0, col, BLOCK_M, HEAD_DIM, NUM_BUFFERS_Q, NO_LOADS, desc_lse,
                                     desc_delta, stat_tiles, stat_row0 + m0, STATS_SMEM)
    return q_count


@triton.jit
def _produce_selected_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count, q_row0, out_row0, col,
                           ids, first, n, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                           NUM_BUFFERS_Q: tl.constexpr):
    """SPARSE: the Q and dO blocks of selected query tiles first .. first + n - 1 (``selected_tile_start``); the id is
    read before the wait for a free slot, so its latency hides behind that wait."""
    for t in range(first, first + n):
        m0 = selected_tile_start(ids, t, BLOCK_Q, BLOCK_M)
        q_count = _produce_row_block(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count, q_row0 + m0,
                                     out_row0 + m0, col, BLOCK_M, HEAD_DIM, NUM_BUFFERS_Q)
    return q_count


@triton.jit
def _opaque_zero(j):
    """0 for j >= 0, which neither LLVM nor ptxas can see (so values computed from it stay inside j's loop)."""
    return tl.inline_asm_elementwise("{ .reg .pred p; setp.lt.s32 p, $1, 0; selp.u32 $0, 1, 0, p; }", "=r,r", [j],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _keep_alive(x, tile, j, DTYPE: tl.constexpr):
    """Ablations (TIMING ONLY): x stored to ``tile`` (of DTYPE) under a condition that never holds for j >= 0 and that
    neither compiler can see through (``_opaque_zero``), so the wgmma that made x is not dropped as dead code."""
    if _opaque_zero(j) != 0:
        tlx.local_store(tile, x.to(DTYPE))


@triton.jit
def _consume_rows_v2(dk, dv, q_count, dq_count, k_tiles, v_tiles, q_tiles, do_tiles, q_fulls, q_empties, p_tiles,
                     ds_tiles, dq_stage, desc_dq, Lse, Delta, stat_index, dq_row0, col, k0, len_q, len_k, qk_scale,
                     right, window_left, lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end,
                     CID: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
                     NUM_BUFFERS_DQ: tl.constexpr, DQ_SPLIT: tl.constexpr, HAS_LEFT: tl.constexpr,
                     HAS_RIGHT: tl.constexpr, DTYPE: tl.constexpr, DQ_SHARED: tl.constexpr, ids=None,
                     sel_first=0, sel_count=0, SPARSE: tl.constexpr = False, BLOCK_Q: tl.constexpr = 0,
                     STATS_AHEAD: tl.constexpr = False, ABLATE: tl.constexpr = 0, MXFP8: tl.constexpr = False,
                     PEEL: tl.constexpr = False, stat_tiles=None, STATS_SMEM: tl.constexpr = False):
    """v2 (FA3's Hopper order): S = Q K^T and dP = dO V^T un-transposed, [rows, keys], so lse and delta are 2
    registers per thread (transposed: 16 each); P and dS go through shared memory as the A operands of dV += P^T dO and
    dK += dS^T Q; dQ = dS K (DQ_SPLIT column slices) from dS in registers. The loop has num_stages=0 (else Triton's
    pipeliner waits for every wgmma right after issuing it), so: S with dP; dV with dS's arithmetic; dK with dQ
    slice 0's staging store. K, V, P, dS are this consumer's buffers (index CID).

    Registers per thread at D128 (peak at dS): dK 64 + dV 64 (in flight) + P 32 + dP 32 + lse, delta 4 + dS bf16 16.

    DQ_SHARED (FA3's dQ): each consumer computes dQ for its half of the columns over all 128 keys of the tile, from
    both consumers' dS in shared memory (named barrier DS_BARRIER, dS double-buffered by block parity so neither
    overwrites what the other still reads): half the dQ staging and reduce-adds (DQ_SPLIT 2 names the halves).

    SPARSE: the blocks are the selected query tiles sel_first .. sel_first + sel_count - 1 at ``ids``
    (``selected_tile_start``: ascending, each starting inside the sequence, so only the last may run past its end);
    a tile is masked when it lies outside the mask-free bulk [bulk_begin, bulk_end) (the forward's test). Each
    tile's id is read one block ahead: read at the top of its own iteration, its L2 latency sat before the wgmma
    issue of every block (the row-zeroing branch needs m0 first); ahead it costs 1-2 LDL per block (sm_90 SASS).

    STATS_AHEAD: lse and delta of block j + 1 prefetched into L1 during block j (their loads, issued beside S and
    waited for right after it, then hit L1; carrying the values instead cost ~12 spill instructions per block). Not
    with SPARSE (dense walks only).

    ABLATE (``configs.BACKWARD_ABLATE``; dense, DQ_SHARED): 0, or TIMING ONLY with WRONG RESULTS (the
    ABLATE_* bits: stages of the block loop removed; the dQ wgmma without its reduce-add is kept by ``_keep_alive``,
    and the wgmma waits count the groups left in flight).

    MXFP8 (``mxfp8_attn_bwd.py``: the MXFP8 backward, design (D) of bench/NOTES.md "MXFP8 backward on Hopper"; dense):
    P = exp2(min(S * scale - lse, 0)) (the MXFP8 oracle's clamp: S from the backward's operands may exceed the
    forward's lse), dV's P rounded to its MXFP8 value at the fixed scale 2**-8 (``_mx_fixed_scale_values``) and dS to
    its 32 x 32 block MXFP8 values (``_mx_square_values``) before their stores: the arithmetic of the ``mxquant``
    ablation, with results (the host feeds MX-valued Q, K, V, dO and delta from the unquantized dO).

    PEEL (``configs.BACKWARD_PEEL``; dense, not MXFP8): the block loop peeled by stage (masked lead, mask-free bulk,
    masked tail: the producer's order and count; the loops' shape below), ``masked`` a constexpr per loop, so
    the bulk loop has no mask code: the default's one loop runs the mask under a runtime branch that ptxas
    if-converts (the dS guard ``where(p == 0, 0, dS)``: 34 FSETP + 34 predicated FSEL per thread, issued in every
    block; bench/NOTES.md "helper peel37"). The same arithmetic per block (a mask-free block never took it).

    STATS_SMEM (``configs.BACKWARD_STATS_SMEM``; dense): lse and delta read from ``stat_tiles`` (the producer's TMA
    copies in the block's ring slot) instead of 4 LDG per block, whose L2 round trips ptxas waits for inside dP's
    wgmma issue (lse) and after P's store (delta) (bench/NOTES.md "helper lsedelta40")."""
    tl.static_assert(not PEEL or not (SPARSE or MXFP8), "PEEL: the dense walk's three stages (not MXFP8)")
    tl.static_assert(not (SPARSE and STATS_AHEAD), "STATS_AHEAD walks dense blocks only")
    tl.static_assert(ABLATE == 0 or (DQ_SHARED and not SPARSE),
                     "the backward ablations remove stages of the default consumers (dQ split, dense)")
    NO_DQ: tl.constexpr = (ABLATE & ABLATE_DQ) != 0
    NO_DQ_ADD: tl.constexpr = (ABLATE & ABLATE_DQ_ADD) != 0
    NO_EXP2: tl.constexpr = (ABLATE & ABLATE_EXP2) != 0
    NO_DS: tl.constexpr = (ABLATE & ABLATE_DS) != 0
    NO_DK: tl.constexpr = (ABLATE & ABLATE_DK) != 0
    NO_DV: tl.constexpr = (ABLATE & ABLATE_DV) != 0
    PROMOTE: tl.constexpr = (ABLATE & ABLATE_PROMOTE) != 0
    tl.static_assert(not (MXFP8 and SPARSE), "MXFP8: dense walks only")
    MX_QUANT: tl.constexpr = MXFP8 or (ABLATE & ABLATE_MX_QUANT) != 0
    SDP_DIM: tl.constexpr = HEAD_DIM // 2 if (ABLATE & ABLATE_HALF_SDP) != 0 else HEAD_DIM  # S and dP's k extent
    # wgmma groups left in flight at dP's wait (dV behind it) and at dQ's / dV's (dK behind them)
    DP_PENDING: tl.constexpr = 0 if NO_DV else 1
    DQ_PENDING: tl.constexpr = 0 if NO_DK else 1
    if SPARSE:
        n_all = sel_count
        m0_next = selected_tile_start(ids, sel_first, BLOCK_Q, BLOCK_M, n_all > 0)
    else:
        n_lead = _n_blocks(lead_begin, lead_end, BLOCK_M)
        n_unmasked = n_lead + _n_blocks(bulk_begin, bulk_end, BLOCK_M)
        n_all = n_unmasked + _n_blocks(tail_begin, tail_end, BLOCK_M)
    HALF_N: tl.constexpr = k_tiles[0].shape[0]  # this consumer's keys
    # PEEL: loops by stage, j counting on across them (the producer's blocks), masked a constexpr per loop.
    # Without HAS_RIGHT (neither causal nor a right window) the lead is always empty (``stage_bounds``:
    # n_lead = 0, its loop folds away): the bulk's loop, then the tail's. With one: two rounds of (masked loop, bulk
    # loop), the lead and the bulk, then the tail and nothing, so the masked body is compiled once (three loops, one
    # per stage, spilled 300 B a thread more at D128 causal: bench/NOTES.md "helper peel37"). Without PEEL: one loop.
    LEAD: tl.constexpr = 0
    BULK: tl.constexpr = 1
    TAIL: tl.constexpr = 2
    LEAD_OR_TAIL: tl.constexpr = 3
    ROUNDS: tl.constexpr = 2 if PEEL and HAS_RIGHT else 1
    LOOPS: tl.constexpr = (2 if HAS_RIGHT else 3) if PEEL else 1
    for rnd in tl.range(0, ROUNDS):
        for part in tl.static_range(LOOPS):
            kind = (LEAD_OR_TAIL if part == 0 else BULK) if HAS_RIGHT else part  # a constexpr
            if not PEEL:
                j_begin = 0
                j_end = n_all
            elif kind == LEAD_OR_TAIL:  # round 0: the lead, round 1: the tail
                j_begin = tl.where(rnd == 0, 0, n_unmasked)
                j_end = tl.where(rnd == 0, n_lead, n_all)
            elif kind == BULK:
                j_begin = n_lead
                j_end = tl.where(rnd == 0, n_unmasked, n_lead)
            else:
                j_begin = 0 if kind == LEAD else n_unmasked
                j_end = n_lead if kind == LEAD else n_all
            for j in tl.range(j_begin, j_end, num_stages=0):
                if SPARSE:  # the next tile's id is read a block ahead (at the top, its latency was on every
                    # block's path)
                    m0 = m0_next
                    m0_next = selected_tile_start(ids, sel_first + j + 1, BLOCK_Q, BLOCK_M, j + 1 < n_all)
                    masked = (m0 < bulk_begin) | (m0 + BLOCK_M > bulk_end)
                elif PEEL:  # the stage's own loop: masked is a constexpr, the bulk's has no mask code
                    masked = kind != BULK
                    if kind == LEAD:
                        m0 = lead_begin + j * BLOCK_M
                    elif kind == BULK:
                        m0 = bulk_begin + (j - n_lead) * BLOCK_M
                    elif kind == TAIL:
                        m0 = tail_begin + (j - n_unmasked) * BLOCK_M
                    else:  # the lead in round 0, the tail in round 1
                        m0 = tl.where(j < n_lead, lead_begin + j * BLOCK_M, tail_begin + (j - n_unmasked) * BLOCK_M)
                else:
                    masked = (j < n_lead) | (j >= n_unmasked)
                    if MXFP8:  # a key tile past its sequence's end takes every block masked: its keys there (K, V
                        # zeroed, not masked in the bulk) have dS = -P delta, which would enter their 32 x 32 blocks'
                        # maxima (the oracle pads zeros); the masked path zeroes P, so dS, there
                        masked = masked | (k0 + HALF_N > len_k)
                    m0 = stage_block_start(j, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK_M)
                buf, phase = _slot_phase(q_count, NUM_BUFFERS_Q)
                tlx.barrier_wait(q_fulls[buf], phase)
                # block-relative (absolute positions cost 64-bit hoisted bounds)
                rows = tl.arange(0, BLOCK_M)
                rows_left = len_q - m0
                rows_ok = rows < rows_left
                if masked:
                    _fix_rows_past_end(q_tiles, do_tiles, buf, m0, len_q, CID, HEAD_DIM, BLOCK_M)
                q_tile = q_tiles[buf]
                do_tile = do_tiles[buf]
                # This consumer's tiles, indexed through an opaque zero: else LLVM hoists their wgmma descriptors (one
                # 64-bit value per 16-wide k-step: ~32 of them) out of the loop and ptxas spills them
                own = CID + _opaque_zero(j)
                k_tile = k_tiles[own]
                v_tile = v_tiles[own]
                p_tile = p_tiles[own]
                if DQ_SHARED:
                    par = q_count & 1  # both consumers count the same blocks
                    ds_tile = ds_tiles[own * 2 + par]
                else:
                    ds_tile = ds_tiles[own]
                keys = tl.arange(0, k_tile.shape[0])
                if SDP_DIM < HEAD_DIM:  # ablation: S and dP at the FP8 wgmma's tensor time (timing only)
                    s = tlx.async_dot(_columns(q_tile, SDP_DIM), tlx.local_trans(_columns(k_tile, SDP_DIM)))
                    dp = tlx.async_dot(_columns(do_tile, SDP_DIM), tlx.local_trans(_columns(v_tile, SDP_DIM)))
                else:
                    s = tlx.async_dot(q_tile, tlx.local_trans(k_tile))  # [rows, keys]
                    dp = tlx.async_dot(do_tile, tlx.local_trans(v_tile))
                if STATS_SMEM:  # the producer's copies in this slot (rows past the sequence end: another row's
                    # values or TMA's zeros, where masked blocks zero P and dS anyway)
                    lse2 = _log2_lse(tl.reshape(tlx.local_load(stat_tiles[buf]), (BLOCK_M,)))
                    delta = tl.reshape(tlx.local_load(stat_tiles[NUM_BUFFERS_Q + buf]), (BLOCK_M,))
                else:
                    lse2, delta = _row_stats(Lse + (stat_index + m0), Delta + (stat_index + m0), rows, rows_ok, True)
                if STATS_AHEAD:  # the next block's lse and delta into L1 (no registers carried: a prefetch)
                    m0_next = stage_block_start(j + 1, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK_M)
                    next_ok = (rows < len_q - m0_next) & (j + 1 < n_all)
                    _prefetch_l1(Lse + (stat_index + m0_next) + rows, next_ok)
                    _prefetch_l1(Delta + (stat_index + m0_next) + rows, next_ok)
                s = tlx.async_dot_wait(1, s)  # dP may still run
                if NO_EXP2:  # ablation: the exponent itself (no MUFU)
                    p = s * qk_scale - lse2[:, None]
                elif MXFP8:  # P <= 1 (the MXFP8 oracle's clamp)
                    p = tl.math.exp2(tl.minimum(s * qk_scale - lse2[:, None], 0.0))
                else:
                    p = tl.math.exp2(s * qk_scale - lse2[:, None])
                if masked:  # the key interval of each row (forward's convention: key - row - diag in [-left, right])
                    ok = key_interval_mask(rows, keys, rows_left, len_k - k0, -window_left, right, HAS_LEFT, HAS_RIGHT)
                    p = tl.where(ok & rows_ok[:, None], p, 0.0)
                if MX_QUANT:  # dV's P in MXFP8 (dS keeps the unrounded P, as the MXFP8 reference)
                    tlx.local_store(p_tile, _mx_fixed_scale_values(p).to(DTYPE))
                else:
                    tlx.local_store(p_tile, p.to(DTYPE))
                tlx.fence_async_shared()
                tlx.named_barrier_wait(OWN_BARRIER + CID, 128)  # every thread's P is in shared memory
                if not NO_DV:
                    if PROMOTE:  # stand-in (timing/compile only): a fresh accumulator, folded below
                        dv_part = tlx.async_dot(tlx.local_trans(p_tile), do_tile)
                    else:
                        dv = tlx.async_dot(tlx.local_trans(p_tile), do_tile, dv)  # [keys, D] += P^T dO
                dp = tlx.async_dot_wait(DP_PENDING, dp)  # dV may still run
                if NO_DS:  # ablation: dS = dP (dS = P would share P's bf16 registers: repacking and spills, not a
                    # removal)
                    ds = dp
                else:
                    ds = p * (dp - delta[:, None])
                # rows past the end (dO zeroed) against a neighbour's NaN values: dP is NaN there, and 0 x NaN would
                # reach the next sequence's dQ rows through the reduce-add
                if masked:
                    ds = tl.where(p == 0.0, 0.0, ds)
                if MX_QUANT:
                    ds = _mx_square_values(ds)
                ds = ds.to(DTYPE)
                tlx.local_store(ds_tile, ds)
                tlx.fence_async_shared()
                if DQ_SHARED:
                    tlx.named_barrier_wait(DS_BARRIER, 256)  # both consumers' dS are in shared memory
                    half: tl.constexpr = HEAD_DIM // 2
                    if not NO_DQ:
                        zero = _opaque_zero(j)
                        dq = tlx.async_dot(ds_tiles[zero * 2 + par],
                                           tlx.local_slice(k_tiles[zero], [0, CID * half], [k_tile.shape[0], half]))
                        dq = tlx.async_dot(ds_tiles[zero * 2 + 2 + par],
                                           tlx.local_slice(k_tiles[zero + 1], [0, CID * half],
                                                           [k_tile.shape[0], half]), dq)
                    if not NO_DK:
                        if PROMOTE:
                            if not NO_DV:  # dV's part folded first: one fresh product live at a time (the count)
                                dv_part = tlx.async_dot_wait(0 if NO_DQ else 1, dv_part)
                                dv = dv + dv_part * qk_scale
                            dk_part = tlx.async_dot(tlx.local_trans(ds_tile), q_tile)
                        else:
                            dk = tlx.async_dot(tlx.local_trans(ds_tile), q_tile, dk)  # [keys, D] += dS^T Q
                    if not NO_DQ:
                        dq = tlx.async_dot_wait(DQ_PENDING, dq)
                    if not NO_DV:
                        # issued before dQ: already done (without dQ: done here)
                        if PROMOTE:
                            if NO_DK:  # else folded before dK's part was issued
                                dv_part = tlx.async_dot_wait(0, dv_part)
                                dv = dv + dv_part * qk_scale
                        else:
                            dv = tlx.async_dot_wait(DQ_PENDING, dv)
                    if not NO_DQ:
                        if NO_DQ_ADD:  # ablation: the dQ wgmma kept, no staging store or reduce-add
                            _keep_alive(dq, dq_stage[CID * NUM_BUFFERS_DQ], j, tl.float32)
                        else:
                            dq_count = _reduce_add_dq(dq, dq_stage, dq_count, desc_dq, (dq_row0 + m0).to(tl.int32),
                                                      col + CID * half, rows_left, CID, NUM_BUFFERS_DQ)
                else:
                    tlx.named_barrier_wait(OWN_BARRIER + CID, 128)  # every thread's dS is in shared memory
                # dQ_block = dS K (unscaled), DQ_SPLIT column slices, each reduce-added into the fp32 accumulator from a
                # staging buffer by TMA. The first slice is issued before dK += dS^T Q, so dK runs during its staging.
                for c in tl.static_range(0 if DQ_SHARED else DQ_SPLIT):
                    k_cols = tlx.local_slice(k_tile, [0, c * (HEAD_DIM // DQ_SPLIT)],
                                             [k_tile.shape[0], HEAD_DIM // DQ_SPLIT])
                    dq = tlx.async_dot(ds, k_cols)
                    if c == 0:
                        dk = tlx.async_dot(tlx.local_trans(ds_tile), q_tile, dk)  # [keys, D] += dS^T Q
                        dq = tlx.async_dot_wait(1, dq)
                        dv = tlx.async_dot_wait(1, dv)  # issued before dQ: already done
                    else:
                        dq = tlx.async_dot_wait(0, dq)
                    dq_count = _reduce_add_dq(dq, dq_stage, dq_count, desc_dq, (dq_row0 + m0).to(tl.int32),
                                              col + c * (HEAD_DIM // DQ_SPLIT), rows_left, CID, NUM_BUFFERS_DQ, True)
                if not NO_DK:
                    if PROMOTE:
                        dk_part = tlx.async_dot_wait(0, dk_part)
                        dk = dk + dk_part * qk_scale
                    else:
                        dk = tlx.async_dot_wait(0, dk)
                tlx.barrier_arrive(q_empties[buf], 1)  # Q and dO (and this consumer's P, dS) are no longer read
                q_count += 1
    return dk, dv, q_count, dq_count


@triton.jit
def _prefetch_l1(ptrs, mask):
    """``prefetch.global.L1`` of each address where mask (a hint: no value, no fault wait)."""
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L1 [$1]; mov.u32 $0, 0; }",
                              "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _zero_dq_rows_past_end(dq, rows_left):
    """dQ rows at or past ``rows_left`` (the next sequence's) as zeros, in a branch only a block that runs past its
    sequence's end takes (``_reduce_add_dq``)."""
    if rows_left < dq.shape[0]:
        dq = tl.where((tl.arange(0, dq.shape[0]) < rows_left)[:, None], dq, 0.0)
    return dq


@triton.jit
def _reduce_add_dq(dq, dq_stage, dq_count, desc_dq, row, col, rows_left, CID: tl.constexpr,
                   NUM_BUFFERS_DQ: tl.constexpr, ZERO_IN_SHARED: tl.constexpr = False):
    """A consumer's dQ slice staged in shared memory (buffer ``dq_count`` of its ring) and TMA reduce-added into the
    fp32 accumulator at (row, col); returns the next staging count. Rows at or past ``rows_left`` (the next sequence's)
    are zeroed first, in a branch only blocks that run past the end take: their dS is 0, but 0 x an infinite key of this
    sequence is NaN. Where: on the registers (ZERO_IN_SHARED False: the dQ split between the consumers, whose spills it
    leaves about as they were), or on the staged rows (ZERO_IN_SHARED: the per-consumer column slices without the split,
    where the register select ~doubled the spills; sm_90 ptxas, bench/NOTES.md v14)."""
    if not ZERO_IN_SHARED:
        dq = _zero_dq_rows_past_end(dq, rows_left)
    stage = dq_stage[CID * NUM_BUFFERS_DQ + dq_count % NUM_BUFFERS_DQ]
    tlx.async_descriptor_store_wait(NUM_BUFFERS_DQ - 1)  # the staging buffer's previous store has read it
    tlx.named_barrier_wait(OWN_BARRIER + CID, 128)
    tlx.local_store(stage, dq)
    tlx.fence_async_shared()
    tlx.named_barrier_wait(OWN_BARRIER + CID, 128)  # every thread's slice is in shared memory
    if ZERO_IN_SHARED:
        if rows_left < dq.shape[0]:
            _zero_rows_past_end(stage, 0, rows_left, dq.shape[0], dq.shape[1], 32)
            tlx.named_barrier_wait(OWN_BARRIER + CID, 128)
    tlx.async_descriptor_store(desc_dq, stage, [row, col], store_reduce="add")
    return dq_count + 1


@triton.jit
def _store_through_tile(tile, x, Ptr, row0, rows_left, stride, col, CID: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows i < rows_left of x ([rows of ``tile``, HEAD_DIM], a wgmma accumulator's layout) to Ptr at rows row0 + i,
    columns col..: through ``tile`` (this consumer's K or V tile, once its last product has completed). Stored from
    registers, the layout change would take a 16 KiB scratch buffer that v2's shared memory has not left."""
    tlx.named_barrier_wait(OWN_BARRIER + CID, 128)  # the whole warpgroup is past its last wgmma reading the tile
    tlx.local_store(tile, x)
    tlx.named_barrier_wait(OWN_BARRIER + CID, 128)
    y = tlx.local_load(tile)
    rows = tl.arange(0, tile.shape[0])
    d = tl.arange(0, HEAD_DIM)
    tl.store(Ptr + (row0 + rows)[:, None] * stride + col + d[None, :], y, mask=(rows < rows_left)[:, None])


@triton.jit
def _store_staged(tile, x, desc, row0, col):
    """STORE_TMA: x ([rows of ``tile``, D], wgmma accumulator layout, already in the output dtype) written to rows
    row0.. of ``desc`` (DK's or DV's [T_kv, Hkv*D] rows) by one TMA store through ``tile`` (this consumer's dQ staging
    buffer): no read back, no pointer stores. The caller has waited for the buffer's previous TMA read; the store's
    own read is waited for only where the buffer is next written. No named barriers of its own: the compiler's
    shared-memory barriers (one per warpgroup after the read's wait, one between the stores and the TMA store, as for
    the forward's ``_store_tile_staged``) order the warpgroup's threads; explicit ones only doubled them (sm_90)."""
    tlx.local_store(tile, x)
    tlx.fence_async_shared()  # the TMA store (async proxy) must see these generic-proxy writes
    tlx.async_descriptor_store(desc, tile, [row0.to(tl.int32), col])


@triton.jit
def _group_part(unit, group, GROUP_SPLIT: tl.constexpr):
    """(kv head, first q head, one past the last) of a work item's ``unit``: its kv head, walking the whole group;
    GROUP_SPLIT > 1: unit = kv head x GROUP_SPLIT + part, walking the part's group / GROUP_SPLIT q heads (heads
    relative to the kv head's first)."""
    if GROUP_SPLIT > 1:
        per_part = group // GROUP_SPLIT
        first = (unit % GROUP_SPLIT) * per_part
        return unit // GROUP_SPLIT, first, first + per_part
    else:
        return unit, 0, group


@triton.jit
def _add_partial(x, Ptr, row0, rows_left, stride, col, HEAD_DIM: tl.constexpr):
    """GROUP_SPLIT: rows i < rows_left of x ([keys, HEAD_DIM] fp32, a wgmma accumulator) added to Ptr's rows
    row0 + i, columns col.. by relaxed fp32 ``red.global.add``, straight from the accumulator's registers: an
    elementwise op, so the addresses are built in x's layout (``tl.atomic_add`` converted x to a coalesced layout
    through 64 KiB of shared memory: 278,600 B, over sm_90's 232,448)."""
    rows = tl.arange(0, x.shape[0])
    d = tl.arange(0, HEAD_DIM)
    ptrs = Ptr + (row0.to(tl.int64) + rows)[:, None] * stride + col + d[None, :]
    ok = (rows < rows_left)[:, None] & (d < HEAD_DIM)[None, :]
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p red.relaxed.gpu.global.add.f32 [$1], $2; "
                              "mov.u32 $0, 0; }", "=r,l,f,r", [ptrs.to(tl.int64), x, ok.to(tl.int32)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["num_heads_kv", "total_out", "group", "window_left", "right", "n_slots",
                               "search_steps", "num_seqs", "rows_s", "rows_o", "n_kv_blocks", "head_group"])
def attn_bwd_tlx_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, Lse, Delta, DK, DV, Q_OFF, KV_OFF, TILE_SEQ,
                        TILE_START, TILE_COUNT, WORK_COUNTER, num_heads_kv, total_out, n_slots, search_steps,
                        num_seqs, rows_s, rows_o, stride_dkvt, group, scale, qk_scale, window_left, right,
                        Q_BLOCK_INDEX, Q_BLOCK_COUNT, n_kv_blocks, stride_tib, stride_tih, stride_tin, stride_tcb,
                        stride_tch, head_group, TILE_HEAD,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_DQ: tl.constexpr, DQ_SPLIT: tl.constexpr,
                        HAS_LEFT: tl.constexpr,
                        HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr, ATOMIC_WORK: tl.constexpr,
                        TILES_FROM_OFFSETS: tl.constexpr, DQ_SHARED: tl.constexpr = False,
                        SPARSE: tl.constexpr = False, BLOCK_Q: tl.constexpr = 0, BLOCK_KV: tl.constexpr = 0,
                        STATS_AHEAD: tl.constexpr = False, HEAD_GROUPED: tl.constexpr = False,
                        UNIFORM_WALK: tl.constexpr = False, ITEM_LIST: tl.constexpr = False,
                        SNAKE: tl.constexpr = False, ABLATE: tl.constexpr = 0, GROUP_SPLIT: tl.constexpr = 1,
                        MXFP8: tl.constexpr = False, KV_EARLY: tl.constexpr = False,
                        PEEL: tl.constexpr = False,
                        STATS_SMEM: tl.constexpr = False, desc_lse=None, desc_delta=None,
                        STORE_TMA: tl.constexpr = False, desc_dk=None, desc_dv=None):
    """Work items (key tile, kv head); desc_q/desc_do: [T (broadcast Q: L_q), Hq*D] blocks [BLOCK_M, D]; desc_k/desc_v
    [T_kv, Hkv*D] blocks [BLOCK_N, D]; desc_dq: the zeroed fp32 [rows of q, Hq*D] accumulator, blocks [BLOCK_M, D].
    The consumers are ``_consume_rows_v2``'s (un-transposed S, P and dS through shared memory, wgmma overlapped);
    DQ_SHARED: their dQ split by columns between the consumers (``_consume_rows_v2``); STATS_AHEAD:
    ``_consume_rows_v2``'s lse/delta prefetch (``configs.BACKWARD_STATS_AHEAD``).

    SPARSE (block-sparse attention, ``block_sparse_backward``): each item walks only the query
    tiles of the Q blocks that selected its KV block (Q_BLOCK_INDEX [B, Hkv, n_kv_blocks, NQB]: the transposed
    selection, ascending ids of BLOCK_Q rows; Q_BLOCK_COUNT [B, Hkv, n_kv_blocks]; ``_selected_rows``), for every q
    head of the group; a key tile lies in one KV block of BLOCK_KV keys.

    HEAD_GROUPED: items in groups of head_group kv heads (``configs.BACKWARD_HEAD_GROUP``; else tile-major);
    UNIFORM_WALK (with SPARSE): the walk's bounds in uniform
    registers (``_selected_rows``, ``configs.SPARSE_BACKWARD_UNIFORM_WALK``); ITEM_LIST: the work list is per item
    (TILE_SEQ, TILE_START, TILE_HEAD: ``block_sparse_bwd.item_list``); SNAKE: every other round of items in reverse
    (``common.snake_work``; ``configs.BACKWARD_ITEM_ORDER``). ABLATE (``configs.BACKWARD_ABLATE``): 0, or TIMING ONLY
    with WRONG RESULTS (``_consume_rows_v2``'s stages removed; "loads": ``_produce_row_block``'s NO_LOADS).

    GROUP_SPLIT > 1 (``configs.BACKWARD_GQA_SPLIT``): each kv head's q-head group in that many parts, one work item
    per (key tile, kv head, part) (``_group_part``); DK / DV are then zeroed fp32 accumulators [T_kv, Hkv, D] that
    each item's partial dK (scaled) / dV is atomically added to (``_add_partial``; the host casts them).

    MXFP8 (dense; ``mxfp8_attn_bwd.py``): P and dS rounded to their MXFP8 values (``_consume_rows_v2``).

    KV_EARLY (``configs.BACKWARD_KV_EARLY``; with DQ_SHARED, one part per group): each consumer
    frees its K/V tiles before its dK/dV epilogue and stores dK/dV through its dQ staging buffer, so the producer's
    next K/V loads run under the epilogue.

    PEEL (``configs.BACKWARD_PEEL``; dense, not MXFP8): the consumers' block loop peeled by stage
    (``_consume_rows_v2``), the mask-free bulk's without mask code; the producer's loops and barriers as without.

    STATS_SMEM (``configs.BACKWARD_STATS_SMEM``; dense, not MXFP8, not with STATS_AHEAD): the producer loads each
    block's lse and delta (desc_lse / desc_delta: ``_stats_descriptor``'s shifted copies) into its ring slot with Q
    and dO, on the same full barrier; the consumers read them from shared memory (``_consume_rows_v2``).

    STORE_TMA (``configs.BACKWARD_STORE_TMA``; with KV_EARLY): a consumer's dK / dV half-tile that lies wholly inside
    the sequence leaves its dQ staging buffer by one TMA store each (desc_dk / desc_dv: DK's / DV's [T_kv, Hkv*D] rows,
    blocks [HALF_N, D]; ``_store_staged``) instead of being read back for masked pointer stores; dV's store waits for
    dK's read of the buffer, and dV's read is waited for where the buffer is next written (the next dQ reduce-add's
    staging, or the next epilogue). A partial half-tile keeps the pointer stores. The same bits."""
    tl.static_assert(not STATS_SMEM or not (SPARSE or MXFP8 or STATS_AHEAD),
                     "STATS_SMEM: the dense walks, not MXFP8, instead of STATS_AHEAD's prefetch")
    tl.static_assert(not PEEL or not (SPARSE or MXFP8), "PEEL: the dense walks, not MXFP8")
    tl.static_assert(not MXFP8 or not SPARSE, "MXFP8: the dense walks")
    tl.static_assert(not ATOMIC_WORK, "the TLX backward uses static persistent striding")
    tl.static_assert(GROUP_SPLIT == 1 or (DQ_SHARED and not SPARSE and not ITEM_LIST and not HEAD_GROUPED),
                     "GROUP_SPLIT: the dense backward with the dQ split, items mapped arithmetically")
    tl.static_assert(not UNIFORM_WALK or SPARSE, "UNIFORM_WALK: block-sparse only")
    tl.static_assert(not ITEM_LIST or not TILES_FROM_OFFSETS, "an item list is a list")
    tl.static_assert(not KV_EARLY or (DQ_SHARED and GROUP_SPLIT == 1),
                     "KV_EARLY: the consumers with the dQ split, one part per group")
    # STORE_TMA's last store reads the staging buffer past the epilogue: the dQ staging's wait (NUM_BUFFERS_DQ - 1
    # pending groups) covers it only with one buffer per consumer
    tl.static_assert(not STORE_TMA or (KV_EARLY and NUM_BUFFERS_DQ == 1 and not MXFP8),
                     "STORE_TMA: KV_EARLY's epilogue, one dQ staging buffer per consumer, not MXFP8")
    tl.static_assert(not SPARSE or (BLOCK_Q % BLOCK_M == 0 and BLOCK_KV % BLOCK_N == 0),
                     "the block-sparse walk takes whole tiles per selected block")
    HALF_N: tl.constexpr = BLOCK_N // NUM_CONSUMERS
    NO_LOADS: tl.constexpr = (ABLATE & ABLATE_LOADS) != 0
    NO_DKV_STORE: tl.constexpr = (ABLATE & ABLATE_DKV_STORE) != 0
    tl.static_assert(not NO_DKV_STORE or GROUP_SPLIT == 1, "the dkvstore ablation: one part per group")
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    n_tiles = _tile_count(TILE_COUNT, n_slots, TILES_FROM_OFFSETS)
    units = num_heads_kv  # per key tile: kv heads (GROUP_SPLIT: x parts of their group)
    if GROUP_SPLIT > 1:
        units = num_heads_kv * GROUP_SPLIT
    n_work = n_tiles * units
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    my_items = snake_items(n_work, pid, programs, SNAKE)

    k_tiles = tlx.local_alloc((HALF_N, HEAD_DIM), dtype, NUM_CONSUMERS)  # one half-tile per consumer
    v_tiles = tlx.local_alloc((HALF_N, HEAD_DIM), dtype, NUM_CONSUMERS)
    q_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_BUFFERS_Q)
    do_tiles = tlx.local_alloc((BLOCK_M, HEAD_DIM), dtype, NUM_BUFFERS_Q)
    p_tiles = tlx.local_alloc((BLOCK_M, HALF_N), dtype, NUM_CONSUMERS)
    ds_tiles = tlx.local_alloc((BLOCK_M, HALF_N), dtype, NUM_CONSUMERS * (2 if DQ_SHARED else 1))
    dq_stage = tlx.local_alloc((BLOCK_M, HEAD_DIM // DQ_SPLIT), tl.float32, NUM_CONSUMERS * NUM_BUFFERS_DQ)
    kv_fulls = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS, arrive_count=1)
    kv_empties = tlx.alloc_barriers(num_barriers=NUM_CONSUMERS, arrive_count=1)
    q_fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_Q, arrive_count=1)
    q_empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS_Q, arrive_count=NUM_CONSUMERS)
    if STATS_SMEM:  # per ring slot the block's lse (slot i) and delta (NUM_BUFFERS_Q + i), loaded with its Q and dO
        stat_tiles = tlx.local_alloc((1, BLOCK_M), tl.float32, 2 * NUM_BUFFERS_Q)
    else:
        stat_tiles = None

    with tlx.async_tasks():
        with tlx.async_task("default"):  # producer
            q_count = 0
            kv_count = 0
            for i in range(0, my_items):
                item = _bwd_item(snake_work(pid, i, programs, SNAKE), Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles,
                                 units, num_seqs, search_steps, rows_s, rows_o, window_left, right, head_group,
                                 TILE_HEAD, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, HEAD_GROUPED,
                                 ITEM_LIST)
                (real, unit, n0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                 tail_begin, tail_end, _) = item
                kv_head, g_begin, g_end = _group_part(unit, group, GROUP_SPLIT)
                if real:
                    kv_phase = kv_count & 1
                    for c in tl.static_range(NUM_CONSUMERS):
                        tlx.barrier_wait(kv_empties[c], kv_phase ^ 1)
                        tlx.barrier_expect_bytes(kv_fulls[c], 2 * HALF_N * HEAD_DIM * tlx.size_of(dtype))
                        row = (kv_row0 + n0 + c * HALF_N).to(tl.int32)
                        tlx.async_descriptor_load(desc_k, k_tiles[c], [row, kv_head * HEAD_DIM], kv_fulls[c])
                        tlx.async_descriptor_load(desc_v, v_tiles[c], [row, kv_head * HEAD_DIM], kv_fulls[c])
                    kv_count += 1
                    q_row0 = _q_rows(out_row0, BROADCAST_Q)
                    if SPARSE:  # read while the K/V loads are in flight
                        sel_first, sel_count = _selected_rows(item, Q_BLOCK_INDEX, Q_BLOCK_COUNT, n_kv_blocks,
                                                              stride_tib, stride_tih, stride_tin, stride_tcb,
                                                              stride_tch, BLOCK_M, BLOCK_Q, BLOCK_KV, UNIFORM_WALK)
                    for g in range(g_begin, g_end):
                        col = (kv_head * group + g) * HEAD_DIM
                        if STATS_SMEM:  # the head's first row in the flat lse / delta (the host keeps it in int32)
                            stat_row0 = (kv_head * group + g) * total_out + out_row0
                        else:
                            stat_row0 = 0
                        if SPARSE:
                            q_count = _produce_selected_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties,
                                                             q_count, q_row0, out_row0, col, Q_BLOCK_INDEX,
                                                             sel_first, sel_count, BLOCK_M, BLOCK_Q, HEAD_DIM,
                                                             NUM_BUFFERS_Q)
                        else:
                            q_count = _produce_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count,
                                                    q_row0, out_row0, col, lead_begin, lead_end, BLOCK_M, HEAD_DIM,
                                                    NUM_BUFFERS_Q, NO_LOADS, desc_lse, desc_delta, stat_tiles,
                                                    stat_row0, STATS_SMEM)
                            q_count = _produce_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count,
                                                    q_row0, out_row0, col, bulk_begin, bulk_end, BLOCK_M, HEAD_DIM,
                                                    NUM_BUFFERS_Q, NO_LOADS, desc_lse, desc_delta, stat_tiles,
                                                    stat_row0, STATS_SMEM)
                            q_count = _produce_rows(desc_q, desc_do, q_tiles, do_tiles, q_fulls, q_empties, q_count,
                                                    q_row0, out_row0, col, tail_begin, tail_end, BLOCK_M, HEAD_DIM,
                                                    NUM_BUFFERS_Q, NO_LOADS, desc_lse, desc_delta, stat_tiles,
                                                    stat_row0, STATS_SMEM)

        with tlx.async_task(num_warps=4, registers=240, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            q_count = 0
            kv_count = 0
            dq_count = 0
            for i in range(0, my_items):
                item = _bwd_item(snake_work(pid, i, programs, SNAKE), Q_OFF, KV_OFF, TILE_SEQ, TILE_START, n_tiles,
                                 units, num_seqs, search_steps, rows_s, rows_o, window_left, right, head_group,
                                 TILE_HEAD, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, TILES_FROM_OFFSETS, HEAD_GROUPED,
                                 ITEM_LIST)
                (real, unit, n0, out_row0, len_q, kv_row0, len_k, lead_begin, lead_end, bulk_begin, bulk_end,
                 tail_begin, tail_end, _) = item
                kv_head, g_begin, g_end = _group_part(unit, group, GROUP_SPLIT)
                if real:
                    if SPARSE:  # read before the wait for K/V
                        sel_first, sel_count = _selected_rows(item, Q_BLOCK_INDEX, Q_BLOCK_COUNT, n_kv_blocks,
                                                              stride_tib, stride_tih, stride_tin, stride_tcb,
                                                              stride_tch, BLOCK_M, BLOCK_Q, BLOCK_KV, UNIFORM_WALK)
                    else:
                        sel_first = 0
                        sel_count = 0
                    k0 = n0 + cid * HALF_N  # this consumer's first key
                    tlx.barrier_wait(kv_fulls[cid], kv_count & 1)
                    if k0 + HALF_N > len_k:  # keys past the sequence end: zero rows (a zero key adds 0 to dQ)
                        _zero_rows_past_end(k_tiles[cid], k0, len_k, HALF_N, HEAD_DIM, 32)
                        _zero_rows_past_end(v_tiles[cid], k0, len_k, HALF_N, HEAD_DIM, 32)
                        tlx.named_barrier_wait(OWN_BARRIER + cid, 128)
                    k_tile = k_tiles[cid]
                    v_tile = v_tiles[cid]
                    dk = tl.zeros([HALF_N, HEAD_DIM], tl.float32)
                    dv = tl.zeros([HALF_N, HEAD_DIM], tl.float32)
                    dq_row0 = _q_rows(out_row0, BROADCAST_Q)
                    for g in range(g_begin, g_end):
                        head = kv_head * group + g
                        col = head * HEAD_DIM
                        stat_index = head.to(tl.int64) * total_out + out_row0
                        dk, dv, q_count, dq_count = _consume_rows_v2(
                            dk, dv, q_count, dq_count, k_tiles, v_tiles, q_tiles, do_tiles, q_fulls, q_empties,
                            p_tiles, ds_tiles, dq_stage, desc_dq, Lse, Delta, stat_index, dq_row0, col, k0, len_q,
                            len_k, qk_scale, right, window_left, lead_begin, lead_end, bulk_begin, bulk_end,
                            tail_begin, tail_end, cid, HEAD_DIM, BLOCK_M, NUM_BUFFERS_Q, NUM_BUFFERS_DQ, DQ_SPLIT,
                            HAS_LEFT, HAS_RIGHT, dtype, DQ_SHARED, Q_BLOCK_INDEX, sel_first, sel_count, SPARSE,
                            BLOCK_Q, STATS_AHEAD, ABLATE, MXFP8, PEEL, stat_tiles, STATS_SMEM)
                    if GROUP_SPLIT > 1:  # this part's dK / dV added to the fp32 accumulators from registers
                        _add_partial(dk * scale, DK, kv_row0 + k0, len_k - k0, stride_dkvt, kv_head * HEAD_DIM,
                                     HEAD_DIM)
                        _add_partial(dv, DV, kv_row0 + k0, len_k - k0, stride_dkvt, kv_head * HEAD_DIM, HEAD_DIM)
                        tlx.named_barrier_wait(DS_BARRIER, 256)  # the other consumer is done with this K tile
                    elif KV_EARLY:  # free K/V first, then dK/dV through this consumer's dQ staging buffer
                        tlx.named_barrier_wait(DS_BARRIER, 256)  # both consumers' last products with K/V are done
                        tlx.fence_async_shared()  # the tiles' generic-proxy writes (row zeroing) before the next TMA
                        tlx.barrier_arrive(kv_empties[cid], 1)  # the producer's next K/V loads run under the stores
                        # [64, D/2] fp32 holds the bytes of [64, D] bf16; K's layout, as the default's stores use
                        out_tile = tlx.local_reinterpret(dq_stage[cid * NUM_BUFFERS_DQ], k_tile.dtype,
                                                         [HALF_N, HEAD_DIM], layout=k_tile.type.layout)
                        tlx.async_descriptor_store_wait(0)  # the last dQ reduce-add has read the staging buffer
                        if NO_DKV_STORE:  # ablation (TIMING ONLY): no stores; dK, dV kept alive
                            _keep_alive(dk, out_tile, kv_count, dtype)
                            _keep_alive(dv, out_tile, kv_count, dtype)
                        elif STORE_TMA and len_k - k0 >= HALF_N:  # a whole half-tile: one TMA store each
                            _store_staged(out_tile, (dk * scale).to(dtype), desc_dk, kv_row0 + k0,
                                          kv_head * HEAD_DIM)
                            tlx.async_descriptor_store_wait(0)  # dK's store has read the buffer
                            _store_staged(out_tile, dv.to(dtype), desc_dv, kv_row0 + k0, kv_head * HEAD_DIM)
                        else:
                            _store_through_tile(out_tile, (dk * scale).to(dtype), DK, kv_row0 + k0, len_k - k0,
                                                stride_dkvt, kv_head * HEAD_DIM, cid, HEAD_DIM)
                            _store_through_tile(out_tile, dv.to(dtype), DV, kv_row0 + k0, len_k - k0, stride_dkvt,
                                                kv_head * HEAD_DIM, cid, HEAD_DIM)
                    else:  # through this consumer's K and V tiles, then free them
                        if DQ_SHARED:
                            tlx.named_barrier_wait(DS_BARRIER, 256)  # the other consumer is done with this K tile
                        if NO_DKV_STORE:  # ablation (TIMING ONLY): no stores; dK, dV kept alive
                            _keep_alive(dk, k_tile, kv_count, dtype)
                            _keep_alive(dv, v_tile, kv_count, dtype)
                        else:
                            _store_through_tile(k_tile, (dk * scale).to(dtype), DK, kv_row0 + k0, len_k - k0,
                                                stride_dkvt, kv_head * HEAD_DIM, cid, HEAD_DIM)
                            _store_through_tile(v_tile, dv.to(dtype), DV, kv_row0 + k0, len_k - k0, stride_dkvt,
                                                kv_head * HEAD_DIM, cid, HEAD_DIM)
                        tlx.named_barrier_wait(OWN_BARRIER + cid, 128)  # every warp has read both tiles back
                        tlx.fence_async_shared()  # these generic-proxy accesses before the producer's next TMA loads
                    if not KV_EARLY:
                        tlx.barrier_arrive(kv_empties[cid], 1)  # every product with K, V of this item has completed
                    kv_count += 1
            tlx.async_descriptor_store_wait(0, read_only=False)  # every dQ reduce-add has landed


# ---------------------------------------------------------------------------------------------------------- host side
def _dq_descriptor(dq_acc: torch.Tensor, block_rows: int, block_cols: int):
    """The fp32 dQ accumulator [rows, Hq, D] viewed as [rows, Hq*D], blocks [block_rows, block_cols] (a column slice of
    one head: block_cols divides D)."""
    rows, heads, dim = dq_acc.shape
    return TensorDescriptor(dq_acc, shape=[rows, heads * dim], strides=[heads * dim, 1],
                            block_shape=[block_rows, block_cols])


def _stats_descriptor(stats: torch.Tensor, block_rows: int):
    """STATS_SMEM: the contiguous fp32 [Hq, rows] lse or delta, flat (n values), as 4 shifted copies [4, width]
    (copy s at column c holds value c + s, zeros past the end; width: n rounded up to 4, rows 16-byte strided),
    blocks [1, block_rows]: the kernel reads a block from any flat row r as copy r % 4 at column r - r % 4. A TMA
    box's inner start must be 16-byte aligned (4 fp32; at a jagged sequence's or a head's row off that, the load
    faults with an illegal instruction: stop 42's GPU run), and a descriptor's base too, so shifting the base will
    not do. Two copy kernels; 4x the vector's bytes."""
    flat = stats.reshape(-1)
    n = flat.numel()
    width = cdiv(n, 4) * 4
    padded = torch.nn.functional.pad(flat, (0, width + 3 - n))  # zeros past the end, for every copy
    shifted = padded.as_strided((4, width), (1, 1)).contiguous()
    return TensorDescriptor(shifted, shape=[4, width], strides=[width, 1], block_shape=[1, block_rows])


# The kernel's block-sparse arguments when it runs dense attention (SPARSE False).
NO_SELECTION = dict(Q_BLOCK_INDEX=None, Q_BLOCK_COUNT=None, n_kv_blocks=0, stride_tib=0, stride_tih=0, stride_tin=0,
                    stride_tcb=0, stride_tch=0, SPARSE=False, BLOCK_Q=0, BLOCK_KV=0)


def _gqa_split(q, k, kv_offsets, params, causal_order: bool, gqa_split: int):
    """(parts, the snake alone) of a GQA call under ``configs.BACKWARD_GQA_SPLIT`` (``gqa_split``: rounds R, the old
    rule ``configs.gqa_split_parts``; ``configs.GQA_SPLIT_AUTO``: ``gqa_split.plan``'s model, from shapes only; a
    split always runs under the snake); (1, False) where CAUSAL_ORDER's list runs (GROUP_SPLIT does not ride on an
    item list; a one-wave call builds none)."""
    num_seqs, heads_kv, block_n = kv_offsets.numel() - 1, k.shape[1], bwd_config_v2(q.shape[2], True).block_n
    slots = capacity_of(k.shape[0], block_n, num_seqs)
    if causal_order and not tiles_from_offsets(slots * heads_kv, num_seqs, 1, q.device):
        return 1, False
    group, programs = q.shape[1] // heads_kv, num_sms(q.device)
    if gqa_split != configs.GQA_SPLIT_AUTO:
        return configs.gqa_split_parts(group, slots * heads_kv, programs, gqa_split), False
    chosen = gqa_split_plan(group, heads_kv, num_seqs, q.shape[0], k.shape[0], params.max_seqlen_kv, q.shape[2],
                            window_bounds(params.causal, params.window_left, params.window_right),
                            params.broadcast_q, programs)
    return chosen.parts, chosen.snake and chosen.parts == 1


def _row_bytes(q, k) -> int:
    """The query-side bytes a row of one kv head's stream holds in the L2: Q and dO of its q heads, and their fp32
    dQ accumulator (the L2 sections' unit: ``causal_item_list``, ``sectioned_item_list``)."""
    return (q.shape[1] // k.shape[1]) * q.shape[2] * (2 * q.element_size() + 4)


def _causal_items(schedule, q, k, kv_offsets, params, q_off, total_out, cfg, device_list):
    """The causal order's (seq, start, kv head) item list of a call whose key tile list ``schedule`` holds (sorted,
    not one wave): made once per shape for a one-length causal batch, else per call on the device (eager calls with
    the same tile list and offsets reuse it) or by torch ops."""
    num_heads_kv, device = k.shape[1], q.device
    row_bytes = _row_bytes(q, k)
    if one_length_causal(q, k, kv_offsets, params):
        return uniform_causal_item_list(kv_offsets.numel() - 1, params.max_seqlen_q, num_heads_kv, row_bytes,
                                        configs.CAUSAL_ORDER_L2_BYTES, cfg.block_n, device)
    if device_list and schedule["n_slots"] ** 2 * num_heads_kv <= configs.CAUSAL_ORDER_DEVICE_MAX_PAIRS:
        return causal_item_list_device(schedule, num_heads_kv, q_off, total_out, row_bytes,
                                       configs.CAUSAL_ORDER_L2_BYTES)
    return causal_item_list(schedule, num_heads_kv, q_off, row_bytes, configs.CAUSAL_ORDER_L2_BYTES)


def one_length_causal(q, k, kv_offsets, params) -> bool:
    """A causal batch (no window, no broadcast Q) whose sequences all have one length, known from the max_seqlen
    hints without reading the offsets (``attn_fwd.uniform_lengths``): the causal order's list is then made once per
    shape (``block_sparse_bwd.uniform_causal_item_list``)."""
    return (window_bounds(params.causal, params.window_left, params.window_right) == (False, 0, True, 0)
            and not params.broadcast_q and params.max_seqlen_q == params.max_seqlen_kv
            and uniform_lengths(params, kv_offsets.numel() - 1, q.shape[0], k.shape[0]))


class BackwardVariant(NamedTuple):
    """The kernel variant ``attention_backward`` settles on for a call (part of the plan and recipe keys; equal to
    the plain tuple of its fields)."""
    dq_shared: bool
    stats_ahead: bool
    head_group: int
    uniform_walk: bool
    item_order: bool
    group_order: bool
    causal_order: bool
    ablate: int
    parts: int
    kv_early: bool
    peel: bool
    stats_smem: bool = False
    store_tma: bool = False


def attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, dq_shared: bool = False,
                       selection=None, stats_ahead: bool = False, head_group: int = 0, uniform_walk: bool = False,
                       item_order: bool = False, group_order: bool = False, causal_order: Optional[bool] = False,
                       ablate: int = 0, gqa_split: int = 0, mxfp8: bool = False,
                       delta_grad_out=None, causal_jagged: bool = False, kv_early: bool = False,
                       peel: bool = False,
                       stats_smem: bool = False, store_tma: bool = False):
    """(dq, dk, dv): the triton backend's contract (``jfa_ops.backends.base``); ``dq_shared``: the consumers' dQ split
    between them (``configs.BACKWARD_DQ_SHARED``). ``selection``: (kv_block_index, kv_block_count) of block-sparse
    attention (``block_sparse_backward``). ``stats_ahead`` (``configs.stats_ahead``): dense only. The schedule's:
    ``head_group`` (``configs.head_group``: items in groups of that many kv heads, 0 tile-major), ``uniform_walk``
    (``configs.SPARSE_BACKWARD_UNIFORM_WALK``; block-sparse only; there, head_group and item_order only with
    uniform_walk), ``item_order`` (``configs.BACKWARD_ITEM_ORDER``: snake striding, and block-sparse items sorted by
    their own blocks, ``block_sparse_bwd.item_list``; head_group ignored unless ``group_order``), ``group_order``
    (``configs.BACKWARD_GROUP_ORDER``; block-sparse with head_group: the item order over a list in head_group's groups,
    ``block_sparse_bwd.zigzag_groups``). A dense call whose signature an earlier call made a recipe for (``_Recipe``)
    launches through it. ``causal_order`` (``configs.BACKWARD_CAUSAL_ORDER``; dense calls with a mask, where the key
    tile list is sorted, not one wave): the items in L2-sized sections of (sequence, kv head) streams
    (``block_sparse_bwd.causal_item_list``; a causal batch of one length: the same list made once per shape), with the
    snake; head_group and item_order yield to it there; head dims below ``configs.CAUSAL_ORDER_MIN_HEAD_DIM`` keep the
    default; None: one-length causal batches only (``one_length_causal``), and with ``causal_jagged``
    (``configs.BACKWARD_CAUSAL_ORDER_JAGGED``) every masked call where no GQA split runs (the split's balance at few kv
    heads; untimed against the list); ``causal_jagged`` also builds a per-call list on the device
    (``block_sparse_bwd.causal_item_list_device``, the same list). ``ablate`` (``configs.BACKWARD_ABLATE``): 0, or
    stages removed from the kernel, TIMING ONLY: the gradients are WRONG (a warning says so); dense calls with the dQ
    split. ``gqa_split`` (``configs.BACKWARD_GQA_SPLIT``: rounds, 0 off, ``configs.GQA_SPLIT_AUTO`` the model's plan): a
    GQA call's q-head groups in parts per kv head (``_gqa_split``; the kernel's GROUP_SPLIT, partial dK/dV added in
    fp32), taken by the snake (auto: or the snake alone); dense calls with the dQ split, without an item list
    (CAUSAL_ORDER's yields where a split runs: none is built in one wave) or head groups. ``mxfp8``
    (``mxfp8_attn_bwd.py``; dense): the kernel's MXFP8 constexpr (P and dS rounded to their MXFP8 values), fed MX-valued
    q, k, v, grad_out; ``delta_grad_out``: the dO the delta pre-pass reads instead of grad_out (the MXFP8 backward's
    unquantized dO); no recipe for either. ``kv_early`` (``configs.BACKWARD_KV_EARLY``, block-sparse
    ``configs.SPARSE_BACKWARD_KV_EARLY``; calls with the dQ split, one part per group, not MXFP8; else ignored): K/V
    freed before the dK/dV epilogue, which stores through the dQ staging buffer (the kernel's KV_EARLY). ``peel``
    (``configs.BACKWARD_PEEL``; dense calls, not MXFP8; else ignored): the consumers' block loop peeled per stage, the
    bulk's without mask code (the kernel's PEEL).
    ``stats_smem``
    (``configs.BACKWARD_STATS_SMEM``; dense calls, not MXFP8, else ignored; instead of ``stats_ahead``): the producer
    loads each block's lse and delta into shared memory with its Q and dO (the kernel's STATS_SMEM); no recipe.
    ``store_tma`` (``configs.BACKWARD_STORE_TMA``; where ``kv_early`` runs, else ignored): whole dK/dV half-tiles leave
    the staging buffer by TMA stores (the kernel's STORE_TMA); no recipe."""
    if selection is not None:  # the experiments walk dense blocks only
        stats_ahead = False
        if not uniform_walk:  # the schedule's ride on the uniform walk (alone, ptxas spilled 12-28 B more per item)
            head_group, item_order, group_order = 0, False, False
        causal_order = False  # dense walks only
    else:
        uniform_walk = group_order = False  # block-sparse walks only
    split_first = False  # a GQA split, where one runs, instead of the list (the knob's jagged calls)
    if causal_order is None:  # block-sparse: False above
        causal_order = one_length_causal(q, k, kv_offsets, params)
        split_first = causal_jagged and not causal_order
        causal_order = causal_order or causal_jagged
    causal_order = (causal_order and (params.causal or params.window_left >= 0 or params.window_right >= 0)
                    and q.shape[2] >= configs.CAUSAL_ORDER_MIN_HEAD_DIM)
    parts = 1  # GROUP_SPLIT
    if gqa_split and selection is None and dq_shared and head_group == 0 and q.shape[1] > k.shape[1]:
        parts, snake_alone = _gqa_split(q, k, kv_offsets, params, causal_order and not split_first, gqa_split)
        item_order = item_order or snake_alone
        causal_order = causal_order and parts == 1  # moot where a split runs (no list was to be built)
    group_order = group_order and head_group > 0
    item_order = item_order or group_order  # the same kernel: a snake over an item list, here in head groups
    if item_order and not group_order:  # a snake over a list sorted longest first; head groups would break that order
        head_group = 0
    kv_early = bool(kv_early and dq_shared and parts == 1 and not mxfp8)  # block-sparse: its own knob's value
    peel = bool(peel and selection is None and not mxfp8)
    # STATS_SMEM's TMA coordinates are int32 rows of the flat [Hq * rows] lse / delta
    stats_smem = bool(stats_smem and selection is None and not mxfp8 and q.shape[1] * (
        (kv_offsets.numel() - 1) * q.shape[0] if params.broadcast_q else q.shape[0]) < 2 ** 31 - 2 ** 16)
    stats_ahead = stats_ahead and not stats_smem  # the lse / delta prefetch has nothing left to prefetch
    store_tma = bool(store_tma and kv_early)  # KV_EARLY's epilogue (its staging buffer)
    if ablate:
        if not (dq_shared and selection is None):
            raise ValueError("the backward ablations (configs.BACKWARD_ABLATE) apply to the default dense kernel only "
                             "(the consumers with the dQ split)")
        warnings.warn(f"tlx backward with ablations {configs.backward_ablation_names(ablate)} (JFA_TLX_BWD_ABLATE / "
                      "configs.BACKWARD_ABLATE): TIMING ONLY, the gradients are WRONG")
    variant = BackwardVariant(dq_shared, stats_ahead, head_group, uniform_walk, item_order, group_order, causal_order,
                              ablate, parts, kv_early, peel, stats_smem, store_tma)
    # no recipe for the MXFP8 backward (delta from another dO), nor with STATS_SMEM or STORE_TMA (their two
    # descriptors are not among the recipe's)
    kept = selection is None and not mxfp8 and delta_grad_out is None and not stats_smem and not store_tma
    key = _recipe_key(grad_out, grad_lse, q, k, v, out, params, variant) if kept else None
    recipe = None if key is None else _RECIPES.get(key)
    if recipe is not None:
        grads = recipe.run(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets)
        if grads is not None:
            return grads
    if mxfp8 and selection is not None:
        raise ValueError("the MXFP8 backward (mxfp8) runs on dense attention only")
    return _full_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, variant, selection,
                          key, mxfp8, delta_grad_out, causal_jagged)


_DELTA_STREAMS: dict = {}  # device -> the side stream of configs.SPARSE_BACKWARD_DELTA_STREAM (made once)


def _delta_side_stream(device):
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if index not in _DELTA_STREAMS:
        _DELTA_STREAMS[index] = torch.cuda.Stream(device=index)
    return _DELTA_STREAMS[index]


@contextlib.contextmanager
def _forked(side):
    """With a side stream: the body's launches go to it, after all the current stream's work so far (its inputs,
    including the caller's); the caller joins it (``wait_stream``) before what reads them. Tensors the body reads or
    writes stay alive past the join (the backward holds them), so none needs ``record_stream``. Works under CUDA
    graph capture (a fork and a join of the captured stream). None: the current stream, as without."""
    if side is None:
        yield
        return
    side.wait_stream(torch.cuda.current_stream(side.device))
    with torch.cuda.stream(side):
        yield


def _full_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, variant, selection, key,
                   mxfp8=False, delta_grad_out=None, device_list=False):
    """The backward, every decision made from the call's arguments; with ``key`` (``_recipe_key``), it keeps a
    recipe for the next calls of that signature where ``_Recipe`` covers the call. ``device_list``: the causal
    order's per-call list built on the device (the same list; no recipe holds a list, so the key need not say),
    where its items x tiles count stays within ``configs.CAUSAL_ORDER_DEVICE_MAX_PAIRS`` (else the torch list)."""
    (dq_shared, stats_ahead, head_group, uniform_walk, item_order, group_order, causal_order, ablate, parts, kv_early,
     peel, stats_smem, store_tma) = variant
    device, num_seqs = q.device, kv_offsets.numel() - 1
    num_heads, head_dim, num_heads_kv = q.shape[1], q.shape[2], k.shape[1]
    if params.broadcast_q:
        q_off = broadcast_offsets(num_seqs, q.shape[0], device)
        total_out = num_seqs * q.shape[0]
    else:
        q_off = common.int32_offsets(q_offsets)
        total_out = q.shape[0]
    kv_off = common.int32_offsets(kv_offsets, same_as=(q_offsets, q_off))
    if num_seqs == 0 or total_out == 0 or k.shape[0] == 0:  # no kernel (a descriptor needs positive extents)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    given = (q, k, v, out, grad_out)
    q, k, v, out, grad_out = (_tma_ready(t) for t in given)
    lse = lse if lse.is_contiguous() else lse.contiguous()
    cfg = bwd_config_v2(head_dim, dq_shared)
    bounds = window_bounds(params.causal, params.window_left, params.window_right)
    has_left, window_left, has_right, right = bounds
    if parts > 1:  # GROUP_SPLIT: the parts' dK (scaled) and dV added in fp32, cast after the kernel
        dkv_acc = torch.zeros((2,) + tuple(k.shape), dtype=torch.float32, device=device)
        dk, dv = dkv_acc[0], dkv_acc[1]
    else:
        dk, dv = (common.alloc_output(t.shape, t.dtype, device) for t in (k, v))
    dq_acc = torch.empty(q.shape, dtype=torch.float32, device=device)  # zeroed by the delta kernel

    # 1. delta = rowsum(dO * O) - grad_lse, and dq_acc = 0 (the triton backend's kernel); block-sparse with
    # SPARSE_BACKWARD_DELTA_STREAM: on a side stream, beside step 2's list launches (joined before the kernel)
    delta = common.alloc_output((num_heads, total_out), torch.float32, device)
    side = _delta_side_stream(device) if selection is not None and configs.SPARSE_BACKWARD_DELTA_STREAM else None
    with _forked(side):
        delta_key = launch_delta(out, grad_out if delta_grad_out is None else delta_grad_out, grad_lse, delta,
                                 dq_acc, total_out, q.shape[0], head_dim)

    # 2. dK, dV, and dQ reduce-added into dq_acc; block-sparse: over the transposed selection, key tiles longest
    # first by the Q blocks that selected them (the triton sparse backward's list)
    if selection is None:
        sparse_dynamic, sparse_static, list_cost = {}, NO_SELECTION, {}
    else:
        q_index, q_count = transposed_selection(k, *selection, params)
        sparse_dynamic = dict(Q_BLOCK_INDEX=q_index, Q_BLOCK_COUNT=q_count, n_kv_blocks=q_index.shape[2],
                              **index_strides("ti", "tc", q_index, q_count))
        sparse_static = dict(SPARSE=True, BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv)
        list_cost = selected_cost_args(q_count, params.block_kv)
    programs, schedule = tile_schedule(
        lambda: kv_tiles(q_off, kv_off, total_out, k.shape[0], cfg.block_n, window_left, right, has_left, has_right,
                         **list_cost),
        kv_off, q_off, k.shape[0], total_out, cfg.block_n, num_heads_kv * parts, "static", 1, device)
    # block-sparse with item_order: the items themselves, sorted by their own blocks (plan_key implies whether), with
    # group_order in head_group's groups; the kernel reads the list (head_group and HEAD_GROUPED: its own mapping)
    items = None
    if item_order and selection is not None and not schedule["TILES_FROM_OFFSETS"]:
        if configs.SPARSE_BACKWARD_SECTIONS and not params.broadcast_q:  # read per call: the same kernel, a list
            build = sectioned_item_list_device if configs.SPARSE_BACKWARD_SECTIONS_DEVICE else sectioned_item_list
            items = build(schedule, q_count, num_heads_kv, params.block_kv, q_off, _row_bytes(q, k),
                          configs.CAUSAL_ORDER_L2_BYTES, total_out, q_index.shape[3])
        else:
            items = item_list(schedule, q_count, num_heads_kv, params.block_kv, head_group if group_order else 0,
                              q_index.shape[3])
    # dense with causal_order (a mask, the list sorted): the items in L2-sized sections of (sequence, kv head)
    # streams (plan_key implies whether: variant, bounds, TILES_FROM_OFFSETS); the sections are list data
    # (a causal batch of one length: the list made once per shape, no per-call host ops)
    if causal_order and not schedule["TILES_FROM_OFFSETS"]:
        items = _causal_items(schedule, q, k, kv_offsets, params, q_off, total_out, cfg, device_list)
    snake = item_order or items is not None or parts > 1  # GROUP_SPLIT's parts under the snake (its balance)
    kernel_group = 0 if snake else head_group
    if items is not None:
        schedule = {**schedule, "TILE_SEQ": items[0], "TILE_START": items[1]}
        sparse_dynamic = {**sparse_dynamic, "TILE_HEAD": items[2]}
    dynamic = dict(
        desc_q=rows_descriptor(q, cfg.block_m), desc_k=rows_descriptor(k, cfg.block_n // 2),
        desc_v=rows_descriptor(v, cfg.block_n // 2), desc_do=rows_descriptor(grad_out, cfg.block_m),
        desc_dq=_dq_descriptor(dq_acc, cfg.block_m, head_dim // cfg.dq_split), Lse=lse, Delta=delta, DK=dk, DV=dv,
        Q_OFF=q_off, KV_OFF=kv_off, **schedule_arguments(schedule), total_out=total_out, **sparse_dynamic,
        **(dict(desc_lse=_stats_descriptor(lse, cfg.block_m), desc_delta=_stats_descriptor(delta, cfg.block_m))
           if stats_smem else {}),
        **(dict(desc_dk=rows_descriptor(dk, cfg.block_n // 2), desc_dv=rows_descriptor(dv, cfg.block_n // 2))
           if store_tma else {}))

    def static():  # every value here follows from plan_key; dK/dV are fresh [T_kv, Hkv, D] tensors
        return dict(num_heads_kv=num_heads_kv, stride_dkvt=num_heads_kv * head_dim, group=num_heads // num_heads_kv,
                    scale=params.scale, qk_scale=params.scale * 1.4426950408889634, window_left=window_left,
                    right=right, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                    NUM_BUFFERS_Q=cfg.num_buffers_q, NUM_BUFFERS_DQ=cfg.num_buffers_dq, DQ_SPLIT=cfg.dq_split,
                    HAS_LEFT=has_left, HAS_RIGHT=has_right, BROADCAST_Q=params.broadcast_q,
                    DQ_SHARED=dq_shared, STATS_AHEAD=stats_ahead, head_group=kernel_group,
                    HEAD_GROUPED=kernel_group > 0, UNIFORM_WALK=uniform_walk,
                    ITEM_LIST=items is not None, SNAKE=snake,
                    ATOMIC_WORK=schedule["ATOMIC_WORK"], TILES_FROM_OFFSETS=schedule["TILES_FROM_OFFSETS"],
                    ABLATE=ablate, GROUP_SPLIT=parts,
                    **({} if items is not None else dict(TILE_HEAD=None)), **sparse_static, MXFP8=mxfp8,
                    KV_EARLY=kv_early, PEEL=peel,
                    STATS_SMEM=stats_smem, **({} if stats_smem else dict(desc_lse=None, desc_delta=None)),
                    STORE_TMA=store_tma, **({} if store_tma else dict(desc_dk=None, desc_dv=None)))

    plan_key = (q.dtype, num_heads, head_dim, num_heads_kv, params.scale, bounds, params.broadcast_q, variant, cfg,
                schedule["ATOMIC_WORK"], schedule["TILES_FROM_OFFSETS"], tuple(sparse_static.items())) + (
                    ("MXFP8",) if mxfp8 else ())
    options = dict(num_warps=NUM_WARPS, num_stages=1)
    if side is not None:  # the kernel reads delta and adds into dq_acc
        torch.cuda.current_stream(device).wait_stream(side)
    launch_planned(attn_bwd_tlx_kernel, plan_key, (programs,), dynamic, static, **options)
    if parts > 1:  # two tensors (views of one would alias the op's outputs)
        dk, dv = dkv_acc[0].to(k.dtype), dkv_acc[1].to(v.dtype)

    # 3. dq = scale * dq_acc in q's dtype (the triton backend's finalize)
    dq = common.alloc_output(q.shape, q.dtype, device)
    finalize_key = (params.scale, 1)  # scale, num_slabs: what the finalize's static arguments follow from
    launch_planned(attn_bwd_dq_finalize_kernel, finalize_key, (cdiv(q.numel(), FINALIZE_BLOCK),),
                   dict(DQ_ACC=dq_acc, DQ=dq, n_elem=q.numel(), slab_stride=q.numel()),
                   lambda: dict(num_slabs=1, scale=params.scale, BLOCK=FINALIZE_BLOCK), num_warps=FINALIZE_WARPS)
    # What _Recipe covers (see there): then keep one for this signature, made of the plans just launched
    if (key is not None and key not in _RECIPES and schedule["TILES_FROM_OFFSETS"] and not schedule["ATOMIC_WORK"]
            and all(a is b and _packed_any_rows(a) for a, b in zip((q, k, v, out, grad_out), given))):
        group = launcher.plan_group(((attn_bwd_delta_kernel, delta_key, _DELTA_SOURCES, {}),
                                     (attn_bwd_tlx_kernel, plan_key, _TLX_SOURCES, options),
                                     (attn_bwd_dq_finalize_kernel, finalize_key, _FINALIZE_SOURCES,
                                      dict(num_warps=FINALIZE_WARPS))))
        if group is not None:
            if len(_RECIPES) >= _RECIPES_MAX:
                _RECIPES.clear()
            _RECIPES[key] = _Recipe(group, device, num_heads, num_heads_kv, cfg, parts, tuple(
                descriptor_layout(dynamic[name]) for name in ("desc_q", "desc_k", "desc_v", "desc_do", "desc_dq")))
    return dq, dk, dv


# --------------------------------------------------------------------- the per-signature recipe (host time)
# Why: as the triton backward's (triton.attn_bwd._Recipe): most of a small call's host time follows from its
# signature (configs, choices, plan keys, ~60 arguments bound). A recipe keeps the three launch plans of a signature
# as one ``launch.PlanGroup``; a later call of the signature checks its sizes, allocates, builds its five descriptors
# (each holds its tensor's address and rows) and launches. The triton backward's switches turn it off too
# (``JFA_BWD_RECIPES=0`` / ``triton.attn_bwd.RECIPES_ENABLED``, ``launch.REPLAYS_ENABLED``). Recipes serve calls of
# one wave only (serving larger calls with their lists made per call measured slower on the H200's model step, stop
# 37: bench/NOTES.md "kept launches past one wave").
_RECIPES: dict = {}
_RECIPES_MAX = 256  # a bound, not a tuning (keys hold no row counts)
launcher.CLEAR_HOOKS.append(_RECIPES.clear)  # recipes hold plans: dropped with them


def _recipe_key(grad_out, grad_lse, q, k, v, out, params, variant):
    """What the full path's decisions for a dense call follow from, except the sizes ``_Recipe.run`` checks per call:
    the device, the tensors' dtypes (TMA's row-stride rule is in bytes), head counts, head_dim, strides (packing, row
    strides), grad_lse's presence and dtype, the options the backward reads, the triton knobs' generation (the one-wave
    rule) and the kernel variant (``configs.BACKWARD_*``). None where no recipe may serve the call: broadcast Q, and
    wherever ``launch.replays_enabled()`` is false (the interpreter, tracing, plans or replays off) or the triton
    backward's recipes are off."""
    if not triton_bwd.RECIPES_ENABLED or params.broadcast_q or not launcher.replays_enabled():
        return None
    return (q.device, q.dtype, k.dtype, v.dtype, out.dtype, grad_out.dtype,
            None if grad_lse is None else grad_lse.dtype, q.shape[1], q.shape[2], k.shape[1], q.stride(), k.stride(),
            v.stride(), out.stride(), grad_out.stride(), params.scale, params.causal, params.window_left,
            params.window_right, params.deterministic, Knobs.generation, variant)


# Where each launch's per-call arguments come from (``launch.PlanGroup`` sources, each specialized once).
_DELTA_SOURCES = dict(Out="out", DOut="grad_out", GradLse="grad_lse", Delta="delta", ZEROED="dq_acc",
                      total_out="total_out", zero_rows="total_out")
_TLX_SOURCES = dict(desc_q="desc_q", desc_k="desc_k", desc_v="desc_v", desc_do="desc_do", desc_dq="desc_dq",
                    Lse="lse", Delta="delta", DK="dk", DV="dv", Q_OFF="q_off", KV_OFF="kv_off", TILE_SEQ="kv_off",
                    TILE_START="kv_off", TILE_COUNT="kv_off", WORK_COUNTER="kv_off", n_slots="kv_slots",
                    search_steps="steps", num_seqs="num_seqs", rows_s="rows_k", rows_o="total_out",
                    total_out="total_out")
_FINALIZE_SOURCES = dict(DQ_ACC="dq_acc", DQ="dq", n_elem="n_elem", slab_stride="n_elem")


class _Recipe:
    """A dense backward signature's launches (delta, the TLX kernel, dQ finalize), made by ``_full_backward`` from
    the plans it launched where its key tile list was mapped from the offsets in one wave. ``run`` serves a call of
    the key's signature whose sizes keep to that path and whose tensors are TMA-ready in place (else None: the
    caller takes the full path); it launches the same kernels with the same arguments as the full path would (tests
    compare them), all three or none."""

    __slots__ = ("group", "device", "num_heads", "num_heads_kv", "cfg", "parts", "layouts", "last")

    def __init__(self, group, device, num_heads, num_heads_kv, cfg, parts, layouts):
        self.group, self.device, self.num_heads, self.num_heads_kv, self.cfg = (group, device, num_heads,
                                                                                num_heads_kv, cfg)
        self.parts = parts  # GROUP_SPLIT (the variant's): parts x kv heads of items, dK/dV added in fp32
        self.layouts = layouts  # of the q, k, v, dO and dQ-accumulator descriptors (rows per call: ``rebase``)
        self.last = None  # (sizes, what _sized derived from them) of the last call (as triton.attn_bwd._Recipe's)

    def _sized(self, num_seqs: int, rows_k: int):
        """(kv_slots, programs, search steps) of a call's sizes on the recipe's device, or None where its key tile
        list is not mapped from the offsets in one wave (the full path's schedule, ``scheduling.tile_schedule``,
        sorts one)."""
        kv_slots = capacity_of(rows_k, self.cfg.block_n, num_seqs)
        items = kv_slots * self.num_heads_kv * self.parts
        if not tiles_from_offsets(items, num_seqs, 1, self.device):
            return None
        programs, _ = launch_schedule("static", items, 1, self.device)
        return kv_slots, programs, binary_search_steps(num_seqs)

    def run(self, grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets):
        device, num_heads = self.device, self.num_heads
        num_seqs, total_out, rows_k = kv_offsets.numel() - 1, q.shape[0], k.shape[0]
        if num_seqs <= 0 or total_out == 0 or rows_k == 0:
            return None  # the full path's early return
        if q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16 or out.data_ptr() % 16 \
                or grad_out.data_ptr() % 16:
            return None  # TMA needs 16-byte aligned bases: the full path copies (row strides: in the key)
        sizes = (num_seqs, rows_k, num_sms(device))  # a model repeats a step's sizes in every layer
        last = self.last
        if last is not None and last[0] == sizes:
            sized = last[1]
        else:
            sized = self._sized(num_seqs, rows_k)
            if sized is None:
                return None  # a sorted tile list: the full path builds it
            self.last = sizes, sized  # one assignment: another thread sees the old pair or the new one
        kv_slots, programs, steps = sized
        q_off = common.int32_offsets(q_offsets)
        kv_off = common.int32_offsets(kv_offsets, same_as=(q_offsets, q_off))
        lse = lse if lse.is_contiguous() else lse.contiguous()
        if self.parts > 1:  # as the full path: the parts' dK (scaled) and dV added in fp32, cast after the kernel
            dkv_acc = torch.zeros((2,) + tuple(k.shape), dtype=torch.float32, device=device)
            dk, dv = dkv_acc[0], dkv_acc[1]
        else:
            dk, dv = common.alloc_output(k.shape, k.dtype, device), common.alloc_output(v.shape, v.dtype, device)
        dq_acc = torch.empty(q.shape, dtype=torch.float32, device=device)
        delta = common.alloc_output((num_heads, total_out), torch.float32, device)
        dq = common.alloc_output(q.shape, q.dtype, device)
        n_elem = q.numel()
        q_layout, k_layout, v_layout, do_layout, dq_layout = self.layouts
        launched = self.group.launch(
            ((cdiv(total_out, DELTA_BLOCK_T), num_heads), (programs,), (cdiv(n_elem, FINALIZE_BLOCK),)),
            out=out, grad_out=grad_out, grad_lse=delta if grad_lse is None else grad_lse.to(torch.float32).contiguous(),
            delta=delta, dq_acc=dq_acc, total_out=total_out,  # descriptors: bases checked above, the rest keyed
            desc_q=rebase(q_layout, q, total_out), desc_k=rebase(k_layout, k, rows_k),
            desc_v=rebase(v_layout, v, rows_k), desc_do=rebase(do_layout, grad_out, total_out),
            desc_dq=rebase(dq_layout, dq_acc, total_out), lse=lse, dk=dk, dv=dv,
            q_off=q_off, kv_off=kv_off, kv_slots=kv_slots, steps=steps, num_seqs=num_seqs,
            rows_k=rows_k, dq=dq, n_elem=n_elem)
        if not launched:
            return None
        if self.parts > 1:  # two tensors (views of one would alias the op's outputs)
            dk, dv = dkv_acc[0].to(k.dtype), dkv_acc[1].to(v.dtype)
        return dq, dk, dv


def block_sparse_backward_reason(q, k, kv_block_index, params) -> Optional[str]:
    """None when ``block_sparse_backward`` runs the call, else why not (the triton sparse backward runs it): the
    block sizes (``configs.sparse_backward_reason``) and the transposed selection's tiles, which the kernel counts
    in int32 (``selected_walk``), from shapes and hints only."""
    reason = configs.sparse_backward_reason(q.shape[-1], params.block_q, params.block_kv)
    if reason is not None:
        return reason
    batch, heads_kv, n_q_blocks = kv_block_index.shape[:3]
    n_kv_blocks = triton.cdiv(longest_rows(k, params.max_seqlen_kv), params.block_kv)
    tiles = batch * heads_kv * n_kv_blocks * n_q_blocks * (params.block_q // bwd_config_v2(q.shape[-1]).block_m)
    if tiles >= 2 ** 31:
        return f"the transposed selection has {tiles} query tiles: too many for int32 positions"
    return None


def block_sparse_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                          kv_block_count, params, dq_shared: bool = True, head_group: int = 0,
                          uniform_walk: bool = False, item_order: bool = False, group_order: bool = False,
                          kv_early: bool = False, store_tma: bool = False):
    """(dq, dk, dv) of ``jfa::block_sparse_attention``: the backward with SPARSE (each key tile walks the query tiles of
    the Q blocks that selected its KV block, from the selection transposed on the device); the triton sparse backward's
    contract. ``block_sparse_backward_reason`` held. ``head_group``, ``uniform_walk``, ``item_order``, ``group_order``:
    the experiments (``attention_backward``); ``kv_early`` (``configs.SPARSE_BACKWARD_KV_EARLY``) and ``store_tma``
    (with it): the dense default's epilogue (``attention_backward``)."""
    return attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params,
                              dq_shared=dq_shared, selection=(kv_block_index, kv_block_count), head_group=head_group,
                              uniform_walk=uniform_walk, item_order=item_order, group_order=group_order,
                              kv_early=kv_early, store_tma=store_tma)

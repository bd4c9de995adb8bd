"""Stage 1 of block-sparse attention on the device, in two Triton launches: block mean-pooling of Q and K, then per
Q block the block scores and the top-k choice (by rank: the order of ``reference.block_sparse.top_blocks``' stable
sort, without sorting). No host sync: every size comes from shapes and the max_seqlen arguments.

Only real blocks get a program. Blocks live in *slots* (``scheduling.slot_tile``: sequence b's block j sits at slot
``g(b) + j``, ``g(b) = off[b] // block - off[0] // block + b``; at most ``cdiv(T, block) + B`` slots), so the grids
cover the batch's rows, not B x max_seqlen (the bench batch: 548 Q-block slots instead of 22 x 128)::

    pooled_q [Q slots, Hkv, D] fp32    mean of a Q block's rows over the kv head's group of query heads
    pooled_k [KV slots, Hkv, D] fp32   mean of a KV block's rows
    q_slot_seq [Q slots] int32         the sequence of a Q slot, -1 for padding (the select kernel's map)
    scores [select slots, Hkv, NKB]    scratch, fp64: pooled_q . pooled_k of the sequence's own blocks (``_exact_dot``);
                                       -inf where the pair is not visible, +inf for the local block (always_local)

The outputs start as -1 (index) and 0 (count); the select kernel writes the real rows' count and kept ids only.
Broadcast Q pools its one Q sequence once; select program t is then (sequence t // NQB, Q block t % NQB).
``KNOBS.sparse_select_overlap``: both stages in one launch (``block_select_overlap_kernel``: work items by ticket, the
select items waiting on the pools' per-slot done-counters).
"""
from __future__ import annotations

import itertools
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

import meta_kernels
from ..base import BlockSelectParams, capturing, stream_key
from ... import validation
from .common import head_dim_consts, int32_offsets, loop_bound, packed_rows, window_bounds
from . import launch as launch_module
from .configs import KNOBS, Knobs, interpreting
from .launch import launch, launch_planned
from .offset_checks import offsets_ok
from .scheduling import (binary_search_steps, capacity_of, fanout_search_steps, shape_constant, slot_tile,
                         slot_tile_fanout)

POOL_WHOLE_BLOCK_MAX = 128 * 128  # elements of the largest whole-block pooling tile (64 registers of bf16 a thread)
POOL_ROWS = 32  # rows per step of the pooling loop (a [32, D] tile summed elementwise; one reduction at the end)
POOL_STREAM_HEADS = 4  # kv heads a pooling program streams under KNOBS.sparse_pool_stream (4 x 32 KB at D128 bf16)
POOL_STREAM_STAGES = tl.constexpr(4)  # ... its loop's stages: 3 [32, D] steps in flight (async copies, 8 KB each)
SELECT_BLOCK_J = 32  # KV blocks per step of the scores and of the rank's outer loop
SELECT_BLOCK_C = 128  # KV blocks compared per rank step: a row of <= 128 blocks ranks in one step per outer step
# the scores' arithmetic (``score_kind``; the kernels' SCORES)
SCORES_FP64, SCORES_FP32_RN, SCORES_FP32 = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
SELECT_GROUP = 4  # Q blocks per select program under KNOBS.sparse_select_grouped
SELECT_BLOCK_DC = 32  # head-dim columns per load of a row's pooled K ([BLOCK_C, 32] fp32) when the row fits a register
SELECT_RADIX_MAX = 512  # KNOBS.sparse_select_radix: the longest row (KV blocks) it holds in registers
SELECT_RADIX_HEADS = tl.constexpr(4)  # ... kv heads per select program, one per warp (num_warps): warp-local counts
SKIP_BLOCK_J = tl.constexpr(128)  # KV blocks per step of KNOBS.sparse_pool_skip's visible count (the bench: one step)
# KNOBS.sparse_select_fill: int32s per step of a past-the-end program's -1 (2 KB: 16-byte stores, 4 a thread) and of a
# select program's row fill (a [HEADS, 128] tile: 4 a thread)
FILL_BLOCK = tl.constexpr(512)
FILL_ROW_BLOCK = tl.constexpr(128)
# KNOBS.sparse_select_overlap: done-counters read per step of a select item's wait (a row of <= 128 K blocks: one)
WAIT_BLOCK = tl.constexpr(128)
LAG_BLOCK = tl.constexpr(1024)  # ... sequences per step of the lag's search (one step up to 1024 sequences)
# KNOBS.sparse_select_overlap_tail: sequences the longest-first order's table holds (fewer than this are ordered,
# ranked in [64, ORDER_STEP] steps by ticket 0's program), and a table position no item reaches
ORDER_BLOCK = tl.constexpr(64)
ORDER_NEVER = tl.constexpr(2**30)
ORDER_STEP = tl.constexpr(8)  # ... sequences compared per step of its ranking


@triton.jit
def _load_step(X, row0, start, end, head, group, steps, step, stride_xt, stride_xh, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """Step ``step`` of a block's pooling: ROWS rows of head head * group + step // steps (zeros past ``end``)."""
    g = step // steps
    r = start + (step - g * steps) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BLOCK_D)
    return tl.load(X + (row0 + r)[:, None] * stride_xt + (head * group + g) * stride_xh + d[None, :],
                   mask=(r < end)[:, None] & (d < HEAD_DIM)[None, :], other=0.0)


@triton.jit
def _pool_slot_search(OFF, t, num_seqs, search_steps, rows, BLOCK: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """(sequence, first row in it, real) of pooling slot t: the 64-ary search (SEARCH_STEPS > 0) or the binary one."""
    if SEARCH_STEPS > 0:
        return slot_tile_fanout(OFF, OFF, t, num_seqs, rows, rows, BLOCK, SEARCH_STEPS)
    else:
        return slot_tile(OFF, OFF, t, num_seqs, search_steps, rows, rows, BLOCK)


@triton.jit
def _block_rows(OFF, seq, start, BLOCK: tl.constexpr):
    """(the sequence's first row in X (int64), the block's end within the sequence) of a real slot."""
    return tl.load(OFF + seq).to(tl.int64), tl.minimum(start + BLOCK, tl.load(OFF + seq + 1) - tl.load(OFF + seq))


@triton.jit
def _pool_slot(X, OFF, Pooled, t, head, num_seqs, search_steps, rows, group, stride_xt, stride_xh, stride_ps,
               stride_ph, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
               SEARCH_STEPS: tl.constexpr, WHOLE_BLOCK: tl.constexpr):
    """Pooled[t, head] = mean of slot t's block over heads head * group .. + group - 1 (real rows only); returns
    (sequence, real). Padding slots write nothing. The steps (ROWS rows of one head) are summed elementwise into a
    [ROWS, D] tile (one reduction at the end), each step's load issued one step ahead: without that, ptxas
    serialized a thread's 16-byte loads (one in flight at a time, sm_90 SASS). WHOLE_BLOCK
    (``KNOBS.sparse_pool_whole_block``): one [BLOCK, D] load per head instead, reduced as it lands: the program's
    32 KB (D128 bf16) in one round trip instead of ~3 (ROWS-row steps, one ahead)."""
    seq, start, real = _pool_slot_search(OFF, t, num_seqs, search_steps, rows, BLOCK, SEARCH_STEPS)
    if real:
        row0, end = _block_rows(OFF, seq, start, BLOCK)
        d = tl.arange(0, BLOCK_D)
        if WHOLE_BLOCK:  # one [BLOCK, D] load per head: the block's rows all in flight at once
            r = start + tl.arange(0, BLOCK)
            tile = X + (row0 + r)[:, None] * stride_xt + head * group * stride_xh + d[None, :]
            tile_ok = (r < end)[:, None] & (d < HEAD_DIM)[None, :]
            total = tl.zeros([BLOCK_D], tl.float32)
            for g in range(0, loop_bound(group)):
                total += tl.sum(tl.load(tile + g * stride_xh, mask=tile_ok, other=0.0).to(tl.float32), 0)
        else:
            steps = (end - start + ROWS - 1) // ROWS
            acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
            x = _load_step(X, row0, start, end, head, group, steps, 0, stride_xt, stride_xh, HEAD_DIM, BLOCK_D, ROWS)
            for step in range(1, loop_bound(steps * group)):
                x_next = _load_step(X, row0, start, end, head, group, steps, step, stride_xt, stride_xh, HEAD_DIM,
                                    BLOCK_D, ROWS)
                acc += x.to(tl.float32)
                x = x_next
            acc += x.to(tl.float32)
            total = tl.sum(acc, 0)
        pooled = total / ((end - start) * group).to(tl.float32)
        tl.store(Pooled + t.to(tl.int64) * stride_ps + head * stride_ph + d, pooled, mask=d < HEAD_DIM)
    return seq, real


@triton.jit
def _pool_slot_stream(X, OFF, Pooled, t, head0, num_seqs, search_steps, rows, heads, group, stride_xt, stride_xh,
                      stride_ps, stride_ph, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                      ROWS: tl.constexpr, SEARCH_STEPS: tl.constexpr, HEADS: tl.constexpr, STAGES: tl.constexpr):
    """``_pool_slot`` for kv heads head0 .. head0 + HEADS - 1 (``KNOBS.sparse_pool_stream``): one stream of ROWS-row
    steps over the heads (the slot search and offsets once for HEADS heads, not once per 32 KB), software-pipelined
    by Triton (``tl.range(num_stages=STAGES)``: async copies to shared memory, STAGES - 1 steps in flight, across
    head boundaries: no drain between heads; registers stay low, 72 on sm_90, so 7 programs fit an SM). Each kv
    head's sum is ``_pool_slot``'s: the same [ROWS, D] accumulator (the same TTGIR layout on sm_90), the same step
    order (query head g of the group slower, row step faster), the same reduction: the same bits."""
    seq, start, real = _pool_slot_search(OFF, t, num_seqs, search_steps, rows, BLOCK, SEARCH_STEPS)
    if real:
        row0, end = _block_rows(OFF, seq, start, BLOCK)
        d = tl.arange(0, BLOCK_D)
        steps = (end - start + ROWS - 1) // ROWS
        per_head = steps * group  # steps of one kv head
        n = tl.minimum(heads - head0, HEADS) * per_head
        q_head0 = head0 * group  # step k reads query head q_head0 + k // steps: kv head k // per_head, g in its group
        acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
        for k in tl.range(0, loop_bound(n), num_stages=STAGES):  # STAGES - 1 steps in flight (async copies)
            acc += _load_step(X, row0, start, end, q_head0, 1, steps, k, stride_xt, stride_xh, HEAD_DIM, BLOCK_D,
                              ROWS).to(tl.float32)
            if (k + 1) % per_head == 0:  # kv head head0 + k // per_head is summed
                pooled = tl.sum(acc, 0) / ((end - start) * group).to(tl.float32)
                tl.store(Pooled + t.to(tl.int64) * stride_ps + (head0 + k // per_head) * stride_ph + d, pooled,
                         mask=d < HEAD_DIM)
                acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    return seq, real


@triton.jit
def _pool_program(X, OFF, OTHER_OFF, Pooled, SLOT_SEQ, FLAG, pid, num_seqs, other_seqs, search_steps, rows,
                  other_rows, max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                  WRITE_SEQ: tl.constexpr, CHECK: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                  WHOLE_BLOCK: tl.constexpr, HEADS: tl.constexpr):
    """Program pid of one side's pooling (``block_pool_kernel``): slot pid // head groups, kv heads from
    (pid % head groups) * HEADS (HEADS > 1: ``_pool_slot_stream``)."""
    head_groups = (heads + HEADS - 1) // HEADS
    t = pid // head_groups
    head = (pid % head_groups) * HEADS
    if CHECK:
        if (t == 0) & (head == 0):
            valid = offsets_ok(OFF, num_seqs, rows, max_s, 1024) & offsets_ok(OTHER_OFF, other_seqs, other_rows,
                                                                            max_o, 1024)
            tl.store(FLAG, valid.to(tl.int32))
    if HEADS > 1:
        seq, real = _pool_slot_stream(X, OFF, Pooled, t, head, num_seqs, search_steps, rows, heads, group, stride_xt,
                                      stride_xh, stride_ps, stride_ph, HEAD_DIM, BLOCK_D, BLOCK, ROWS, SEARCH_STEPS,
                                      HEADS, POOL_STREAM_STAGES)
    else:
        seq, real = _pool_slot(X, OFF, Pooled, t, head, num_seqs, search_steps, rows, group, stride_xt, stride_xh,
                               stride_ps, stride_ph, HEAD_DIM, BLOCK_D, BLOCK, ROWS, SEARCH_STEPS, WHOLE_BLOCK)
    if WRITE_SEQ:
        if head == 0:
            tl.store(SLOT_SEQ + t, tl.where(real, seq, -1))


@triton.jit(do_not_specialize=["num_seqs", "other_seqs", "search_steps", "rows", "other_rows", "max_s", "max_o",
                               "heads", "group"])
def block_pool_kernel(X, OFF, OTHER_OFF, Pooled, SLOT_SEQ, FLAG, num_seqs, other_seqs, search_steps, rows,
                      other_rows, max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, WRITE_SEQ: tl.constexpr,
                      CHECK: tl.constexpr, SEARCH_STEPS: tl.constexpr, WHOLE_BLOCK: tl.constexpr,
                      HEADS: tl.constexpr):
    """Program t * heads + head: pools slot t of X (one launch for Q, one for K: each its block size and one loop
    body; both sides in one program made ptxas serialize the K side's loads). WRITE_SEQ: head 0 also writes
    SLOT_SEQ[t] (the slot's sequence, -1 for padding). CHECK: program (0, 0) also checks OFF and OTHER_OFF (rows,
    max_seqlen of each; max < 0: none) and writes FLAG (1: valid). Heads vary fastest: the programs running at once
    read whole [heads, D] rows of the same blocks (one head's 2 x D bytes per row, strided by the row, is all a
    slot-major order would read of a DRAM page before moving on). The slot's sequence: SEARCH_STEPS > 0 (under
    ``KNOBS.sparse_pool_fanout``) by a 64-ary search (``scheduling.slot_tile_fanout``): one dependent load for
    <= 64 sequences; else the binary search (``slot_tile``, search_steps halvings: 5 on the bench's batch, each
    before the program's first row load). HEADS > 1 (``KNOBS.sparse_pool_stream``): program
    t * cdiv(heads, HEADS) + i pools kv heads i * HEADS .. + HEADS - 1 of slot t in one stream."""
    _pool_program(X, OFF, OTHER_OFF, Pooled, SLOT_SEQ, FLAG, tl.program_id(0), num_seqs, other_seqs, search_steps,
                  rows, other_rows, max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph, HEAD_DIM,
                  BLOCK_D, BLOCK, ROWS, WRITE_SEQ, CHECK, SEARCH_STEPS, WHOLE_BLOCK, HEADS)


@triton.jit(do_not_specialize=["num_seqs", "kv_seqs", "search_steps", "kv_search_steps", "rows", "kv_rows", "max_s",
                               "max_o", "heads", "group", "q_programs"])
def block_pool_pair_kernel(X, OFF, Pooled, XK, KV_OFF, PooledK, SLOT_SEQ, FLAG, num_seqs, kv_seqs, search_steps,
                           kv_search_steps, rows, kv_rows, max_s, max_o, heads, group, q_programs, stride_xt,
                           stride_xh, stride_ps, stride_ph, stride_kt, stride_kh, stride_pks, stride_pkh,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                           BLOCK_KV: tl.constexpr, ROWS: tl.constexpr, CHECK: tl.constexpr,
                           SEARCH_STEPS: tl.constexpr, KV_SEARCH_STEPS: tl.constexpr, WHOLE_BLOCK: tl.constexpr,
                           KV_WHOLE_BLOCK: tl.constexpr, HEADS: tl.constexpr):
    """``block_pool_kernel`` for Q (programs [0, q_programs), writes SLOT_SEQ, holds the offsets check) and K (the
    rest) in one launch (``KNOBS.sparse_pool_one_launch``): one launch and one tail instead of two; K's programs
    start while Q's last wave drains. Each program runs one side's body only."""
    pid = tl.program_id(0)
    if pid < q_programs:
        _pool_program(X, OFF, KV_OFF, Pooled, SLOT_SEQ, FLAG, pid, num_seqs, kv_seqs, search_steps, rows, kv_rows,
                      max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph, HEAD_DIM, BLOCK_D,
                      BLOCK, ROWS, True, CHECK, SEARCH_STEPS, WHOLE_BLOCK, HEADS)
    else:
        _pool_program(XK, KV_OFF, KV_OFF, PooledK, SLOT_SEQ, FLAG, pid - q_programs, kv_seqs, kv_seqs,
                      kv_search_steps, kv_rows, kv_rows, max_o, max_o, heads, 1, stride_kt, stride_kh, stride_pks,
                      stride_pkh, HEAD_DIM, BLOCK_D, BLOCK_KV, ROWS, False, False, KV_SEARCH_STEPS, KV_WHOLE_BLOCK,
                      HEADS)


@triton.jit
def _block_ranks(KEEP, i, len_q, len_k, n_kv_blocks, window_left, right, BLOCK_Q: tl.constexpr,
                 BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr):
    """Whether Q block i's row ranks blocks by score (``KNOBS.sparse_pool_skip``): it keeps some but not all of its
    visible blocks, and not only the local one (ALWAYS_LOCAL: +inf, beaten by no finite score). Geometry only, as
    ``_select_q_block`` derives it (the same diagonals, visible range, visibility and keep table)."""
    d0 = i * BLOCK_Q + len_k - len_q
    d1 = tl.minimum((i + 1) * BLOCK_Q, len_q) - 1 + len_k - len_q
    local = tl.minimum(tl.maximum(d1, 0), tl.maximum(len_k - 1, 0)) // BLOCK_KV
    n_own = tl.minimum((len_k + BLOCK_KV - 1) // BLOCK_KV, n_kv_blocks)
    lo, hi = _visible_range(d0, d1, n_own, window_left, right, BLOCK_KV, HAS_LEFT, HAS_RIGHT)
    n_visible = tl.full([], 0, tl.int32)
    local_visible = tl.full([], 0, tl.int32)
    for j0 in range(loop_bound(lo), loop_bound(hi), SKIP_BLOCK_J):
        j = j0 + tl.arange(0, SKIP_BLOCK_J)
        _, vis = _visible_scores(tl.zeros([SKIP_BLOCK_J], tl.float32), j, j < hi, d0, d1, local, len_k, window_left,
                                 right, BLOCK_KV, HAS_LEFT, HAS_RIGHT, False)
        n_visible += tl.sum(vis.to(tl.int32), 0)
        local_visible += tl.sum((vis & (j == local)).to(tl.int32), 0)
    count = tl.load(KEEP + n_visible)
    ranks = (count > 0) & (count < n_visible)
    if ALWAYS_LOCAL:
        ranks = ranks & ((count > 1) | (local_visible == 0))
    return ranks


@triton.jit
def _pool_skip_q_program(X, OFF, Pooled, KV_OFF, SLOT_SEQ, FLAG, KEEP, pid, num_seqs, kv_seqs, search_steps, rows,
                         kv_rows, max_s, max_o, heads, group, n_kv_blocks, window_left, right, stride_xt, stride_xh,
                         stride_ps, stride_ph, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                         BLOCK_KV: tl.constexpr, ROWS: tl.constexpr, CHECK: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                         WHOLE_BLOCK: tl.constexpr, HEADS: tl.constexpr, HAS_LEFT: tl.constexpr,
                         HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr):
    """``block_pool_pair_skip_kernel``'s Q program ``pid`` (pid < q_programs)."""
    head_groups = (heads + HEADS - 1) // HEADS
    t = pid // head_groups
    head = (pid % head_groups) * HEADS
    seq, start, real = _pool_slot_search(OFF, t, num_seqs, search_steps, rows, BLOCK, SEARCH_STEPS)
    ranks = _block_ranks(KEEP, start // BLOCK, tl.load(OFF + seq + 1) - tl.load(OFF + seq),
                         tl.load(KV_OFF + seq + 1) - tl.load(KV_OFF + seq), n_kv_blocks, window_left, right, BLOCK,
                         BLOCK_KV, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL)
    if real & (ranks == 0):
        h = tl.arange(0, HEADS)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        tl.store(Pooled + t.to(tl.int64) * stride_ps + (head + h) * stride_ph + d,
                 tl.zeros([HEADS, BLOCK_D], tl.float32), mask=(head + h < heads) & (d < HEAD_DIM))
        if head == 0:
            tl.store(SLOT_SEQ + t, seq)
        if CHECK:  # _pool_program's (slot 0 may be skipped)
            if (t == 0) & (head == 0):
                valid = offsets_ok(OFF, num_seqs, rows, max_s, 1024) & offsets_ok(KV_OFF, kv_seqs, kv_rows,
                                                                                max_o, 1024)
                tl.store(FLAG, valid.to(tl.int32))
    else:
        _pool_program(X, OFF, KV_OFF, Pooled, SLOT_SEQ, FLAG, pid, num_seqs, kv_seqs, search_steps, rows,
                      kv_rows, max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph, HEAD_DIM,
                      BLOCK_D, BLOCK, ROWS, True, CHECK, SEARCH_STEPS, WHOLE_BLOCK, HEADS)


@triton.jit(do_not_specialize=["num_seqs", "kv_seqs", "search_steps", "kv_search_steps", "rows", "kv_rows", "max_s",
                               "max_o", "heads", "group", "q_programs", "n_kv_blocks", "window_left", "right"])
def block_pool_pair_skip_kernel(X, OFF, Pooled, XK, KV_OFF, PooledK, SLOT_SEQ, FLAG, KEEP, num_seqs, kv_seqs,
                                search_steps, kv_search_steps, rows, kv_rows, max_s, max_o, heads, group, q_programs,
                                n_kv_blocks, window_left, right, stride_xt, stride_xh, stride_ps, stride_ph,
                                stride_kt, stride_kh, stride_pks, stride_pkh, HEAD_DIM: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_KV: tl.constexpr,
                                ROWS: tl.constexpr, CHECK: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                                KV_SEARCH_STEPS: tl.constexpr, WHOLE_BLOCK: tl.constexpr,
                                KV_WHOLE_BLOCK: tl.constexpr, HEADS: tl.constexpr, HAS_LEFT: tl.constexpr,
                                HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr):
    """``block_pool_pair_kernel`` with ``KNOBS.sparse_pool_skip``: a Q block whose row ranks nothing by score
    (``_block_ranks``: it keeps all its visible blocks, only its local one, or none) is not read: its pooled rows
    are written 0 instead (the select kernel still scores them: 0, finite, so a row keeps every visible block or the
    local one alone as before; 32 KB a kv head read -> 512 B written). The rest is ``_pool_program``'s (its slot
    search once more first: a dependent load or two)."""
    pid = tl.program_id(0)
    if pid < q_programs:
        _pool_skip_q_program(X, OFF, Pooled, KV_OFF, SLOT_SEQ, FLAG, KEEP, pid, num_seqs, kv_seqs, search_steps,
                             rows, kv_rows, max_s, max_o, heads, group, n_kv_blocks, window_left, right, stride_xt,
                             stride_xh, stride_ps, stride_ph, HEAD_DIM, BLOCK_D, BLOCK, BLOCK_KV, ROWS, CHECK,
                             SEARCH_STEPS, WHOLE_BLOCK, HEADS, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL)
    else:
        _pool_program(XK, KV_OFF, KV_OFF, PooledK, SLOT_SEQ, FLAG, pid - q_programs, kv_seqs, kv_seqs,
                      kv_search_steps, kv_rows, kv_rows, max_o, max_o, heads, 1, stride_kt, stride_kh, stride_pks,
                      stride_pkh, HEAD_DIM, BLOCK_D, BLOCK_KV, ROWS, False, False, KV_SEARCH_STEPS, KV_WHOLE_BLOCK,
                      HEADS)


@triton.jit
def _exact_dot(pk, pq, SCORES: tl.constexpr):
    """Row sums of pk * pq (fp32 [N, D] x [D]) in fp64: the same bits for equal rows wherever they sit in the tile.
    Why fp64: a product of two fp32 values is exact in fp64, so whether the compiler contracts a multiply and the
    add after it into an FMA (it chose per register, not per row: sm_90 PTX of the [128, 16] row tile fused p0 * q0
    in rows 0 and 3 of a thread and p1 * q1 in rows 1 and 2) cannot change a sum; the sum's order is the layout's,
    the same for every row. In fp32 two equal KV blocks scored differently and broke ties by position, not index
    (H200, triton 3.8: ``test_selection_ties_and_many_blocks[rows]``)."""
    if SCORES == SCORES_FP32_RN:  # ``KNOBS.sparse_select_fp32_rn``: mul.rn products are never fused (PTX ISA)
        return tl.sum(tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f",
                                                [pk, tl.broadcast_to(pq[None, :], pk.shape)], dtype=tl.float32,
                                                is_pure=True, pack=1), 1)
    elif SCORES == SCORES_FP32:  # the same under the interpreter (numpy never fuses; it runs no PTX)
        return tl.sum(pk * pq[None, :], 1)
    else:
        return tl.sum(pk.to(tl.float64) * pq.to(tl.float64)[None, :], 1)


@triton.jit
def _scores(PK, PQ_ROW, kv_slot0, head, stride_pks, stride_pkh, c, c_ok, HEAD_DIM: tl.constexpr,
            BLOCK_D: tl.constexpr, BLOCK_DC: tl.constexpr, SCORES: tl.constexpr):
    """pooled_q . pooled_k (fp64, ``_exact_dot``) of KV blocks c (0 where not c_ok): pooled K read in BLOCK_DC-column
    slices, all issued before the first use (one round trip), each summed as it lands (the fp64 products of a whole
    [32, 128] tile held 113 registers)."""
    s = tl.zeros(c.shape, tl.float64 if SCORES == SCORES_FP64 else tl.float32)
    for d0c in tl.static_range(0, BLOCK_D, BLOCK_DC):
        dc = d0c + tl.arange(0, BLOCK_DC)
        d_ok = dc < HEAD_DIM
        pk = tl.load(PK + (kv_slot0 + c).to(tl.int64)[:, None] * stride_pks + head * stride_pkh + dc[None, :],
                     mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        pq = tl.load(PQ_ROW + dc, mask=d_ok, other=0.0)
        s += _exact_dot(pk, pq, SCORES)
    return s


@triton.jit
def _visible_scores(s, j, j_ok, d0, d1, local, len_k, window_left, right, BLOCK_KV: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr):
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
    return s, vis


@triton.jit
def _visible_range(d0, d1, n_own, window_left, right, BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr,
                   HAS_RIGHT: tl.constexpr):
    """[lo, hi): the row's KV blocks that can be visible (a superset: ``_visible_scores`` still decides). Block j
    is visible only if j * BLOCK_KV - right <= d1 (HAS_RIGHT) and its last key + left >= d0 (HAS_LEFT; that key is
    at most (j + 1) * BLOCK_KV - 1). Blocks outside score -inf and rank behind every visible one: never kept."""
    lo = n_own * 0
    hi = n_own
    if HAS_RIGHT:
        top = d1 + right  # Triton's // truncates toward 0: negative numerators first
        hi = tl.minimum(hi, tl.where(top < 0, 0, top // BLOCK_KV + 1))
    if HAS_LEFT:
        bottom = d0 - window_left
        lo = tl.minimum(tl.where(bottom < 0, 0, bottom // BLOCK_KV), hi)
    return lo, hi


@triton.jit
def _select_row_in_registers(PK, PQ_ROW, KEEP, index_row, count_ptr, kv_slot0, head, lo, hi, stride_pks, stride_pkh,
                             d0, d1, local, len_k, window_left, right, HEAD_DIM: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_J: tl.constexpr,
                             BLOCK_C: tl.constexpr, BLOCK_DC: tl.constexpr, HAS_LEFT: tl.constexpr,
                             HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr, SCORES: tl.constexpr):
    """One row (its blocks [lo, hi), hi <= BLOCK_C) without the scratch row: the scores of all its blocks as one
    register vector (``_scores``), then the ranks of BLOCK_J blocks at a time against the whole vector (block j's own
    score picked out of it by a masked max: a selection, no rounding). No barrier, no re-read of the scores."""
    c = tl.arange(0, BLOCK_C)
    c_ok = (c >= lo) & (c < hi)
    s = _scores(PK, PQ_ROW, kv_slot0, head, stride_pks, stride_pkh, c, c_ok, HEAD_DIM, BLOCK_D, BLOCK_DC, SCORES)
    s, vis = _visible_scores(s, c, c_ok, d0, d1, local, len_k, window_left, right, BLOCK_KV, HAS_LEFT, HAS_RIGHT,
                             ALWAYS_LOCAL)
    count = tl.load(KEEP + tl.sum(vis.to(tl.int32), 0))
    tl.store(count_ptr, count)
    slot0 = count * 0  # kept blocks before the current chunk
    for j0 in tl.static_range(0, BLOCK_C, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        s_j = tl.max(tl.where(c[None, :] == j[:, None], s[None, :], float("-inf")), 1)  # a pick: no arithmetic
        beats = (s[None, :] > s_j[:, None]) | ((s[None, :] == s_j[:, None]) & (c[None, :] < j[:, None]))
        rank = tl.sum((beats & c_ok[None, :]).to(tl.int32), 1)
        kept = (rank < count) & (j >= lo) & (j < hi)
        slot = slot0 + tl.cumsum(kept.to(tl.int32), 0) - 1
        tl.store(index_row + slot, j, mask=kept)
        slot0 += tl.sum(kept.to(tl.int32), 0)


@triton.jit
def _keep_top_radix(scores_rows, index_rows, rows_ok, count, lo, hi, WIDTH: tl.constexpr, ROWS: tl.constexpr,
                    SCORES: tl.constexpr):
    """``KNOBS.sparse_select_radix``: each of ROWS scratch rows (pointers [ROWS, 1], rows_ok: which are real; one Q
    block's kv heads: the same count, lo, hi) gets in its Index row the blocks of rank < count, the ranks of the
    pairwise rank (a higher score, or an equal one at a lower index, beats), found without comparing pairs. A row's
    scores [lo, hi) are read back once as an order-preserving unsigned key (``-0.0`` made ``+0.0``: the compares
    take them equal) into [ROWS, WIDTH], a row a warp, so each count below is a warp's reduction (no barrier); a
    bitwise binary search (one count a key bit: 32 for fp32 scores) finds T, the count-th largest key; kept: keys
    above T, then the first (count - #above) keys equal to T in index order. NaN scores (pooled inf or NaN) beat
    nothing and nothing beats them in the pairwise rank: they are kept (count > 0: the caller's condition) and left
    out of the search, as there."""
    c = tl.arange(0, WIDTH)[None, :] + rows_ok.to(tl.int32) * 0
    in_row = (c >= lo) & (c < hi) & rows_ok
    s = tl.load(scores_rows + c, mask=in_row, other=0.0) + 0.0  # -0.0 + 0.0 = +0.0
    if SCORES == SCORES_FP64:
        bits = s.to(tl.uint64, bitcast=True)
    else:
        bits = s.to(tl.uint32, bitcast=True)
    one = tl.full([ROWS, 1], 1, bits.dtype)
    top = one << (bits.dtype.primitive_bitwidth - 1)
    key = tl.where((bits & top) != 0, ~bits, bits | top)  # negative scores reversed below the positive ones
    nan = s != s
    valid = in_row & ~nan
    threshold = tl.zeros([ROWS, 1], bits.dtype)
    for b in tl.static_range(bits.dtype.primitive_bitwidth - 1, -1, -1):
        candidate = threshold | (one << b)
        at_least = tl.sum((valid & (key >= candidate)).to(tl.int32), 1)[:, None]
        threshold = tl.where(at_least >= count, candidate, threshold)
    above = valid & (key > threshold)
    tie = valid & (key == threshold)
    ties_before = tl.cumsum(tie.to(tl.int32), 1) - tie.to(tl.int32)
    kept = above | (tie & (ties_before < count - tl.sum(above.to(tl.int32), 1)[:, None])) | (in_row & nan)
    slot = tl.cumsum(kept.to(tl.int32), 1) - 1
    tl.store(index_rows + slot, c, mask=kept)


@triton.jit
def _score_row(PK, PQ_ROW, scores_row, kv_slot0, head, lo, hi, stride_pks, stride_pkh, d0, d1, local, len_k,
               window_left, right, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_KV: tl.constexpr,
               BLOCK_J: tl.constexpr, BLOCK_DC: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               ALWAYS_LOCAL: tl.constexpr, SCORES: tl.constexpr):
    """The scores of a row's blocks [lo, hi) into its scratch row; returns how many are visible."""
    n_visible = tl.full([], 0, tl.int32)
    for j0 in range(loop_bound(lo), loop_bound(hi), BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < hi
        s = _scores(PK, PQ_ROW, kv_slot0, head, stride_pks, stride_pkh, j, j_ok, HEAD_DIM, BLOCK_D, BLOCK_DC,
                    SCORES)
        s, vis = _visible_scores(s, j, j_ok, d0, d1, local, len_k, window_left, right, BLOCK_KV, HAS_LEFT,
                                 HAS_RIGHT, ALWAYS_LOCAL)
        n_visible += tl.sum(vis.to(tl.int32), 0)
        tl.store(scores_row + j, s, mask=j_ok)
    return n_visible


@triton.jit
def _select_row_scratch(PK, PQ_ROW, KEEP, scores_row, index_row, count_ptr, kv_slot0, head, lo, hi, stride_pks,
                        stride_pkh, d0, d1, local, len_k, window_left, right, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_DC: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                        ALWAYS_LOCAL: tl.constexpr, SCORES: tl.constexpr):
    """One row of any length (its blocks [lo, hi)): the scores into the program's scratch row, then the ranks read
    back from it."""
    n_visible = _score_row(PK, PQ_ROW, scores_row, kv_slot0, head, lo, hi, stride_pks, stride_pkh, d0, d1, local,
                           len_k, window_left, right, HEAD_DIM, BLOCK_D, BLOCK_KV, BLOCK_J, BLOCK_DC, HAS_LEFT,
                           HAS_RIGHT, ALWAYS_LOCAL, SCORES)
    count = tl.load(KEEP + n_visible)
    tl.store(count_ptr, count)
    tl.debug_barrier()  # the row's scores, stored by all of this program's threads, are read back below
    slot0 = count * 0  # kept blocks before the current chunk
    for j0 in range(loop_bound(lo), loop_bound(tl.where(count > 0, hi, lo)), BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        s_j = tl.load(scores_row + j, mask=j < hi, other=float("-inf"))
        rank = tl.zeros([BLOCK_J], tl.int32)
        for c0 in range(loop_bound(lo), loop_bound(hi), BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            s_c = tl.load(scores_row + c, mask=c < hi, other=float("-inf"))
            beats = (s_c[None, :] > s_j[:, None]) | ((s_c[None, :] == s_j[:, None]) & (c[None, :] < j[:, None]))
            rank += tl.sum((beats & (c < hi)[None, :]).to(tl.int32), 1)
        kept = (rank < count) & (j < hi)
        slot = slot0 + tl.cumsum(kept.to(tl.int32), 0) - 1
        tl.store(index_row + slot, j, mask=kept)
        slot0 += tl.sum(kept.to(tl.int32), 0)


@triton.jit
def _select_heads_radix(PK, PQ_ROW, KEEP, scores_row, index_row, count_ptr, kv_slot0, head, heads, lo, hi,
                        stride_pks, stride_pkh, stride_pqh, stride_sh, stride_ih, stride_ch, d0, d1, local, len_k,
                        window_left, right, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_KV: tl.constexpr,
                        BLOCK_J: tl.constexpr, BLOCK_DC: tl.constexpr, HAS_LEFT: tl.constexpr,
                        HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr, SCORES: tl.constexpr,
                        RADIX_WIDTH: tl.constexpr):
    """``KNOBS.sparse_select_radix``: one Q block's rows of kv heads head .. head + SELECT_RADIX_HEADS - 1 (those
    < heads; pointers at head's row, the others a head stride apart): each head's scores into its scratch row
    (``_score_row``, the pairwise path's code: the same bits), the count once (it depends on the row's geometry
    only), then the heads' choices together, a head a warp (``_keep_top_radix``)."""
    n_visible = tl.full([], 0, tl.int32)
    for h in range(0, SELECT_RADIX_HEADS):
        if head + h < heads:
            n_visible = _score_row(PK, PQ_ROW + h * stride_pqh, scores_row + h * stride_sh, kv_slot0, head + h, lo,
                                   hi, stride_pks, stride_pkh, d0, d1, local, len_k, window_left, right, HEAD_DIM,
                                   BLOCK_D, BLOCK_KV, BLOCK_J, BLOCK_DC, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, SCORES)
    count = tl.load(KEEP + n_visible)
    h = tl.arange(0, SELECT_RADIX_HEADS)[:, None]
    heads_ok = head + h < heads
    tl.store(count_ptr + h * stride_ch, count + h * 0, mask=heads_ok)
    tl.debug_barrier()  # the rows' scores, stored by all of this program's threads, are read back below
    if count > 0:  # the pairwise rank's loop runs for count > 0 only (NaN scores are kept by both)
        _keep_top_radix(scores_row + h * stride_sh, index_row + h * stride_ih, heads_ok, count, lo, hi, RADIX_WIDTH,
                        SELECT_RADIX_HEADS, SCORES)


@triton.jit
def _capacity(total_rows, BLOCK: tl.constexpr, num_seqs):
    """``scheduling.capacity_of`` on the device: the select kernel's slots (its grid's select programs per head
    group), so that the past-the-end programs after them need no launch argument of their own."""
    return ((total_rows + BLOCK - 1) // BLOCK + num_seqs + 3) // 4 * 4


@triton.jit
def _fill_row(Index, Count, seq, head, heads, i, slot_real, q_ok, len_q, n_q_blocks, n_kv_blocks, stride_ib,
              stride_ih, stride_iq, stride_cb, stride_ch, BLOCK_Q: tl.constexpr, HEADS: tl.constexpr):
    """``KNOBS.sparse_select_fill``: -1 over the whole Index row of Q block i (kv heads head .. + HEADS - 1, those
    < heads) before ``_select_q_block`` writes its kept ids over the front (a barrier between: other threads of the
    program write them), and Count 0 where that writes none (a KV side with bad offsets). Nothing for a padding
    slot or a block past the sequence's end or NQB: ``_fill_past_end`` owns those rows."""
    if slot_real & (i < n_q_blocks) & (i * BLOCK_Q < len_q):
        h = tl.arange(0, HEADS)[:, None]
        heads_ok = head + h < heads
        seq64 = seq.to(tl.int64)
        row = Index + seq64 * stride_ib + (head + h) * stride_ih + i * stride_iq
        for c0 in range(0, loop_bound(n_kv_blocks), FILL_ROW_BLOCK):
            c = c0 + tl.arange(0, FILL_ROW_BLOCK)[None, :]
            tl.store(row + c, tl.full([HEADS, FILL_ROW_BLOCK], -1, tl.int32), mask=heads_ok & (c < n_kv_blocks))
        none = q_ok.to(tl.int32) + h * 0 == 0  # no kept ids follow (q_ok false)
        tl.store(Count + seq64 * stride_cb + (head + h) * stride_ch + i, h * 0, mask=heads_ok & none)
    tl.debug_barrier()  # the -1s land before any thread of the program stores a kept id over them


@triton.jit
def _fill_past_end(Q_OFF, Q_SLOT_SEQ, Index, Count, seq, head, n_q_blocks, n_kv_blocks, rows_q, num_seqs, stride_ib,
                   stride_ih, stride_cb, stride_ch, BLOCK_Q: tl.constexpr, FILL: tl.constexpr):
    """``KNOBS.sparse_select_fill``: Index -1 and Count 0 over sequence seq's rows of kv head ``head`` that no select
    program writes: Q blocks from the sequence's last (its length's cdiv) to NQB, one contiguous run of Index. All
    its rows when its own offsets are bad, or (FILL 2: the call checks its offsets) when the pooling's check,
    stored at Q_SLOT_SEQ[capacity], failed: under JFA_VALIDATE=deferred, bad offsets may leave rows that no select
    program maps to, and their counts must still be in range (a later block_sparse_attention reads that many ids)."""
    begin_q = tl.load(Q_OFF + seq)
    len_q = tl.load(Q_OFF + seq + 1) - begin_q
    bad = (begin_q < 0) | (len_q < 0) | (begin_q + len_q > rows_q)
    if FILL == 2:
        bad = bad | (tl.load(Q_SLOT_SEQ + _capacity(rows_q, BLOCK_Q, num_seqs)) == 0)
    first = tl.where(bad, 0, tl.minimum((tl.maximum(len_q, 0) + BLOCK_Q - 1) // BLOCK_Q, n_q_blocks))
    seq64 = seq.to(tl.int64)
    rows = Index + seq64 * stride_ib + head * stride_ih  # contiguous: Q block i's row at rows + i * n_kv_blocks
    for e in range(first * n_kv_blocks, loop_bound(n_q_blocks * n_kv_blocks), FILL_BLOCK):
        c = e + tl.arange(0, FILL_BLOCK)
        tl.store(rows + c, tl.full([FILL_BLOCK], -1, tl.int32), mask=c < n_q_blocks * n_kv_blocks)
    counts = Count + seq64 * stride_cb + head * stride_ch
    for i0 in range(first, loop_bound(n_q_blocks), FILL_BLOCK):
        i = i0 + tl.arange(0, FILL_BLOCK)
        tl.store(counts + i, tl.zeros([FILL_BLOCK], tl.int32), mask=i < n_q_blocks)


@triton.jit(do_not_specialize=["n_q_blocks", "n_kv_blocks", "kv_slots", "rows_kv", "heads", "window_left",
                               "right", "num_seqs", "rows_q"])
def block_select_kernel(PQ, PK, Q_OFF, KV_OFF, Q_SLOT_SEQ, KEEP, Scores, Index, Count, n_q_blocks, n_kv_blocks,
                        kv_slots, rows_kv, heads, num_seqs, rows_q, stride_pqs, stride_pqh, stride_pks, stride_pkh,
                        stride_ss, stride_sh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, window_left, right,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
                        BLOCK_KV: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
                        HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr,
                        BROADCAST_Q: tl.constexpr, ROW_IN_REGISTERS: tl.constexpr, BLOCK_DC: tl.constexpr,
                        VISIBLE_RANGE: tl.constexpr, GROUP: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                        SCORES: tl.constexpr, RADIX_WIDTH: tl.constexpr, HEADS: tl.constexpr,
                        FILL: tl.constexpr):
    """Program t * cdiv(heads, HEADS) + head / HEADS (heads fastest, as the pooling): one Q block of one sequence
    (its Q slot t; broadcast Q: sequence t // NQB, Q block t % NQB). Count = KEEP[visible blocks], Index = the
    Count best blocks in ascending order (the rest stays -1).

    1. Scores of the sequence's own KV blocks into the program's row of Scores (scratch): pooled_q . pooled_k, -inf
       where the pair is not visible (``meta_kernels.block_visible``: max(d0, first key - right) <= min(d1, last
       key + left) with d0..d1 the diagonals of block i's rows), +inf for the local block (ALWAYS_LOCAL).
    2. Block j's rank = how many blocks beat it (a higher score, or an equal one at a lower index): the position
       of a stable descending sort, so ties break toward the lower index as ``reference.block_sparse.top_blocks``.
       Kept: rank < Count; its slot in Index: how many kept blocks precede it (ascending ids, no sort).
    ROW_IN_REGISTERS (the row's blocks fit BLOCK_C, ``KNOBS.sparse_select_rows``): both steps on a register vector
    (``_select_row_in_registers``), Scores unused. VISIBLE_RANGE (``KNOBS.sparse_select_visible``): both steps over
    the blocks the row can see (``_visible_range``), not all the sequence's. GROUP > 1 (``KNOBS.sparse_select_grouped``,
    rows in registers only): program t * heads + head ranks GROUP consecutive Q blocks of one sequence (its group
    slot, found by ``scheduling.slot_tile_fanout``; broadcast Q: sequence t // cdiv(NQB, GROUP)), so the sequence's
    offsets and the head's pooled K row are fetched once per GROUP rows (the later rows' pooled K from L1) and the
    grid is GROUP times smaller: fewer waves of the ~5 dependent round trips a program waits through. RADIX_WIDTH
    > 0 (``KNOBS.sparse_select_radix``, scratch rows of <= RADIX_WIDTH blocks; HEADS = SELECT_RADIX_HEADS): a
    program takes HEADS kv heads of its Q block, step 2's choice by a radix select, a head a warp
    (``_select_heads_radix``): the same blocks without the pairwise compares. Else HEADS = 1. Padding slots,
    and sequences whose offsets point outside the tensors (bad offsets under JFA_VALIDATE=deferred), read and write
    nothing. FILL > 0 (``KNOBS.sparse_select_fill``): Index and Count come uninitialized and this launch writes all
    of them (``_fill_row``, ``_fill_past_end``)."""
    _select_program(tl.program_id(0), PQ, PK, Q_OFF, KV_OFF, Q_SLOT_SEQ, KEEP, Scores, Index, Count, n_q_blocks,
                    n_kv_blocks, kv_slots, rows_kv, heads, num_seqs, rows_q, stride_pqs, stride_pqh, stride_pks,
                    stride_pkh, stride_ss, stride_sh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch,
                    window_left, right, HEAD_DIM, BLOCK_D, BLOCK_Q, BLOCK_KV, BLOCK_J, BLOCK_C, HAS_LEFT, HAS_RIGHT,
                    ALWAYS_LOCAL, BROADCAST_Q, ROW_IN_REGISTERS, BLOCK_DC, VISIBLE_RANGE, GROUP, SEARCH_STEPS, SCORES,
                    RADIX_WIDTH, HEADS, FILL, False, Q_SLOT_SEQ, Q_SLOT_SEQ, 0, 0, 0)


@triton.jit
def _pid(pid, WAIT: tl.constexpr):
    """The select program's number: ``pid`` in the overlap kernel (WAIT), else the grid's, read where the shipped
    kernel read it (the same PTX)."""
    if WAIT:
        return pid
    else:
        return tl.program_id(0)


@triton.jit
def _select_program(pid, PQ, PK, Q_OFF, KV_OFF, Q_SLOT_SEQ, KEEP, Scores, Index, Count, n_q_blocks, n_kv_blocks,
                    kv_slots, rows_kv, heads, num_seqs, rows_q, stride_pqs, stride_pqh, stride_pks, stride_pkh,
                    stride_ss, stride_sh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, window_left, right,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_KV: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr,
                    BROADCAST_Q: tl.constexpr, ROW_IN_REGISTERS: tl.constexpr, BLOCK_DC: tl.constexpr,
                    VISIBLE_RANGE: tl.constexpr, GROUP: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                    SCORES: tl.constexpr, RADIX_WIDTH: tl.constexpr, HEADS: tl.constexpr,
                    FILL: tl.constexpr,
                    WAIT: tl.constexpr, FLAGS_Q, FLAGS_K, target, limit, q_limit):
    """``block_select_kernel``'s program ``pid`` (WAIT; else the grid's). WAIT (``KNOBS.sparse_select_overlap``, in
    ``block_select_overlap_kernel``): before reading what the pooling wrote, wait until the slots' done-counters
    (FLAGS_Q / FLAGS_K: Q / K slots) reach ``target`` (``_await_slots``; K slots at or past ``limit``, Q slots at or
    past ``q_limit``, are not waited on: they sit at or past the item's own position, their items may not be taken
    yet; in slot order both are the position)."""
    head_groups = (heads + HEADS - 1) // HEADS
    if FILL > 0 and not BROADCAST_Q:
        tail = _pid(pid, WAIT) - _capacity(rows_q, BLOCK_Q * GROUP, num_seqs) * head_groups
        if tail >= 0:  # a past-the-end program (sequence tail // heads, kv head tail % heads); its slot t below is
            # past the slots: not real, so the rest writes nothing. (sm_90 registers: 56, the shipped kernel 48; an
            # early return here 64 and a spill; these programs first in the grid 62)
            if WAIT and FILL == 2:  # the check's flag: stored by Q slot 0's pooling
                _await_slots(FLAGS_Q, 0, 1, target, limit)
            _fill_past_end(Q_OFF, Q_SLOT_SEQ, Index, Count, tail // heads, tail % heads, n_q_blocks, n_kv_blocks,
                           rows_q, num_seqs, stride_ib, stride_ih, stride_cb, stride_ch, BLOCK_Q, FILL)
    t = _pid(pid, WAIT) // head_groups
    head = _pid(pid, WAIT) % head_groups * HEADS
    if BROADCAST_Q:  # the one Q sequence's blocks: Q block i at slot i
        n_groups = (n_q_blocks + GROUP - 1) // GROUP
        seq = t // n_groups
        i0 = t % n_groups * GROUP
        q_slot0 = i0 * 0
        len_q = tl.load(Q_OFF + 1) - tl.load(Q_OFF)
        q_ok = i0 * BLOCK_Q < len_q
    elif GROUP == 1:
        if WAIT:  # Q slot t's pooling (its slot map entry, its pooled Q)
            _await_slots(FLAGS_Q, t, 1, target, q_limit)
        if FILL > 0:  # past-the-end programs read no slot (fill 2's flag sits at the first slot past them)
            seq = tl.load(Q_SLOT_SEQ + t, mask=t < _capacity(rows_q, BLOCK_Q, num_seqs), other=-1)
        else:
            seq = tl.load(Q_SLOT_SEQ + t)
        q_ok = seq >= 0
        seq = tl.maximum(seq, 0)
        begin_q = tl.load(Q_OFF + seq)
        len_q = tl.load(Q_OFF + seq + 1) - begin_q
        q_slot0 = begin_q // BLOCK_Q - tl.load(Q_OFF) // BLOCK_Q + seq  # Q slot t = g(seq) + i
        i0 = t - q_slot0
    else:  # group slots: sequence b's group j at slot off[b] // (GROUP * BLOCK_Q) - off[0] // (...) + b + j
        seq, start, q_ok = slot_tile_fanout(Q_OFF, KV_OFF, t, num_seqs, rows_q, rows_kv, GROUP * BLOCK_Q,
                                            SEARCH_STEPS)
        begin_q = tl.load(Q_OFF + seq)
        len_q = tl.load(Q_OFF + seq + 1) - begin_q
        q_slot0 = begin_q // BLOCK_Q - tl.load(Q_OFF) // BLOCK_Q + seq  # the pooling's Q slot of block 0
        i0 = start // BLOCK_Q
    slot_real = q_ok  # the slot is one of the batch's Q blocks (the KV side's checks follow)
    begin_k = tl.load(KV_OFF + seq)
    end_k = tl.load(KV_OFF + seq + 1)
    len_k = end_k - begin_k
    kv_slot0 = begin_k // BLOCK_KV - tl.load(KV_OFF) // BLOCK_KV + seq  # the sequence's first KV slot
    n_own = tl.minimum((len_k + BLOCK_KV - 1) // BLOCK_KV, n_kv_blocks)
    # KV blocks outside the KV slots (bad offsets) are never read
    q_ok = q_ok & (begin_k >= 0) & (len_k >= 0) & (end_k <= rows_kv) & (kv_slot0 >= 0) \
        & (kv_slot0 + n_own <= kv_slots)
    if WAIT:  # the pooled rows the select reads (bad offsets, q_ok false: none)
        if BROADCAST_Q:
            _await_slots(FLAGS_Q, i0, q_ok.to(tl.int32), target, q_limit)
        wait_lo = n_own * 0
        wait_hi = tl.where(q_ok, n_own, 0)
        if VISIBLE_RANGE:  # the K blocks _select_q_block reads (causal: those up to the diagonal, long pooled)
            d0 = i0 * BLOCK_Q + len_k - len_q
            d1 = tl.minimum((i0 + 1) * BLOCK_Q, len_q) - 1 + len_k - len_q
            wait_lo, wait_hi = _visible_range(d0, d1, wait_hi, window_left, right, BLOCK_KV, HAS_LEFT, HAS_RIGHT)
        _await_slots(FLAGS_K, kv_slot0 + wait_lo, wait_hi - wait_lo, target, limit)
    if GROUP == 1:
        if FILL > 0:
            _fill_row(Index, Count, seq, head, heads, i0, slot_real, q_ok, len_q, n_q_blocks, n_kv_blocks, stride_ib,
                      stride_ih, stride_iq, stride_cb, stride_ch, BLOCK_Q, HEADS)
        _select_q_block(PQ, PK, KEEP, Scores, Index, Count, t, head, heads, seq, i0, q_slot0, q_ok, len_q, len_k,
                        kv_slot0, n_own, n_q_blocks, stride_pqs, stride_pqh, stride_pks, stride_pkh, stride_ss,
                        stride_sh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, window_left, right, HEAD_DIM,
                        BLOCK_D, BLOCK_Q, BLOCK_KV, BLOCK_J, BLOCK_C, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL,
                        ROW_IN_REGISTERS, BLOCK_DC, VISIBLE_RANGE, SCORES, RADIX_WIDTH)
    else:
        for g in range(0, GROUP):  # a loop, not unrolled: unrolled, ptxas hoisted all rows' loads (248 registers)
            if FILL > 0:
                _fill_row(Index, Count, seq, head, heads, i0 + g, slot_real, q_ok, len_q, n_q_blocks, n_kv_blocks,
                          stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, BLOCK_Q, HEADS)
            _select_q_block(PQ, PK, KEEP, Scores, Index, Count, t, head, heads, seq, i0 + g, q_slot0, q_ok, len_q,
                            len_k, kv_slot0, n_own, n_q_blocks, stride_pqs, stride_pqh, stride_pks, stride_pkh,
                            stride_ss, stride_sh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, window_left,
                            right, HEAD_DIM, BLOCK_D, BLOCK_Q, BLOCK_KV, BLOCK_J, BLOCK_C, HAS_LEFT, HAS_RIGHT,
                            ALWAYS_LOCAL, ROW_IN_REGISTERS, BLOCK_DC, VISIBLE_RANGE, SCORES, RADIX_WIDTH)


@triton.jit
def _select_q_block(PQ, PK, KEEP, Scores, Index, Count, t, head, heads, seq, i, q_slot0, q_ok, len_q, len_k,
                    kv_slot0, n_own, n_q_blocks, stride_pqs, stride_pqh, stride_pks, stride_pkh, stride_ss, stride_sh,
                    stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, window_left, right,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                    BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    ALWAYS_LOCAL: tl.constexpr, ROW_IN_REGISTERS: tl.constexpr, BLOCK_DC: tl.constexpr,
                    VISIBLE_RANGE: tl.constexpr, SCORES: tl.constexpr, RADIX_WIDTH: tl.constexpr):
    """Q block i of sequence seq (pooled Q at slot q_slot0 + i): its Count and Index row (``block_select_kernel``;
    RADIX_WIDTH > 0: those of kv heads head .. head + SELECT_RADIX_HEADS - 1). Nothing when the block is not real
    (a length over max_seqlen_q, bad offsets, has no row in Index)."""
    if q_ok & (i < n_q_blocks) & (i * BLOCK_Q < len_q):
        d0 = i * BLOCK_Q + len_k - len_q
        d1 = tl.minimum((i + 1) * BLOCK_Q, len_q) - 1 + len_k - len_q
        local = tl.minimum(tl.maximum(d1, 0), tl.maximum(len_k - 1, 0)) // BLOCK_KV
        seq64 = seq.to(tl.int64)
        index_row = Index + seq64 * stride_ib + head * stride_ih + i * stride_iq
        count_ptr = Count + seq64 * stride_cb + head * stride_ch + i
        pq_row = PQ + (q_slot0 + i).to(tl.int64) * stride_pqs + head * stride_pqh
        lo = n_own * 0
        hi = n_own
        if VISIBLE_RANGE:
            lo, hi = _visible_range(d0, d1, n_own, window_left, right, BLOCK_KV, HAS_LEFT, HAS_RIGHT)
        if ROW_IN_REGISTERS:
            _select_row_in_registers(PK, pq_row, KEEP, index_row, count_ptr, kv_slot0, head, lo, hi, stride_pks,
                                     stride_pkh, d0, d1, local, len_k, window_left, right, HEAD_DIM, BLOCK_D,
                                     BLOCK_KV, BLOCK_J, BLOCK_C, BLOCK_DC, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, SCORES)
        elif RADIX_WIDTH > 0:
            _select_heads_radix(PK, pq_row, KEEP, Scores + t.to(tl.int64) * stride_ss + head * stride_sh, index_row,
                                count_ptr, kv_slot0, head, heads, lo, hi, stride_pks, stride_pkh, stride_pqh,
                                stride_sh, stride_ih, stride_ch, d0, d1, local, len_k, window_left, right, HEAD_DIM,
                                BLOCK_D, BLOCK_KV, BLOCK_J, BLOCK_DC, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, SCORES,
                                RADIX_WIDTH)
        else:
            _select_row_scratch(PK, pq_row, KEEP, Scores + t.to(tl.int64) * stride_ss + head * stride_sh,
                                index_row, count_ptr, kv_slot0, head, lo, hi, stride_pks, stride_pkh, d0, d1,
                                local, len_k, window_left, right, HEAD_DIM, BLOCK_D, BLOCK_KV, BLOCK_J, BLOCK_C,
                                BLOCK_DC, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, SCORES)


@triton.jit
def _await_slots(FLAGS, first, n, target, limit):
    """``KNOBS.sparse_select_overlap``: spin until the done-counters FLAGS[first .. first + n - 1] equal ``target``
    (acquire loads: the pooled rows their items stored are visible after), slots at or past ``limit`` (the waiting
    item's position: their items may not be taken yet) left out; then a barrier, so that every thread of the program
    reads after the waits of all (an acquire orders only its own thread's later loads)."""
    for c0 in range(0, loop_bound(n), WAIT_BLOCK):
        c = first + c0 + tl.arange(0, WAIT_BLOCK)
        pending = (c < first + n) & (c < limit)
        left = tl.sum(pending.to(tl.int32), 0)
        while left > 0:
            done = tl.atomic_add(FLAGS + c, tl.zeros([WAIT_BLOCK], tl.int32), mask=pending, sem="acquire")
            pending = pending & (done != target)
            left = tl.sum(pending.to(tl.int32), 0)
    tl.debug_barrier()


@triton.jit
def _signal_slot(FLAG):
    """``KNOBS.sparse_select_overlap``: a pool item's done (its slot's counter + 1, release), after a barrier: every
    thread's pooled stores come before the one thread's release (the barrier orders them within the program, the
    release makes them visible device-wide to an acquiring reader)."""
    tl.debug_barrier()
    tl.atomic_add(FLAG, 1, sem="release")


@triton.jit
def _items_before(p, qs, ks, ss, lag, hgp, hgs):
    """Work items at positions < p of ``block_select_overlap_kernel``'s order: position p holds slot p's Q pool items
    (hgp, p < qs), its K pool items (hgp, p < ks), then Q slot p - lag's select items (hgs, 0 <= p - lag < ss)."""
    return hgp * (tl.minimum(p, qs) + tl.minimum(p, ks)) + hgs * tl.minimum(tl.maximum(p - lag, 0), ss)


@triton.jit
def _safe_lag(Q_OFF, KV_OFF, kv_seqs, n_q_blocks, n_kv_blocks, limit, BLOCK_Q: tl.constexpr,
              BLOCK_KV: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """The smallest lag (in positions) that puts every select item after the pool items it reads: Q slot t of
    sequence b (t >= g_q(b); broadcast Q: select slot b * NQB + i reads Q slot i <= it) reads K slots g_k(b) ..
    g_k(b) + n_own(b) - 1, so lag >= g_k(b) + n_own(b) - g_q(b) over the sequences with Q rows and K rows, and >= 1
    (its own Q slot). Clamped to [1, limit] (limit = max(Q slots, K slots): every pool item first): bad offsets get
    some lag, and the waits' position bound keeps any lag deadlock-free."""
    lag = tl.full([], 1, tl.int32)
    q_base = tl.load(Q_OFF) // BLOCK_Q
    kv_base = tl.load(KV_OFF) // BLOCK_KV
    for b0 in range(0, loop_bound(kv_seqs), LAG_BLOCK):
        b = b0 + tl.arange(0, LAG_BLOCK)
        ok = b < kv_seqs
        k0 = tl.load(KV_OFF + b, mask=ok, other=0)
        len_k = tl.load(KV_OFF + b + 1, mask=ok, other=0) - k0
        n_own = tl.minimum((len_k + BLOCK_KV - 1) // BLOCK_KV, n_kv_blocks)
        g_k = k0 // BLOCK_KV - kv_base + b
        if BROADCAST_Q:
            g_q = b * n_q_blocks
            has_q = ok & (tl.load(Q_OFF + 1) > tl.load(Q_OFF))
        else:
            q0 = tl.load(Q_OFF + b, mask=ok, other=0)
            g_q = q0 // BLOCK_Q - q_base + b
            has_q = ok & (tl.load(Q_OFF + b + 1, mask=ok, other=0) > q0)
        # a sequence with no K rows (n_own 0) reads no K slot: its own Q slot (lag 1) is all it needs
        lag = tl.maximum(lag, tl.max(tl.where(has_q & (n_own > 0), g_k + n_own - g_q, 1), 0))
    return tl.minimum(lag, limit)


@triton.jit
def _order_table(Q_OFF, KV_OFF, TABLE, kv_seqs, qs, ks, n_kv_blocks, limit, BLOCK_Q: tl.constexpr,
                 BLOCK_KV: tl.constexpr):
    """``KNOBS.sparse_select_overlap_tail``: (lag, ordered) of the longest-first order, computed by ticket 0's
    program. Positions take sequences in rank order: sequence 0 first (its Q slot 0 holds the check's flag, which
    the fill items, tickets right after slot 0's pool items, wait on), then the others by K slots (its blocks + the
    padding slot) descending, ties by index; within a sequence its slots in order, Q and K sides each packed from
    position 0 (P_q(b), P_k(b): the slot counts of the sequences ranked before b), the slots past the last
    sequence at their own position. TABLE (int32 [4, ORDER_BLOCK]) by rank: P_q, the first Q slot, P_k, the first
    K slot; rank B holds the end (slot g(B) at position g(B)), ranks past it a position no item reaches. lag: the
    smallest that puts every select item after its reads (Q slot t of b at position P_q(b) + i reads K positions
    P_k(b) .. P_k(b) + n_own(b) - 1: lag >= P_k(b) + n_own(b) - P_q(b)), >= 1, <= limit. ordered is 0 (TABLE
    unwritten, the slot order kept) for B >= ORDER_BLOCK or when a sequence's slot count is < 1 or the slots overrun
    the capacity (bad offsets): with counts >= 1 the ranks' slot ranges tile [0, g(B)), so every position maps to
    one slot and each slot's pooling finds the sequence the table names (the K limit's premise)."""
    b = tl.arange(0, ORDER_BLOCK)
    few = b * 0 + kv_seqs < ORDER_BLOCK
    ok = (b < kv_seqs) & few
    q0 = tl.load(Q_OFF + b, mask=b <= kv_seqs, other=0)
    k0 = tl.load(KV_OFF + b, mask=b <= kv_seqs, other=0)
    q1 = tl.load(Q_OFF + b + 1, mask=ok, other=0)
    k1 = tl.load(KV_OFF + b + 1, mask=ok, other=0)
    q_base = tl.load(Q_OFF) // BLOCK_Q
    kv_base = tl.load(KV_OFF) // BLOCK_KV
    g_q = q0 // BLOCK_Q - q_base + b  # b = B: the first slot past the batch
    g_k = k0 // BLOCK_KV - kv_base + b
    c_q = tl.where(ok, q1 // BLOCK_Q - q_base + b + 1 - g_q, 0)
    c_k = tl.where(ok, k1 // BLOCK_KV - kv_base + b + 1 - g_k, 0)
    end_q = tl.sum(tl.where(b == kv_seqs, g_q, 0), 0)
    end_k = tl.sum(tl.where(b == kv_seqs, g_k, 0), 0)
    ordered = (tl.min(tl.where(ok, tl.minimum(c_q, c_k), 1), 0) >= 1) & (tl.max(few.to(tl.int32), 0) != 0) \
        & (end_q <= qs) & (end_k <= ks)
    # the ranks and positions by [64, ORDER_STEP] tiles in a loop, the step's entries picked out of the registers
    # (one [64, 64] compare held 128 registers a thread on sm_90: the kernel's 7 programs per SM down to 4)
    rank = tl.zeros([ORDER_BLOCK], tl.int32)
    for c0 in range(0, ORDER_BLOCK, ORDER_STEP):
        c = c0 + tl.arange(0, ORDER_STEP)
        key_c = tl.sum(tl.where(b[:, None] == c[None, :], c_k[:, None], 0), 0)
        beats = ((c != 0) & (c < kv_seqs))[None, :] & ((key_c[None, :] > c_k[:, None]) | (
            (key_c[None, :] == c_k[:, None]) & (c[None, :] < b[:, None])))
        rank += tl.sum(beats.to(tl.int32), 1)
    rank = tl.where(b == 0, 0, 1 + rank)
    p_q = tl.zeros([ORDER_BLOCK], tl.int32)  # the slots of the sequences ranked before (c_q, c_k: 0 past B)
    p_k = tl.zeros([ORDER_BLOCK], tl.int32)
    for c0 in range(0, ORDER_BLOCK, ORDER_STEP):
        c = c0 + tl.arange(0, ORDER_STEP)
        pick = b[:, None] == c[None, :]
        before = tl.sum(tl.where(pick, rank[:, None], 0), 0)[None, :] < rank[:, None]
        p_q += tl.sum(tl.where(before, tl.sum(tl.where(pick, c_q[:, None], 0), 0)[None, :], 0), 1)
        p_k += tl.sum(tl.where(before, tl.sum(tl.where(pick, c_k[:, None], 0), 0)[None, :], 0), 1)
    n_own = tl.minimum((k1 - k0 + BLOCK_KV - 1) // BLOCK_KV, n_kv_blocks)
    has_q = ok & (q1 > q0)
    need = tl.where(n_own > 0, p_k + n_own - p_q, 1)  # no K slot read: only its own Q slot (lag 1)
    lag = tl.minimum(tl.maximum(tl.max(tl.where(has_q, need, 1), 0), 1), limit)
    if ordered:
        tl.store(TABLE + rank, p_q, mask=ok)
        tl.store(TABLE + ORDER_BLOCK + rank, g_q, mask=ok)
        tl.store(TABLE + 2 * ORDER_BLOCK + rank, p_k, mask=ok)
        tl.store(TABLE + 3 * ORDER_BLOCK + rank, g_k, mask=ok)
        past = b >= kv_seqs
        tl.store(TABLE + b, tl.where(b == kv_seqs, end_q, ORDER_NEVER), mask=past)
        tl.store(TABLE + ORDER_BLOCK + b, end_q + b * 0, mask=past)
        tl.store(TABLE + 2 * ORDER_BLOCK + b, tl.where(b == kv_seqs, end_k, ORDER_NEVER), mask=past)
        tl.store(TABLE + 3 * ORDER_BLOCK + b, end_k + b * 0, mask=past)
    return lag, ordered.to(tl.int32)


@triton.jit
def _slot_at(TABLE, p):
    """``KNOBS.sparse_select_overlap_tail``: (the slot at position p of one side's order, its rank) from the side's
    TABLE rows (positions, first slots): one load of each row, a count and two picks."""
    r = tl.arange(0, ORDER_BLOCK)
    first = tl.load(TABLE + r)
    at = tl.sum((first <= p).to(tl.int32), 0) - 1  # positions rise with the rank: the last one <= p
    start = tl.sum(tl.where(r == at, first, 0), 0)
    slot0 = tl.sum(tl.where(r == at, tl.load(TABLE + ORDER_BLOCK + r), 0), 0)
    return slot0 + p - start, at


@triton.jit(do_not_specialize=["num_seqs", "kv_seqs", "search_steps", "kv_search_steps", "rows", "kv_rows", "max_s",
                               "max_o", "heads", "group", "q_programs", "n_kv_blocks", "window_left", "right",
                               "n_q_blocks", "kv_slots", "rows_kv", "rows_q", "select_slots", "fills"])
def block_select_overlap_kernel(X, OFF, Pooled, XK, KV_OFF, PooledK, SLOT_SEQ, FLAG, KEEP, PQ, PK, Q_OFF, Q_SLOT_SEQ,
                                Scores, Index, Count, STATE, FLAGS, num_seqs, kv_seqs, search_steps,
                                kv_search_steps, rows, kv_rows, max_s, max_o, heads, group, q_programs, n_kv_blocks,
                                window_left, right, n_q_blocks, kv_slots, rows_kv, rows_q, select_slots, fills,
                                stride_xt, stride_xh, stride_ps, stride_ph, stride_kt, stride_kh, stride_pks,
                                stride_pkh, stride_pqs, stride_pqh, stride_ss, stride_sh, stride_ib, stride_ih,
                                stride_iq, stride_cb, stride_ch, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK: tl.constexpr, BLOCK_KV: tl.constexpr, ROWS: tl.constexpr, CHECK: tl.constexpr,
                                SEARCH_STEPS: tl.constexpr, KV_SEARCH_STEPS: tl.constexpr,
                                WHOLE_BLOCK: tl.constexpr, KV_WHOLE_BLOCK: tl.constexpr, HEADS: tl.constexpr,
                                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALWAYS_LOCAL: tl.constexpr,
                                BLOCK_Q: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr,
                                BROADCAST_Q: tl.constexpr, ROW_IN_REGISTERS: tl.constexpr, BLOCK_DC: tl.constexpr,
                                VISIBLE_RANGE: tl.constexpr, GROUP: tl.constexpr, SEL_SEARCH_STEPS: tl.constexpr,
                                SCORES: tl.constexpr, RADIX_WIDTH: tl.constexpr, SEL_HEADS: tl.constexpr,
                                FILL: tl.constexpr, SKIP: tl.constexpr, ORDER: tl.constexpr):
    """``KNOBS.sparse_select_overlap``: the pooling (``block_pool_pair_kernel``, SKIP: ``..._skip_kernel``) and the
    select (``block_select_kernel``, FILL > 0, GROUP 1) in one launch. A program takes its work item by ticket
    (STATE[0], zeroed per call like the counters), not by program id, so an item waits only on items with earlier
    tickets, which running programs hold: no deadlock whatever order the hardware starts programs in. Ticket order:
    Q slot 0's pool items, the past-the-end fill items (``fills``; FILL 2 reads the check's flag that Q slot 0's
    pooling stores), then positions p = 0, 1, ... (``_items_before``): position p's Q and K pool items, then the
    select items of the Q slot at position p - lag. Each pool item adds 1 to its slot's counter in FLAGS (Q slots,
    then K slots from FLAGS + q slots) after its stores (``_signal_slot``); a select item waits (``_await_slots``)
    until its Q slot's and its sequence's K slots' counters read the pool items per slot, slots at or past its own
    position left out. Positions are slots (ORDER 0, or no valid table) or ``_order_table``'s longest-first order
    (ORDER: ``KNOBS.sparse_select_overlap_tail``; the table after the counters in FLAGS). lag: the smallest that
    puts the slots a select item reads at earlier positions (``_safe_lag`` / ``_order_table``, from the offsets:
    the bench's batch NKB), found by ticket 0's program and published in STATE[1] (ordered << 32 | lag, release;
    lag >= 1, so 0 means not yet); the others read it (acquire) before they map their tickets."""
    hgp = (heads + HEADS - 1) // HEADS  # pool items per slot
    hgs = (heads + SEL_HEADS - 1) // SEL_HEADS  # select items per Q slot
    qs = q_programs // hgp
    ks = kv_slots
    ticket = tl.atomic_add(STATE, 1, sem="acq_rel").to(tl.int32)
    target = hgp  # a slot's counter once its pool items are done
    FLAGS_K = FLAGS + qs
    TABLE = FLAGS + qs + ks  # ORDER: _order_table's rows (Q positions, Q slots, K positions, K slots)
    is_fill = (ticket >= hgp) & (ticket < hgp + fills)
    lag = ticket * 0
    ordered = ticket * 0
    if ticket == 0:
        lag = _safe_lag(Q_OFF, KV_OFF, kv_seqs, n_q_blocks, n_kv_blocks, tl.maximum(qs, ks), BLOCK_Q, BLOCK_KV,
                        BROADCAST_Q)
        if ORDER:
            order_lag, ordered = _order_table(Q_OFF, KV_OFF, TABLE, kv_seqs, qs, ks, n_kv_blocks,
                                              tl.maximum(qs, ks), BLOCK_Q, BLOCK_KV)
            lag = tl.where(ordered != 0, order_lag, lag)
            tl.debug_barrier()  # every thread's table stores before the one thread's release below
        tl.atomic_xchg(STATE + 1, (ordered.to(tl.int64) << 32) | lag.to(tl.int64), sem="release")
    elif not is_fill:  # ticket 0 was taken first: its program runs, and publishes without waiting on anything
        published = tl.atomic_add(STATE + 1, tl.zeros([], tl.int64), sem="acquire")
        while published == 0:
            published = tl.atomic_add(STATE + 1, tl.zeros([], tl.int64), sem="acquire")
        lag = (published & 0xFFFFFFFF).to(tl.int32)
        ordered = (published >> 32).to(tl.int32)
        if ORDER:
            tl.debug_barrier()  # the table is read by every thread after the one thread's acquire
    if is_fill:  # a past-the-end fill item (the select kernel's grid's last ones)
        _select_program(select_slots * hgs + ticket - hgp, PQ, PK, Q_OFF, KV_OFF, Q_SLOT_SEQ, KEEP, Scores, Index,
                        Count, n_q_blocks, n_kv_blocks, kv_slots, rows_kv, heads, num_seqs, rows_q, stride_pqs,
                        stride_pqh, stride_pks, stride_pkh, stride_ss, stride_sh, stride_ib, stride_ih, stride_iq,
                        stride_cb, stride_ch, window_left, right, HEAD_DIM, BLOCK_D, BLOCK_Q, BLOCK_KV, BLOCK_J,
                        BLOCK_C, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, BROADCAST_Q, ROW_IN_REGISTERS, BLOCK_DC,
                        VISIBLE_RANGE, GROUP, SEL_SEARCH_STEPS, SCORES, RADIX_WIDTH, SEL_HEADS, FILL, True, FLAGS,
                        FLAGS_K, target, 1, 1)
    else:
        item = tl.where(ticket < hgp, ticket, ticket - fills)
        lo = item * 0  # the item's position: the last p with _items_before(p) <= item (a search, no loads)
        hi = tl.maximum(tl.maximum(qs, ks), lag + select_slots)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            below = _items_before(mid, qs, ks, select_slots, lag, hgp, hgs) <= item
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        p = lo
        r = item - _items_before(p, qs, ks, select_slots, lag, hgp, hgs)
        if (p < qs) & (r < hgp):  # position p's Q slot's pooling, kv heads from r * HEADS
            t = p
            if ORDER:
                if ordered != 0:
                    t = _slot_at(TABLE, p)[0]
            if SKIP:
                _pool_skip_q_program(X, OFF, Pooled, KV_OFF, SLOT_SEQ, FLAG, KEEP, t * hgp + r, num_seqs, kv_seqs,
                                     search_steps, rows, kv_rows, max_s, max_o, heads, group, n_kv_blocks,
                                     window_left, right, stride_xt, stride_xh, stride_ps, stride_ph, HEAD_DIM,
                                     BLOCK_D, BLOCK, BLOCK_KV, ROWS, CHECK, SEARCH_STEPS, WHOLE_BLOCK, HEADS,
                                     HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL)
            else:
                _pool_program(X, OFF, KV_OFF, Pooled, SLOT_SEQ, FLAG, t * hgp + r, num_seqs, kv_seqs, search_steps,
                              rows, kv_rows, max_s, max_o, heads, group, stride_xt, stride_xh, stride_ps, stride_ph,
                              HEAD_DIM, BLOCK_D, BLOCK, ROWS, True, CHECK, SEARCH_STEPS, WHOLE_BLOCK, HEADS)
            _signal_slot(FLAGS + t)
        else:
            r -= tl.where(p < qs, hgp, 0)
            if (p < ks) & (r < hgp):  # position p's K slot's pooling
                t = p
                if ORDER:
                    if ordered != 0:
                        t = _slot_at(TABLE + 2 * ORDER_BLOCK, p)[0]
                _pool_program(XK, KV_OFF, KV_OFF, PooledK, SLOT_SEQ, FLAG, t * hgp + r, kv_seqs, kv_seqs,
                              kv_search_steps, kv_rows, kv_rows, max_o, max_o, heads, 1, stride_kt, stride_kh,
                              stride_pks, stride_pkh, HEAD_DIM, BLOCK_D, BLOCK_KV, ROWS, False, False,
                              KV_SEARCH_STEPS, KV_WHOLE_BLOCK, HEADS)
                _signal_slot(FLAGS_K + t)
            else:  # the select of position p - lag's Q slot, kv heads from (r - its pool items) * SEL_HEADS
                r -= tl.where(p < ks, hgp, 0)
                t = p - lag
                limit = p  # in slot order a slot's position is its number
                q_limit = p
                if ORDER:
                    if ordered != 0:  # Q slot t: at p - lag < p; its sequence's K slots: those at positions < p
                        t, at = _slot_at(TABLE, p - lag)
                        q_limit = t + 1
                        limit = tl.load(TABLE + 3 * ORDER_BLOCK + at) + p - tl.load(TABLE + 2 * ORDER_BLOCK + at)
                _select_program(t * hgs + r, PQ, PK, Q_OFF, KV_OFF, Q_SLOT_SEQ, KEEP, Scores, Index, Count,
                                n_q_blocks, n_kv_blocks, kv_slots, rows_kv, heads, num_seqs, rows_q, stride_pqs,
                                stride_pqh, stride_pks, stride_pkh, stride_ss, stride_sh, stride_ib, stride_ih,
                                stride_iq, stride_cb, stride_ch, window_left, right, HEAD_DIM, BLOCK_D, BLOCK_Q,
                                BLOCK_KV, BLOCK_J, BLOCK_C, HAS_LEFT, HAS_RIGHT, ALWAYS_LOCAL, BROADCAST_Q,
                                ROW_IN_REGISTERS, BLOCK_DC, VISIBLE_RANGE, GROUP, SEL_SEARCH_STEPS, SCORES,
                                RADIX_WIDTH, SEL_HEADS, FILL, True, FLAGS, FLAGS_K, target, limit, q_limit)


def score_kind() -> int:
    """The scores' arithmetic (``_exact_dot``): fp64, or with ``KNOBS.sparse_select_fp32_rn`` fp32 (mul.rn products on
    the device, plain ones under the interpreter)."""
    if not KNOBS.sparse_select_fp32_rn:
        return SCORES_FP64.value
    return (SCORES_FP32 if interpreting() else SCORES_FP32_RN).value


def select_radix_width(n_kv_blocks: int) -> int:
    """The select kernel's RADIX_WIDTH: ``KNOBS.sparse_select_radix``'s row width (a power of two >= 16) where a row of
    n_kv_blocks fits ``SELECT_RADIX_MAX``, else 0 (the pairwise rank)."""
    if not KNOBS.sparse_select_radix or n_kv_blocks > SELECT_RADIX_MAX:
        return 0
    return max(16, triton.next_power_of_2(n_kv_blocks))


def pool_whole_block(block: int, block_d: int) -> bool:
    """``KNOBS.sparse_pool_whole_block`` where a block's [block, D] tile fits a program's registers (<= 128 x 128)."""
    return KNOBS.sparse_pool_whole_block and block * block_d <= POOL_WHOLE_BLOCK_MAX


def _pool_launches(q, k, pooled_q, pooled_k, check: bool, q_seqs, num_seqs, max_q, params, heads_kv, hd) -> list:
    """The pooling's launches (``_Launch``): ``block_pool_kernel`` once per side, or both sides in one
    ``block_pool_pair_kernel`` launch (``KNOBS.sparse_pool_one_launch``); ``KNOBS.sparse_pool_stream``:
    POOL_STREAM_HEADS kv heads per program. Q's side writes q_slot_seq and (``check``) the offsets check's flag."""
    heads = POOL_STREAM_HEADS if KNOBS.sparse_pool_stream else 1
    sides = []
    for x, off, pooled, seqs, block, group, max_s in (
            (q, "q_off", pooled_q, q_seqs, params.block_q, q.shape[1] // heads_kv, max_q),
            (k, "kv_off", pooled_k, num_seqs, params.block_kv, 1, params.max_seqlen_kv)):
        sides.append(dict(
            num_seqs=seqs, search_steps=binary_search_steps(seqs), rows=x.shape[0],
            max_s=max_s, group=group, stride_xt=x.stride(0), stride_xh=x.stride(1), stride_ps=pooled.stride(0),
            stride_ph=pooled.stride(1), BLOCK=block,
            SEARCH_STEPS=fanout_search_steps(seqs) if KNOBS.sparse_pool_fanout else 0,
            WHOLE_BLOCK=heads == 1 and pool_whole_block(block, hd["BLOCK_D"]),
            programs=pooled.shape[0] * -(-heads_kv // heads)))
    common = dict(heads=heads_kv, HEAD_DIM=hd["HEAD_DIM"], BLOCK_D=hd["BLOCK_D"], ROWS=POOL_ROWS, CHECK=check,
                  HEADS=heads)
    flag = "flag" if check else "q_slot_seq"
    options = dict(num_warps=4, num_stages=1)
    q_side, k_side = sides
    if KNOBS.sparse_pool_one_launch:
        q_programs = q_side.pop("programs")
        static = dict(
            **q_side, kv_seqs=k_side["num_seqs"], kv_search_steps=k_side["search_steps"], kv_rows=k_side["rows"],
            max_o=k_side["max_s"], q_programs=q_programs, stride_kt=k_side["stride_xt"],
            stride_kh=k_side["stride_xh"], stride_pks=k_side["stride_ps"], stride_pkh=k_side["stride_ph"],
            BLOCK_KV=k_side["BLOCK"], KV_SEARCH_STEPS=k_side["SEARCH_STEPS"], KV_WHOLE_BLOCK=k_side["WHOLE_BLOCK"],
            **common)
        tensors = dict(X="q", OFF="q_off", Pooled="pooled_q", XK="k", KV_OFF="kv_off", PooledK="pooled_k",
                       SLOT_SEQ="q_slot_seq", FLAG=flag)
        kernel = block_pool_pair_kernel
        # KNOBS.sparse_pool_skip: on the streaming one-launch pooling (the default's), not for a broadcast Q (its
        # blocks serve every sequence's rows)
        if KNOBS.sparse_pool_skip and heads > 1 and not params.broadcast_q:
            has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left,
                                                                    params.window_right)
            kernel = block_pool_pair_skip_kernel
            static.update(n_kv_blocks=params.n_kv_blocks, window_left=window_left, right=right, HAS_LEFT=has_left,
                          HAS_RIGHT=has_right, ALWAYS_LOCAL=params.always_local)
            tensors["KEEP"] = "keep"
        return [_Launch(kernel, (q_programs + k_side["programs"],), static, tensors, options)]
    out = []
    for side, x, off, pooled, first in ((q_side, "q", "q_off", "pooled_q", True),
                                        (k_side, "k", "kv_off", "pooled_k", False)):
        programs = side.pop("programs")
        static = dict(**side, other_seqs=num_seqs, other_rows=k.shape[0], max_o=params.max_seqlen_kv,
                      WRITE_SEQ=first, **{**common, "CHECK": first and check})
        tensors = dict(X=x, OFF=off, Pooled=pooled, OTHER_OFF="kv_off", SLOT_SEQ="q_slot_seq", FLAG=flag)
        out.append(_Launch(block_pool_kernel, (programs,), static, tensors, options))
    return out


# block_select_overlap_kernel's names for the select's constexprs that the pooling has too (its own values)
OVERLAP_SELECT_RENAMES = {"SEARCH_STEPS": "SEL_SEARCH_STEPS", "HEADS": "SEL_HEADS"}


def _overlap_launch(pool: "_Launch", select: "_Launch", fills: int, order: bool = False) -> "_Launch":
    """``KNOBS.sparse_select_overlap``: the pair pooling's launch (``block_pool_pair_kernel`` or its skip kernel) and
    the select's (FILL > 0, GROUP 1) as one ``block_select_overlap_kernel`` launch: their arguments merged (the
    select's SEARCH_STEPS and HEADS renamed: the pooling has its own), one program per work item of both grids.
    order: ``KNOBS.sparse_select_overlap_tail``'s longest-first order (ORDER)."""
    static = dict(pool.static)
    for name, value in select.static.items():
        name = OVERLAP_SELECT_RENAMES.get(name, name)
        assert static.setdefault(name, value) == value, name  # shared names mean the same value
    tensors = dict(pool.tensors)
    for name, source in select.tensors.items():
        assert tensors.setdefault(name, source) == source, name
    tensors.update(STATE="overlap_state", FLAGS="overlap_flags")
    select_slots = (select.grid[0] - fills) // -(-static["heads"] // static["SEL_HEADS"])  # per select item
    static.update(select_slots=select_slots, fills=fills, SKIP=pool.kernel is block_pool_pair_skip_kernel,
                  ORDER=order)
    return _Launch(block_select_overlap_kernel, (pool.grid[0] + select.grid[0],), static, tensors, pool.options)


@shape_constant
def _keep_table(n_kv_blocks: int, keep_ratio: float, top_k: int, device: torch.device) -> torch.Tensor:
    """keep[n] for n visible blocks (the float64 rule of ``meta_kernels.keep_count``), once per shape."""
    visible = torch.arange(n_kv_blocks + 1, dtype=torch.int32, device=device)
    return meta_kernels.keep_count(visible, keep_ratio, top_k).to(torch.int32)


class _Strided:
    """A contiguous tensor's ``shape`` and ``stride()`` without the tensor (sizes may be symbolic while traced)."""

    def __init__(self, shape):
        self.shape, strides = tuple(shape), [1]
        for size in reversed(self.shape[1:]):
            strides.insert(0, strides[0] * size)
        self._strides = tuple(strides)

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]


class _Launch(NamedTuple):
    """One launch of a selection: its kernel, grid, the arguments its call signature fixes (``static``), the tensor
    arguments by the name of the call's tensor they take (``tensors``: parameter -> ``_Layout.run`` name)."""
    kernel: object
    grid: tuple
    static: dict
    tensors: dict
    options: dict


class _Layout:
    """What a selection's call signature fixes (``_layout_key``): the scratch tensors' shapes and every launch's
    grid and non-tensor arguments. ``run`` allocates the outputs and scratch, launches, and asserts the check."""

    __slots__ = ("key", "plan_id", "index_shape", "count_shape", "pooled_q_shape", "pooled_k_shape", "scores_shape",
                 "scores_dtype", "check", "launches", "keep", "broadcast_offsets", "fill", "overlap_flags")

    def __init__(self, key, q, k, num_seqs: int, params: BlockSelectParams):
        heads_kv, head_dim = k.shape[1], q.shape[2]
        self.key, self.plan_id = key, next(_PLAN_IDS)
        n_q, n_kv = params.n_q_blocks, params.n_kv_blocks
        self.count_shape = (num_seqs, heads_kv, n_q)
        self.index_shape = self.count_shape + (n_kv,)
        # read-only tensors of the shape (``shape_constant``): kept, so that a call captured in a CUDA graph reads
        # them instead of rebuilding them inside the graph (the keep table: ~5 small kernels; ``_READ_BY_GRAPHS``)
        self.keep = _keep_table(n_kv, params.keep_ratio, params.top_k, q.device)
        self.check = params.check_offsets
        # the one Q sequence [0, L_q] (an arange: no host copy)
        self.broadcast_offsets = _broadcast_offsets(q.shape[0], q.device) if params.broadcast_q else None
        q_seqs, max_q = (1, -1) if params.broadcast_q else (num_seqs, params.max_seqlen_q)
        q_slots = capacity_of(q.shape[0], params.block_q, q_seqs)
        kv_slots = capacity_of(k.shape[0], params.block_kv, num_seqs)
        select_slots = num_seqs * n_q if params.broadcast_q else q_slots  # the select kernel's programs per head
        self.pooled_q_shape = (q_slots, heads_kv, head_dim)
        self.pooled_k_shape = (kv_slots, heads_kv, head_dim)
        hd = head_dim_consts(head_dim)
        pooled_q, pooled_k = _Strided(self.pooled_q_shape), _Strided(self.pooled_k_shape)  # shapes, strides only
        self.launches = _pool_launches(q, k, pooled_q, pooled_k, self.check, q_seqs, num_seqs, max_q, params,
                                       heads_kv, hd)
        block_c = min(SELECT_BLOCK_C, triton.next_power_of_2(n_kv))
        # every row fits one register vector
        in_registers = (KNOBS.sparse_select_rows or KNOBS.sparse_select_grouped) and n_kv <= block_c
        group = SELECT_GROUP if KNOBS.sparse_select_grouped and in_registers else 1
        if group > 1:  # programs per head: a group of Q blocks each (select_slots counts one Q block each)
            select_slots = num_seqs * -(-n_q // group) if params.broadcast_q else capacity_of(
                q.shape[0], params.block_q * group, q_seqs)
        score_mode = score_kind()
        radix_width = select_radix_width(n_kv) if not in_registers else 0
        select_heads = SELECT_RADIX_HEADS.value if radix_width else 1  # kv heads per select program
        self.scores_shape = None if in_registers else (select_slots, heads_kv, n_kv)
        self.scores_dtype = torch.float64 if score_mode == SCORES_FP64.value else torch.float32
        scores = pooled_q if in_registers else _Strided(self.scores_shape)
        index_strides, count_strides = _Strided(self.index_shape).stride(), _Strided(self.count_shape).stride()
        has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left,
                                                                params.window_right)
        # KNOBS.sparse_select_overlap: the pooling and the select in one launch (the pair pooling, ungrouped select)
        overlap = KNOBS.sparse_select_overlap and KNOBS.sparse_pool_one_launch and group == 1
        # KNOBS.sparse_select_fill (or the overlap): the select launch writes the whole outputs (no fills); 2: it
        # reads the check's flag
        fill = KNOBS.sparse_select_fill or overlap
        self.fill = 0 if not fill else 2 if self.check and not params.broadcast_q else 1
        static = dict(
            n_q_blocks=n_q, n_kv_blocks=n_kv, kv_slots=kv_slots, rows_kv=k.shape[0], heads=heads_kv,
            num_seqs=q_seqs, rows_q=q.shape[0], stride_pqs=pooled_q.stride(0), stride_pqh=pooled_q.stride(1),
            stride_pks=pooled_k.stride(0), stride_pkh=pooled_k.stride(1), stride_ss=scores.stride(0),
            stride_sh=scores.stride(1), stride_ib=index_strides[0], stride_ih=index_strides[1],
            stride_iq=index_strides[2], stride_cb=count_strides[0], stride_ch=count_strides[1],
            window_left=window_left, right=right, HEAD_DIM=hd["HEAD_DIM"], BLOCK_D=hd["BLOCK_D"],
            BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv, BLOCK_J=min(SELECT_BLOCK_J, block_c), BLOCK_C=block_c,
            HAS_LEFT=has_left, HAS_RIGHT=has_right, ALWAYS_LOCAL=params.always_local,
            BROADCAST_Q=params.broadcast_q, ROW_IN_REGISTERS=in_registers,
            BLOCK_DC=min(SELECT_BLOCK_DC, hd["BLOCK_D"]), VISIBLE_RANGE=KNOBS.sparse_select_visible, GROUP=group,
            SEARCH_STEPS=fanout_search_steps(q_seqs) if group > 1 and not params.broadcast_q else 0,
            SCORES=score_mode, RADIX_WIDTH=radix_width, HEADS=select_heads, FILL=self.fill)
        tensors = dict(PQ="pooled_q", PK="pooled_k", Q_OFF="q_off", KV_OFF="kv_off", Q_SLOT_SEQ="q_slot_seq",
                       KEEP="keep", Scores="pooled_q" if in_registers else "scores", Index="index", Count="count")
        grid = (select_slots * -(-heads_kv // select_heads),)
        if self.fill and not params.broadcast_q:  # then one program per (sequence, kv head): rows past its end
            grid = (grid[0] + num_seqs * heads_kv,)
        self.launches.append(_Launch(block_select_kernel, grid, static, tensors, dict(num_warps=4, num_stages=1)))
        self.overlap_flags = 0
        if overlap:  # the done-counters: one per Q slot, then one per K slot
            fills = num_seqs * heads_kv if self.fill and not params.broadcast_q else 0
            # KNOBS.sparse_select_overlap_tail: the longest-first order (not broadcast Q: its select slots are not
            # its Q slots), its table after the counters
            order = KNOBS.sparse_select_overlap_tail and not params.broadcast_q
            self.launches = [_overlap_launch(*self.launches, fills, order)]
            self.overlap_flags = q_slots + kv_slots + (4 * ORDER_BLOCK.value if order else 0)

    def run(self, q, k, q_offsets, kv_offsets):
        """(index, count) of one call: allocations, the offsets as the kernels read them, the launches (through
        their plans when the signature has a key), the check's assert."""
        device = q.device
        if self.fill:  # the select launch writes every element
            index = torch.empty(self.index_shape, dtype=meta_kernels.INDEX_DTYPE, device=device)
            count = torch.empty(self.count_shape, dtype=meta_kernels.INDEX_DTYPE, device=device)
        else:
            index = torch.full(self.index_shape, -1, dtype=meta_kernels.INDEX_DTYPE, device=device)
            count = torch.zeros(self.count_shape, dtype=meta_kernels.INDEX_DTYPE, device=device)
        kv_off = int32_offsets(kv_offsets, checked=self.check)
        if self.broadcast_offsets is not None:
            q_off = self.broadcast_offsets
        else:
            q_off = int32_offsets(q_offsets, same_as=(kv_offsets, kv_off), checked=self.check)
        pooled_q = torch.empty(self.pooled_q_shape, dtype=torch.float32, device=device)
        q_slots = self.pooled_q_shape[0]
        # fill 2: the check's flag after the slots' sequences, where the select kernel finds it (no argument more)
        q_slot_seq = torch.empty((q_slots + (self.fill == 2),), dtype=torch.int32, device=device)
        flag = None
        if self.check:
            flag = q_slot_seq[q_slots:] if self.fill == 2 else torch.empty((1,), dtype=torch.int32, device=device)
        state = flags = None
        if self.overlap_flags:  # the ticket, lag word and done-counters, zeroed per call (stream-ordered like every
            # output; the kernel relies on it: tickets from 0, lag word 0 until published, counters from 0): a kept,
            # self-resetting copy per layout saved the two memsets (~4 us) but let two launches share it (a graph
            # replayed on one stream while its layout runs eagerly on another), where spinning programs could wait
            # on another launch's tickets (lead, stop 46)
            state, flags = (torch.zeros((2,), dtype=torch.int64, device=device),
                            torch.zeros((self.overlap_flags,), dtype=torch.int32, device=device))
        sources = dict(
            q=q, k=k, q_off=q_off, kv_off=kv_off, pooled_q=pooled_q, overlap_state=state, overlap_flags=flags,
            pooled_k=torch.empty(self.pooled_k_shape, dtype=torch.float32, device=device),
            q_slot_seq=q_slot_seq, flag=flag,
            keep=self.keep, index=index, count=count,
            scores=None if self.scores_shape is None else torch.empty(self.scores_shape, dtype=self.scores_dtype,
                                                                      device=device))
        for n, (kernel, grid, static, tensors, options) in enumerate(self.launches):
            dynamic = {name: sources[source] for name, source in tensors.items()}
            if self.key is None:
                launch(kernel, grid, {**static, **dynamic}, **options)
            else:  # every static value follows from the layout (its id: hashing the key again cost ~2 us a launch)
                launch_planned(kernel, (self.plan_id, n), grid, dynamic, lambda static=static: static, **options)
            # the pooling holds the check: asserted before select (after the one launch of the overlap)
            if n == max(len(self.launches) - 2, 0) and self.check:
                validation.device_flag(sources["flag"], validation.validation_mode(device))
        return index, count


# Layouts per call signature. Why: a selection's host path derived ~45 launch arguments, grids and shapes per call
# (~50 of its ~85 us on CPU with launches stubbed: bench/NOTES.md "selection host path, helper selshare, stop 28"),
# all fixed by the key: the params, q's and k's shapes and strides, the device, the offsets' dtypes and shapes
# and whether both sides pass one tensor, the knobs' generation (configs.Knobs) and the interpreter switch. Kept
# only under ``KNOBS.sparse_select_layouts`` where launches go through plans (``launch.replays_enabled``: not traced,
# not interpreted).
_LAYOUTS: dict = {}
_PLAN_IDS = itertools.count()  # a layout's launches' plan keys: (its id, launch number)
_LAYOUTS_MAX = 256  # a bound, not a tuning (signatures hold row counts, which vary per batch)
launch_module.CLEAR_HOOKS.append(_LAYOUTS.clear)
# Layouts a CUDA graph capture read (id -> layout), never dropped: the graph reads their keep table and broadcast
# offsets on every replay (rather than ~5 small kernels of its own), also after ``_LAYOUTS`` and the per-shape cache
# let go of them (then freed memory, soon another tensor's data); a graph's life is not visible here. A few hundred
# bytes each, one per signature captured.
_READ_BY_GRAPHS: dict = {}


def _layout_key(q, k, q_offsets, kv_offsets, params) -> Optional[tuple]:
    if not (KNOBS.sparse_select_layouts and launch_module.replays_enabled()):
        return None
    # the stream: a layout keeps shape constants (keep table, broadcast offsets) made on its first call's stream
    return (params, q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype, q.device,
            None if q_offsets is None else (q_offsets.dtype, q_offsets.shape), kv_offsets.dtype, kv_offsets.shape,
            q_offsets is kv_offsets, Knobs.generation, stream_key(q.device))


def select_kv_blocks(q, k, q_offsets, kv_offsets, params: BlockSelectParams):
    num_seqs, n_q, n_kv = kv_offsets.shape[0] - 1, params.n_q_blocks, params.n_kv_blocks
    if num_seqs == 0 or n_q == 0 or n_kv == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        index = torch.full((num_seqs, k.shape[1], n_q, n_kv), -1, dtype=meta_kernels.INDEX_DTYPE, device=q.device)
        count = torch.zeros((num_seqs, k.shape[1], n_q), dtype=meta_kernels.INDEX_DTYPE, device=q.device)
        if params.check_offsets:  # no kernel runs to hold the check
            validation.device_check(None if params.broadcast_q else q_offsets, q.shape[0], params.max_seqlen_q,
                                    kv_offsets, k.shape[0], params.max_seqlen_kv, validation.validation_mode(q.device))
        return index, count
    key = _layout_key(q, k, q_offsets, kv_offsets, params)
    layout = None if key is None else _LAYOUTS.get(key)
    q, k = packed_rows(q), packed_rows(k)
    if layout is None:
        layout = _Layout(key, q, k, num_seqs, params)
        # not kept when made inside a CUDA graph capture: its keep table then holds data only when the graph replays
        if key is not None and not capturing(q.device):
            if len(_LAYOUTS) >= _LAYOUTS_MAX:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
    elif capturing(q.device):
        _READ_BY_GRAPHS[id(layout)] = layout
    return layout.run(q, k, q_offsets, kv_offsets)


@shape_constant
def _broadcast_offsets(rows: int, device: torch.device) -> torch.Tensor:
    """[0, rows] (an arange: no host copy, and rows may be symbolic while traced)."""
    return torch.arange(2, dtype=torch.int32, device=device) * rows

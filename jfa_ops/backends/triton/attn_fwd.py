"""Forward kernel: jagged flash attention, online softmax, over a longest-first tile list (see scheduling.py).

Shapes: q [T_q, Hq, D] (broadcast_q: [L_q, Hq, D]), k/v [T_kv, Hkv, D], out [T_q, Hq, D], lse [Hq, T_q] float32.
One work item = (query tile, q head), ordered kv head -> tile (longest first) -> q head of the group
(``common.work_item``), so that the programs running side by side read the same kv head's K/V through the L2. By
default one program per work item (the hardware hands the next one to whichever SM frees up: measured better than
a persistent grid's static striding on jagged/causal; ``configs.KNOBS.fwd_schedule``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import validation
from ..base import capturing, stream_key, tracing
from . import common, launch
from .common import (LN2, dot_precision, softmax_step, first_work, head_dim_consts, load_rows, loop_bound,
                     next_work, packed_rows, query_row0, row_source, row_strides, seq_extent, stage_bounds, store_rows,
                     visible, window_bounds, work_item)
from .configs import KNOBS, Knobs, get_config, nvidia
from .launch import launch_planned
from .offset_checks import offsets_ok
from .scheduling import forward_tiles, schedule_arguments, shape_constant, slot_tile, tile_schedule


@triton.jit
def fwd_step(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, n0, rows, cols, d_ok, len_q,
             len_k, lo_off, hi_off, qk_scale, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, MASKED: tl.constexpr,
             PAD_D: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr, FMA_SOFTMAX: tl.constexpr,
             AT_N0: tl.constexpr):
    """One key block [n0, n0 + BLOCK_N) of the forward's online softmax (scores, mask, softmax step, P V): returns
    (acc, m_i, l_i). USE_TMA: k_src/v_src are tensor descriptors over [T_kv, Hkv*D] read at (kv_row0 + n0, kv_col)
    (a block may run into the next sequence's rows: masked scores, zeroed V); else row pointers: of the sequence's
    first key, read n0 rows on (AT_N0: the block-sparse walk), else of the block itself (the dense walk)."""
    keys = n0 + cols
    if USE_TMA:
        k = k_src.load([(kv_row0 + n0).to(tl.int32), kv_col])
    elif AT_N0:
        k = load_rows(k_src + n0.to(tl.int64) * stride_kt, keys < len_k, d_ok, MASKED, PAD_D)
    else:
        k = load_rows(k_src, keys < len_k, d_ok, MASKED, PAD_D)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if not FMA_SOFTMAX:
        s = s * qk_scale
    if MASKED:
        s = tl.where(visible(rows[:, None], keys[None, :], len_q, len_k, lo_off, hi_off, HAS_LO, HAS_HI),
                     s, float("-inf"))
    p, alpha, m_new, l_i = softmax_step(s, m_i, l_i, qk_scale, MASKED, FMA_SOFTMAX)
    if USE_TMA:
        v = v_src.load([(kv_row0 + n0).to(tl.int32), kv_col])
        if MASKED:  # rows past the sequence belong to the next one: p = 0 there, but 0 * NaN/inf would leak
            v = tl.where((keys < len_k)[:, None], v, tl.zeros_like(v))
    elif AT_N0:
        v = load_rows(v_src + n0.to(tl.int64) * stride_vt, keys < len_k, d_ok, MASKED, PAD_D)
    else:
        v = load_rows(v_src, keys < len_k, d_ok, MASKED, PAD_D)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def store_out_lse(Out, Lse, acc, m_i, l_i, out_row0, rows, head, total_out, stride_ot, stride_oh, d, rows_ok, d_ok,
                  PAD_D: tl.constexpr):
    """The forward's epilogue: out = acc / l and lse (natural log) of rows ``out_row0 + rows``, q head ``head``.
    Rows that saw no key: l = 0, acc = 0 -> out 0 and lse -inf (never 0/0)."""
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    store_rows(Out + (out_row0 + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
               out.to(Out.dtype.element_ty), rows_ok, d_ok, PAD_D)
    tl.store(Lse + head.to(tl.int64) * total_out + out_row0 + rows, lse, mask=rows_ok)


@triton.jit
def _fwd_kv_blocks(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, rows, cols, d_ok, len_q,
                   len_k, lo_off, hi_off, qk_scale, n_begin, n_end,
                   BLOCK_N: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, MASKED: tl.constexpr,
                   PAD_D: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   FMA_SOFTMAX: tl.constexpr):
    """Online-softmax update over key blocks [n_begin, n_end). Scores live in the log2 domain (qk_scale has 1/ln 2).

    k_src/v_src: tensor descriptors over [T_kv, Hkv*D] when USE_TMA (a block may run into the next sequence's rows:
    those keys are masked in the masked stages and never reach the mask-free bulk), else row pointers."""
    if not USE_TMA:
        k_src += n_begin.to(tl.int64) * stride_kt
        v_src += n_begin.to(tl.int64) * stride_vt
    for n0 in range(loop_bound(n_begin), loop_bound(n_end), BLOCK_N):
        acc, m_i, l_i = fwd_step(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, n0, rows, cols,
                                 d_ok, len_q, len_k, lo_off, hi_off, qk_scale, HAS_LO, HAS_HI, MASKED, PAD_D, USE_TMA,
                                 DOT_PRECISION, FMA_SOFTMAX, False)
        if not USE_TMA:
            k_src += BLOCK_N * stride_kt
            v_src += BLOCK_N * stride_vt
    return acc, m_i, l_i


@triton.jit
def _fwd_tile(Q, K, V, Out, Lse, Q_OFF, KV_OFF, seq, m0, head, total_out,
              stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
              group, qk_scale, window_left, right,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr,
              USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr, FMA_SOFTMAX: tl.constexpr):
    """One work item: query rows [m0, m0 + BLOCK_M) of sequence ``seq``, q head ``head``."""
    out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
    q_row0 = query_row0(out_row0, BROADCAST_Q)
    rows = m0 + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    rows_ok = rows < len_q
    q = load_rows(Q + (q_row0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], rows_ok, d_ok, True, PAD_D)
    kv_head = head // group
    k_src = row_source(K, kv_row0, cols, stride_kt, kv_head, stride_kh, d, USE_TMA)
    v_src = row_source(V, kv_row0, cols, stride_vt, kv_head, stride_vh, d, USE_TMA)
    kv_col = kv_head * HEAD_DIM

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
        m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    # Masked leading edge (window start), mask-free bulk, masked trailing edge (diagonal, window end, last
    # block).
    acc, m_i, l_i = _fwd_kv_blocks(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, rows,
                                   cols, d_ok, len_q, len_k, -window_left, right, qk_scale, lead_begin, lead_end,
                                   BLOCK_N, HAS_LEFT, HAS_RIGHT, True, PAD_D, USE_TMA, DOT_PRECISION,
                                   FMA_SOFTMAX)
    acc, m_i, l_i = _fwd_kv_blocks(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, rows,
                                   cols, d_ok, len_q, len_k, -window_left, right, qk_scale, bulk_begin, bulk_end,
                                   BLOCK_N, HAS_LEFT, HAS_RIGHT, False, PAD_D, USE_TMA, DOT_PRECISION,
                                   FMA_SOFTMAX)
    acc, m_i, l_i = _fwd_kv_blocks(acc, m_i, l_i, q, k_src, v_src, stride_kt, stride_vt, kv_row0, kv_col, rows,
                                   cols, d_ok, len_q, len_k, -window_left, right, qk_scale, tail_begin, tail_end,
                                   BLOCK_N, HAS_LEFT, HAS_RIGHT, True, PAD_D, USE_TMA, DOT_PRECISION,
                                   FMA_SOFTMAX)

    store_out_lse(Out, Lse, acc, m_i, l_i, out_row0, rows, head, total_out, stride_ot, stride_oh, d, rows_ok, d_ok,
                  PAD_D)


@triton.jit(do_not_specialize=["num_heads", "total_out", "group", "window_left", "right", "n_slots", "search_steps",
                               "num_seqs", "rows_s", "rows_o", "max_q", "max_kv"])
def attn_fwd_kernel(Q, K, V, Out, Lse, Q_OFF, KV_OFF, TILE_SEQ, TILE_START, TILE_COUNT, WORK_COUNTER, FLAG,
                    num_heads, total_out, n_slots, search_steps, num_seqs, rows_s, rows_o, max_q, max_kv,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                    group, qk_scale, window_left, right,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    BROADCAST_Q: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    FMA_SOFTMAX: tl.constexpr, KV_MAJOR: tl.constexpr, ATOMIC_WORK: tl.constexpr,
                    TILES_FROM_OFFSETS: tl.constexpr, CHECK_OFFSETS: tl.constexpr):
    """Work items (tile, head), tiles longest first (order: ``common.work_item``). Program p handles items p, p + P,
    ... (one each on the default grid); ATOMIC_WORK: each program takes the next item from WORK_COUNTER.
    TILES_FROM_OFFSETS (one wave, ``scheduling.tile_schedule``): items are the n_slots unsorted slots, mapped to
    tiles here (``slot_tile``), padding skipped. CHECK_OFFSETS: program 0 also checks both offsets tensors (rows_s,
    rows_o, max_q, max_kv) and writes FLAG (1: valid); the scheduling kernel does it when there is one."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor launches it (a Python float): keep fp32 math
    tl.static_assert(BLOCK_D >= HEAD_DIM)
    if CHECK_OFFSETS:
        if tl.program_id(0) == 0:
            valid = offsets_ok(Q_OFF, num_seqs, rows_s, max_q, 1024) & offsets_ok(KV_OFF, num_seqs, rows_o, max_kv,
                                                                                  1024)
            tl.store(FLAG, valid.to(tl.int32))
    if TILES_FROM_OFFSETS:
        n_tiles = n_slots
    else:
        n_tiles = tl.load(TILE_COUNT)  # real tile count lives on the device: no host sync
    n_work = n_tiles * num_heads
    work = first_work(WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)
    while work < n_work:
        tile, head = work_item(work, n_tiles, num_heads, group, KV_MAJOR)
        if TILES_FROM_OFFSETS:
            seq, m0, real = slot_tile(Q_OFF, KV_OFF, tile, num_seqs, search_steps, rows_s, rows_o, BLOCK_M)
        else:
            seq, m0, real = tl.load(TILE_SEQ + tile), tl.load(TILE_START + tile), True
        if real:
            _fwd_tile(Q, K, V, Out, Lse, Q_OFF, KV_OFF, seq, m0, head, total_out, stride_qt, stride_qh, stride_kt,
                      stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, group, qk_scale, window_left, right,
                      HEAD_DIM, BLOCK_D, PAD_D, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, BROADCAST_Q, USE_TMA,
                      DOT_PRECISION, FMA_SOFTMAX)
        work = next_work(work, WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)


TMA_ENABLED = True  # K/V through the Hopper tensor-memory accelerator where possible (devcheck toggles it)
# H200, Triton 3.6: the causal forward with TMA K/V hangs at head_dim 256 (bf16 and fp16; 128x64 tiles, 2 stages;
# non-causal and the pointer path are fine; bench/NOTES.md, session 4). Only head dims up to 128 use TMA.
TMA_MAX_HEAD_DIM = 128
# Below this many rows the pointer path: a descriptor costs host time on every call (built here, encoded again by
# Triton's launcher: ~10 us per tensor on the H200's host, bench/NOTES.md v7) while a small call's few K/V blocks
# gain nothing from TMA; the small jagged batches of recommendation models are host-bound.
TMA_MIN_ROWS = 4096
@functools.lru_cache(maxsize=None)
def _capability(device_index: int):
    return torch.cuda.get_device_capability(device_index)


def use_tma(pad_d: bool, *tensors: torch.Tensor) -> bool:
    """Tensor descriptors over these [T, H, D] tensors (``rows_descriptor``): sm_90+, 16-bit, unpadded head dim (a
    padded block would reach into the next head's columns) up to TMA_MAX_HEAD_DIM, at least TMA_MIN_ROWS rows in
    the first tensor, and every tensor non-empty (a
    descriptor needs positive extents) with a 16-byte aligned base and row stride (TMA's rule; a slice of a fused
    projection usually qualifies)."""
    first = tensors[0]
    if tracing():  # torch.compile: the descriptors' alignment rule needs data pointers (see docs/architecture.md)
        return False
    if (first.dtype == torch.float32 or pad_d or first.shape[-1] > TMA_MAX_HEAD_DIM or first.shape[0] < TMA_MIN_ROWS
            or not _tma_device(first)):
        return False
    return not any(t.shape[0] == 0 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16 for t in tensors)


def _tma_device(t: torch.Tensor) -> bool:
    """TMA enabled and the tensor on an NVIDIA sm_90+ GPU (tests replace this to run the TMA paths in the
    interpreter). ROCm builds are excluded by vendor: an AMD MI300 also reports capability 9.x."""
    if not TMA_ENABLED or t.device.type != "cuda" or not nvidia():
        return False
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())[0] >= 9


def rows_descriptor(t: torch.Tensor, block_rows: int):
    """Tensor descriptor over a [T, H, D] tensor with packed rows (``common.packed_rows``) viewed as [T, H*D] with
    row stride t.stride(0), block [block_rows, D]: one head's rows, read at (first row, head * D). Rows past T read
    as zeros (TMA bounds), so only the last block needs none."""
    return TensorDescriptor(t, shape=[t.shape[0], t.shape[1] * t.shape[2]], strides=[t.stride(0), 1],
                            block_shape=[block_rows, t.shape[2]])


def descriptor_layout(descriptor) -> dict:
    """Everything a 2-d tensor descriptor holds but its tensor (shape, strides, block, options): what kept launches
    keep (never the tensor: a kept call must not hold a user's tensor alive), for ``rebase``."""
    return {name: value for name, value in vars(descriptor).items() if name != "base"}


def rebase(layout: dict, t: torch.Tensor, rows: Optional[int] = None):
    """The descriptor of ``layout`` (``descriptor_layout``) over tensor ``t`` (with ``rows`` rows, if given), built
    without ``TensorDescriptor.__post_init__``'s asserts: for kept launches, whose key fixes what the layout holds
    (strides, block, dtype, and the shape but the rows) and which check ``t``'s base alignment and ``rows > 0`` per
    call. Why: 3 per tlx forward and 5 per backward cost ~4 us each through the asserts on CPU, ~0.5 us this way.
    The lists are the layout's own (Triton's launcher only reads them). tests/backends/test_tlx_host.py checks that
    it equals Triton's own build (a field Triton adds fails it)."""
    built = TensorDescriptor.__new__(TensorDescriptor)
    built.__dict__ = dict(layout, base=t) if rows is None else dict(layout, base=t, shape=[rows, layout["shape"][1]])
    return built


@shape_constant
def broadcast_offsets(num_seqs: int, len_q: int, device: torch.device) -> torch.Tensor:
    """Output-row offsets of a broadcast Q: sequence b owns rows [b*L_q, (b+1)*L_q) (cached per shape: read-only)."""
    return torch.arange(num_seqs + 1, device=device, dtype=torch.int32) * len_q


def kernel_offsets(q, q_offsets, kv_offsets, broadcast_q: bool, checked: bool = False):
    """(q_off, kv_off, total_out): the offsets as the kernels read them (``common.int32_offsets``, ``checked`` as
    there; a broadcast Q's output rows b * L_q + i, ``broadcast_offsets``) and the output's rows."""
    num_seqs = kv_offsets.numel() - 1
    if broadcast_q:
        q_off = broadcast_offsets(num_seqs, q.shape[0], q.device)
        total_out = num_seqs * q.shape[0]
    else:
        q_off = common.int32_offsets(q_offsets, checked=checked)
        total_out = q.shape[0]
    return q_off, common.int32_offsets(kv_offsets, same_as=(q_offsets, q_off), checked=checked), total_out


class _Replay:
    """A small call's forward fixed for its signature (``replay_key``): allocate out/lse (and the check flag),
    convert the offsets as the full path does, launch its one-launch ``launch.PlanGroup`` (every int a constant of
    the signature, the tensors named by ``SOURCES``). Made only where the full path launches nothing but the
    attention kernel from tensors the call has (or, for broadcast Q, the output offsets ``broadcast_offsets`` keeps
    per shape: read-only, so the replay keeps them too): one wave (no tile list), inputs used in place. Without
    ``descriptors`` no TMA descriptors; with them (the tlx forward: the layouts of its q, k, v descriptors), the
    call's descriptors over q, k, v (``rebase``), built per call because each holds its tensor's address, and over
    out where the launch took one (the tlx forward's STORE_TMA: a fourth layout, over the replay's fresh out)."""

    # the tensors (and descriptors) a replayed call launches with
    SOURCES = ("q", "k", "v", "out", "lse", "q_off", "kv_off", "flag", "desc_q", "desc_k", "desc_v", "desc_o")
    # fresh allocations of the replay's own dtypes (allocators align them): specialized on a replay's first call
    # only (launch.PlanGroup ``trusted``; bench/NOTES.md "tiny-call backend host floor")
    TRUSTED = ("out", "lse", "flag")

    __slots__ = ("group", "grids", "out_shape", "lse_shape", "dtype", "device", "convert_q", "convert_kv", "check",
                 "broadcast_offsets", "descriptors", "checked")

    def __init__(self, group, grid, out, lse, q_offsets, kv_offsets, check: bool, broadcast_offsets,
                 descriptors=None):
        self.group, self.grids, self.out_shape, self.lse_shape = group, (grid,), out.shape, lse.shape
        self.dtype, self.device, self.check = out.dtype, out.device, check
        self.broadcast_offsets = broadcast_offsets  # None unless broadcast Q
        self.convert_q = q_offsets is not None and q_offsets.dtype != torch.int32
        self.convert_kv = kv_offsets is not q_offsets and kv_offsets.dtype != torch.int32
        self.descriptors = descriptors  # None, or the layouts of the q, k, v (and out) descriptors (descriptor_layout)
        self.checked = False  # True once a run specialized every source as the plans'

    def int32(self, offsets):
        """int64 offsets as the full path converts them (``common.int32_offsets``: saturated where checked)."""
        return common.saturated_int32(offsets) if self.check else offsets.to(torch.int32)

    def run(self, q, k, v, q_offsets, kv_offsets):
        """(out, lse), or None when an input does not specialize as the replay's (the caller runs the full path)."""
        desc_q = desc_k = desc_v = desc_o = None
        if self.descriptors is not None:
            if q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16:
                return None  # TMA needs 16-byte aligned bases: the full path copies (row strides: in the key)
            q_layout, k_layout, v_layout = self.descriptors[:3]  # shapes and strides: in the key, as when it was made
            desc_q, desc_k, desc_v = rebase(q_layout, q), rebase(k_layout, k), rebase(v_layout, v)
        if self.broadcast_offsets is not None:
            if capturing(self.broadcast_offsets.device):
                # a captured graph would read the kept offsets' memory on every replay, also after this replay and
                # the per-shape cache let go of them (clear_cache, the bounds of both): another tensor's data then.
                # The full path makes its own in the graph's pool (shape_constant is bypassed while capturing).
                return None
            q_off = self.broadcast_offsets
        else:
            q_off = self.int32(q_offsets) if self.convert_q else q_offsets
        kv_off = q_off if kv_offsets is q_offsets else self.int32(kv_offsets) if self.convert_kv else kv_offsets
        out = common.alloc_output(self.out_shape, self.dtype, self.device)
        lse = common.alloc_output(self.lse_shape, torch.float32, self.device)
        flag = torch.empty(size=(1,), dtype=torch.int32, device=self.device) if self.check else None
        if self.descriptors is not None and len(self.descriptors) == 4:
            desc_o = rebase(self.descriptors[3], out)  # a fresh allocation: aligned
        checked = self.checked
        if not self.group.launch(self.grids, q, k, v, out, lse, q_off, kv_off, flag, desc_q, desc_k, desc_v, desc_o,
                                 trusted=checked):
            return None
        if not checked:
            self.checked = True
        if self.check:
            validation.device_flag(flag, validation.validation_mode(self.device))
        return out, lse


# Replays per call signature: why: of a small eager call's ~70 us of backend host time (CPU, tools/
# host_backend_cpu.py) most is this function's per-call derivation of what the signature fixes. The key holds every
# input of that derivation: the params, each tensor's shape and strides (packed rows, strides, sizes, the one-wave
# choice), the device, the offsets' dtypes and shapes and whether both sides pass one tensor, the knobs' generation
# (configs.Knobs) and the TMA switches; dtypes and alignment are checked per call by the launch replay.
_REPLAYS: dict = {}
_REPLAYS_MAX = 256  # a bound, not a tuning (signatures hold row counts, which vary per batch)
launch.CLEAR_HOOKS.append(_REPLAYS.clear)


def replay_key(q, k, v, q_offsets, kv_offsets, params) -> Optional[tuple]:
    if not launch.replays_enabled():
        return None
    # the stream: a broadcast-Q replay keeps output offsets made on its first call's stream (base.stream_key)
    if kv_offsets is q_offsets:  # one tensor for both sides (self-attention): its dtype and shape once
        return (params, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.device,
                (q_offsets.dtype, q_offsets.shape), None, None, True, Knobs.generation, TMA_ENABLED, TMA_MIN_ROWS,
                stream_key(q.device))
    return (params, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.device,
            None if q_offsets is None else (q_offsets.dtype, q_offsets.shape), kv_offsets.dtype, kv_offsets.shape,
            False, Knobs.generation, TMA_ENABLED, TMA_MIN_ROWS, stream_key(q.device))


def replayed(replays: dict, key: Optional[tuple], q, k, v, q_offsets, kv_offsets):
    """(out, lse) of the replay ``replays`` keeps for ``key``, or None (no key, no replay, or the replay declined:
    the caller runs its full path)."""
    replay = None if key is None else replays.get(key)
    return None if replay is None else replay.run(q, k, v, q_offsets, kv_offsets)


def attention_forward(q, k, v, q_offsets, kv_offsets, params):
    key = replay_key(q, k, v, q_offsets, kv_offsets, params)
    result = replayed(_REPLAYS, key, q, k, v, q_offsets, kv_offsets)
    if result is not None:
        return result
    inputs = q, k, v
    q, k, v = packed_rows(q), packed_rows(k), packed_rows(v)  # slices of a fused projection: no copy
    device, num_seqs = q.device, kv_offsets.numel() - 1
    num_heads, head_dim, num_heads_kv = q.shape[1], q.shape[2], k.shape[1]
    q_off, kv_off, total_out = kernel_offsets(q, q_offsets, kv_offsets, params.broadcast_q, params.check_offsets)
    out = common.alloc_output((total_out, num_heads, head_dim), q.dtype, device)
    lse = common.alloc_output((num_heads, total_out), torch.float32, device)
    if total_out == 0 or num_seqs == 0:
        if params.check_offsets:  # no kernel runs to hold the check
            validation.device_check(None if params.broadcast_q else q_offsets, q.shape[0], params.max_seqlen_q,
                                    kv_offsets, k.shape[0], params.max_seqlen_kv, validation.validation_mode(device))
        return out, lse

    hd = head_dim_consts(head_dim)
    cfg = get_config("fwd", head_dim, q.dtype, params.causal, device)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    # Offset checks (params.check_offsets: JFA_VALIDATE=async|deferred) ride in the scheduling kernel, or in this
    # kernel when no list is built; broadcast Q's own offsets are an arange (its max_seqlen_q rule is sync-only).
    flag = torch.empty(size=(1,), dtype=torch.int32, device=device) if params.check_offsets else None
    max_q = -1 if params.broadcast_q else params.max_seqlen_q
    programs, schedule = tile_schedule(
        lambda **check: forward_tiles(q_off, kv_off, total_out, k.shape[0], cfg.block_m, window_left, right,
                                      has_left, has_right, **check),
        q_off, kv_off, total_out, k.shape[0], cfg.block_m, num_heads, KNOBS.fwd_schedule, cfg.programs_per_sm, device,
        **({} if flag is None else dict(flag=flag, max_s=max_q, max_o=params.max_seqlen_kv)))
    tma = use_tma(hd["PAD_D"], k, v)
    k_arg, v_arg = (rows_descriptor(k, cfg.block_n), rows_descriptor(v, cfg.block_n)) if tma else (k, v)
    group = num_heads // num_heads_kv
    fma_softmax = KNOBS.fwd_fma_softmax and params.scale > 0
    check = flag is not None and schedule["TILES_FROM_OFFSETS"]
    dynamic = dict(Q=q, K=k_arg, V=v_arg, Out=out, Lse=lse, Q_OFF=q_off, KV_OFF=kv_off, **schedule_arguments(schedule),
                   FLAG=kv_off if flag is None else flag, total_out=total_out, max_q=max_q,
                   max_kv=params.max_seqlen_kv)

    def static():  # every value here follows from plan_key
        return dict(num_heads=num_heads, **row_strides("q", q), **row_strides("k", k), **row_strides("v", v),
                    **row_strides("o", out), group=group, qk_scale=params.scale * 1.4426950408889634,  # / ln 2
                    window_left=window_left, right=right, **hd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                    HAS_LEFT=has_left, HAS_RIGHT=has_right, BROADCAST_Q=params.broadcast_q, USE_TMA=tma,
                    DOT_PRECISION=dot_precision(q.dtype), FMA_SOFTMAX=fma_softmax, KV_MAJOR=KNOBS.fwd_kv_major,
                    ATOMIC_WORK=schedule["ATOMIC_WORK"], TILES_FROM_OFFSETS=schedule["TILES_FROM_OFFSETS"],
                    CHECK_OFFSETS=check)

    plan_key = (q.dtype, num_heads, head_dim, num_heads_kv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                v.stride(0), v.stride(1), params.scale, window_left, right, has_left, has_right, params.broadcast_q,
                tma, fma_softmax, KNOBS.fwd_kv_major, schedule["ATOMIC_WORK"], schedule["TILES_FROM_OFFSETS"], check,
                cfg)
    launch_planned(attn_fwd_kernel, plan_key, (programs,), dynamic, static, num_warps=cfg.num_warps,
                   num_stages=cfg.num_stages)
    if (key is not None and key not in _REPLAYS and schedule["TILES_FROM_OFFSETS"] and not schedule["ATOMIC_WORK"] and not tma
            and all(a is b for a, b in zip((q, k, v), inputs))):
        keep_replay(_REPLAYS, attn_fwd_kernel, key, plan_key, (programs,), dynamic,
                    (q, k, v, out, lse, q_off, kv_off, flag), dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
                    q_offsets, kv_offsets)
    if flag is not None:
        validation.device_flag(flag, validation.validation_mode(device))
    return out, lse


_OWN_SOURCE = {name: n for n, name in enumerate(("Q", "K", "V", "Out", "Lse", "Q_OFF", "KV_OFF", "FLAG"))}
_OWN_SOURCE.update(desc_q=8, desc_k=9, desc_v=10, desc_o=11)  # the tlx forward's descriptor arguments


def keep_replay(replays: dict, kernel, key, plan_key, grid, dynamic, sources, options, q_offsets, kv_offsets,
                descriptors: bool = False) -> None:
    """Store in ``replays`` the replay of the launch of ``kernel`` just made, if every tensor argument is one of
    ``sources`` (``_Replay.SOURCES`` in order, the descriptors last where there are any): its own (Q is q, even when
    q is k) or else the first identical one (the tile list's offsets). ``descriptors``: the launch read q, k, v
    through descriptors, ``sources``' [8:11], and wrote out through ``sources``' [11] where that is not None (the
    replay keeps their layouts)."""
    if q_offsets is None and capturing(sources[5].device):
        return  # broadcast offsets made inside a CUDA graph capture hold data only when the graph replays
    names = {}
    for name, value in dynamic.items():
        if isinstance(value, (int, float)):
            names[name] = value  # a constant of the signature
            continue
        if value is None:
            return
        own = _OWN_SOURCE.get(name)
        index = own if own is not None and own < len(sources) and sources[own] is value else next(
            (i for i, source in enumerate(sources) if source is value), None)
        if index is None:
            return
        names[name] = _Replay.SOURCES[index]
    group = launch.plan_group([(kernel, plan_key, names, options)], order=_Replay.SOURCES, trusted=_Replay.TRUSTED)
    if group is None:
        return
    if len(replays) >= _REPLAYS_MAX:
        replays.clear()
    replays[key] = _Replay(group, grid, sources[3], sources[4], q_offsets, kv_offsets, sources[7] is not None,
                           sources[5] if q_offsets is None else None,
                           tuple(descriptor_layout(d) for d in sources[8:12] if d is not None)
                           if descriptors else None)

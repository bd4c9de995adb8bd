"""Stage 2 backward on the device, from the dense kernels' building blocks (``attn_bwd``):

1. delta = rowsum(dO * O) - grad_lse: the dense ``attn_bwd_delta_kernel``.
2. dK/dV: the selection transposed on the device (``transpose_selection``: per KV block, the Q blocks that selected
   it, ascending; torch ops, no host sync); work items (key tile, kv head), each sums over its group's q heads and
   over only those Q blocks (``attn_bwd.dkdv_step``), then writes dK, dV once (no atomics: deterministic).
3. dQ: work items (query tile, q head) over the same selected KV blocks as the forward (``attn_bwd.dq_step``).
   Broadcast Q: one work item per (query tile of L_q, q head) sums over the sequences in order (deterministic).

Both passes take their work from the dense backward's lists (``scheduling.tile_schedule``), longest first by the
selected-block count of the tile's block (``block_sparse_fwd.selected_cost_args``), and split each tile's selected
blocks into a masked lead, a mask-free bulk and a masked tail as the forward does (``selected_tiles_split``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..base import per_trace, reusable_in_eager
from . import common
from .attn_bwd import DELTA_BLOCK_T, _row_stats, attn_bwd_delta_kernel, dkdv_step, dq_step, store_dk_dv
from .attn_fwd import rows_descriptor, use_tma
from .block_sparse_fwd import (index_strides, longest_rows, selected_blocks, selected_cost_args, selected_tiles_split,
                               sparse_offsets, tile_sizes)
from .common import (dot_precision, first_work, head_dim_consts, launch_schedule, load_rows, load_tma_pair,
                     loop_bound, next_work, packed_rows, query_row0, row_source, row_strides, seq_extent, stage_bounds,
                     store_rows, window_bounds)
from .configs import KNOBS, SHARED_MEMORY_LIMITS, interpreting, shared_memory_limit
from .launch import launch, launch_planned
from .scheduling import (binary_search_steps, forward_tiles, grouped_order, kv_tiles, narrow_keys, shape_constant,
                         single_tiles, stream_sections, tile_schedule, work_tile)


TRANSPOSE_BLOCK_J = 32  # KV blocks per program of transpose_selection_kernel
TRANSPOSE_MAX_WIDTH = 256  # selection rows up to this wide are transposed in one launch (a [32, 256] compare/row)


@triton.jit
def _row_ids(INDEX, COUNT, bh, i, n_q_blocks, width, w):
    """Row i's used ids (-1 past its count, and for rows past n_q_blocks). The row is read whole and cut at its
    count afterwards, so the count and row loads go out together."""
    row = tl.minimum(bh * 0 + i, n_q_blocks - 1)  # rows past the last: read the last one, use none of it
    count = tl.where(i < n_q_blocks, tl.load(COUNT + bh * n_q_blocks + row), 0)
    ids = tl.load(INDEX + (bh * n_q_blocks + row) * width + w, mask=w < width, other=-1)
    return tl.where(w < count, ids, -1)


@triton.jit
def _append_row(out, pos, i, ids, j, j_ok):
    """Appends Q block i to the lists of the KV blocks j that row i's ids name; returns the new list lengths."""
    member = tl.max((ids[None, :] == j[:, None]).to(tl.int32), 1) > 0
    tl.store(out + pos, i, mask=member & j_ok)
    return pos + member.to(tl.int32)


@triton.jit(do_not_specialize=["n_q_blocks", "n_kv_blocks", "width"])
def transpose_selection_kernel(INDEX, COUNT, Q_INDEX, Q_COUNT, n_q_blocks, n_kv_blocks, width,
                               BLOCK_J: tl.constexpr, BLOCK_W: tl.constexpr):
    """Program (b * H + h, j-chunk): for KV blocks j of the chunk, walks the Q blocks i in order and appends i to
    j's list when row i lists j among its first count ids (so the lists come out ascending, duplicates once).
    Four rows per step, their loads issued together before any store (a row per step was one memory latency per
    row: ~128 in a row of the bench's batch). INDEX [B, H, NQB, width], COUNT [B, H, NQB], Q_INDEX
    [B, H, n_kv_blocks, NQB] (pre-filled with NQB), Q_COUNT [B, H, n_kv_blocks]; all contiguous."""
    bh = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_ok = j < n_kv_blocks
    w = tl.arange(0, BLOCK_W)
    out = Q_INDEX + (bh * n_kv_blocks + j) * n_q_blocks
    pos = tl.zeros([BLOCK_J], tl.int32)
    for i in range(0, loop_bound(n_q_blocks), 4):
        ids0 = _row_ids(INDEX, COUNT, bh, i, n_q_blocks, width, w)
        ids1 = _row_ids(INDEX, COUNT, bh, i + 1, n_q_blocks, width, w)
        ids2 = _row_ids(INDEX, COUNT, bh, i + 2, n_q_blocks, width, w)
        ids3 = _row_ids(INDEX, COUNT, bh, i + 3, n_q_blocks, width, w)
        pos = _append_row(out, pos, i, ids0, j, j_ok)
        pos = _append_row(out, pos, i + 1, ids1, j, j_ok)
        pos = _append_row(out, pos, i + 2, ids2, j, j_ok)
        pos = _append_row(out, pos, i + 3, ids3, j, j_ok)
    tl.store(Q_COUNT + bh * n_kv_blocks + j, pos, mask=j_ok)


# The scatter transpose (``KNOBS.sparse_transpose_scatter``): rows per program of the mark pass x ids per step, and
# KV blocks per program of the list pass x Q blocks per step. 8 elements a thread: 32 registers on sm_90 and sm_80
# (16 rows or KV blocks: 96 / 80; 16 programs of 4 warps per SM instead of 5 / 6: ptxas -v, test_arch_compile).
SCATTER_ROWS, SCATTER_W = 8, 128
LISTS_J, LISTS_CHUNK = 4, 128


@triton.jit(do_not_specialize=["n_q_blocks", "n_kv_blocks", "width"])
def transpose_mark_kernel(INDEX, COUNT, MARK, n_q_blocks, n_kv_blocks, width, ROWS: tl.constexpr,
                          BLOCK_W: tl.constexpr):
    """Program (b * H + h, chunk of ROWS Q blocks i): MARK[b, h, j, i] = 1 for every id j in [0, n_kv_blocks) among
    row i's first min(count, width) ids (MARK [B, H, n_kv_blocks, NQB] int8, zeroed before). Only the used ids are
    read (rows past a sequence's end have count 0: no id read, one step of nothing); duplicates store 1 twice.
    Every writer of an entry writes the same 1, so the order of the stores does not matter."""
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    i_ok = i < n_q_blocks
    count = tl.minimum(tl.load(COUNT + bh * n_q_blocks + i, mask=i_ok, other=0), width)
    rows = INDEX + (bh * n_q_blocks + i.to(tl.int64)) * width
    marks = MARK + bh * n_kv_blocks * n_q_blocks + i
    w = tl.arange(0, BLOCK_W)
    for w0 in range(0, loop_bound(tl.max(count, 0)), BLOCK_W):
        used = (w0 + w)[None, :] < count[:, None]
        ids = tl.load(rows[:, None] + (w0 + w)[None, :], mask=used, other=-1)
        ok = used & (ids >= 0) & (ids < n_kv_blocks)
        tl.store(marks[:, None] + ids.to(tl.int64) * n_q_blocks, tl.full([ROWS, BLOCK_W], 1, tl.int8), mask=ok)


@triton.jit(do_not_specialize=["n_q_blocks", "n_kv_blocks"])
def transpose_lists_kernel(MARK, Q_INDEX, Q_COUNT, n_q_blocks, n_kv_blocks, BLOCK_J: tl.constexpr,
                           CHUNK: tl.constexpr):
    """Program (b * H + h, chunk of BLOCK_J KV blocks j): j's list = the Q blocks i with MARK[b, h, j, i] set,
    ascending (each at its rank: the marks before it, a running prefix sum), then n_q_blocks up to NQB; its count.
    Writes every entry of its Q_INDEX rows (no fill before) and its Q_COUNT."""
    bh = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    j_ok = j < n_kv_blocks
    row = (bh * n_kv_blocks + j.to(tl.int64)) * n_q_blocks
    c = tl.arange(0, CHUNK)
    pos = tl.zeros([BLOCK_J], tl.int32)
    for i0 in range(0, n_q_blocks, CHUNK):
        i = i0 + c
        ok = j_ok[:, None] & (i < n_q_blocks)[None, :]
        mark = tl.load(MARK + row[:, None] + i[None, :], mask=ok, other=0).to(tl.int32)
        rank = pos[:, None] + tl.cumsum(mark, 1) - 1
        tl.store(Q_INDEX + row[:, None] + rank, i[None, :] + tl.zeros([BLOCK_J, CHUNK], tl.int32),
                 mask=ok & (mark != 0))
        pos += tl.sum(mark, 1)
    for p0 in range(0, n_q_blocks, CHUNK):
        p = p0 + c
        tail = j_ok[:, None] & (p < n_q_blocks)[None, :] & (p[None, :] >= pos[:, None])
        tl.store(Q_INDEX + row[:, None] + p[None, :], tl.full([BLOCK_J, CHUNK], 0, tl.int32) + n_q_blocks,
                 mask=tail)
    tl.store(Q_COUNT + bh * n_kv_blocks + j, pos, mask=j_ok)


def transpose_selection_scatter(kv_block_index: torch.Tensor, kv_block_count: torch.Tensor, n_kv_blocks: int):
    """``transpose_selection``'s outputs, bit for bit, in three launches whose work follows the used ids, not
    NQB x n_kv_blocks compares per (sequence, head): a zeroed int8 mark matrix [B, H, n_kv_blocks, NQB], the mark
    pass (``transpose_mark_kernel``: reads only each row's used ids, stores a 1 per id) and the list pass
    (``transpose_lists_kernel``: per KV block a running prefix sum over its marks places each Q block at its rank,
    then the NQB padding; no torch.full before). Why: transpose_selection_kernel's [32 KV blocks x width] compare
    per row of every padded Q block was 595 us a backward call on the bench's T66944 batch (H100 profile,
    bench/NOTES.md "Transposed selection, helper transpose46"), this is ~35 MB of traffic. Any width."""
    batch, heads, n_q_blocks, width = kv_block_index.shape
    device = kv_block_index.device
    q_index = torch.empty((batch, heads, n_kv_blocks, n_q_blocks), dtype=torch.int32, device=device)
    q_count = torch.empty((batch, heads, n_kv_blocks), dtype=torch.int32, device=device)
    if not q_count.numel():
        return q_index, q_count
    mark = torch.zeros((batch, heads, n_kv_blocks, n_q_blocks), dtype=torch.int8, device=device)
    if mark.numel() and width:
        launch(transpose_mark_kernel, (batch * heads, triton.cdiv(n_q_blocks, SCATTER_ROWS)), dict(
            INDEX=kv_block_index.contiguous(), COUNT=kv_block_count.contiguous(), MARK=mark, n_q_blocks=n_q_blocks,
            n_kv_blocks=n_kv_blocks, width=width, ROWS=SCATTER_ROWS, BLOCK_W=SCATTER_W), num_warps=4, num_stages=1)
    launch(transpose_lists_kernel, (batch * heads, triton.cdiv(n_kv_blocks, LISTS_J)), dict(
        MARK=mark, Q_INDEX=q_index, Q_COUNT=q_count, n_q_blocks=n_q_blocks, n_kv_blocks=n_kv_blocks,
        BLOCK_J=LISTS_J, CHUNK=LISTS_CHUNK), num_warps=4, num_stages=1)
    return q_index, q_count


def transpose_selection(kv_block_index: torch.Tensor, kv_block_count: torch.Tensor, n_kv_blocks: int):
    """(q_block_index [B, H, n_kv_blocks, NQB] int32: per KV block the Q blocks that selected it, ascending, then
    NQB; q_block_count [B, H, n_kv_blocks] int32). Ids outside [0, n_kv_blocks) and entries past a row's count are
    dropped. On the device, no sync: under ``KNOBS.sparse_transpose_kernel`` one fill and one launch
    (``transpose_selection_kernel``) for rows up to TRANSPOSE_MAX_WIDTH ids, else ~12 torch ops over
    [B, H, NQB, n_kv_blocks + 1] (a segmented sort among them)."""
    batch, heads, n_q_blocks, width = kv_block_index.shape
    device = kv_block_index.device
    if KNOBS.sparse_transpose_scatter:
        return transpose_selection_scatter(kv_block_index, kv_block_count, n_kv_blocks)
    if KNOBS.sparse_transpose_kernel and width <= TRANSPOSE_MAX_WIDTH:
        q_index = torch.full((batch, heads, n_kv_blocks, n_q_blocks), n_q_blocks, dtype=torch.int32, device=device)
        q_count = torch.empty((batch, heads, n_kv_blocks), dtype=torch.int32, device=device)
        if q_count.numel():
            launch(transpose_selection_kernel, (batch * heads, triton.cdiv(n_kv_blocks, TRANSPOSE_BLOCK_J)), dict(
                INDEX=kv_block_index.contiguous(), COUNT=kv_block_count.contiguous(), Q_INDEX=q_index,
                Q_COUNT=q_count, n_q_blocks=n_q_blocks, n_kv_blocks=n_kv_blocks, width=width,
                BLOCK_J=TRANSPOSE_BLOCK_J, BLOCK_W=max(16, triton.next_power_of_2(width))), num_warps=4,
                num_stages=1)
        return q_index, q_count
    used = torch.arange(width, device=device) < kv_block_count[..., None]
    ids = torch.where(used & (kv_block_index >= 0) & (kv_block_index < n_kv_blocks), kv_block_index, n_kv_blocks)
    selected = torch.zeros((batch, heads, n_q_blocks, n_kv_blocks + 1), dtype=torch.bool, device=device)
    selected.scatter_(3, ids.long(), True)
    by_kv = selected[..., :n_kv_blocks].transpose(2, 3)  # [B, H, n_kv_blocks, NQB]
    q_blocks = torch.arange(n_q_blocks, dtype=torch.int32, device=device)
    q_index = torch.where(by_kv, q_blocks, n_q_blocks).sort(dim=-1).values
    return q_index.to(torch.int32).contiguous(), by_kv.sum(-1, dtype=torch.int32).contiguous()


def transposed_selection(k: torch.Tensor, kv_block_index: torch.Tensor, kv_block_count: torch.Tensor, params):
    """(q_block_index, q_block_count) of ``transpose_selection`` over the KV blocks of the longest sequence the shapes
    and hints allow (``longest_rows``): the key-stationary passes' work, built on the device (the triton dK/dV pass
    and the TLX backward's SPARSE walk read it)."""
    n_kv_blocks = triton.cdiv(longest_rows(k, params.max_seqlen_kv), params.block_kv)
    return transpose_selection(kv_block_index.contiguous(), kv_block_count.contiguous(), n_kv_blocks)


def _tile_items(schedule: dict, heads_kv: int):
    """(seq, start, kv head) of every (key tile, kv head) item, tile-major in the key tile list's order."""
    seq = schedule["TILE_SEQ"].repeat_interleave(heads_kv)
    start = schedule["TILE_START"].repeat_interleave(heads_kv)
    head = torch.arange(heads_kv, dtype=torch.int32, device=seq.device).repeat(schedule["TILE_SEQ"].numel())
    return seq, start, head


def _walk_costs(seq, start, head, real, q_count: torch.Tensor, block_kv: int):
    """Each item's walk, int64: the Q blocks of its kv head that selected its KV block (``q_count``, the transposed
    selection's counts [B, Hkv, n_kv_blocks]); -1 for padding items (not ``real``)."""
    block = torch.div(start, block_kv, rounding_mode="floor").clamp(0, q_count.shape[2] - 1)
    return torch.where(real, q_count[seq.clamp(min=0).long(), head.long(), block.long()].to(torch.int64), -1)


def item_list(schedule: dict, q_count: torch.Tensor, heads_kv: int, block_kv: int, head_group: int = 0,
              max_count: int = 0):
    """(seq, start, kv head) per work item, int32 [tiles x heads_kv], longest first by the item's own walk (the
    Q blocks of its kv head that selected its KV block: ``q_count``, the transposed selection's counts [B, Hkv,
    n_kv_blocks]); the key tile list (``schedule``, sorted by the blocks summed over the heads) is tile-major, where
    the heads of one tile differ: static striding over it left the busiest SM 4-8% over the mean on the bench's
    sparse batch, 0.4-0.7% over this list with SNAKE (bench/NOTES.md "TLX block-sparse backward v2"). Padding tiles
    (seq -1) go last; the kernel's item count (tiles x heads) is unchanged. Device ops only: no sync.

    ``head_group`` > 0 (``configs.BACKWARD_GROUP_ORDER``): group-major (kv heads head // head_group), each group's
    items by their own walk, the last group longest first and the others alternating (``zigzag_groups``).

    ``KNOBS.sparse_item_one_sort`` (helper transpose46): the same permutation from one stable sort of 32-bit keys
    where the counts' bound ``max_count`` (the transposed selection's NQB: no list is longer) lets them fit, else
    of the 64-bit keys, instead of two 64-bit sorts (cub's radix sort passes go by the key's bits: ~107 us for the
    two on the bench's 8,720 items, H100 profile). Same order: the longest-first sort is stable, so its ties (equal
    cost) stay in list order, and the group sort keeps the ties of (group, +-cost), which equal cost within a
    group: sorting the list once by (group, +-cost) keeps the same ties in the same order."""
    seq, start, head = _tile_items(schedule, heads_kv)
    cost = _walk_costs(seq, start, head, seq >= 0, q_count, block_kv)
    if KNOBS.sparse_item_one_sort:
        if head_group > 0:
            order = zigzag_groups(cost, head, head_group, heads_kv, max_count)
        else:  # -1 (padding) .. q_count: int32
            order = torch.sort(cost.to(torch.int32), descending=True, stable=True).indices
        return _ordered(seq, start, head, order)
    order = torch.sort(cost, descending=True, stable=True).indices
    if head_group > 0:
        order = order[zigzag_groups(cost[order], head[order], head_group, heads_kv)]
    return _ordered(seq, start, head, order)


def zigzag_groups(cost: torch.Tensor, head: torch.Tensor, head_group: int, heads_kv: int, max_count: int = 0):
    """The stable order (a permutation: new position -> old) of a work list sorted longest first by ``cost`` (-1:
    padding, kept last) that takes its kv heads' groups (head // head_group) one after the other, the last group
    longest first, the one before it shortest first, and so on. Why: the ~132 items in flight are then of one
    group (HEAD_GROUP's L2 reuse of their Q/dO/dQ rows), and they progress in step through rows of sequences of one
    length (similar costs side by side); the snake (SNAKE) balances each monotone run, the turns between groups are
    either all short or all long items, and the partial last round is the list's shortest items (a group-major list
    sorted longest first in every group left the busiest SM 5-12% over the mean, this 0.4-1.1%: bench/NOTES.md
    "ordered head groups"). Device ops only: no sync. ``max_count`` > 0: no cost exceeds it, which lets the sort's
    keys be 32-bit where they fit (``grouped_order``)."""
    group = head.long() // head_group
    last = common.cdiv(heads_kv, head_group) - 1
    within = torch.where((last - group) % 2 == 0, -cost, cost)  # ascending key: longest first in the last group
    return grouped_order(cost >= 0, group, within, last + 1, max_count)


def causal_item_list(schedule: dict, heads_kv: int, q_offsets: torch.Tensor, bytes_per_row: int, l2_bytes: int):
    """(seq, start, kv head) per work item, int32 [tiles x heads_kv] (tlx ``configs.BACKWARD_CAUSAL_ORDER``; the
    kernel takes it with ITEM_LIST and SNAKE): the dense items in sections of (sequence, kv head) streams whose
    query-side rows (``bytes_per_row``: Q, dO and the fp32 dQ accumulator of a kv head's q heads) fill ``l2_bytes``
    (tlx ``configs.CAUSAL_ORDER_L2_BYTES``; a stream larger than that is a section alone), the streams taken longest
    sequence first (``q_offsets``: the [B + 1] query offsets the kernel reads), each section longest item first
    with its streams side by side (the key tile list's order: ``schedule`` is sorted longest first), the sections
    alternating direction with the last longest first (``zigzag_groups``' rule: the snake balances each monotone
    run). Why: the key tile list of a causal batch is sorted by cost across sequences, so the default tile-major
    order runs one item per stream (8 sequences x 16 heads side by side at the bench's B8 H16) and nearly every Q/dO
    read and dQ reduce-add misses the L2 (modelled 90-95 KiB of DRAM per block, the full mask 13); FA3's backward
    scheduler (SingleTileBwdLPTScheduler) runs a section's key blocks side by side instead. Padding tiles (seq -1)
    go last. Device ops only: no sync."""
    seq, start, head = _tile_items(schedule, heads_kv)
    rank = torch.arange(schedule["TILE_SEQ"].numel(), dtype=torch.int64, device=seq.device).repeat_interleave(heads_kv)
    real = seq >= 0
    section, longest_first = stream_sections(seq, head, real, heads_kv, q_offsets, bytes_per_row, l2_bytes)
    # a section's items longest first (the list's order) or reversed, alternating, the last section longest first
    within = torch.where(longest_first, rank, -rank)
    order = grouped_order(real, section, within)  # ties (one tile's heads) keep the list's order
    return _ordered(seq, start, head, order)


def _section_bound(total_rows: int, heads_kv: int, bytes_per_row: int, l2_bytes: int, max_count: int) -> int:
    """``sectioned_item_list``'s bound on its sections (0: none): how many sections ``total_rows`` query rows can
    fill, where both bounds are known (> 0); the device list (``_sectioned_item_list_device``) clamps by it too."""
    return total_rows * heads_kv * bytes_per_row // l2_bytes + 1 if total_rows > 0 and max_count > 0 else 0


def sectioned_item_list(schedule: dict, q_count: torch.Tensor, heads_kv: int, block_kv: int, q_offsets: torch.Tensor,
                        bytes_per_row: int, l2_bytes: int, total_rows: int = 0, max_count: int = 0):
    """(seq, start, kv head) per block-sparse work item, int32 [tiles x heads_kv] (tlx
    ``configs.SPARSE_BACKWARD_SECTIONS``): ``causal_item_list``'s L2 sections of (sequence, kv head) streams, each
    section's items by their own walk (``q_count``, as ``item_list``), longest first in the last section and
    alternating before it. Why: ``item_list``'s order (head groups, each longest first across the whole batch) puts
    side by side the items of equal walks, which in a causal batch are other sequences' (a key tile's walk falls
    along its sequence), so the ~132 items in flight read the Q, dO and fp32 dQ rows of many (sequence, head)
    streams at once: ncu on the H100 (the bench's causal keep 0.25 backward) read an L2 hit rate of 56% and DRAM at
    59% of peak against 80% / 34% on the non-causal keep 0.25 row (bench/NOTES.md "Stop 54"). Padding items (seq -1)
    last. Device ops only: no sync. ``total_rows`` (the query rows the offsets index) and ``max_count`` (no walk is
    longer) > 0 bound the sort keys, 32-bit where they fit (``grouped_order``)."""
    seq, start, head = _tile_items(schedule, heads_kv)
    real = seq >= 0
    cost = _walk_costs(seq, start, head, real, q_count, block_kv)
    section, longest_first = stream_sections(seq, head, real, heads_kv, q_offsets, bytes_per_row, l2_bytes)
    within = torch.where(longest_first, -cost, cost)
    groups = _section_bound(total_rows, heads_kv, bytes_per_row, l2_bytes, max_count)
    if groups:  # offsets past total_rows (deferred validation raises later) must not overflow the 32-bit keys
        section = section.clamp(max=groups - 1)
    return _ordered(seq, start, head, grouped_order(real, section, within, groups, max_count))


def _ordered(seq, start, head, order):
    """The items (seq, start, kv head) in ``order`` (new position -> old), each contiguous."""
    return seq[order].contiguous(), start[order].contiguous(), head[order].contiguous()


@shape_constant
def uniform_causal_item_list(num_seqs: int, length: int, heads_kv: int, bytes_per_row: int, l2_bytes: int,
                             block_n: int, device):
    """``causal_item_list`` of a causal batch (no other window) whose sequences all have ``length`` query and key
    rows, made once per shape (``scheduling.shape_constant``) instead of per call: such a batch's sorted key tile
    list follows from shapes (``kv_tiles``: cost = rows x visible rows falls with the tile index, ties stable over
    (seq, start), so tile index first, the sequences in order; no padding, so [B x tiles x heads_kv] = the kernel's
    items). Why: the per-call list is ~59 small device ops (2 stable sorts), ~0.7-1.2 ms of host time per call on the
    H200's host, which a call near the host floor pays in full (bench/NOTES.md "TLX causal backward order v2")."""
    tiles = common.cdiv(length, block_n)
    seq = torch.arange(num_seqs, dtype=torch.int32, device=device).repeat(tiles)
    start = torch.arange(tiles, dtype=torch.int32, device=device).repeat_interleave(num_seqs) * block_n
    offsets = torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * length
    return causal_item_list(dict(TILE_SEQ=seq, TILE_START=start), heads_kv, offsets, bytes_per_row, l2_bytes)


# The causal order's list built on the device (tlx ``configs.BACKWARD_CAUSAL_ORDER_JAGGED``): the same items in the
# same places as ``causal_item_list``, in two launches and one allocation instead of ~59 small device ops.
CAUSAL_STREAMS_BLOCK, CAUSAL_STREAMS_CHUNK = 32, 128  # sequences per program x sequences compared per step
CAUSAL_ITEMS_BLOCK, CAUSAL_ITEMS_CHUNK = 64, 128  # items placed per program x key tiles counted per step


@triton.jit
def _sequences_ahead(Q_OFF, c0, num_seqs, length, b, CHUNK: tl.constexpr):
    """Sequences c0 .. c0 + CHUNK - 1 against sequences b (lengths ``length``, int64): (c_ok: c is a sequence, its
    length (int64, clamped at 0), ahead [len(b), CHUNK]: c comes before b longest first, stable (longer, or as long
    and earlier))."""
    c = c0 + tl.arange(0, CHUNK)
    c_ok = c < num_seqs
    other = tl.maximum(tl.load(Q_OFF + c + 1, mask=c_ok, other=0) - tl.load(Q_OFF + c, mask=c_ok, other=0), 0)
    other = other.to(tl.int64)
    ahead = c_ok[None, :] & ((other[None, :] > length[:, None])
                             | ((other[None, :] == length[:, None]) & (c[None, :] < b[:, None])))
    return c_ok, other, ahead


@triton.jit(do_not_specialize=["n_items", "num_seqs", "n_g"])
def causal_streams_kernel(Q_OFF, OUT, n_items, num_seqs, heads, bytes_per_row, l2_bytes, n_g, BLOCK: tl.constexpr,
                          CHUNK: tl.constexpr, HEADS: tl.constexpr):
    """Per sequence b (lengths clamped at 0): POS[b] = its place among the sequences longest first (stable); the
    section of its streams (b, h), SEC[b * heads + h] = (bytes of the streams before it) // l2_bytes, streams in that
    order (sequence by sequence, heads in order; a stream is length x bytes_per_row); G[s] = the streams in sections
    < s, written where an item reads it (s = a stream's section, and that + 1); LAST = the last stream's section.
    SCRATCH = OUT + 3 x n_items (past the list) = [POS: B][SEC: B x heads][LAST: 1][G: n_g] int32
    (``causal_item_list_device``)."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = b < num_seqs
    length = tl.maximum(tl.load(Q_OFF + b + 1, mask=ok, other=0) - tl.load(Q_OFF + b, mask=ok, other=0), 0)
    length = length.to(tl.int64)
    pos = tl.zeros([BLOCK], tl.int32)
    rows_ahead = tl.zeros([BLOCK], tl.int64)
    shortest_ahead = tl.full([BLOCK], 1 << 62, tl.int64)  # the length of the stream just before this one's first
    for c0 in range(0, loop_bound(num_seqs), CHUNK):
        _, other, ahead = _sequences_ahead(Q_OFF, c0, num_seqs, length, b, CHUNK)
        pos += tl.sum(ahead.to(tl.int32), 1)
        rows_ahead += tl.sum(tl.where(ahead, other[None, :], 0), 1)
        shortest_ahead = tl.minimum(shortest_ahead, tl.min(tl.where(ahead, other[None, :], 1 << 62), 1))
    shortest_ahead = tl.where(pos == 0, 0, shortest_ahead)  # none ahead: the first stream (its section opens)
    h = tl.arange(0, HEADS)
    h_ok = h < heads
    row_bytes = tl.cast(bytes_per_row, tl.int64)
    l2 = tl.cast(l2_bytes, tl.int64)
    first = rows_ahead * heads * row_bytes  # bytes of the streams before (b, 0)
    stream = length * row_bytes
    filled = first[:, None] + h[None, :].to(tl.int64) * stream[:, None]
    sec = filled // l2
    before = tl.where(h[None, :] == 0, (first - shortest_ahead * row_bytes)[:, None], filled - stream[:, None])
    prev_sec = tl.where((h[None, :] == 0) & (pos[:, None] == 0), -1, before // l2)  # the stream before's section
    both = ok[:, None] & h_ok[None, :]
    POS = OUT + 3 * n_items.to(tl.int64)
    SEC = POS + num_seqs
    LAST = SEC + num_seqs * heads
    G = LAST + 1
    tl.store(POS + b, pos, mask=ok)
    tl.store(SEC + b[:, None] * heads + h[None, :], sec.to(tl.int32), mask=both)
    place = pos[:, None] * heads + h[None, :]
    opens = both & (sec > prev_sec)  # the first stream of its section: G of that section and of those skipped
    tl.store(G + tl.minimum(sec, n_g - 1), place, mask=opens & (sec < n_g))
    tl.store(G + tl.minimum(prev_sec + 1, n_g - 1), place, mask=opens & (prev_sec + 1 < n_g))
    last = both & (pos[:, None] == num_seqs - 1) & (h[None, :] == heads - 1)
    tl.store(G + tl.minimum(sec + 1, n_g - 1), place + 1, mask=last & (sec + 1 < n_g))
    tl.store(LAST + place * 0, sec.to(tl.int32), mask=last)


@triton.jit(do_not_specialize=["n_items", "num_seqs", "n_g"])
def causal_items_kernel(TILE_SEQ, TILE_START, OUT, n_items, heads, num_seqs, n_g, BLOCK: tl.constexpr,
                        CHUNK: tl.constexpr):
    """``causal_item_list``'s list from ``causal_streams_kernel``'s SCRATCH: item i = (tile i // heads, kv head
    i % heads) of the sorted key tile list goes to its place, OUT[0 / 1 / 2, place] = (seq, start, head) (OUT
    [3 x n_items] int32). A real item of section S (its stream's) lands after the items of the sections before
    (for every real tile, its heads of a section < S: clamp(G[S] - POS[seq] x heads, 0, heads)), then after the
    items of S whose tile is earlier in the list (S longest first: the last section and every other one before it)
    or later (reversed), then after its tile's heads of S before its own; padding items (seq -1) go last, in
    order. Every place is taken once: a permutation (no atomics, no sort)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_items
    r = i // heads
    h = i % heads
    n_tiles = n_items // heads
    seq = tl.load(TILE_SEQ + r, mask=ok, other=-1)
    start = tl.load(TILE_START + r, mask=ok, other=0)
    real = ok & (seq >= 0)
    POS = OUT + 3 * n_items.to(tl.int64)  # causal_streams_kernel's SCRATCH
    SEC = POS + num_seqs
    LAST = SEC + num_seqs * heads
    G = LAST + 1
    s = tl.minimum(tl.maximum(seq, 0), tl.maximum(num_seqs - 1, 0))
    sec = tl.load(SEC + s * heads + h, mask=real, other=0)
    g_lo = tl.load(G + tl.minimum(sec, n_g - 1), mask=real, other=0)  # streams in sections < sec
    g_hi = tl.load(G + tl.minimum(sec + 1, n_g - 1), mask=real, other=0)  # streams in sections <= sec
    own = tl.load(POS + s, mask=real, other=0) * heads
    forward = (tl.load(LAST, mask=num_seqs > 0, other=0) - sec) % 2 == 0  # the section longest first (the list's order)
    before = tl.zeros([BLOCK], tl.int32)  # real items of the sections before
    earlier = tl.zeros([BLOCK], tl.int32)  # items of this section on tiles taken before this one
    real_tiles = tl.zeros([BLOCK], tl.int32)
    padding_before = tl.zeros([BLOCK], tl.int32)
    for c0 in range(0, loop_bound(n_tiles), CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        c_in = c < n_tiles
        c_seq = tl.load(TILE_SEQ + c, mask=c_in, other=-1)
        c_real = c_seq >= 0
        c_first = tl.load(POS + tl.maximum(c_seq, 0), mask=c_real, other=0) * heads
        lower = tl.minimum(tl.maximum(g_lo[:, None] - c_first[None, :], 0), heads)
        upto = tl.minimum(tl.maximum(g_hi[:, None] - c_first[None, :], 0), heads)
        before += tl.sum(tl.where(c_real[None, :], lower, 0), 1)
        first = tl.where(forward[:, None], c[None, :] < r[:, None], c[None, :] > r[:, None])
        earlier += tl.sum(tl.where(c_real[None, :] & first, upto - lower, 0), 1)
        real_tiles += tl.sum(c_real.to(tl.int32), 0)
        padding_before += tl.sum(((c_in & ~c_real)[None, :] & (c[None, :] < r[:, None])).to(tl.int32), 1)
    within = h - tl.minimum(tl.maximum(g_lo - own, 0), heads)
    place = tl.where(real, before + earlier + within, (real_tiles + padding_before) * heads + h)
    tl.store(OUT + place, seq, mask=ok)
    tl.store(OUT + n_items + place, start, mask=ok)
    tl.store(OUT + 2 * n_items + place, h, mask=ok)


def causal_item_list_device(schedule: dict, heads_kv: int, q_offsets: torch.Tensor, total_q: int,
                            bytes_per_row: int, l2_bytes: int):
    """``causal_item_list`` (the same three int32 tensors, bit for bit, for offsets whose lengths sum to at most
    ``total_q``, the query rows) built in two launches (``causal_streams_kernel``, ``causal_items_kernel``) and
    one allocation: no sort, no host sync. Why: the torch list is ~59 small device ops, ~0.18 ms of a jagged causal
    backward on the H200 (its kernel 10% faster with the list: bench/NOTES.md "causal order list on the device").
    The items kernel counts over the tile list per item (items x tiles: 4.5k x 284 at T32768 H16). Eager calls
    with the same tile list (one kept by ``base.reusable_in_eager``: a model's layers) and offsets reuse the list."""
    return per_trace(_causal_item_list_device, schedule["TILE_SEQ"], schedule["TILE_START"], heads_kv, q_offsets,
                     total_q, bytes_per_row, l2_bytes)


@reusable_in_eager
def _causal_item_list_device(seq, start, heads_kv, q_offsets, total_q, bytes_per_row, l2_bytes):
    n_tiles, num_seqs, device = seq.numel(), q_offsets.numel() - 1, seq.device
    n_items = n_tiles * heads_kv
    n_g = bytes_per_row * heads_kv * total_q // l2_bytes + 2  # sections + 1 (the last stream's section + 1 is read)
    out = torch.empty(3 * n_items + num_seqs * (heads_kv + 1) + 1 + n_g, dtype=torch.int32, device=device)
    if num_seqs > 0:
        launch_planned(causal_streams_kernel, (heads_kv, bytes_per_row, l2_bytes),
                       (common.cdiv(num_seqs, CAUSAL_STREAMS_BLOCK),),
                       dict(Q_OFF=q_offsets, OUT=out, n_items=n_items, num_seqs=num_seqs, n_g=n_g),
                       lambda: dict(heads=heads_kv, bytes_per_row=bytes_per_row, l2_bytes=l2_bytes,
                                    BLOCK=CAUSAL_STREAMS_BLOCK, CHUNK=CAUSAL_STREAMS_CHUNK,
                                    HEADS=triton.next_power_of_2(heads_kv)), num_warps=4, num_stages=1)
    if n_items > 0:
        launch_planned(causal_items_kernel, (heads_kv,), (common.cdiv(n_items, CAUSAL_ITEMS_BLOCK),),
                       dict(TILE_SEQ=seq, TILE_START=start, OUT=out, n_items=n_items,
                            num_seqs=num_seqs, n_g=n_g),
                       lambda: dict(heads=heads_kv, BLOCK=CAUSAL_ITEMS_BLOCK, CHUNK=CAUSAL_ITEMS_CHUNK),
                       num_warps=4, num_stages=1)
    # three rows (16-byte aligned: the tile lists' capacity is a multiple of 4) in two aten ops
    return out.as_strided((3, n_items), (n_items, 1)).unbind(0)


# The sectioned sparse list built on the device (tlx ``configs.SPARSE_BACKWARD_SECTIONS_DEVICE``): the same items in
# the same places as ``sectioned_item_list``, in two launches and one allocation instead of its 49 device ops.
SECTION_KEYS_BLOCK, SECTION_KEYS_CHUNK = 64, 128  # items keyed per program x sequences compared per step
SECTION_PLACES_BLOCK, SECTION_PLACES_CHUNK = 32, 256  # items placed per program x item keys compared per step
# The places kernel compares items x items, the torch list sorts: past this many items (tiles x kv heads) the device
# list takes the torch list's path (the same list). The bench's batch has ~8.7k items (76M compares), its full
# suite's T134272 ~17.5k; a 1M-row batch ~130k (17G compares: milliseconds).
SECTIONS_DEVICE_MAX_ITEMS = 24576


@triton.jit
def _keys_of(OUT, n_items, WIDE: tl.constexpr):
    """Where ``section_keys_kernel`` keeps the items' sort keys: OUT past the list (3 x n_items int32), 8-byte
    aligned, int64 if WIDE else int32."""
    at = OUT + 3 * n_items.to(tl.int64) + n_items % 2
    return at.to(tl.pointer_type(tl.int64)) if WIDE else at


@triton.jit(do_not_specialize=["n_items", "num_seqs", "groups", "bound", "n_kv_blocks", "stride_cb", "stride_ch",
                               "stride_ck"])
def section_keys_kernel(TILE_SEQ, TILE_START, Q_OFF, Q_COUNT, OUT, n_items, heads, num_seqs, bytes_per_row,
                        l2_bytes, block_kv, groups, bound, n_kv_blocks, stride_cb, stride_ch, stride_ck,
                        BLOCK: tl.constexpr, CHUNK: tl.constexpr, WIDE: tl.constexpr):
    """``sectioned_item_list``'s sort key per item i = (tile i // heads, kv head i % heads), into ``_keys_of``:
    its stream's section (``stream_sections``: the streams of the sequences longer than its own, or as long and
    earlier, fill the bytes before it), clamped below ``groups`` when > 0, and its walk (``q_count``) negated where
    the section goes longest first; packed as ``grouped_order`` packs them (32-bit unless WIDE, wrapping as its
    cast does), padding above every real key. Why the keys: equal keys keep the list's order, so an item's place
    is a count of keys (``section_places_kernel``)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_items
    h = i % heads
    seq = tl.load(TILE_SEQ + i // heads, mask=ok, other=-1)
    start = tl.load(TILE_START + i // heads, mask=ok, other=0)
    real = ok & (seq >= 0)
    # stream_sections' index into its streams: (seq, head), clamped to the last stream
    stream = tl.minimum(tl.maximum(seq, 0) * heads + h, num_seqs * heads - 1)
    b = stream // heads
    length = tl.maximum(tl.load(Q_OFF + b + 1, mask=real, other=0) - tl.load(Q_OFF + b, mask=real, other=0), 0)
    length = length.to(tl.int64)
    rows_ahead = tl.zeros([BLOCK], tl.int64)
    total_rows = tl.cast(0, tl.int64)
    shortest = tl.cast(1 << 62, tl.int64)
    for c0 in range(0, loop_bound(num_seqs), CHUNK):
        c_ok, other, ahead = _sequences_ahead(Q_OFF, c0, num_seqs, length, b, CHUNK)
        rows_ahead += tl.sum(tl.where(ahead, other[None, :], 0), 1)
        total_rows += tl.sum(other, 0)
        shortest = tl.minimum(shortest, tl.min(tl.where(c_ok, other, 1 << 62), 0))
    row_bytes = tl.cast(bytes_per_row, tl.int64)
    l2 = tl.cast(l2_bytes, tl.int64)
    section = (rows_ahead * heads + (stream % heads) * length) * row_bytes // l2
    last = (total_rows * heads - shortest) * row_bytes // l2  # the last stream's (a shortest one) section
    longest_first = (last - section) % 2 == 0
    section = tl.where(groups > 0, tl.minimum(section, groups - 1), section)  # sectioned_item_list's bound
    block = tl.minimum(tl.maximum(start // block_kv, 0), n_kv_blocks - 1)
    walk = tl.load(Q_COUNT + tl.maximum(seq, 0).to(tl.int64) * stride_cb + h.to(tl.int64) * stride_ch
                   + block.to(tl.int64) * stride_ck, mask=real, other=0).to(tl.int64)
    within = tl.where(longest_first, -walk, walk)
    if WIDE:
        key = tl.where(real, section * (1 << 32) + within, 1 << 62)
    else:
        key = tl.where(real, section * (2 * bound + 1) + within + bound, (1 << 31) - 1).to(tl.int32)
    tl.store(_keys_of(OUT, n_items, WIDE) + i, key, mask=ok)


@triton.jit
def _keys_before(firsts, KEYS, key, lo, hi, n_items, past, CHUNK: tl.constexpr, OR_EQUAL: tl.constexpr):
    """``firsts`` plus, per item (rows) and step lane, the keys at [lo, hi) smaller than the item's (OR_EQUAL:
    or equal): [lo, hi) all before the items (OR_EQUAL) or all after them. Past the list: the largest key
    (``past``), counted for none."""
    for c0 in range(loop_bound(lo), loop_bound(hi), CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        other = tl.load(KEYS + c, mask=c < n_items, other=past)
        if OR_EQUAL:
            firsts += (other[None, :] <= key[:, None]).to(tl.int32)
        else:
            firsts += (other[None, :] < key[:, None]).to(tl.int32)
    return firsts


@triton.jit(do_not_specialize=["n_items"])
def section_places_kernel(TILE_SEQ, TILE_START, OUT, n_items, heads, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                          WIDE: tl.constexpr):
    """``sectioned_item_list``'s list from ``section_keys_kernel``'s keys: item i goes to its place in the stable
    sort by key, the items with a smaller key or an equal key earlier in the list (items x items compares), OUT[0 /
    1 / 2, place] = (seq, start, kv head). Every place is taken once: a permutation (no atomics, no sort). The
    steps before and after the one that holds the program's items need one compare per pair, not three."""
    tl.static_assert(CHUNK % BLOCK == 0)  # the program's items lie in one step
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_items
    KEYS = _keys_of(OUT, n_items, WIDE)
    if WIDE:
        past = (1 << 63) - 1
    else:
        past = (1 << 31) - 1
    key = tl.load(KEYS + i, mask=ok, other=0)
    own = tl.program_id(0) * BLOCK // CHUNK * CHUNK  # the step that holds the program's items
    firsts = tl.zeros([BLOCK, CHUNK], tl.int32)  # summed once after the loops: no cross-thread sum per step
    firsts = _keys_before(firsts, KEYS, key, 0, own, n_items, past, CHUNK, True)
    c = own + tl.arange(0, CHUNK)
    other = tl.load(KEYS + c, mask=c < n_items, other=past)
    first = (other[None, :] < key[:, None]) | ((other[None, :] == key[:, None]) & (c[None, :] < i[:, None]))
    firsts += first.to(tl.int32)
    firsts = _keys_before(firsts, KEYS, key, own + CHUNK, n_items, n_items, past, CHUNK, False)
    place = tl.sum(firsts, 1)
    r = i // heads
    tl.store(OUT + place, tl.load(TILE_SEQ + r, mask=ok, other=0), mask=ok)
    tl.store(OUT + n_items + place, tl.load(TILE_START + r, mask=ok, other=0), mask=ok)
    tl.store(OUT + 2 * n_items + place, i % heads, mask=ok)


def sectioned_item_list_device(schedule: dict, q_count: torch.Tensor, heads_kv: int, block_kv: int,
                               q_offsets: torch.Tensor, bytes_per_row: int, l2_bytes: int, total_rows: int = 0,
                               max_count: int = 0):
    """``sectioned_item_list`` (the same three int32 tensors, bit for bit) built in two launches
    (``section_keys_kernel``, ``section_places_kernel``) and one allocation: no sort, no host sync. Why: the torch
    list's 49 small device ops (two stable sorts; the items' radix sort ~31 us alone) were ~50-80 us of the H100's
    time per backward on the bench's sparse batch (8,720 items). The places kernel compares items x items (76M
    pairs there; ``SECTIONS_DEVICE_MAX_ITEMS`` bounds it: a longer list is ``sectioned_item_list``'s). Eager calls
    with the same tensors reuse the list (``base.reusable_in_eager``)."""
    if schedule["TILE_SEQ"].numel() * heads_kv > SECTIONS_DEVICE_MAX_ITEMS:
        return sectioned_item_list(schedule, q_count, heads_kv, block_kv, q_offsets, bytes_per_row, l2_bytes,
                                   total_rows, max_count)
    return per_trace(_sectioned_item_list_device, schedule["TILE_SEQ"], schedule["TILE_START"], q_count, heads_kv,
                     block_kv, q_offsets, bytes_per_row, l2_bytes, total_rows, max_count)


@reusable_in_eager
def _sectioned_item_list_device(seq, start, q_count, heads_kv, block_kv, q_offsets, bytes_per_row, l2_bytes,
                                total_rows, max_count):
    n_tiles, num_seqs, device = seq.numel(), q_offsets.numel() - 1, seq.device
    n_items = n_tiles * heads_kv
    groups = _section_bound(total_rows, heads_kv, bytes_per_row, l2_bytes, max_count)
    wide = not narrow_keys(groups, max_count)  # grouped_order's choice of 32-bit keys
    out = torch.empty(3 * n_items + n_items % 2 + n_items * (2 if wide else 1), dtype=torch.int32, device=device)
    if n_items > 0:
        launch_planned(section_keys_kernel, (heads_kv, bytes_per_row, l2_bytes, block_kv, wide, SECTION_KEYS_BLOCK,
                                             SECTION_KEYS_CHUNK),
                       (common.cdiv(n_items, SECTION_KEYS_BLOCK),),
                       dict(TILE_SEQ=seq, TILE_START=start, Q_OFF=q_offsets, Q_COUNT=q_count, OUT=out,
                            n_items=n_items, num_seqs=num_seqs, groups=groups, bound=max_count,
                            n_kv_blocks=q_count.shape[2], stride_cb=q_count.stride(0), stride_ch=q_count.stride(1),
                            stride_ck=q_count.stride(2)),
                       lambda: dict(heads=heads_kv, bytes_per_row=bytes_per_row, l2_bytes=l2_bytes, block_kv=block_kv,
                                    BLOCK=SECTION_KEYS_BLOCK, CHUNK=SECTION_KEYS_CHUNK, WIDE=wide),
                       num_warps=4, num_stages=1)
        launch_planned(section_places_kernel, (heads_kv, wide, SECTION_PLACES_BLOCK, SECTION_PLACES_CHUNK),
                       (common.cdiv(n_items, SECTION_PLACES_BLOCK),),
                       dict(TILE_SEQ=seq, TILE_START=start, OUT=out, n_items=n_items),
                       lambda: dict(heads=heads_kv, BLOCK=SECTION_PLACES_BLOCK, CHUNK=SECTION_PLACES_CHUNK, WIDE=wide),
                       num_warps=4, num_stages=1)
    return out.as_strided((3, n_items), (n_items, 1)).unbind(0)


def dkdv_stages(cfg, dtype: torch.dtype, head_dim: int, device) -> int:
    """The dK/dV pass's pipeline depth: the dense config's, or 3 under ``KNOBS.sparse_dkdv_stages3`` for 16-bit
    head dims <= 128 on a device with sm_90's shared memory (3 x [64, 128] Q and dO tiles fit there)."""
    if (KNOBS.sparse_dkdv_stages3 and dtype.itemsize == 2 and head_dim <= 128 and not interpreting()
            and shared_memory_limit(device) >= SHARED_MEMORY_LIMITS[90]):
        return 3
    return cfg.num_stages


@triton.jit
def _dkdv_selected_tiles(dk, dv, k, v, q_ptrs, do_ptrs, Lse, Delta, stat_index, stride_qt, stride_dot, q_row0,
                         out_row0, qdo_col, ids, keys, rows0, d_ok, len_q, len_k, lo_off, hi_off, qk_scale, t_begin,
                         t_end, bulk_begin, bulk_end, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
                         HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, MASKED: tl.constexpr, PAD_D: tl.constexpr,
                         QDO_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK, dV of one key tile over the selected query tiles [t_begin, t_end) (tile t: the (t % per-block)-th BLOCK_M
    rows of Q block ids[t // per-block]); mask-free (not MASKED) inside the rows' bulk [bulk_begin, bulk_end).
    QDO_TMA: q_ptrs/do_ptrs are tensor descriptors read at (q_row0 + m0, qdo_col) / (out_row0 + m0, qdo_col);
    masked tiles zero the rows past the sequence (the next sequence's)."""
    TILES_PER_BLOCK: tl.constexpr = BLOCK_Q // BLOCK_M
    for t in range(loop_bound(t_begin), loop_bound(t_end)):
        m0 = tl.load(ids + t // TILES_PER_BLOCK) * BLOCK_Q + (t % TILES_PER_BLOCK) * BLOCK_M
        if MASKED:
            m0 = tl.where(m0 < len_q, m0, len_q)  # tiles past the sequence: fully masked
        else:
            m0 = tl.minimum(tl.maximum(m0, bulk_begin), bulk_end - BLOCK_M)  # unsorted ids stay in the sequence
        rows = m0 + rows0
        rows_ok = rows < len_q
        if QDO_TMA:
            q, do = load_tma_pair(q_ptrs, do_ptrs, q_row0, out_row0, m0, qdo_col, rows, len_q, MASKED)
        else:
            q = load_rows(q_ptrs + m0.to(tl.int64) * stride_qt, rows_ok, d_ok, MASKED, PAD_D)
            do = load_rows(do_ptrs + m0.to(tl.int64) * stride_dot, rows_ok, d_ok, MASKED, PAD_D)
        lse2, delta = _row_stats(Lse, Delta, stat_index + rows, rows_ok, MASKED)
        dk, dv, _ = dkdv_step(dk, dv, k, v, q, do, lse2, delta, keys, rows, len_q, len_k, lo_off, hi_off, qk_scale,
                              HAS_LO, HAS_HI, MASKED, DOT_PRECISION)
    return dk, dv


@triton.jit
def _sparse_dkdv_tile(Q, K, V, DOut, Lse, Delta, DK, DV, Q_OFF, KV_OFF, Q_BLOCK_INDEX, Q_BLOCK_COUNT, seq, n0,
                      kv_head, total_out, n_kv_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                      stride_vh, stride_dot, stride_doh, stride_dkvt, stride_tib, stride_tih, stride_tin, stride_tcb,
                      stride_tch, group, scale, qk_scale, window_left, right,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr,
                      HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr, QDO_TMA: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, ONE_PASS_SPLIT: tl.constexpr):
    """Keys [n0, n0 + BLOCK_N) of one (sequence, kv head): dK, dV over the Q blocks that selected their KV block."""
    kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
    out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
    q_row0 = query_row0(out_row0, BROADCAST_Q)
    keys = n0 + tl.arange(0, BLOCK_N)
    keys_ok = keys < len_k
    rows0 = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    k = load_rows(K + (kv_row0 + keys)[:, None] * stride_kt + kv_head * stride_kh + d[None, :], keys_ok, d_ok, True,
                  PAD_D)
    v = load_rows(V + (kv_row0 + keys)[:, None] * stride_vt + kv_head * stride_vh + d[None, :], keys_ok, d_ok, True,
                  PAD_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # Keys stationary: key j is seen by rows i with -right <= i - j - (L_q - L_k) <= window_left.
    _, _, bulk_begin, bulk_end, _, _ = stage_bounds(n0, len_k, len_q, -right, window_left, HAS_RIGHT, HAS_LEFT,
                                                    BLOCK_N, BLOCK_M)
    ids, count = selected_blocks(Q_BLOCK_INDEX, Q_BLOCK_COUNT, seq, kv_head, n0 // BLOCK_KV, n_kv_blocks, stride_tib,
                                 stride_tih, stride_tin, stride_tcb, stride_tch)
    lead_end, bulk_stop = selected_tiles_split(ids, count, bulk_begin, bulk_end, BLOCK_Q, BLOCK_M, ONE_PASS_SPLIT)
    for g in range(loop_bound(group)):  # the q heads of this kv head's group: sum in registers
        head = kv_head * group + g
        q_ptrs = row_source(Q, q_row0, rows0, stride_qt, head, stride_qh, d, QDO_TMA)
        do_ptrs = row_source(DOut, out_row0, rows0, stride_dot, head, stride_doh, d, QDO_TMA)
        stat_index = head.to(tl.int64) * total_out + out_row0
        # masked lead (window end), mask-free bulk, masked tail (diagonal, sequence end), as the dense stages
        dk, dv = _dkdv_selected_tiles(dk, dv, k, v, q_ptrs, do_ptrs, Lse, Delta, stat_index, stride_qt, stride_dot,
                                      q_row0, out_row0, head * HEAD_DIM, ids, keys, rows0, d_ok, len_q, len_k, -right,
                                      window_left, qk_scale, 0,
                                      lead_end, bulk_begin, bulk_end, BLOCK_M, BLOCK_Q, HAS_RIGHT, HAS_LEFT, True,
                                      PAD_D, QDO_TMA, DOT_PRECISION)
        dk, dv = _dkdv_selected_tiles(dk, dv, k, v, q_ptrs, do_ptrs, Lse, Delta, stat_index, stride_qt, stride_dot,
                                      q_row0, out_row0, head * HEAD_DIM, ids, keys, rows0, d_ok, len_q, len_k, -right,
                                      window_left, qk_scale, lead_end,
                                      bulk_stop, bulk_begin, bulk_end, BLOCK_M, BLOCK_Q, HAS_RIGHT, HAS_LEFT, False,
                                      PAD_D, QDO_TMA, DOT_PRECISION)
        dk, dv = _dkdv_selected_tiles(dk, dv, k, v, q_ptrs, do_ptrs, Lse, Delta, stat_index, stride_qt, stride_dot,
                                      q_row0, out_row0, head * HEAD_DIM, ids, keys, rows0, d_ok, len_q, len_k, -right,
                                      window_left, qk_scale, bulk_stop,
                                      count * (BLOCK_Q // BLOCK_M), bulk_begin, bulk_end, BLOCK_M, BLOCK_Q, HAS_RIGHT,
                                      HAS_LEFT, True, PAD_D, QDO_TMA, DOT_PRECISION)
    store_dk_dv(DK, DV, dk, dv, scale, kv_row0, keys, kv_head, stride_dkvt, d, keys_ok, d_ok, HEAD_DIM, PAD_D)


@triton.jit(do_not_specialize=["num_heads_kv", "total_out", "n_kv_blocks", "n_slots", "search_steps", "num_seqs",
                               "rows_s", "rows_o", "group", "window_left", "right"])
def block_sparse_dkdv_kernel(Q, K, V, DOut, Lse, Delta, DK, DV, Q_OFF, KV_OFF, Q_BLOCK_INDEX, Q_BLOCK_COUNT,
                             TILE_SEQ, TILE_START, TILE_COUNT, WORK_COUNTER, num_heads_kv, total_out, n_kv_blocks,
                             n_slots, search_steps, num_seqs, rows_s, rows_o, stride_qt, stride_qh, stride_kt,
                             stride_kh, stride_vt, stride_vh, stride_dot, stride_doh, stride_dkvt, stride_tib,
                             stride_tih, stride_tin, stride_tcb, stride_tch, group, scale, qk_scale, window_left,
                             right,
                             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
                             BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                             BROADCAST_Q: tl.constexpr, QDO_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                             KV_MAJOR: tl.constexpr, ATOMIC_WORK: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr,
                             ONE_PASS_SPLIT: tl.constexpr):
    """Work items (key tile, kv head), as the dense ``attn_bwd_dkdv_kernel`` takes them (``scheduling.work_tile``)."""
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)  # Inductor passes fp64
    tl.static_assert(BLOCK_Q % BLOCK_M == 0)
    tl.static_assert(BLOCK_KV % BLOCK_N == 0)
    if TILES_FROM_OFFSETS:
        n_tiles = n_slots
    else:
        n_tiles = tl.load(TILE_COUNT)
    work = first_work(WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)
    while work < n_tiles * num_heads_kv:
        seq, n0, kv_head, real = work_tile(work, n_tiles, num_heads_kv, 1, TILE_SEQ, TILE_START, KV_OFF, Q_OFF,
                                           num_seqs, search_steps, rows_s, rows_o, BLOCK_N, KV_MAJOR,
                                           TILES_FROM_OFFSETS)
        if real:
            _sparse_dkdv_tile(Q, K, V, DOut, Lse, Delta, DK, DV, Q_OFF, KV_OFF, Q_BLOCK_INDEX, Q_BLOCK_COUNT, seq, n0,
                              kv_head, total_out, n_kv_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                              stride_vh, stride_dot, stride_doh, stride_dkvt, stride_tib, stride_tih, stride_tin,
                              stride_tcb, stride_tch, group, scale, qk_scale, window_left, right, HEAD_DIM, BLOCK_D,
                              PAD_D, BLOCK_M, BLOCK_N, BLOCK_Q, BLOCK_KV, HAS_LEFT, HAS_RIGHT, BROADCAST_Q,
                              QDO_TMA, DOT_PRECISION, ONE_PASS_SPLIT)
        work = next_work(work, WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)


@triton.jit
def _dq_selected_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, kv_row0, kv_col, ids, rows,
                       cols, d_ok, len_q, len_k, lo_off, hi_off, qk_scale, t_begin, t_end, bulk_begin, bulk_end,
                       BLOCK_N: tl.constexpr, BLOCK_KV: tl.constexpr, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                       MASKED: tl.constexpr, PAD_D: tl.constexpr, KV_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ (unscaled) of one query tile over the selected key tiles [t_begin, t_end), as the forward's loop. KV_TMA:
    k_ptrs/v_ptrs are tensor descriptors read at (kv_row0 + n0, kv_col); masked tiles zero rows past the sequence."""
    TILES_PER_BLOCK: tl.constexpr = BLOCK_KV // BLOCK_N
    for t in range(loop_bound(t_begin), loop_bound(t_end)):
        block = tl.load(ids + t // TILES_PER_BLOCK)
        n0 = block * BLOCK_KV + (t % TILES_PER_BLOCK) * BLOCK_N
        if MASKED:
            n0 = tl.where((block >= 0) & (n0 < len_k), n0, len_k)  # ids outside the sequence: fully masked
        else:
            n0 = tl.minimum(tl.maximum(n0, bulk_begin), bulk_end - BLOCK_N)  # unsorted ids stay in the sequence
        keys = n0 + cols
        if KV_TMA:
            k, v = load_tma_pair(k_ptrs, v_ptrs, kv_row0, kv_row0, n0, kv_col, keys, len_k, MASKED)
        else:
            k = load_rows(k_ptrs + n0.to(tl.int64) * stride_kt, keys < len_k, d_ok, MASKED, PAD_D)
            v = load_rows(v_ptrs + n0.to(tl.int64) * stride_vt, keys < len_k, d_ok, MASKED, PAD_D)
        dq = dq_step(dq, q, do, lse2, delta, k, v, rows, keys, len_q, len_k, lo_off, hi_off, qk_scale, HAS_LO,
                     HAS_HI, MASKED, DOT_PRECISION)
    return dq


@triton.jit
def _sparse_dq_tile(Q, K, V, DOut, Lse, Delta, DQ, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, seq_begin, m0, head,
                    num_seqs, total_out, n_q_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                    stride_vh, stride_dot, stride_doh, stride_dqt, stride_dqh, stride_ib, stride_ih, stride_in,
                    stride_cb, stride_ch, group, scale, qk_scale, window_left, right,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr,
                    HAS_RIGHT: tl.constexpr, BROADCAST_Q: tl.constexpr, KV_TMA: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, ONE_PASS_SPLIT: tl.constexpr):
    """Query rows [m0, m0 + BLOCK_M) of one sequence (broadcast Q: of every sequence, summed in order), q head."""
    if BROADCAST_Q:
        seq_end = seq_begin + num_seqs
    else:
        seq_end = seq_begin + 1
    # broadcast Q: every sequence has the same L_q
    first_row, len_q = seq_extent(tl.load(Q_OFF + seq_begin), tl.load(Q_OFF + seq_begin + 1))
    q_row0 = query_row0(first_row, BROADCAST_Q)
    rows = m0 + tl.arange(0, BLOCK_M)
    rows_ok = rows < len_q
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    kv_head = head // group
    q = load_rows(Q + (q_row0 + rows)[:, None] * stride_qt + head * stride_qh + d[None, :], rows_ok, d_ok, True,
                  PAD_D)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for seq in range(loop_bound(seq_begin), loop_bound(seq_end)):
        out_row0, len_q = seq_extent(tl.load(Q_OFF + seq), tl.load(Q_OFF + seq + 1))
        kv_row0, len_k = seq_extent(tl.load(KV_OFF + seq), tl.load(KV_OFF + seq + 1))
        do = load_rows(DOut + (out_row0 + rows)[:, None] * stride_dot + head * stride_doh + d[None, :], rows_ok,
                       d_ok, True, PAD_D)
        lse2, delta = _row_stats(Lse, Delta, head.to(tl.int64) * total_out + out_row0 + rows, rows_ok, True)
        k_ptrs = row_source(K, kv_row0, cols, stride_kt, kv_head, stride_kh, d, KV_TMA)
        v_ptrs = row_source(V, kv_row0, cols, stride_vt, kv_head, stride_vh, d, KV_TMA)
        _, _, bulk_begin, bulk_end, _, _ = stage_bounds(m0, len_q, len_k, -window_left, right, HAS_LEFT, HAS_RIGHT,
                                                        BLOCK_M, BLOCK_N)
        ids, count = selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, kv_head, m0 // BLOCK_Q, n_q_blocks, stride_ib,
                                     stride_ih, stride_in, stride_cb, stride_ch)
        lead_end, bulk_stop = selected_tiles_split(ids, count, bulk_begin, bulk_end, BLOCK_KV, BLOCK_N,
                                                   ONE_PASS_SPLIT)
        # masked lead (window start), mask-free bulk, masked tail (diagonal, window end, partial last block)
        dq = _dq_selected_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, kv_row0,
                                kv_head * HEAD_DIM, ids, rows, cols, d_ok,
                                len_q, len_k, -window_left, right, qk_scale, 0, lead_end, bulk_begin, bulk_end,
                                BLOCK_N, BLOCK_KV, HAS_LEFT, HAS_RIGHT, True, PAD_D, KV_TMA, DOT_PRECISION)
        dq = _dq_selected_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, kv_row0,
                                kv_head * HEAD_DIM, ids, rows, cols, d_ok,
                                len_q, len_k, -window_left, right, qk_scale, lead_end, bulk_stop, bulk_begin,
                                bulk_end, BLOCK_N, BLOCK_KV, HAS_LEFT, HAS_RIGHT, False, PAD_D, KV_TMA,
                                DOT_PRECISION)
        dq = _dq_selected_tiles(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kt, stride_vt, kv_row0,
                                kv_head * HEAD_DIM, ids, rows, cols, d_ok,
                                len_q, len_k, -window_left, right, qk_scale, bulk_stop,
                                count * (BLOCK_KV // BLOCK_N), bulk_begin, bulk_end, BLOCK_N, BLOCK_KV, HAS_LEFT,
                                HAS_RIGHT, True, PAD_D, KV_TMA, DOT_PRECISION)
    store_rows(DQ + (q_row0 + rows)[:, None] * stride_dqt + head * stride_dqh + d[None, :],
               (dq * scale).to(DQ.dtype.element_ty), rows_ok, d_ok, PAD_D)


@triton.jit(do_not_specialize=["num_heads", "num_seqs", "total_out", "n_q_blocks", "n_slots", "search_steps",
                               "rows_s", "rows_o", "group", "window_left", "right"])
def block_sparse_dq_kernel(Q, K, V, DOut, Lse, Delta, DQ, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, TILE_SEQ,
                           TILE_START, TILE_COUNT, WORK_COUNTER, num_heads, num_seqs, total_out, n_q_blocks, n_slots,
                           search_steps, rows_s, rows_o, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                           stride_vh, stride_dot, stride_doh, stride_dqt, stride_dqh, stride_ib, stride_ih,
                           stride_in, stride_cb, stride_ch, group, scale, qk_scale, window_left, right,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
                           BLOCK_KV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                           BROADCAST_Q: tl.constexpr, KV_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                           ATOMIC_WORK: tl.constexpr, TILES_FROM_OFFSETS: tl.constexpr, ONE_PASS_SPLIT: tl.constexpr):
    """Work items (query tile, q head), tile-major as the dense ``attn_bwd_dq_kernel`` (``scheduling.work_tile``).
    Broadcast Q: the tiles are L_q's query blocks (sequence 0) and each sums over every sequence."""
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)  # Inductor passes fp64
    tl.static_assert(BLOCK_Q % BLOCK_M == 0)
    tl.static_assert(BLOCK_KV % BLOCK_N == 0)
    if TILES_FROM_OFFSETS:
        n_tiles = n_slots
    else:
        n_tiles = tl.load(TILE_COUNT)
    work = first_work(WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)
    while work < n_tiles * num_heads:
        seq, m0, head, real = work_tile(work, n_tiles, num_heads, 1, TILE_SEQ, TILE_START, Q_OFF, KV_OFF, num_seqs,
                                        search_steps, rows_s, rows_o, BLOCK_M, False, TILES_FROM_OFFSETS)
        if real:
            _sparse_dq_tile(Q, K, V, DOut, Lse, Delta, DQ, Q_OFF, KV_OFF, BLOCK_INDEX, BLOCK_COUNT, seq, m0, head,
                            num_seqs, total_out, n_q_blocks, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                            stride_vh, stride_dot, stride_doh, stride_dqt, stride_dqh, stride_ib, stride_ih,
                            stride_in, stride_cb, stride_ch, group, scale, qk_scale, window_left, right, HEAD_DIM,
                            BLOCK_D, PAD_D, BLOCK_M, BLOCK_N, BLOCK_Q, BLOCK_KV, HAS_LEFT, HAS_RIGHT, BROADCAST_Q,
                            KV_TMA, DOT_PRECISION, ONE_PASS_SPLIT)
        work = next_work(work, WORK_COUNTER if ATOMIC_WORK else None, ATOMIC_WORK)


def block_sparse_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index,
                          kv_block_count, params):
    q, k, v, out, grad_out = (packed_rows(t) for t in (q, k, v, out, grad_out))
    device, num_seqs = q.device, kv_offsets.shape[0] - 1
    num_heads, head_dim, num_heads_kv = q.shape[1], q.shape[2], k.shape[1]
    q_off, kv_off, total_out = sparse_offsets(q, q_offsets, kv_offsets, params.broadcast_q)
    if num_seqs == 0 or total_out == 0 or k.shape[0] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    lse = lse.contiguous()
    hd = head_dim_consts(head_dim)
    has_left, window_left, has_right, right = window_bounds(params.causal, params.window_left, params.window_right)
    common_args = dict(
        Q=q, K=k, V=v, DOut=grad_out, Lse=lse, Q_OFF=q_off, KV_OFF=kv_off, total_out=total_out,
        **row_strides("q", q), **row_strides("k", k), **row_strides("v", v), **row_strides("do", grad_out),
        group=num_heads // num_heads_kv, scale=params.scale, qk_scale=params.scale * 1.4426950408889634,  # / ln 2
        window_left=window_left, right=right, **hd, BLOCK_Q=params.block_q, BLOCK_KV=params.block_kv,
        HAS_LEFT=has_left, HAS_RIGHT=has_right, BROADCAST_Q=params.broadcast_q, DOT_PRECISION=dot_precision(q.dtype))

    # 1. delta = rowsum(dO * O) - grad_lse
    delta = common.alloc_output((num_heads, total_out), torch.float32, device)
    launch(attn_bwd_delta_kernel, (triton.cdiv(total_out, DELTA_BLOCK_T), num_heads), dict(
        Out=out, DOut=grad_out, GradLse=delta if grad_lse is None else grad_lse.to(torch.float32).contiguous(),
        Delta=delta, ZEROED=delta, total_out=total_out, zero_rows=0, **row_strides("o", out),
        **row_strides("do", grad_out), **hd, BLOCK_T=DELTA_BLOCK_T, HAS_GRAD_LSE=grad_lse is not None, ZERO=False))
    index, count = kv_block_index.contiguous(), kv_block_count.contiguous()

    # 2. dK, dV over the transposed selection: key tiles x kv heads, longest first by selecting Q blocks
    q_index, q_count = transposed_selection(k, index, count, params)
    n_kv_blocks = q_index.shape[2]
    dk, dv = (common.alloc_output(t.shape, t.dtype, device) for t in (k, v))
    cfg, block_m, block_n = tile_sizes("dkdv", head_dim, q.dtype, params.causal, device, params.block_q,
                                       params.block_kv)
    programs, schedule = tile_schedule(
        lambda: kv_tiles(q_off, kv_off, total_out, k.shape[0], block_n, window_left, right, has_left, has_right,
                         **selected_cost_args(q_count, params.block_kv)),
        kv_off, q_off, k.shape[0], total_out, block_n, num_heads_kv, KNOBS.bwd_schedule, cfg.programs_per_sm, device)
    # Q and dO through TMA (KNOBS.sparse_tma, attn_fwd.use_tma): no [BLOCK_M, D] pointer tensors in registers
    qdo_tma = KNOBS.sparse_tma and use_tma(hd["PAD_D"], q, grad_out, k)
    qdo = dict(Q=rows_descriptor(q, block_m), DOut=rows_descriptor(grad_out, block_m)) if qdo_tma else {}
    launch(block_sparse_dkdv_kernel, (programs,), dict(
        **dict(common_args, **qdo), QDO_TMA=qdo_tma, Delta=delta, DK=dk, DV=dv, Q_BLOCK_INDEX=q_index, Q_BLOCK_COUNT=q_count, **schedule,
        num_heads_kv=num_heads_kv, n_kv_blocks=n_kv_blocks, stride_dkvt=dk.stride(0),
        **index_strides("ti", "tc", q_index, q_count), BLOCK_M=block_m, BLOCK_N=block_n,
        KV_MAJOR=KNOBS.bwd_kv_major, ONE_PASS_SPLIT=KNOBS.sparse_one_pass_split), num_warps=cfg.num_warps,
        num_stages=dkdv_stages(cfg, q.dtype, head_dim, device))

    # 3. dQ over the selection itself: query tiles x q heads, longest first (broadcast Q: L_q's tiles, each summing
    # over the sequences)
    dq = common.alloc_output(q.shape, q.dtype, device)
    cfg, block_m, block_n = tile_sizes("dq", head_dim, q.dtype, params.causal, device, params.block_q,
                                       params.block_kv)
    if params.broadcast_q:
        tiles = single_tiles(triton.cdiv(q.shape[0], block_m), block_m, device)
        programs, counter = launch_schedule(KNOBS.bwd_schedule, tiles.capacity * num_heads, cfg.programs_per_sm,
                                            device)
        schedule = dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start, TILE_COUNT=tiles.count,
                        WORK_COUNTER=tiles.count if counter is None else counter, n_slots=tiles.capacity,
                        search_steps=binary_search_steps(num_seqs), num_seqs=num_seqs, rows_s=total_out,
                        rows_o=k.shape[0],
                        ATOMIC_WORK=counter is not None, TILES_FROM_OFFSETS=False)
    else:
        programs, schedule = tile_schedule(
            lambda: forward_tiles(q_off, kv_off, total_out, k.shape[0], block_m, window_left, right, has_left,
                                  has_right, **selected_cost_args(count, params.block_q)),
            q_off, kv_off, total_out, k.shape[0], block_m, num_heads, KNOBS.bwd_schedule, cfg.programs_per_sm, device)
    kv_tma = KNOBS.sparse_tma and use_tma(hd["PAD_D"], k, v)
    kv = dict(K=rows_descriptor(k, block_n), V=rows_descriptor(v, block_n)) if kv_tma else {}
    launch(block_sparse_dq_kernel, (programs,), dict(
        **dict(common_args, **kv), KV_TMA=kv_tma, Delta=delta, DQ=dq, BLOCK_INDEX=index, BLOCK_COUNT=count, **schedule, num_heads=num_heads,
        n_q_blocks=index.shape[2], stride_dqt=dq.stride(0), stride_dqh=dq.stride(1),
        **index_strides("i", "c", index, count), BLOCK_M=block_m, BLOCK_N=block_n,
        ONE_PASS_SPLIT=KNOBS.sparse_one_pass_split), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return dq, dk, dv

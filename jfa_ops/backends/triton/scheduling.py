"""Tile lists built on the device, longest first, for the persistent kernels. No host sync anywhere.

A *tile* is (sequence id, first row of the stationary side) for one block of ``block`` rows of one sequence. The
number of real tiles depends on the lengths (device data), so the list has a length bounded by shapes alone::

    sum_b cdiv(L_b, block) <= cdiv(T, block) + B

and the real count stays on the device (``count``, a 1-element int32 tensor the kernels read). Entries past the real
count are padding (seq = -1, cost -1: sorted last) and are never visited.

Order: descending estimated cost (visible pairs of the tile), so that the persistent grid's static striding hands the
longest tiles out first and the short ones fill in at the end (greedy longest-processing-time-first).
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class TileList:
    seq: torch.Tensor  # [capacity] int32: first sequence of the tile (-1: padding)
    start: torch.Tensor  # [capacity] int32: first stationary row of the tile, relative to its sequence
    count: torch.Tensor  # [1] int32: number of real tiles (device scalar)
    capacity: int  # shape-derived upper bound on count (host int)


def _lengths(offsets: torch.Tensor) -> torch.Tensor:
    return (offsets[1:] - offsets[:-1]).to(torch.int64)


def build_tiles(stationary_offsets: torch.Tensor, other_offsets: torch.Tensor, total_rows: int, block: int,
                lo_off: int, hi_off: int, has_lo: bool, has_hi: bool) -> TileList:
    """Tiles over the stationary side (queries for forward/dQ, keys for dK/dV), longest first.

    A stationary position ``s`` of a sequence sees the other side's positions ``o`` with
    ``s + lo_off + diag <= o <= s + hi_off + diag`` with ``diag = L_other - L_stationary`` (each bound only if
    present; the bottom-right alignment of FlashAttention), clipped to ``[0, L_other)``. The tile cost is (rows in
    the tile) x (other-side positions its rows can see).
    """
    device = stationary_offsets.device
    num_seqs = other_offsets.numel() - 1
    capacity = (total_rows + block - 1) // block + num_seqs
    len_s, len_o = _lengths(stationary_offsets), _lengths(other_offsets)
    tiles_per_seq = (len_s + block - 1) // block
    last_tile = torch.cumsum(tiles_per_seq, 0)  # inclusive prefix sum
    t = torch.arange(capacity, device=device, dtype=torch.int64)
    seq = torch.searchsorted(last_tile, t, right=True)  # t >= total -> num_seqs
    valid = seq < num_seqs
    seq = seq.clamp(max=num_seqs - 1)
    start = (t - (last_tile - tiles_per_seq)[seq]) * block
    rows = (len_s[seq] - start).clamp(max=block)
    diag = (len_o - len_s)[seq]
    first, last = start, start + rows - 1
    lo = (first + lo_off + diag).clamp(min=0) if has_lo else torch.zeros_like(first)
    hi = torch.minimum(last + hi_off + diag + 1, len_o[seq]) if has_hi else len_o[seq]
    cost = torch.where(valid, rows * (hi - lo).clamp(min=0), torch.full_like(rows, -1))
    order = torch.argsort(cost, descending=True, stable=True)
    seq = torch.where(valid, seq, torch.full_like(seq, -1))[order].to(torch.int32)
    start = start[order].to(torch.int32)
    count = last_tile[-1:].to(torch.int32)
    return TileList(seq, start, count, capacity)


def forward_tiles(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, total_q: int, block_m: int, window_left: int,
                  right: int, has_left: bool, has_right: bool) -> TileList:
    """Query tiles. Row i sees keys j with i + diag - window_left <= j <= i + diag + right, diag = L_k - L_q."""
    return build_tiles(q_offsets, kv_offsets, total_q, block_m, -window_left, right, has_left, has_right)


def kv_tiles(q_offsets: torch.Tensor, kv_offsets: torch.Tensor, total_kv: int, block_n: int, window_left: int,
             right: int, has_left: bool, has_right: bool) -> TileList:
    """Key tiles. Key j is seen by rows i with j - diag - right <= i <= j - diag + window_left (diag = L_k - L_q)."""
    return build_tiles(kv_offsets, q_offsets, total_kv, block_n, -right, window_left, has_right, has_left)


def single_tiles(num_tiles: int, block: int, device: torch.device) -> TileList:
    """Tiles 0..num_tiles-1 of one block each (seq 0), e.g. query blocks of a broadcast Q; no sort needed."""
    ids = torch.arange(num_tiles, device=device, dtype=torch.int32)
    return TileList(torch.zeros_like(ids), ids * block, torch.full((1,), num_tiles, device=device,
                                                                    dtype=torch.int32), num_tiles)

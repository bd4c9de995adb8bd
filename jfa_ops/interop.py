"""Interop with other attention libraries: a block-sparse selection as a FlexAttention ``BlockMask``.

FlexAttention sees the jagged batch packed as one sequence (``[1, H, T, D]``); the mask keeps each sequence to
itself, applies causal/window per sequence (bottom-right aligned, as ``jagged_attention``) and keeps only the
selected blocks. ``create_block_mask`` derives Flex's block lists from it, so Flex skips what the selection drops
(block for block when every sequence starts at a multiple of the block sizes, as in the bench).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

import meta_kernels
from jfa_ops import validation
from jfa_ops.ops.block_sparse import check_index_values

__all__ = ["selection_mask_mod", "to_flex_block_mask", "flex_packed_attention"]


def _row_sequence(offsets: Tensor, rows: int) -> Tensor:
    """[rows] int64: which sequence each packed row belongs to (device ops only)."""
    return torch.searchsorted(offsets.long()[1:], torch.arange(rows, device=offsets.device), right=True)


def selection_mask_mod(kv_block_index: Tensor, kv_block_count: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                       q_rows: int, kv_rows: int, num_heads_q: int, block_q: int, block_kv: int,
                       causal: bool = False, window: Sequence[int] = (-1, -1)):
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` over the packed rows: True iff both rows are in the same
    sequence, the causal/window mask lets the pair through and the key's block is selected for the query's block
    (kv head ``h // (num_heads_q // Hkv)``)."""
    batch, heads_kv, n_q_blocks, width = kv_block_index.shape
    device = kv_block_index.device
    q_off, kv_off = q_offsets.long(), kv_offsets.long()
    n_kv_blocks = int(width)
    kv_lengths = kv_off.diff()
    n_kv_dense = max(n_kv_blocks, 1)
    # dense [B, Hkv, NQB, NKB + 1] table of selected pairs (the last column takes unused entries)
    used = torch.arange(width, device=device) < kv_block_count[..., None]
    ids = torch.where(used & (kv_block_index >= 0), kv_block_index.long(), n_kv_dense).clamp(max=n_kv_dense)
    selected = torch.zeros((batch, heads_kv, n_q_blocks + 1, n_kv_dense + 1), dtype=torch.bool, device=device)
    selected[:, :, :n_q_blocks].scatter_(3, ids, True)
    group = num_heads_q // heads_kv
    seq_of_q, seq_of_k = _row_sequence(q_off, q_rows), _row_sequence(kv_off, kv_rows)  # lookups: vmap-friendly
    left, right = window

    def mask_mod(b, h, q_idx, kv_idx):
        seq = seq_of_q[q_idx]
        seq_k = seq_of_k[kv_idx]
        i = q_idx - q_off[seq]
        j = kv_idx - kv_off[seq]
        len_q = q_off[seq + 1] - q_off[seq]
        d = i + kv_lengths[seq] - len_q
        ok = (seq == seq_k) & (j >= 0) & (j < kv_lengths[seq])
        if causal:
            ok = ok & (j <= d)
        if left != -1:
            ok = ok & (j >= d - left)
        if right != -1:
            ok = ok & (j <= d + right)
        q_block = (i // block_q).clamp(max=n_q_blocks)
        kv_block = (j // block_kv).clamp(min=0, max=n_kv_dense)
        return ok & selected[seq, h // group, q_block, kv_block]

    return mask_mod


def to_flex_block_mask(kv_block_index: Tensor, kv_block_count: Tensor, q_offsets: Tensor, kv_offsets: Tensor, *,
                       num_heads_q: int, block_q: int, block_kv: int, causal: bool = False,
                       window: Sequence[int] = (-1, -1), flex_block_size=None, _compile: bool = False):
    """The selection as a FlexAttention ``BlockMask`` over the packed batch (B=1, H=num_heads_q, Q_LEN=T_q,
    KV_LEN=T_kv), with Flex blocks of ``flex_block_size`` (default: (block_q, block_kv)). Broadcast Q is not
    expressible as one packed sequence: pass ``q`` repeated per sequence instead; nor is a batch without q or kv
    rows (a ``ValueError``). ``_compile``: build the mask with
    a compiled ``create_block_mask`` (needed on the GPU at long lengths)."""
    from torch.nn.attention.flex_attention import create_block_mask

    q_rows, kv_rows = _check_selection(kv_block_index, kv_block_count, q_offsets, kv_offsets, num_heads_q, block_q,
                                       block_kv, causal, window)
    mask_mod = selection_mask_mod(kv_block_index, kv_block_count, q_offsets, kv_offsets, q_rows=q_rows,
                                  kv_rows=kv_rows, num_heads_q=num_heads_q, block_q=block_q, block_kv=block_kv,
                                  causal=causal, window=window)
    return create_block_mask(mask_mod, 1, num_heads_q, q_rows, kv_rows, device=kv_block_index.device,
                             BLOCK_SIZE=flex_block_size or (block_q, block_kv), _compile=_compile)


def _check_selection(kv_block_index: Tensor, kv_block_count: Tensor, q_offsets: Tensor, kv_offsets: Tensor,
                     num_heads_q: int, block_q: int, block_kv: int, causal: bool, window: Sequence[int]):
    """``block_sparse_attention``'s rules for a selection, its offsets and the mask options, on the host (the mask
    is built there anyway): a selection the mask cannot describe (too few Q blocks, ids past a sequence, bad
    offsets) would be dropped from it silently, a window below -1 would make a mask of no meaning. Returns the
    packed lengths (q_rows, kv_rows)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    meta_kernels.check_window(window)
    if not isinstance(kv_block_index, Tensor):
        raise TypeError(f"kv_block_index must be a torch.Tensor, got {type(kv_block_index).__name__}")
    for name, offsets in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        meta_kernels.attention._check_offsets(name, offsets, kv_block_index.device, "kv_block_index")
    if q_offsets.shape[0] != kv_offsets.shape[0]:
        raise ValueError(f"q_offsets and kv_offsets must both be [B+1], got {q_offsets.shape[0]} and "
                         f"{kv_offsets.shape[0]}")
    k_like = kv_block_index.new_empty((0, kv_block_index.shape[1], 0))  # what check_block_index reads of k
    meta_kernels.check_block_index(kv_block_index, kv_block_count, k_like, kv_offsets, block_q, block_kv)
    heads_kv = kv_block_index.shape[1]
    if not isinstance(num_heads_q, int) or isinstance(num_heads_q, bool):
        raise TypeError(f"num_heads_q must be an int, got {type(num_heads_q).__name__}")
    if num_heads_q < 1 or heads_kv < 1 or num_heads_q % heads_kv != 0:
        raise ValueError(f"num_heads_q ({num_heads_q}) must be a positive multiple of kv_block_index's kv heads "
                         f"({heads_kv})")
    q_rows, kv_rows = int(q_offsets[-1]), int(kv_offsets[-1])  # the packed lengths (one host read, setup time)
    validation.check_on_host("q_offsets", q_offsets, q_rows)
    validation.check_on_host("kv_offsets", kv_offsets, kv_rows)
    if q_rows < 1 or kv_rows < 1:  # create_block_mask indexes row 0 of each (an IndexError from inside it)
        raise ValueError(f"to_flex_block_mask needs at least one q row and one kv row (FlexAttention masks a "
                         f"non-empty packed sequence), got q_offsets[-1]={q_rows}, kv_offsets[-1]={kv_rows}")
    check_index_values(q_offsets.diff(), kv_offsets.diff(), kv_block_index, kv_block_count, block_q, block_kv)
    return q_rows, kv_rows


def flex_packed_attention(q: Tensor, k: Tensor, v: Tensor, block_mask, *, scale=None, flex=None) -> Tensor:
    """FlexAttention over packed [T, H, D] q/k/v with ``block_mask`` (``to_flex_block_mask``): out [T_q, Hq, D].
    ``flex``: the (compiled) flex_attention to call (default: the eager one)."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex or flex_attention
    out = fn(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
             block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1)

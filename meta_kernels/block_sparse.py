"""Shape rules and argument checks of the block-sparse family: ``jfa::select_kv_blocks`` and
``jfa::block_sparse_attention`` (+ backward).

Legend as in ``meta_kernels.attention``, plus ``NQB``/``NKB``: the static number of Q/KV blocks per sequence,
``ceil(max_seqlen_q / block_q)`` (broadcast_q: ``ceil(L_q / block_q)``) and ``ceil(max_seqlen_kv / block_kv)``::

    kv_block_index [B, Hkv, NQB, NKB] int32   selected KV block ids of (sequence, kv head, Q block), ascending,
                                              -1 after the first kv_block_count entries
    kv_block_count [B, Hkv, NQB] int32        how many are selected (0 for Q blocks past the sequence's end)

The sizes depend on shapes and the max_seqlen arguments only (never on offset values), so the selection's output
shape is static under ``torch.compile`` and no host sync is needed to size it.
"""
from __future__ import annotations

import torch

from meta_kernels.attention import _fails, _is_int, check_attention_args, check_window

INDEX_DTYPE = torch.int32


def num_blocks(rows, block: int):
    """ceil(rows / block) (rows may be a SymInt)."""
    return (rows + block - 1) // block


def check_block_sizes(block_q, block_kv) -> None:
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
        if value >= 2**31:
            raise ValueError(f"{name} must be < 2**31 (the kernels' int32), got {value}")


def check_select_args(q, k, q_offsets, kv_offsets, block_q, block_kv, keep_ratio, top_k, causal, window,
                      broadcast_q, always_local, max_seqlen_q, max_seqlen_kv) -> None:
    """Raise ``TypeError``/``ValueError`` naming the argument (metadata and options only)."""
    check_select_options(block_q, block_kv, keep_ratio, top_k, causal, window, broadcast_q, always_local,
                         max_seqlen_q, max_seqlen_kv)
    check_attention_args(q, k, k, q_offsets, kv_offsets, window, broadcast_q)


def check_select_options(block_q, block_kv, keep_ratio, top_k, causal, window, broadcast_q, always_local,
                         max_seqlen_q, max_seqlen_kv) -> None:
    """The non-tensor options of ``select_kv_blocks`` (the wrapper takes any Python object)."""
    check_block_sizes(block_q, block_kv)
    for name, flag in (("causal", causal), ("broadcast_q", broadcast_q), ("always_local", always_local)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
    if not isinstance(keep_ratio, (float, int)) or isinstance(keep_ratio, bool):
        raise TypeError(f"keep_ratio must be a float, got {type(keep_ratio).__name__}")
    if not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int or None, got {type(top_k).__name__}")
    if top_k == 0 or top_k < -1:
        raise ValueError(f"top_k must be >= 1 (or None/-1 to use keep_ratio), got {top_k}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if not _is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    # The output's size comes from them, so they are required (a static shape, no host sync to find the lengths).
    if _fails(max_seqlen_kv < 0):
        raise ValueError(f"max_seqlen_kv is required (>= 0): it sizes the output, got {max_seqlen_kv}")
    if not broadcast_q and _fails(max_seqlen_q < 0):
        raise ValueError(f"max_seqlen_q is required (>= 0) unless broadcast_q=True: it sizes the output, got "
                         f"{max_seqlen_q}")
    check_window(window)


def select_shapes(q, k, kv_offsets, block_q: int, block_kv: int, max_seqlen_q, max_seqlen_kv, broadcast_q: bool):
    """(kv_block_index shape, kv_block_count shape) of ``select_kv_blocks``."""
    n_q_blocks = num_blocks(q.shape[0] if broadcast_q else max_seqlen_q, block_q)
    n_kv_blocks = num_blocks(max_seqlen_kv, block_kv)
    lead = (kv_offsets.shape[0] - 1, k.shape[1], n_q_blocks)
    return lead + (n_kv_blocks,), lead


def check_block_index(kv_block_index, kv_block_count, k, kv_offsets, block_q, block_kv) -> None:
    """kv_block_index [B, Hkv, NQB, NKB] and kv_block_count [B, Hkv, NQB], int32, on k's device."""
    check_block_sizes(block_q, block_kv)
    for name, t, rank in (("kv_block_index", kv_block_index, 4), ("kv_block_count", kv_block_count, 3)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != INDEX_DTYPE:
            raise TypeError(f"{name} must be int32 (as select_kv_blocks returns it), got {t.dtype}")
        if t.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")
        if t.device != k.device:
            raise ValueError(f"{name} must be on k's device {k.device}, got {t.device}")
    expected = (kv_offsets.shape[0] - 1, k.shape[1])
    if any(_fails(a != b) for a, b in zip(kv_block_index.shape[:2], expected)):
        raise ValueError(f"kv_block_index must be [B, Hkv, NQB, NKB] with B, Hkv = {tuple(expected)}, got shape "
                         f"{tuple(kv_block_index.shape)}")
    if any(_fails(a != b) for a, b in zip(kv_block_count.shape, kv_block_index.shape[:3])):
        raise ValueError(f"kv_block_count must be kv_block_index's [B, Hkv, NQB] {tuple(kv_block_index.shape[:3])}, "
                         f"got {tuple(kv_block_count.shape)}")


def block_visible(q_rows: int, kv_rows: int, block_q: int, block_kv: int, causal: bool, left: int, right: int,
                  i, j):
    """Whether some query of Q block i sees some key of KV block j (bottom-right aligned causal/window mask); i, j
    broadcast (ints or integer tensors). Queries r of block i have diagonals d = r + L_k - L_q in [d0, d1]; key c is
    visible from d iff d - left <= c <= d + right (causal: right = min(right, 0)), so the block pair is visible iff
    max(d0, first key - right) <= min(d1, last key + left), and both blocks are non-empty."""
    if causal:
        right = 0 if right < 0 else min(right, 0)
    d0 = i * block_q + (kv_rows - q_rows)
    d1 = _minimum((i + 1) * block_q, q_rows) - 1 + (kv_rows - q_rows)
    first = j * block_kv
    last = _minimum((j + 1) * block_kv, kv_rows) - 1
    lo = d0 if right < 0 else _maximum(d0, first - right)
    hi = d1 if left < 0 else _minimum(d1, last + left)
    return (lo <= hi) & (i * block_q < q_rows) & (first < kv_rows)


def _minimum(a, b):
    return torch.minimum(a, torch.as_tensor(b)) if isinstance(a, torch.Tensor) else min(a, b)


def _maximum(a, b):
    return torch.maximum(a, torch.as_tensor(b)) if isinstance(a, torch.Tensor) else max(a, b)


def local_block(q_rows: int, kv_rows: int, block_q: int, block_kv: int, i):
    """The KV block holding the diagonal key of Q block i's last row (clamped into the sequence): visible whenever
    any block is (``always_local`` keeps it)."""
    d1 = _minimum((i + 1) * block_q, q_rows) - 1 + (kv_rows - q_rows)
    d1 = _minimum(_maximum(d1, 0), max(kv_rows - 1, 0))
    return d1 // block_kv


KEEP_EPS = 1e-9  # float64 rounding of keep_ratio * n (0.3 * 10 = 3.0000000000000004) must not keep one more


def keep_count(visible_blocks: torch.Tensor, keep_ratio: float, top_k: int) -> torch.Tensor:
    """How many blocks a Q block keeps out of ``visible_blocks`` (an integer tensor): ``min(top_k, n)`` when
    top_k > 0, else ``ceil(keep_ratio * n - KEEP_EPS)`` in float64, at least 1 for n >= 1 (ceil(keep_ratio * n) is,
    since keep_ratio > 0: the margin alone would keep none for keep_ratio <= KEEP_EPS)."""
    if top_k > 0:  # a top_k past the count's dtype keeps them all (clamp converts its bound to that dtype)
        return torch.clamp(visible_blocks, max=min(top_k, torch.iinfo(visible_blocks.dtype).max))
    kept = torch.ceil(visible_blocks.to(torch.float64) * keep_ratio - KEEP_EPS).to(visible_blocks.dtype)
    return torch.minimum(kept.clamp(min=1), visible_blocks)

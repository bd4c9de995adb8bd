"""Checks of offset *values* (the metadata checks are in ``meta_kernels``).

Reading offset values costs a host sync on CUDA, so the mode is chosen by env ``JFA_VALIDATE``:
- ``sync``: read the offsets and raise ``ValueError`` naming the argument (always used for CPU tensors: free there).
- ``async`` (default on CUDA): device-side ``torch._assert_async`` checks; no sync, a failure surfaces as a CUDA
  device assert at the next synchronization. With triton: one kernel for both offsets tensors + one assert
  (``offset_checks.py``); without: ~9 aten ops per tensor.
- ``off``: no value checks.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

MODES = ("sync", "async", "off")


def validation_mode(device: torch.device) -> str:
    if device.type == "cpu":
        return "sync"
    mode = os.environ.get("JFA_VALIDATE", "async")
    if mode not in MODES:
        raise ValueError(f"JFA_VALIDATE must be one of {MODES}, got {mode!r}")
    return mode


def _check_sync(name: str, offsets: torch.Tensor, rows: int, max_seqlen: int) -> None:
    values = offsets.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    if values[-1] != rows:
        raise ValueError(f"{name}[-1] must equal the number of rows ({rows}), got {values[-1]}")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if max_seqlen >= 0 and lengths and max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen for {name} is {max_seqlen}, smaller than the longest sequence {max(lengths)}")


def _check_async(name: str, offsets: torch.Tensor, rows: int, max_seqlen: int) -> None:
    lengths = offsets[1:] - offsets[:-1]
    ok = (offsets[0] == 0) & (offsets[-1] == rows)
    if lengths.numel():
        ok &= lengths.min() >= 0
        if max_seqlen >= 0:
            ok &= lengths.max() <= max_seqlen
    torch._assert_async(ok, f"jfa.attention: bad {name} (first != 0, last != rows, decreasing, or > max_seqlen)")


def _check_async_fused(q_offsets, q_rows, max_seqlen_q, kv_offsets, kv_rows, max_seqlen_kv) -> bool:
    """Both checks in one Triton launch + one assert (CUDA); False where that path does not apply (no triton, CPU)."""
    if kv_offsets.device.type != "cuda":
        return False
    try:
        from jfa_ops.backends.triton.offset_checks import offsets_ok
    except ImportError:  # a CUDA build without triton: the aten checks below still run
        return False
    if q_offsets is None:
        ok = offsets_ok(kv_offsets, kv_rows, max_seqlen_kv)
    else:
        ok = offsets_ok(kv_offsets, kv_rows, max_seqlen_kv, q_offsets, q_rows, max_seqlen_q)
    torch._assert_async(ok, "jfa.attention: bad kv_offsets or q_offsets (first != 0, last != rows, decreasing, "
                            "or a length > max_seqlen)")
    return True


def check_offset_values(
    q: torch.Tensor,
    k: torch.Tensor,
    q_offsets: Optional[torch.Tensor],
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
) -> None:
    mode = validation_mode(q.device)
    if mode == "off":
        return
    if mode == "async" and _check_async_fused(q_offsets, q.shape[0], max_seqlen_q, kv_offsets, k.shape[0],
                                              max_seqlen_kv):
        return
    check = _check_sync if mode == "sync" else _check_async
    check("kv_offsets", kv_offsets, k.shape[0], max_seqlen_kv)
    if q_offsets is not None:
        check("q_offsets", q_offsets, q.shape[0], max_seqlen_q)
    elif max_seqlen_q >= 0 and q.shape[0] > max_seqlen_q and mode == "sync":
        raise ValueError(f"max_seqlen_q ({max_seqlen_q}) is smaller than broadcast q's rows ({q.shape[0]})")

"""Device-side offset checks in one Triton launch (``JFA_VALIDATE=async`` on CUDA, see ``validation.py``).

Nine small aten ops per offsets tensor (diff, min, max, compares, ands) were the largest host cost of a small
forward on CUDA; this kernel reads each offsets tensor once and writes one flag for both, which
``torch._assert_async`` then checks: two launches per call, no host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import loop_bound
from .launch import launch

CHECK_BLOCK = 1024  # offsets read per loop step (one program does it all: B is small next to any kernel's work)


@triton.jit
def _offsets_ok(OFF, num_seqs, rows, max_seqlen, HAS_MAX: tl.constexpr, BLOCK: tl.constexpr):
    """first == 0, last == rows, lengths >= 0 and (HAS_MAX) <= max_seqlen."""
    ok = (tl.load(OFF) == 0) & (tl.load(OFF + num_seqs) == rows)
    bad = tl.zeros([BLOCK], tl.int32)
    for b0 in range(0, loop_bound(num_seqs), BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        in_range = b < num_seqs
        length = tl.load(OFF + b + 1, mask=in_range, other=0) - tl.load(OFF + b, mask=in_range, other=0)
        wrong = length < 0
        if HAS_MAX:
            wrong = wrong | (length > max_seqlen)
        bad += wrong.to(tl.int32)
    return ok & (tl.sum(bad, 0) == 0)


@triton.jit(do_not_specialize=["num_seqs_a", "rows_a", "max_a", "num_seqs_b", "rows_b", "max_b"])
def offsets_ok_kernel(OFF_A, num_seqs_a, rows_a, max_a, OFF_B, num_seqs_b, rows_b, max_b, OK,
                      HAS_MAX_A: tl.constexpr, HAS_B: tl.constexpr, HAS_MAX_B: tl.constexpr, BLOCK: tl.constexpr):
    ok = _offsets_ok(OFF_A, num_seqs_a, rows_a, max_a, HAS_MAX_A, BLOCK)
    if HAS_B:
        ok = ok & _offsets_ok(OFF_B, num_seqs_b, rows_b, max_b, HAS_MAX_B, BLOCK)
    tl.store(OK, ok)


def offsets_ok(a: torch.Tensor, rows_a: int, max_a: int, b=None, rows_b: int = 0, max_b: int = -1) -> torch.Tensor:
    """A 1-element bool tensor on the offsets' device: both offsets tensors ([B+1], any integer dtype) are valid.
    ``max_* < 0``: no max_seqlen bound."""
    ok = torch.empty((1,), dtype=torch.bool, device=a.device)
    b_arg = a if b is None else b
    launch(offsets_ok_kernel, (1,), dict(
        OFF_A=a, num_seqs_a=a.numel() - 1, rows_a=rows_a, max_a=max_a, OFF_B=b_arg, num_seqs_b=b_arg.numel() - 1,
        rows_b=rows_b, max_b=max_b, OK=ok, HAS_MAX_A=max_a >= 0, HAS_B=b is not None, HAS_MAX_B=max_b >= 0,
        BLOCK=CHECK_BLOCK), num_warps=4)
    return ok

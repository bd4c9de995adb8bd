"""Device-side offset checks (``JFA_VALIDATE=async|deferred`` on CUDA, see ``jfa_ops/validation.py``), folded into
the kernel that already reads the offsets: ``scheduling.tile_slots_kernel`` when a tile list is built, else the
forward kernel's program 0. They write one int32 flag for both offsets tensors (1: valid), which ``validation``
asserts (async) or keeps (deferred): no launch of their own.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import loop_bound


@triton.jit
def offsets_ok(OFF, num_seqs, rows, max_seqlen, BLOCK: tl.constexpr):
    """first == 0, last == rows, lengths >= 0 and (when max_seqlen >= 0) <= max_seqlen; a scalar bool."""
    ok = (tl.load(OFF) == 0) & (tl.load(OFF + num_seqs) == rows)
    bad = tl.zeros([BLOCK], tl.int32)
    for b0 in range(0, loop_bound(num_seqs), BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        in_range = b < num_seqs
        length = tl.load(OFF + b + 1, mask=in_range, other=0) - tl.load(OFF + b, mask=in_range, other=0)
        wrong = (length < 0) | ((max_seqlen >= 0) & (length > max_seqlen))
        bad += wrong.to(tl.int32)
    return ok & (tl.sum(bad, 0) == 0)

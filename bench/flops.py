"""Useful work of one attention call, counted exactly on the host from the lengths and the mask.

Mask (FlashAttention's bottom-right convention, the one ``jfa_ops`` uses): in a sequence with ``Lq`` queries and
``Lk`` keys, query ``i`` sits at key position ``c = i + Lk - Lq`` and sees key ``j`` iff
    (not causal or j <= c)  and  (left < 0 or j >= c - left)  and  (right < 0 or j <= c + right).

FLOPs: ``4 * D`` per visible (query, key) pair per query head forward (QK^T and PV, 2 each), backward 2.5x that,
forward + backward 3.5x. Padding and masked-out pairs a kernel computes anyway count as zero.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

import meta_kernels

BACKWARD_FACTOR = 2.5
MODE_FACTOR = {"fwd": 1.0, "bwd": BACKWARD_FACTOR, "fwdbwd": 1.0 + BACKWARD_FACTOR}


def visible_pairs(q_lens, kv_lens, causal: bool = False, window: tuple[int, int] = (-1, -1)) -> int:
    """Visible pairs summed over sequences; the closed form lives in ``meta_kernels`` (the op's FLOP formula uses it
    too). Equal (Lq, Lk) pairs are counted once: broadcast-Q batches repeat one Lq a thousand times."""
    if len(q_lens) != len(kv_lens):
        raise ValueError(f"{len(q_lens)} query lengths but {len(kv_lens)} key lengths")
    counts = Counter(zip((int(n) for n in q_lens), (int(n) for n in kv_lens)))
    return sum(n * meta_kernels.visible_pairs([lq], [lk], causal, window) for (lq, lk), n in counts.items())


def attention_flops(pairs: int, num_heads_q: int, head_dim: int, mode: str = "fwd") -> float:
    """Useful FLOPs for ``pairs`` visible pairs per head (``mode``: fwd, bwd or fwdbwd)."""
    return 4.0 * head_dim * num_heads_q * pairs * MODE_FACTOR[mode]


def _brute_force(lq, lk, causal, window):
    """Visible pairs of one sequence counted on the oracle's explicit mask (``jfa_ops.testing.visible_mask``)."""
    from jfa_ops.testing import visible_mask

    return int(visible_mask(lq, lk, causal, window).sum())


def self_test() -> None:
    """Compare the closed form with a brute-force count on small cases (run: python -m bench.flops)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        lq, lk = (int(x) for x in rng.integers(0, 40, size=2))
        causal = bool(rng.integers(0, 2))
        window = tuple(int(x) for x in rng.integers(-1, 12, size=2))
        got, want = visible_pairs([lq], [lk], causal, window), _brute_force(lq, lk, causal, window)
        assert got == want, (lq, lk, causal, window, got, want)
    assert visible_pairs([4096], [4096]) == 4096 * 4096
    assert visible_pairs([4096], [4096], causal=True) == 4096 * 4097 // 2
    print("flops self-test ok")


if __name__ == "__main__":
    self_test()

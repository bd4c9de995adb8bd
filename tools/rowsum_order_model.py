"""The TLX forward's softmax row sums in the two orders of ``configs.FORWARD_ROWSUM_ONCE`` (helper fwdsum37,
bench/NOTES.md "fwdsum37") against a float64 oracle, on the CPU: fp32 arithmetic emulated op by op in numpy.

Per row and 128-key block, a thread of the wgmma accumulator layout holds keys 8 n + 2 q + e (n < 16, its lane q < 4
in the quad, e < 2). The default: each thread sums its 32 keys (a tree, as the SASS does), the quad adds the four
sums by butterfly shuffles, then l = l * alpha + that (one FFMA). ROWSUM_ONCE: 8 parts per row (q, e), each
l_part = l_part * alpha + its 16 keys (a tree), reduced once after the last block (e in the thread, then the quad's
butterfly). Both against sum_j exp2(s_j - m_final) in float64 over the same fp32 probabilities.

    python tools/rowsum_order_model.py [--rows 2048] [--keys 4096] [--seed 0]
"""
from __future__ import annotations

import argparse

import numpy as np

F = np.float32


def tree(x: np.ndarray) -> np.ndarray:
    """Pairwise fp32 sum over the last axis (its length a power of two)."""
    while x.shape[-1] > 1:
        x = (x[..., 0::2] + x[..., 1::2]).astype(F)
    return x[..., 0]


def fma(a, b, c) -> np.ndarray:
    """fp32 a * b + c rounded once (the product is exact in float64)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F)


def butterfly(x: np.ndarray) -> np.ndarray:
    """The quad's shuffle reduction over the last axis (4 lanes: xor 2, then xor 1), every lane's result (lane 0's)."""
    a = (x[..., 0] + x[..., 2]).astype(F), (x[..., 1] + x[..., 3]).astype(F)
    return (a[0] + a[1]).astype(F)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    blocks = args.keys // 128
    # scores in the log2 domain of a D128 head with unit-variance q, k entries: q.k / sqrt(D) ~ N(0, 1), times 1/ln 2
    s = (rng.standard_normal((args.rows, args.keys)) * 1.4426950408889634).astype(F)
    m = np.full(args.rows, -np.inf, F)
    l_default = np.zeros(args.rows, F)
    l_parts = np.zeros((args.rows, 4, 2), F)  # (q, e)
    for j in range(blocks):
        sb = s[:, 128 * j:128 * (j + 1)]
        m_new = np.maximum(m, sb.max(1))
        alpha = np.exp2((m - m_new).astype(np.float64)).astype(F)
        p = np.exp2((sb - m_new[:, None]).astype(np.float64)).astype(F)  # [rows, 128]: key 8 n + 2 q + e
        per = p.reshape(args.rows, 16, 4, 2)  # (n, q, e)
        thread = tree(per.transpose(0, 2, 1, 3).reshape(args.rows, 4, 32))  # each lane q's 32 keys
        l_default = fma(l_default, alpha, butterfly(thread))
        l_parts = fma(l_parts, alpha[:, None, None], tree(per.transpose(0, 2, 3, 1)))  # 16 keys per (q, e)
        m = m_new
    l_once = butterfly((l_parts[..., 0] + l_parts[..., 1]).astype(F))
    p64 = np.exp2(s.astype(np.float64) - m[:, None].astype(np.float64)).astype(F).astype(np.float64)
    exact = p64.sum(1)  # the same fp32 probabilities at the final max, summed in float64
    for name, l in (("default (per block)", l_default), ("ROWSUM_ONCE", l_once)):
        rel = np.abs(l.astype(np.float64) - exact) / exact
        print(f"{name:20s} |l - oracle| / oracle: max {rel.max():.2e}, rms {np.sqrt((rel ** 2).mean()):.2e}; "
              f"lse error (abs, ln): max {rel.max():.2e}")
    diff = np.abs(l_once.astype(np.float64) - l_default.astype(np.float64)) / exact
    print(f"ROWSUM_ONCE vs default: max {diff.max():.2e}, rms {np.sqrt((diff ** 2).mean()):.2e} relative; "
          f"rows equal {np.mean(l_once == l_default):.3f}; fp32 eps {np.finfo(F).eps:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

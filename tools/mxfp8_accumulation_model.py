"""Which FP8 wgmma accumulation costs the TLX MXFP8 forward its accuracy (CPU, float64; bench/NOTES.md "MXFP8 fused
re-basing + fp32 PV"). ``TRITON_INTERPRET=1 PYTHONPATH=. python tools/mxfp8_accumulation_model.py``

``jfa_ops.testing.rebased_mxfp8_attention_model``'s arithmetic (the kernel's, exact) with its three tensor-core sums
replaced by a model of Hopper's FP8 MMA (``jfa_ops.testing.fp8_mma_model``: truncating, an e8m13 accumulator). Each
of S = Qr Kr^T (over head_dim) and P V (over a key tile) runs as one chain per tile (as the kernel: a fresh
accumulator per tile, tiles joined in fp32) or promoted to fp32 every ``promote`` elements of its contraction.
Prints out's relative error vs the exact model per variant, on N(0, 1) inputs and on magnitudes spread over 2**+-12
(tools/tlx_check.py's cases).
"""
from __future__ import annotations

import math
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import jfa_ops  # noqa: E402
from jfa_ops.backends.triton.mxfp8_rebase import rebase_rows, rebase_v_tiles  # noqa: E402
from jfa_ops.testing import fp8_mma_model as fp8_mma  # noqa: E402


def model(rebased, q_off, kv_off, qk_mma, pv_mma, block_n=128):
    """rebased_mxfp8_attention_model (non-causal, no window) with the two products through ``qk_mma``/``pv_mma``
    (the denominator's row sums of the rounded P through ``pv_mma`` against ones)."""
    qr, qf, kr, kf, vt, vf = (t.double() if t.dtype != torch.float8_e4m3fn else t.float().double() for t in rebased)
    heads_q, head_dim = qr.shape[1], qr.shape[2]
    group = heads_q // kr.shape[1]
    qk = head_dim ** -0.5 / math.log(2)
    out = torch.zeros(qr.shape[0], heads_q, head_dim, dtype=torch.float64)
    for b in range(len(kv_off) - 1):
        q0, q1, k0, k1 = int(q_off[b]), int(q_off[b + 1]), int(kv_off[b]), int(kv_off[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        tile0 = k0 // block_n + b
        for h in range(heads_q):
            hk = h // group
            m = torch.full((q1 - q0,), -math.inf, dtype=torch.float64)
            lq = torch.zeros(q1 - q0, dtype=torch.float64)
            acc = torch.zeros(q1 - q0, head_dim, dtype=torch.float64)
            for i, n0 in enumerate(range(0, k1 - k0, block_n)):
                n1 = min(k1 - k0, n0 + block_n)
                s = qk_mma(qr[q0:q1, h], kr[k0 + n0:k0 + n1, hk].T) * kf[hk, k0 + n0:k0 + n1][None, :] \
                    * (qf[h, q0:q1] * qk)[:, None]
                m_new = torch.maximum(m, torch.ceil(s.amax(dim=1)))
                p8 = torch.exp2(s - (m_new - 8)[:, None]).float().to(torch.float8_e4m3fn).double()
                alpha = torch.exp2(m - m_new)
                cols = (tile0 + i) * block_n
                values = vt[hk * head_dim:(hk + 1) * head_dim, cols:cols + n1 - n0].T
                pv = pv_mma(p8, values) * vf[tile0 + i, hk][None, :]
                lq = lq * alpha + pv_mma(p8, torch.ones(n1 - n0, 1, dtype=torch.float64))[:, 0]
                acc, m = acc * alpha[:, None] + pv, m_new
            out[q0:q1, h] = acc / (lq / 256)[:, None]
    return out


def case(spread, seed=7, lengths=(300, 77, 129), kv_lengths=(290, 77, 129), heads=2, dim=128):
    g = torch.Generator().manual_seed(seed)

    def rand(rows):
        x = torch.randn(rows, heads, dim, generator=g)
        if spread:
            x = x * torch.pow(2.0, torch.empty(rows, 1, dim).uniform_(-spread, spread, generator=g))
        return x.to(torch.bfloat16)

    q_off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    kv_off = torch.tensor([0, *torch.tensor(kv_lengths).cumsum(0).tolist()])
    q, k, v = rand(int(q_off[-1])), rand(int(kv_off[-1])), rand(int(kv_off[-1]))
    pairs = [jfa_ops.mxfp8_quantize(q, backend="reference"), jfa_ops.mxfp8_quantize(k, backend="reference"),
             jfa_ops.mxfp8_quantize(v, kv_off, block=(32, 1), backend="reference")]
    rebased = (*rebase_rows(*pairs[0]), *rebase_rows(*pairs[1]), *rebase_v_tiles(*pairs[2], kv_off.to(torch.int32),
                                                                                  128))
    return rebased, q_off, kv_off


def main():
    exact = lambda a, b: a @ b  # noqa: E731
    emul = lambda **kw: (lambda a, b: fp8_mma(a, b, **kw))  # noqa: E731
    variants = {
        "kernel (QK^T and PV one chain per tile)": (emul(), emul()),
        "QK^T exact, PV one chain per tile": (exact, emul()),
        "QK^T one chain, PV exact": (emul(), exact),
        "PV promoted per 64 keys": (emul(), emul(promote=64)),
        "PV promoted per 32 keys": (emul(), emul(promote=32)),
        "QK^T promoted per 64 of D": (emul(promote=64), emul()),
        "QK^T promoted per 32 of D": (emul(promote=32), emul()),
        "both per 32": (emul(promote=32), emul(promote=32)),
        "k-steps of 16: kernel": (emul(group=16), emul(group=16)),
        "k-steps of 16: QK^T exact": (exact, emul(group=16)),
        "k-steps of 16: PV promoted per 32 keys": (emul(group=16), emul(group=16, promote=32)),
        "k-steps of 16: QK^T promoted per 64 of D": (emul(group=16, promote=64), emul(group=16)),
        "k-steps of 16: QK^T promoted per 32 of D": (emul(group=16, promote=32), emul(group=16)),
    }
    for label, spread in (("N(0, 1)", None), ("spread 2**+-12", 12)):
        rebased, q_off, kv_off = case(spread)
        want = model(rebased, q_off, kv_off, exact, exact)
        print(f"{label}: out vs the exact model (relative, Frobenius)", flush=True)
        for name, (qk_mma, pv_mma) in variants.items():
            got = model(rebased, q_off, kv_off, qk_mma, pv_mma)
            print(f"  {name:42s} {((got - want).norm() / want.norm()).item():.2e}", flush=True)


if __name__ == "__main__":
    main()

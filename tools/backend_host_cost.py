"""Per-call wall time of a small call on each backend given, one process: `PYTHONPATH=$PWD python
tools/backend_host_cost.py [--backends tlx,triton] [--calls 300]` on a CUDA machine (with TLX on the path for tlx).

The bench's overhead case (B=4, lengths <= 64, H8, D128, causal, bf16; tools/host_profile.py): `jagged_attention`
under no_grad, and forward + backward through `torch.autograd.grad`. Decides whether an automatic backend choice
costs small calls host time (the GPU work of one call is ~10 us, far below its host time)."""
from __future__ import annotations

try:  # the TLX plugin registers before anything imports triton (torch does), as tools/tlx_compile.py
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse

import torch

import jfa_ops
from host_profile import HEAD_DIM, HEADS, LENS, per_call_us  # tools/ is on the path of a script run from it


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="tlx,triton")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32).cuda()
    mk = lambda g: torch.randn(sum(LENS), HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                               requires_grad=g)
    q, k, v = mk(False), mk(False), mk(False)
    qg, kg, vg = mk(True), mk(True), mk(True)
    grad_out = torch.randn_like(q)
    print(f"{'backend':10s} {'no_grad fwd us':>15s} {'fwd+bwd us':>11s}")
    for backend in args.backends.split(","):
        def fwd():
            with torch.no_grad():
                jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend=backend)

        def fwd_bwd():
            o = jfa_ops.jagged_attention(qg, kg, vg, off, off, causal=True, backend=backend)
            torch.autograd.grad(o, (qg, kg, vg), grad_out)

        try:
            print(f"{backend:10s} {per_call_us(fwd, args.calls):15.1f} {per_call_us(fwd_bwd, args.calls):11.1f}",
                  flush=True)
        except Exception as e:  # noqa: BLE001 (a backend that cannot run here)
            print(f"{backend:10s} skipped: {type(e).__name__}: {e}"[:200], flush=True)


if __name__ == "__main__":
    main()

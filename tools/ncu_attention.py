"""One attention call of one implementation, bracketed for Nsight Compute (issue 10: "why, from a profile").

`ncu --profile-from-start off ... python tools/ncu_attention.py --impl jfa:tlx --suite dense --case "B8 S4096"
--mode fwd` (tools/ncu_attention.sh runs ours and FA4's on the same cases and exports the counters). The bench's
own case and peer code build the inputs and the call (bench.suites, bench.peers), so the profiled call is the one the
bench times. The call runs `--warmup` times first (compiles, autotuning, tile lists, FA4's JIT), then once between
cudaProfilerStart and cudaProfilerStop: with `--profile-from-start off` ncu sees only that call's kernels. `--mode
bwd` runs the forward outside the window and only the backward inside it, by ``torch.autograd.grad`` as the bench
does (stop 54: ``backward`` after the warmups added a ~780 us ``.grad`` accumulation to the profiled window).
"""
from __future__ import annotations

import argparse
import sys

import torch

from bench.peers import JfaBackend, Skip, make_peer
from bench.suites import build_cases, make_inputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, help="jfa:<backend> (jfa:tlx, jfa:triton) or a bench peer (fa4, varlen)")
    parser.add_argument("--suite", default="dense")
    parser.add_argument("--case", required=True, help="the bench case's label, e.g. 'S4096' or 'T32768 causal'")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--size", default="full", help="the bench's case size (smoke: tiny, for a CPU dry run)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no profiler window)")
    args = parser.parse_args()
    cases = [c for c in build_cases([args.suite], [args.head_dim], args.size) if c.label == args.case]
    if not cases:
        labels = [c.label for c in build_cases([args.suite], [args.head_dim], args.size)]
        print(f"no case {args.case!r} in suite {args.suite}: {labels}")
        return 2
    case, device = cases[0], torch.device(args.device)
    cuda = device.type == "cuda"
    peer = JfaBackend(args.impl.split(":", 1)[1]) if args.impl.startswith("jfa:") else make_peer(args.impl)
    why = peer.unavailable(device)
    if why:
        print(f"{args.impl} unavailable: {why}")
        return 2
    try:
        prepared = peer.prepare(case, make_inputs(case, device))
    except Skip as e:
        print(f"{args.impl} skips {case.label}: {e}")
        return 2
    grad = None

    def call():
        nonlocal grad
        if args.mode == "fwd":
            with torch.no_grad():
                prepared.fn()
            return
        out = prepared.fn()
        grad = torch.randn_like(out) if grad is None else grad
        return out

    for _ in range(args.warmup):  # compiles, tile lists, FA4's JIT: none of it inside the window
        out = call()
        if out is not None:
            torch.autograd.grad(out, prepared.leaves, grad)
    out = call()  # the forward of a bwd run, outside the window
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    if out is None:
        call()
    else:
        torch.autograd.grad(out, prepared.leaves, grad)  # as the bench: no .grad accumulation kernels
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {args.impl} {args.suite} {case.label} D{args.head_dim} {args.mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one compiled attention call's host time goes: jfa_ops vs torch's varlen_attn, on a CUDA machine.

`PYTHONPATH=$PWD python tools/compiled_profile.py [--calls 300] [--top 22] [--profile jfa,varlen] [--code DIR]`. The bench's overhead case
(B=4, lengths <= 64, H8, D128, causal, bf16), each function compiled with ``torch.compile(dynamic=True)`` (default
mode) as the bench's "compiled fwd" column does (leaves require grad, so AOTAutograd's training graph runs), then:
wall us per call (forward; forward + backward), the GPU operations torch.profiler records per call, and a cProfile
table of the forward (own time) for each. ``--code DIR`` writes Inductor's generated wrapper code of each graph
there (what the compiled call runs on the host, op by op). The question (issue 9, bench/NOTES.md v11): the compiled
forward costs more per call than the eager one and than varlen_attn's compiled forward; is it torch's runtime
(guards, AOTAutograd wrappers: the same for every peer), Inductor's launches of our kernels, or extra graph ops?
Rows "jfa+rank" and "jfa+unsorted" rerun jfa with the traced-list knobs flipped (``configs.KNOBS``), in this process.
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import sys

import torch
from host_profile import HEAD_DIM, HEADS, LENS, per_call_us, profile  # this script's directory is on sys.path


def gpu_ops(fn, calls: int = 20):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    names = collections.Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return {n: c / calls for n, c in names.most_common()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=22)
    parser.add_argument("--profile", default="jfa,varlen", help="which rows get a cProfile table")
    parser.add_argument("--code", default=None, help="directory for Inductor's wrapper code of each graph")
    args = parser.parse_args()
    if args.code:
        os.makedirs(args.code, exist_ok=True)
    import jfa_ops
    from torch.nn.attention.varlen import varlen_attn

    dev = "cuda"
    off = torch.tensor((0,) + LENS).cumsum(0).to(torch.int32).to(dev)
    t = sum(LENS)
    q, k, v = (torch.randn(t, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn(t, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    from jfa_ops.backends.triton.configs import KNOBS

    jfa = lambda q, k, v, off: jfa_ops.jagged_attention(q, k, v, off, off, causal=True)  # noqa: E731
    causal = ({"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters
              else {"window_size": (-1, 0)})
    impls = {  # name: (function, the traced-list knobs it runs with)
        "jfa": (jfa, {}),
        "jfa+rank": (jfa, {"traced_rank_tiles": True}),  # tile lists ordered by the rank kernel, not torch.sort
        "jfa+unsorted": (jfa, {"traced_sorted_lists": False}),  # no lists: the kernels map unsorted slots
        "varlen": (lambda q, k, v, off: varlen_attn(q, k, v, off, off, max(LENS), max(LENS), **causal), {}),
    }
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; us per call, median of 5 x {args.calls}")
    defaults = {name: getattr(KNOBS, name) for name in ("traced_rank_tiles", "traced_sorted_lists")}
    for name, (fn, knobs) in impls.items():
        for knob, value in {**defaults, **knobs}.items():
            setattr(KNOBS, knob, value)
        torch._dynamo.reset()
        compiled = torch.compile(fn, dynamic=True)
        fwd = lambda: compiled(q, k, v, off)  # noqa: E731
        fwdbwd = lambda: torch.autograd.grad(compiled(q, k, v, off), (q, k, v), grad_out)  # noqa: E731
        fwd(), fwdbwd()
        torch.cuda.synchronize()
        eager = lambda: fn(q, k, v, off)  # noqa: E731
        print(f"{name:8s} compiled fwd {per_call_us(fwd, args.calls):8.1f}   compiled fwd+bwd "
              f"{per_call_us(fwdbwd, args.calls // 2):8.1f}   eager fwd {per_call_us(eager, args.calls):8.1f}")
        print(f"         GPU ops per compiled fwd: {gpu_ops(fwd)}")
        print(f"         GPU ops per compiled fwd+bwd: {sum(gpu_ops(fwdbwd).values()):.0f}")
        if name in args.profile.split(","):
            profile(fwd, args.calls, f"{name} compiled fwd", args.top)
        if args.code:  # the wrapper modules (those with a ``call``) this impl's graphs loaded, in one file
            from torch._inductor import codecache
            with open(os.path.join(args.code, f"{name}_wrappers.py"), "w") as dst:
                for mod in codecache.PyCodeCache.modules:
                    path = getattr(mod, "__file__", None)
                    if path and os.path.exists(path) and hasattr(mod, "call"):
                        dst.write(f"# ==== {path}\n" + open(path).read() + "\n")
            codecache.PyCodeCache.modules.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the host time of one small call goes: `PYTHONPATH=$PWD python3 tools/profile_host.py` on a CUDA machine.

The bench's overhead case (B=4, lengths <= 64, H=8, D=128, causal, bf16), through public entry points only
(``jfa_ops.jagged_attention``, ``torch.ops.jfa.attention``, ``torch.compile``, ``torch.profiler``), so it keeps
working while a backend's host code changes. For each of

    fwd          eager forward recording autograd (inputs require grad)
    fwd_nograd   eager forward under torch.no_grad
    bwd          the backward alone, through a graph built once and retained
    compiled     the forward under torch.compile(dynamic=True), default mode

it prints: wall µs per call (many calls, one sync); the GPU activities per call (kernels, copies, memsets: what the
host pays a launch for) with their µs; the CUDA runtime/driver calls per call; the host time per section (the
profiler's ops by self time, and the Python time by package from cProfile). ``--json PATH`` writes the numbers.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import time

import torch

import jfa_ops

LENS = (64, 17, 40, 5)  # bench.suites.overhead_cases
HEADS, HEAD_DIM = 8, 128
DRIVER_CALL = re.compile(r"^cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemsetAsync, ...

# Python time by package (path fragments, first match wins): names of packages, not of functions, so a rewrite of
# the launch path moves time between sections instead of breaking the tool.
SECTIONS = (
    ("jfa_ops api + op body", os.sep + "jfa_ops" + os.sep),
    ("meta_kernels (shape rules)", os.sep + "meta_kernels" + os.sep),
    ("triton runtime (launcher, JIT)", os.sep + "triton" + os.sep),
    ("torch dynamo/inductor runtime", os.sep + "torch" + os.sep + "_inductor"),
    ("torch dynamo/inductor runtime", os.sep + "torch" + os.sep + "_dynamo"),
    ("torch autograd", os.sep + "torch" + os.sep + "autograd"),
    ("torch custom-op dispatch (_ops, _library)", os.sep + "torch" + os.sep + "_ops.py"),
    ("torch custom-op dispatch (_ops, _library)", os.sep + "torch" + os.sep + "_library"),
    ("torch other", os.sep + "torch" + os.sep),
)


def make_inputs(device, heads=HEADS, head_dim=HEAD_DIM):
    off = torch.tensor((0,) + LENS, device=device).cumsum(0).to(torch.int32)
    t = sum(LENS)
    mk = lambda: torch.randn(t, heads, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)  # noqa
    return mk(), mk(), mk(), off


def sync():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def wall_us(fn, calls):
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def profiled(fn, calls):
    """(GPU activities {name: (count, µs)}, driver calls {name: (count, µs)}, host ops by self µs) per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_initialized() else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync()
    gpu, driver = {}, {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            table, name = gpu, e.name[:80]
        elif DRIVER_CALL.match(e.name) and e.name != "cudaDeviceSynchronize":
            table, name = driver, e.name
        else:
            continue
        n, us = table.get(name, (0, 0.0))
        table[name] = (n + 1, us + e.time_range.elapsed_us())
    per_call = lambda t: {k: (n / calls, us / calls) for k, (n, us) in t.items()}  # noqa: E731
    ops = {a.key: a.self_cpu_time_total / calls for a in prof.key_averages()
           if a.self_cpu_time_total > 0 and not DRIVER_CALL.match(a.key)}
    return per_call(gpu), per_call(driver), ops


def python_sections(fn, calls):
    """Python own time per call by package (cProfile: absolute values are inflated, proportions hold)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    sync()
    prof.disable()
    out = {}
    for (path, _, func), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():
        section = next((name for name, frag in SECTIONS if frag in path), "other" if path != "~" else "builtins")
        out[section] = out.get(section, 0.0) + tottime / calls * 1e6
    return out, prof


def report(name, fn, calls, top):
    wall = wall_us(fn, calls)
    gpu, driver, ops = profiled(fn, min(calls, 50))
    sections, prof = python_sections(fn, calls)
    launches = sum(n for n, _ in gpu.values())
    print(f"===== {name}: {wall:.1f} us/call wall; {launches:.1f} GPU activities/call, "
          f"{sum(us for _, us in gpu.values()):.1f} us of GPU time; "
          f"{sum(n for n, _ in driver.values()):.1f} driver calls/call")
    print("  GPU activities per call (count, us):")
    for k, (n, us) in sorted(gpu.items(), key=lambda x: -x[1][0]):
        print(f"    {n:5.1f} {us:8.1f}  {k}")
    print("  CUDA runtime/driver calls per call (count, host us):")
    for k, (n, us) in sorted(driver.items(), key=lambda x: -x[1][1]):
        print(f"    {n:5.1f} {us:8.1f}  {k}")
    print(f"  host ops by self time (torch.profiler, us/call, top {top}):")
    for k, us in sorted(ops.items(), key=lambda x: -x[1])[:top]:
        print(f"    {us:8.1f}  {k}")
    print("  Python own time by package (cProfile, us/call, inflated by the profiler):")
    for k, us in sorted(sections.items(), key=lambda x: -x[1]):
        print(f"    {us:8.1f}  {k}")
    print(f"  Python functions by own time (top {top}):")
    lines = []
    stats = pstats.Stats(prof)
    for (path, line, func), (_, ncalls, tottime, _, _) in sorted(stats.stats.items(), key=lambda x: -x[1][2])[:top]:
        lines.append(f"    {tottime / calls * 1e6:8.1f}  {ncalls / calls:5.1f}x  {func} "
                     f"({os.path.basename(path)}:{line})")
    print("\n".join(lines))
    return {"wall_us": wall, "gpu_activities": launches, "gpu_us": sum(us for _, us in gpu.values()),
            "driver_calls": sum(n for n, _ in driver.values()), "gpu": gpu, "driver": driver,
            "python_sections_us": sections, "top_ops_us": dict(sorted(ops.items(), key=lambda x: -x[1])[:top])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--only", default="fwd,fwd_nograd,bwd,compiled", help="comma list of the sections above")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--device", default="cuda", help="cpu: checks the tool itself (no GPU activities there)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM)
    args = ap.parse_args(argv)
    q, k, v, off = make_inputs(args.device, args.heads, args.head_dim)
    leaves = [q, k, v]

    def fwd():  # the public wrapper
        return jfa_ops.jagged_attention(q, k, v, off, off, causal=True, backend=args.backend)

    def op_fwd():  # the op itself: the wrapper's own cost is the difference
        return torch.ops.jfa.attention(q, k, v, off, off, -1, -1, scale=None, causal=True, window_left=-1,
                                       window_right=-1, broadcast_q=False, deterministic=False,
                                       backend=args.backend)[0]

    def fwd_nograd():
        with torch.no_grad():
            return fwd()

    out = fwd()
    grad = torch.randn_like(out)

    def bwd():
        return torch.autograd.grad(out, leaves, grad, retain_graph=True)

    compiled = torch.compile(fwd, dynamic=True, backend=args.compile_backend)
    runs = {"fwd": fwd, "fwd_nograd": fwd_nograd, "bwd": bwd, "compiled": compiled}
    results = {}
    for name in args.only.split(","):
        results[name] = report(name, runs[name], args.calls, args.top)
    wrapper = None
    if "fwd" in results:
        wrapper = wall_us(fwd, args.calls) - wall_us(op_fwd, args.calls)
        print(f"===== jagged_attention wrapper over torch.ops.jfa.attention: {wrapper:.1f} us/call")
    print("summary: section | wall us | GPU us | GPU activities | driver calls")
    for name, r in results.items():
        print(f"  {name:10s} | {r['wall_us']:8.1f} | {r['gpu_us']:6.1f} | {r['gpu_activities']:4.1f} | "
              f"{r['driver_calls']:4.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "wrapper_us": wrapper, "sections": results}, f, indent=1)


if __name__ == "__main__":
    main()

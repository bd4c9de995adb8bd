"""Where each further attention call of a compiled graph spends its host time (issue 9: "a compiled model pays no
more per attention call than eager does"; bench/NOTES.md "compiled per-layer cost (helper compiledlayer)").

`PYTHONPATH=$PWD python3 tools/compiled_layer_profile.py [--peers triton,sdpa_flash,floor] [--calls 200] [--top 25]` on
a CUDA machine (CPU smoke: `--device cpu --peers reference,sdpa_math`). ``floor`` is torch's own floor for a traced
Triton kernel per layer: a 3-argument copy kernel launched by Inductor and its one output (ours: 1 launch of ~40
arguments and 2 outputs). The bench's overhead case and its per-layer
columns (bench/timing.py ``compiled_per_layer``): each peer's ``Prepared.layer`` chained 1 and 4 times, each chain
compiled with ``torch.compile(dynamic=True)`` (default mode, Inductor), then per further layer, i.e.
(4-call graph - 1-call graph) / 3:

- wall us of the forward with the leaves requiring grad (AOTAutograd's training graph: the bench's column) and
  without (the inference graph: what the training wrapper adds is the difference);
- torch.profiler's events per call (CPU ops, CUDA runtime calls such as cuLaunchKernelEx / cudaMalloc, GPU kernels):
  count and self us (CPU time; GPU time for kernels), for the events whose count or time moves with the layers;
- cProfile's own time per Python function (Inductor's wrapper, its launcher, Triton's launcher, AOTAutograd's
  runtime wrappers), the same difference.

Both profilers inflate what they time; read their rows against each other and against the wall column.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import re
import statistics
import sys
import types

import torch

sys.path.insert(0, ".")
from bench import peers as bench_peers  # noqa: E402
from bench import suites, timing  # noqa: E402

LAYERS = timing.LAYERS
_HASH = re.compile(r"[a-z0-9]{40,}")  # Inductor's graph and module names differ between the two graphs


def same_name(key: str) -> str:
    return _HASH.sub("<graph>", key)


def floor_layer(q: torch.Tensor):
    """torch's floor for one traced Triton kernel per layer: a copy kernel of 3 arguments (``triton_op`` +
    ``wrap_triton``, as our traced path; identity gradient), launched by Inductor, its output allocated."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(X, Y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)

    @torch.library.triton_op("jfa_tools::layer_floor_copy", mutates_args=())
    def floor_copy(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        n = x.numel()
        torch.library.wrap_triton(copy_kernel)[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return y

    floor_copy.register_autograd(lambda ctx, grad: grad)
    return (floor_copy, q)


def prepared(peer: str, device: str):
    case = suites.overhead_cases((128,), "quick")[0]
    inputs = suites.make_inputs(case, device)
    if peer == "floor":
        q = inputs.q.detach().clone().requires_grad_(True)
        return types.SimpleNamespace(layer=floor_layer(q), leaves=[q])
    if peer in bench_peers.PEER_ORDER + bench_peers.EXTRA_PEERS:
        return bench_peers.make_peer(peer).prepare(case, inputs)
    return bench_peers.JfaBackend(peer).prepare(case, inputs)


def graphs(prep, grad: bool):
    """{calls: compiled chain} for 1 and LAYERS calls. Without grad, compiled and run under no_grad: AOTAutograd's
    inference graph (the same kernels, no saved tensors, no autograd node)."""
    attend, q = prep.layer
    layer = (attend, q) if grad else (attend, q.detach())
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        compiled = {n: torch.compile(timing.chained(layer, n), dynamic=True) for n in (1, LAYERS)}
        for fn in compiled.values():
            fn()
    return {n: (lambda fn=fn: _with_grad(grad, fn)) for n, fn in compiled.items()}


def _with_grad(grad: bool, fn):
    with torch.set_grad_enabled(grad):
        return fn()


def per_layer_wall(fns, device, rounds: int = 5) -> float:
    calls = timing.calls_for(fns[LAYERS], device) or 200
    walls = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            walls[n].append(timing.wall_us(fn, device, calls))
    return (statistics.median(walls[LAYERS]) - statistics.median(walls[1])) / (LAYERS - 1)


def profiler_events(fn, device, calls: int) -> dict:
    """{event name: [count per call, self us per call]} over ``calls`` calls: CPU time for host events, GPU time for
    the GPU's ("GPU <kernel>": a per-layer GPU time near the wall's would mean the chain is GPU-bound)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for _ in range(10):
        fn()
    timing.sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        timing.sync(device)
    out = collections.defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        gpu = e.device_type != torch.autograd.DeviceType.CPU
        row = out[same_name(("GPU " if gpu else "") + e.key)]
        row[0] += e.count / calls
        row[1] += (getattr(e, "self_device_time_total", 0.0) if gpu else e.self_cpu_time_total) / calls
    return out


def cprofile_functions(fn, device, calls: int) -> dict:
    """{function: [calls per call, own us per call]} over ``calls`` calls."""
    for _ in range(10):
        fn()
    timing.sync(device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    timing.sync(device)
    stats = pstats.Stats(prof).stats
    out = collections.defaultdict(lambda: [0.0, 0.0])
    for (file, line, name), (_, nc, tt, _, _) in stats.items():
        row = out[same_name(f"{file.rsplit('/', 2)[-1] if '/' in file else file}:{line} {name}")]
        row[0] += nc / calls
        row[1] += tt / calls * 1e6
    return out


def per_layer_rows(one: dict, many: dict, top: int):
    rows = []
    for key in set(one) | set(many):
        a, b = one.get(key, [0.0, 0.0]), many.get(key, [0.0, 0.0])
        count, us = (b[0] - a[0]) / (LAYERS - 1), (b[1] - a[1]) / (LAYERS - 1)
        if abs(count) >= 0.05 or abs(us) >= 0.5:
            rows.append((us, count, key))
    rows.sort(key=lambda r: -abs(r[0]))
    return rows[:top]


def print_rows(title: str, rows) -> None:
    print(f"  {title}: per further layer, (4-call - 1-call) / 3")
    print(f"    {'self us':>8s} {'count':>6s}  event")
    for us, count, key in rows:
        print(f"    {us:8.2f} {count:6.2f}  {key[:110]}")
    print(f"    {sum(r[0] for r in rows):8.2f}         (sum of the rows shown)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="triton,sdpa_flash,floor",
                        help="jfa backends, bench peer names, and/or floor (a traced 3-argument Triton copy kernel)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(f"torch {torch.__version__}; per further layer of a compiled chain of {LAYERS} calls (us)")
    for peer in args.peers.split(","):
        prep = prepared(peer, args.device)
        no_grad = per_layer_wall(graphs(prep, grad=False), args.device)
        fns = graphs(prep, grad=True)
        wall = per_layer_wall(fns, args.device)
        print(f"{peer}: wall per layer, leaves requiring grad {wall:.1f} (the bench's column), "
              f"inference graph {no_grad:.1f}")
        print_rows("torch.profiler", per_layer_rows(profiler_events(fns[1], args.device, args.calls),
                                                    profiler_events(fns[LAYERS], args.device, args.calls), args.top))
        print_rows("cProfile", per_layer_rows(cprofile_functions(fns[1], args.device, args.calls),
                                              cprofile_functions(fns[LAYERS], args.device, args.calls), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Timing, peak memory and host overhead of one prepared peer.

GPU: median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between calls). CPU: median of a wall-clock
timer. Small inputs are rotated over several copies so repeated calls do not measure the cache.
"""
from __future__ import annotations

import itertools
import statistics
import time
from typing import Callable, List, Optional

import torch

from bench.peers import Prepared

L2_BYTES = 50 * 2**20  # H200: 50 MiB
MAX_ROTATIONS = 8


def rotations_for(input_bytes: int, device) -> int:
    """Input copies to cycle through so that together they are several times the L2 cache."""
    if torch.device(device).type != "cuda":
        return 1
    return max(1, min(MAX_ROTATIONS, -(-4 * L2_BYTES // max(1, input_bytes))))


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], device, warmup_ms: float, rep_ms: float) -> float:
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()  # first call: compilation, caches
    times, deadline = [], time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def mode_callable(mode: str, preps: List[Prepared]) -> Callable[[], object]:
    """The callable timed for ``mode``, cycling over the rotated preparations.

    fwd: forward under no_grad. bwd: backward only, through a graph built once and retained.
    fwdbwd: forward then backward (torch.autograd.grad: no .grad accumulation kernels).
    """
    order = itertools.cycle(range(len(preps)))
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return preps[next(order)].fn()
        return call
    if mode == "fwdbwd":
        grads = [torch.randn_like(p.fn().detach()) for p in preps]

        def call():
            i = next(order)
            return torch.autograd.grad(preps[i].fn(), preps[i].leaves, grads[i])
        return call
    if mode == "bwd":
        outs = [p.fn() for p in preps]
        grads = [torch.randn_like(o.detach()) for o in outs]

        def call():
            i = next(order)
            return torch.autograd.grad(outs[i], preps[i].leaves, grads[i], retain_graph=True)
        return call
    raise ValueError(f"unknown mode {mode!r}")


def peak_memory_mib(call: Callable[[], object], device) -> Optional[float]:
    """Peak allocated memory of one call above what was allocated before it (CUDA only)."""
    if torch.device(device).type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = call()
    sync(device)
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak / 2**20


def host_overhead_us(call: Callable[[], object], device, calls: Optional[int] = None, graph: bool = False) -> dict:
    """Eager wall time per call (many calls, one sync at the end) and the device's own time per call.

    The device time is the sum of the GPU activities (kernels, copies, memsets) the profiler records over the calls;
    ``wall_us - kernel_us`` is what the host adds when it cannot run ahead of the GPU. ``graph``: also the time per
    replay of the call captured in a CUDA graph (our GPU backends only: a peer's failed capture could poison the run).
    """
    on_cuda = torch.device(device).type == "cuda"
    calls = calls or (200 if on_cuda else 20)
    for _ in range(10 if on_cuda else 2):
        call()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync(device)
    wall_us = (time.perf_counter() - t0) / calls * 1e6
    kernel_us = graph_us = None
    if on_cuda:
        kernel_us = _profiled_device_us(call, device, calls=50)
        graph_us = cuda_graph_us(call, calls) if graph else None
    return {"wall_us": wall_us, "kernel_us": kernel_us,
            "overhead_us": None if kernel_us is None else wall_us - kernel_us, "graph_us": graph_us}


def cuda_graph_us(call: Callable[[], object], calls: int) -> Optional[float]:
    """Wall time per replay of ``call`` captured in a CUDA graph (what `torch.compile(mode="reduce-overhead")` gives a
    host-bound caller: the eager host work is gone). None where capture fails (a peer that syncs, or allocates
    outside the graph pool)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()  # warm-up on the side stream, as torch.cuda.graphs asks
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6
    except Exception:  # noqa: BLE001 - not capturable: reported as missing
        torch.cuda.synchronize()
        return None


def _profiled_device_us(call, device, calls: int) -> Optional[float]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync(device)
    total = 0.0
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            total += e.time_range.elapsed_us()
    return total / calls if total > 0 else None

"""Timing, peak memory and host overhead of one prepared peer.

GPU: median of ``triton.testing.do_bench`` (CUDA events, L2 flushed between calls). CPU: median of a wall-clock
timer. Small inputs are rotated over several copies so repeated calls do not measure the cache.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import os
import statistics
import time
import types
from typing import Callable, List, Optional, Tuple

import torch

from bench.peers import Prepared, one_line

L2_BYTES = 50 * 2**20  # H200: 50 MiB
MAX_ROTATIONS = 8
LAYERS = 4  # calls chained in the overhead suite's per-layer compiled columns (the model suite's layer count)


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


class GpuClocks:
    """What the GPU ran at while a row was timed: the SM clock (median and lowest, MHz), the hottest temperature (C),
    the median power (W) and the throttle reasons seen (``nvmlDeviceGetCurrentClocksThrottleReasons``, idle left
    out), sampled every ``period_s`` by a thread during ``window()``. Two timings of the same call in one run differed
    by up to 6% (bench/NOTES.md "Stop 57"); these fields say whether the clocks moved with them. Needs ``pynvml``
    (nvidia-ml-py); without it, on CPU, or with ``JFA_BENCH_CLOCKS=0`` (the sampling thread's NVML calls take the GIL
    for a few us every 20 ms: for host-bound rows), ``window()`` yields an empty dict."""

    REASONS = {0x2: "app clocks", 0x4: "sw power cap", 0x8: "hw slowdown", 0x20: "sw thermal",
               0x40: "hw thermal", 0x80: "hw power brake", 0x100: "display clocks"}

    def __init__(self, device, period_s: float = 0.02):
        self.period_s = period_s
        self.nvml = self.handle = None
        if torch.device(device).type != "cuda" or os.environ.get("JFA_BENCH_CLOCKS", "1") == "0":
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            index = torch.device(device).index
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if index is None else index)
            self.nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML: rows carry no clock fields
            self.nvml = self.handle = None

    def sample(self) -> Tuple[int, int, float, int]:
        nv, h = self.nvml, self.handle
        try:  # (deprecated in newer NVML in favour of the "event reasons": no reasons rather than no samples)
            reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        except Exception:  # noqa: BLE001
            reasons = 0
        return (nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                nv.nvmlDeviceGetPowerUsage(h) / 1e3, reasons)

    @contextlib.contextmanager
    def window(self):
        """Samples while the body runs; the dict it yields is filled when the body ends."""
        fields: dict = {}
        if self.nvml is None:
            yield fields
            return
        import threading
        samples, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    samples.append(self.sample())
                except Exception:  # noqa: BLE001
                    return
                stop.wait(self.period_s)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            yield fields
        finally:
            stop.set()
            thread.join()
            fields.update(clock_fields(samples, self.REASONS))


def clock_fields(samples, reasons) -> dict:
    """``GpuClocks.window``'s record fields from (SM MHz, temperature C, power W, throttle mask) samples."""
    if not samples:
        return {}
    mask = 0
    for s in samples:
        mask |= s[3]
    return {"sm_mhz": statistics.median(s[0] for s in samples), "sm_mhz_min": min(s[0] for s in samples),
            "temp_c_max": max(s[1] for s in samples), "power_w": round(statistics.median(s[2] for s in samples), 1),
            "throttle": sorted(name for bit, name in reasons.items() if mask & bit), "clock_samples": len(samples)}


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


def wall_us(call: Callable[[], object], device, calls: Optional[int] = None, windows: int = 1) -> float:
    """Eager wall time per call: warm-up, then many calls and one sync at the end (the host may run ahead); with
    ``windows`` > 1 the median of that many such windows (one host hiccup, a collection or a preempted thread, then
    moves one window, not the result)."""
    on_cuda = torch.device(device).type == "cuda"
    calls = calls or (200 if on_cuda else 20)
    for _ in range(10 if on_cuda else 2):
        call()
    sync(device)
    runs = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        sync(device)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


EAGER_WINDOWS = 3  # the overhead suite's eager columns: median of 3 windows of 200 calls


def host_reference_us(device, calls: int = 2000) -> float:
    """Host speed, to compare runs: µs per iteration of a fixed loop of what a small attention call's host path does
    (a Python call with keywords, a dict, a ``torch.empty`` on ``device``, a view), no GPU work; median of 5. Two
    runs whose references differ by a factor x were on hosts about x apart in speed, whatever they imported."""
    shape = torch.Size((4, 8))

    def step(n, dtype=torch.float16):
        meta = {"n": n, "dtype": dtype}
        return torch.empty(size=shape, dtype=meta["dtype"], device=device).view(-1)

    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(calls):
            step(i, dtype=torch.float16)
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def host_state(device) -> str:
    """What makes one run's per-call host times differ from another's besides the code: the host's speed
    (``host_reference_us``), its load, this process's threads and Python heap (objects the GC tracks, frozen ones
    included)."""
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else "?"
    return (f"reference {host_reference_us(device):.2f} us, load {os.getloadavg()[0]:.1f}, threads {threads}, "
            f"heap {(len(gc.get_objects()) + gc.get_freeze_count()) / 1e6:.2f} M objects")


@contextlib.contextmanager
def frozen_heap():
    """Times taken on a heap whose existing objects are frozen (``gc.collect(); gc.freeze()``; unfrozen after): a
    generation-2 collection then scans only what was made since, so how much else the process imported (FA4's CuTe
    DSL, its MLIR bindings, quack) costs no implementation time, and a collection the imports left due
    cannot land in one implementation's columns. The collections of what each call itself makes still run and are
    charged to it (bench/NOTES.md "Host cost vs heap size, stop 25")."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def gc_collections() -> List[int]:
    """Garbage collections so far, per generation."""
    return [g["collections"] for g in gc.get_stats()]


def calls_for(call: Callable[[], object], device, seconds: float = 0.05) -> Optional[int]:
    """Calls for ``wall_us`` that take about ``seconds`` (between 20 and its default): the reference backend's
    milliseconds per call would otherwise spend the run's budget on one column."""
    if torch.device(device).type != "cuda":
        return None
    call()
    sync(device)
    t0 = time.perf_counter()
    call()
    sync(device)
    return max(20, min(200, int(seconds / max(time.perf_counter() - t0, 1e-9))))


def overhead_record(prep: Prepared, device, graph: bool = False, compile_backend: Optional[str] = None) -> dict:
    """Per-call costs of one tiny call, every way a user makes it (the `overhead` suite; keys in µs per call):

    ``fwd_wall_us`` eager forward recording autograd (leaves require grad), ``fwdbwd_wall_us`` forward + backward,
    ``nograd_wall_us`` / ``inference_wall_us`` the forward under ``torch.no_grad`` / ``torch.inference_mode``,
    ``compiled_wall_us`` the forward through ``torch.compile(dynamic=True)`` (default mode; ``compiled_graphs`` and
    ``compiled_graph_breaks`` from Dynamo's counters), ``fwd_kernel_us`` / ``fwd_launches`` (and ``fwdbwd_*``) the
    GPU activities torch.profiler records per call and their summed time, ``graph_us`` the no_grad forward replayed
    from a CUDA graph (``graph``: our GPU backends only; a peer's failed capture could poison the run);
    ``layer_fwd_us`` / ``layer_fwdbwd_us`` what a compiled model pays per attention call (``compiled_per_layer``).
    ``eager_gc_collections``: garbage collections per generation while the four eager columns ran (a GC-heavy call
    path shows here; the caller freezes the heap first: ``frozen_heap``).
    A column that fails holds None and its reason in ``<column>_skip``.
    """
    on_cuda = torch.device(device).type == "cuda"
    compile_backend = compile_backend or ("inductor" if on_cuda else "aot_eager")
    calls = eager_calls(prep)
    fwdbwd, nograd = calls["fwdbwd"], calls["nograd"]

    rec: dict = {}

    def column(key, measure):
        try:
            rec[key] = measure()
        except Exception as e:  # noqa: BLE001 - one column failing leaves the others
            rec[key], rec[key + "_skip"] = None, one_line(e)
            sync(device)

    collections = gc_collections()
    for name, call in calls.items():
        if name == "fwdbwd" and prep.no_backward:
            rec["fwdbwd_wall_us"], rec["fwdbwd_wall_us_skip"] = None, prep.no_backward
        else:
            column(f"{name}_wall_us", lambda call=call: wall_us(call, device, windows=EAGER_WINDOWS))
    rec["eager_gc_collections"] = [b - a for a, b in zip(collections, gc_collections())]
    if on_cuda:
        rec["fwd_kernel_us"], rec["fwd_launches"] = profiled_device_us(prep.fn, device, calls=50)
        if not prep.no_backward:
            rec["fwdbwd_kernel_us"], rec["fwdbwd_launches"] = profiled_device_us(fwdbwd, device, calls=20)
        rec["graph_us"] = cuda_graph_us(nograd, 200) if graph else None
    column("compiled_wall_us", lambda: compiled_wall_us(prep.fn, device, compile_backend, rec))
    rec.update(compiled_per_layer(prep, device, compile_backend))
    rec["compile_backend"] = compile_backend
    return rec


def eager_calls(prep: Prepared) -> dict:
    """The overhead suite's eager calls of one preparation, by column name: ``fwd`` the forward recording autograd,
    ``fwdbwd`` forward + backward (``torch.autograd.grad``: no .grad accumulation kernels), ``nograd`` /
    ``inference`` the forward under ``torch.no_grad`` / ``torch.inference_mode``."""
    grad_out = torch.randn_like(prep.fn().detach())

    def fwdbwd():
        return torch.autograd.grad(prep.fn(), prep.leaves, grad_out)

    def nograd():
        with torch.no_grad():
            return prep.fn()

    def inference():
        with torch.inference_mode():
            return prep.fn()
    return {"fwd": prep.fn, "fwdbwd": fwdbwd, "nograd": nograd, "inference": inference}


def compiled_wall_us(fn: Callable[[], object], device, backend: str, rec: dict) -> float:
    """Wall µs per call of ``fn`` under ``torch.compile(dynamic=True)``; Dynamo's graph and graph-break counts go into
    ``rec`` (compiled_graphs: 1 is one graph, more means breaks or recompiles)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, dynamic=True, backend=backend)
    compiled()  # compiles outside the timing
    sync(device)
    us = wall_us(compiled, device)
    rec["compiled_graphs"] = counters["stats"]["unique_graphs"]
    rec["compiled_graph_breaks"] = sum(counters["graph_break"].values())
    return us


def chained(layer, calls: int) -> Callable[[], torch.Tensor]:
    """``calls`` attention calls in a row, each one's output the next one's q (``Prepared.layer``), as in a model."""
    attend, q = layer

    def layers():
        x = q
        for _ in range(calls):
            x = attend(x)
        return x
    # a code object per length: Dynamo keeps compiled graphs per code object, and one shared by two lengths would
    # check the other length's guards first on every call of one of them
    return types.FunctionType(layers.__code__.replace(co_name=f"layers{calls}"), layers.__globals__,
                              f"layers{calls}", None, layers.__closure__)


def compiled_per_layer(prep: Prepared, device, backend: str, layers: int = LAYERS, rounds: int = 3) -> dict:
    """What a compiled model pays per attention call, torch's per-graph costs (Dynamo's guards, AOTAutograd's runtime
    wrappers, the graph call) left out: graphs of 1 and of ``layers`` chained calls (``chained``), each compiled
    with ``dynamic=True`` with the leaves requiring grad, timed in turn ``rounds`` times (the host's speed drifts),
    and the difference of their median wall times over ``layers - 1``.

    ``layer_fwd_us`` the forward, ``layer_fwdbwd_us`` forward + backward (``torch.autograd.grad`` of the last
    output); ``layer_graphs`` / ``layer_graph_breaks``: Dynamo's counts for the ``layers``-call function (a peer that
    breaks the graph pays its breaks per call here too). The single-call ``compiled_wall_us`` keeps the per-graph
    floor, which a model pays once per step, not per layer."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    keys = ("layer_fwd_us", "layer_fwdbwd_us")
    out: dict = dict.fromkeys(keys)
    if prep.layer is None:
        return dict(out, **{k + "_skip": "no chainable call (output not in q's layout)" for k in keys})
    attend, q = prep.layer
    try:
        if attend(q).shape != q.shape:
            return dict(out, **{k + "_skip": "the output is not q-shaped: calls do not chain" for k in keys})
        torch._dynamo.reset()
        counters.clear()
        compiled = {n: torch.compile(chained(prep.layer, n), dynamic=True, backend=backend) for n in (1, layers)}
        grad = torch.randn_like(compiled[1]().detach())  # compiles outside the timing
        graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
        compiled[layers]()
        out.update(layer_graphs=counters["stats"]["unique_graphs"] - graphs,
                   layer_graph_breaks=sum(counters["graph_break"].values()) - breaks)
        walls = {(n, key): [] for n in compiled for key in keys}
        calls = calls_for(compiled[layers], device)  # the same count for both graphs
        for _ in range(rounds):
            for n, fn in compiled.items():
                walls[n, "layer_fwd_us"].append(wall_us(fn, device, calls))
                if not prep.no_backward:
                    walls[n, "layer_fwdbwd_us"].append(
                        wall_us(lambda: torch.autograd.grad(fn(), prep.leaves, grad), device, calls))
    except Exception as e:  # noqa: BLE001 - these columns failing leaves the others
        sync(device)
        return dict(out, **{k + "_skip": one_line(e) for k in keys})
    for key in keys:
        if not walls[1, key]:
            out[key + "_skip"] = prep.no_backward
        else:
            out[key] = (statistics.median(walls[layers, key]) - statistics.median(walls[1, key])) / (layers - 1)
    return out


def graph_replay(call: Callable[[], object]) -> Optional[Callable[[], None]]:
    """``call`` captured in a CUDA graph (warmed up on a side stream first, as torch.cuda.graphs asks): its replay,
    to time what the GPU does without the host's per-call work. None where capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay
    except Exception:  # noqa: BLE001 - not capturable: the caller times the eager call
        torch.cuda.synchronize()
        return None


def cuda_graph_us(call: Callable[[], object], calls: int) -> Optional[float]:
    """Wall time per replay of ``call`` captured in a CUDA graph (what `torch.compile(mode="reduce-overhead")` gives a
    host-bound caller: the eager host work is gone). None where capture fails (a peer that syncs, or allocates
    outside the graph pool)."""
    replay = graph_replay(call)
    if replay is None:  # not capturable: reported as missing
        return None
    t0 = time.perf_counter()
    for _ in range(calls):
        replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def profiled_device_us(call, device, calls: int) -> Tuple[Optional[float], Optional[float]]:
    """(device µs, GPU activities) per call: the summed time and count of the kernels, copies and memsets that
    torch.profiler records over ``calls`` calls (after one unprofiled call)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    call()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync(device)
    total, count = 0.0, 0
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            total += e.time_range.elapsed_us()
            count += 1
    if count == 0:
        return None, None
    return total / calls, count / calls

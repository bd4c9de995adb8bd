"""Inductor's generated wrapper for a graph of chained traced attention calls, made and run on a machine without a GPU.

`PYTHONPATH=$PWD python tools/compiled_wrapper_cpu.py [--layers 1,4] [--show 4] [--dir DIR]`. Each graph (the
forward op of ``layers`` chained calls, one offsets tensor, sizes symbolic as under ``torch.compile(dynamic=True)``,
``JFA_COMPILE_PATH=inductor``) is traced with fake CUDA tensors on a stubbed H100 and lowered by Inductor up to its
wrapper code (tests/test_compile_inductor.py's ``inductor_wrapper``: loading the module needs CUDA, so the code is
taken from the file Inductor writes). Then the wrapper's ``call`` runs on CPU
tensors with every kernel launch stubbed (a Python function taking the launch's arguments), which times Inductor's
own per-call Python: allocations, views, size arithmetic, the launch call's argument passing; not the launcher
(Inductor's ``CachingAutotuner.run`` and Triton's launcher), which needs a GPU (tools/compiled_layer_profile.py).
Prints, per graph, the launches and the wrapper lines by kind, and wall us per call; ``--show N`` prints graph N's
``call``; then the Python layers of one launch (``launch_chain_us``: Inductor's launcher and Triton's, real where they
run without a GPU) for our forward kernel's arguments and for a 3-argument kernel. bench/NOTES.md "compiled per-layer cost (helper compiledlayer)".
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, ".")

from tests.test_compile_inductor import inductor_wrapper, wrapper_lines  # noqa: E402  (the lowering, the counts)


class _StubKernel:
    def __init__(self, name: str, launches: list):
        self.name, self.launches = name, launches

    def run(self, *args, stream):
        self.launches.append(self.name)


def load_call(path: str, launches: list):
    """The wrapper's ``call`` on CPU: CPU allocations, no device guard, every kernel a stub."""
    import torch

    class StubCompile:
        def triton(self, name, source, device_str=None):
            return _StubKernel(name, launches)

        def wait(self, scope):
            pass

    source = open(path).read().split('\nif __name__ == "__main__":')[0]
    for old, new in (("from torch._C import _cuda_getCurrentRawStream as get_raw_stream", "get_raw_stream = int"),
                     ("async_compile = AsyncCompile()", "async_compile = StubCompile()"),
                     ("torch._C._dynamo.guards._empty_strided_cuda", "torch._C._dynamo.guards._empty_strided_cpu"),
                     ("with torch.cuda._DeviceGuard(0):", "with nullcontext():"),
                     ("torch.cuda.set_device(0)", "pass")):
        assert old in source, f"Inductor's wrapper changed: no {old!r}"
        source = source.replace(old, new)
    scope = {"StubCompile": StubCompile, "nullcontext": contextlib.nullcontext, "__name__": "wrapper_cpu"}
    exec(compile(source, path, "exec"), scope)
    return scope["call"], source


def per_call_us(call, args, calls: int = 2000, rounds: int = 7) -> float:
    for _ in range(200):
        call(list(args))
    runs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            call(list(args))
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def launch_chain_us(pointers: int, scalars: int) -> float:
    """Host us of one launch's Python layers as Inductor runs a user-defined Triton kernel: torch 2.11's
    ``CachingAutotuner.run`` steady state (no cached fast path; what it runs per launch, restated here), the
    generated launcher, Triton's ``CompiledKernel.launch_metadata`` and ``CudaLauncher.__call__`` (this Triton's, real)
    and the two hook chains; the C launch itself is a C no-op (``str.format`` of its arguments), so its argument
    conversion (a ``data_ptr`` call per tensor) and the driver's ``cuLaunchKernelEx`` are not in it."""
    import types
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler.compiler import CompiledKernel

    class Driver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton.runtime.driver.set_active(Driver())
    binary = types.SimpleNamespace(_init_handles=lambda: None, name="kernel", function=1, src=None, metadata=None)
    binary.launch_metadata = types.MethodType(CompiledKernel.launch_metadata, binary)

    def c_launch(*args):  # (..., launch_metadata, enter hook, exit hook, ...): the C launcher calls the hooks
        if args[9] is not None:
            args[9](args[8])
        "".format(*args)
        if args[10] is not None:
            args[10](args[8])

    launcher_object = types.SimpleNamespace(
        global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0, profile_scratch_align=1,
        gsan_enabled=False, num_ctas=1, launch=c_launch, launch_cooperative_grid=False, launch_pdl=False,
        arg_annotations=None, kernel_signature=None)
    names = ", ".join(f"a{i}" for i in range(pointers + scalars))
    scope = dict(runner=types.MethodType(CudaLauncher.__call__, launcher_object), bin=binary, function=1,
                 metadata=None, launch_enter_hook=knobs.runtime.launch_enter_hook,
                 launch_exit_hook=knobs.runtime.launch_exit_hook)
    exec(f"def launcher({names}, _grid_0, _grid_1, _grid_2, stream):\n"  # Inductor's, for a FixedGrid kernel
         f"    grid_0 = _grid_0\n    grid_1 = _grid_1\n    grid_2 = _grid_2\n"
         f"    runner(grid_0, grid_1, grid_2, stream, function, metadata, bin.launch_metadata((grid_0, grid_1, "
         f"grid_2), stream, {names}), launch_enter_hook, launch_exit_hook, {names})\n", scope)
    launcher = scope["launcher"]
    config = types.SimpleNamespace()
    meta = {"coordinate_descent_tuning": False}

    def run(*args, stream):
        if hasattr(triton, "set_allocator"):
            def alloc_fn(size, align, stream):
                return torch.empty(size, dtype=torch.int8, device="cuda")
            triton.set_allocator(alloc_fn)
        if not getattr(config, "found_by_coordesc", False) and meta.get("coordinate_descent_tuning", False):
            pass
        if torch.autograd.profiler._is_profiler_enabled:
            pass
        return launcher(*args, stream=stream)

    args = [torch.empty(4)] * pointers + list(range(scalars)) + [1, 1, 1]
    return per_call_us(lambda _: run(*args, stream=0), (), calls=20000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,4")
    parser.add_argument("--show", type=int, default=0, help="print the call of the graph with this many layers")
    parser.add_argument("--dir", default=None, help="keep Inductor's output here (default: a temporary directory)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    directory = args.dir or tempfile.mkdtemp(prefix="jfa_wrapper_")
    counts = [int(n) for n in args.layers.split(",")]
    rows = (64, 17, 40, 5)  # the bench's overhead case lengths; heads and head_dim are the fake inputs' (4/2, 16)
    t = sum(rows)
    inputs = [torch.randn(t, 4, 16, dtype=torch.float16), torch.randn(t, 2, 16, dtype=torch.float16),
              torch.randn(t, 2, 16, dtype=torch.float16),
              torch.tensor((0,) + rows, dtype=torch.int32).cumsum(0).to(torch.int32)]
    result = {}
    for n in counts:
        launches: list = []
        call, source = load_call(inductor_wrapper(n, directory), launches)
        call(list(inputs))
        result[n] = dict(launches=collections.Counter(launches), lines=wrapper_lines(source),
                         us=per_call_us(call, inputs))
        print(f"{n} layer(s): launches {dict(result[n]['launches'])}")
        print(f"    wrapper lines {result[n]['lines']}")
        print(f"    wrapper us per call on CPU, launches stubbed: {result[n]['us']:.1f}")
        if n == args.show:
            print(source[source.index("    def call(self, args):"):source.index("runner = Runner(")])
    if len(counts) == 2:
        a, b = counts
        per = lambda x, y: (y - x) / (b - a)  # noqa: E731
        print(f"per further layer: wrapper {per(result[a]['us'], result[b]['us']):.1f} us; "
              f"launches {sum(result[b]['launches'].values()) - sum(result[a]['launches'].values())} / {b - a}; "
              + ", ".join(f"{k} {per(result[a]['lines'].get(k, 0), v):+.2f}" for k, v in result[b]['lines'].items()))
    for name, (pointers, scalars) in (("attn_fwd_kernel", (12, 21)), ("a 3-argument kernel", (2, 1))):
        print(f"one launch's Python layers (Inductor + Triton, C launch a no-op), {name}: "
              f"{launch_chain_us(pointers, scalars):.1f} us")
    if not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the installed torch + triton pair compile our traced graphs end to end, without a GPU? For the TLX install's
pair on the H200 (torch 2.11 + Triton 3.8), where torch's kernel analysis failed (bench/NOTES.md "Traced path under
Triton 3.8"): `PYTHONPATH=/tmp/t38:$PWD python3 tools/inductor_compile_cpu.py` (CPU; on this box with torch 2.11's
venv and the TLX site first on PYTHONPATH).

Traces one forward and one backward call (``JFA_COMPILE_PATH=inductor``, sizes symbolic as under ``dynamic=True``,
fake CUDA tensors on a stubbed H100: tests/test_compile_inductor.py's ``_FAKE_H100`` and ``_WRAPPER`` stubs), lowers
each graph with Inductor to its wrapper module, then compiles every kernel the module defines (ours and Inductor's
own) for sm_90 as Inductor's compile workers do (``CachingAutotuner.precompile(warm_cache_only=True)``: triton.compile
to a cubin, nothing loaded), in this process and, with ``--workers``, in a fresh interpreter as Inductor's compile
workers start (the parent's sys.path as PYTHONPATH, no TLX plugin preloaded). Prints one JSON line per graph:
``analysis`` (what torch's analysis says each kernel writes; every tensor argument = the analysis failed), and per
kernel ``ok`` or the error. Exit status 1 when anything failed.
"""
from __future__ import annotations

try:  # as the bench under the TLX install: the plugin registers before triton is imported
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, ".")
# --path split: the size-split path's graphs (a cond per op: the kernels below the threshold, the op above)
os.environ["JFA_COMPILE_PATH"] = sys.argv[sys.argv.index("--path") + 1] if "--path" in sys.argv else "inductor"
os.environ.pop("TRITON_INTERPRET", None)

from tests.test_compile_inductor import _WRAPPER  # noqa: E402  (the fake H100 and Inductor's CUDA stubs)

KERNEL = re.compile(r"async_compile\.triton\('(\w+)', '''\n(.*?)''', device_str='cuda'\)", re.S)
# no GPU: Inductor's compile asks for the active GPU driver only to set it (triton.compile gets the target itself)
NO_DRIVER = """
import triton
from triton.backends.compiler import GPUTarget
from torch._inductor.runtime import triton_helpers


class _H100Driver:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(_H100Driver())
triton_helpers.set_driver_to_gpu = lambda: None
"""
COMPILE = NO_DRIVER + """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
getattr(module, sys.argv[2]).precompile(warm_cache_only=True)
"""


class Lowered(Exception):
    pass


def lower(ns: dict, fn, inputs) -> str:
    """The wrapper module's source Inductor writes for ``fn``'s graph."""
    import torch
    from torch._inductor import compile_fx, config
    from torch._inductor.codecache import PyCodeCache

    def written(key, path, *args, **kwargs):
        raise Lowered(path)

    PyCodeCache.load_by_key_path = written
    try:
        with ns["mode"], config.patch(pattern_matcher=False, fx_graph_cache=False):
            compile_fx.compile_fx(torch.fx.symbolic_trace(fn), list(inputs))
    except Exception as e:  # Inductor wraps what its steps raise (InductorError)
        lowered = getattr(e, "inner_exception", e)
        if not isinstance(lowered, Lowered):
            raise
        return open(str(lowered)).read()
    raise AssertionError("Inductor wrote no wrapper module")


def compile_kernel(name: str, source: str, directory: str, in_worker: bool) -> str:
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    try:
        if in_worker:  # as Inductor's SubprocPool starts its workers: the parent's sys.path, nothing preloaded
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
            done = subprocess.run([sys.executable, "-c", COMPILE, path, name], env=env, capture_output=True,
                                  text=True, timeout=600)
            return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1][:500]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        getattr(module, name).precompile(warm_cache_only=True)
        return "ok"
    except Exception as e:  # noqa: BLE001 (the report is the point)
        return f"{type(e).__name__}: {e}"[:500]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", action="store_true", help="also compile each kernel in a fresh interpreter")
    parser.add_argument("--path", choices=("inductor", "split"), default="inductor",
                        help="JFA_COMPILE_PATH of the traced graphs (split: cond on the row count)")
    args = parser.parse_args()
    ns: dict = {"__name__": "inductor_compile_cpu"}
    sys.argv[1:] = ["1", "none"]  # the stubs' script reads LAYERS, MAX_SEQLEN
    exec(_WRAPPER.split("\ndef layers(")[0] + NO_DRIVER, ns)  # noqa: S102
    import torch
    import triton
    from torch._higher_order_ops import triton_kernel_wrap

    analysis = []
    identify = triton_kernel_wrap.identify_mutated_tensors

    def recorded(kernel, kwargs, *rest):
        written = identify(kernel, kwargs, *rest)
        tensors = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) or type(v).__name__ == "TensorBox"]
        fn = kernel
        while not hasattr(fn, "arg_names"):
            fn = fn.fn
        analysis.append(f"{fn.fn.__name__}: {'EVERY TENSOR (analysis failed)' if written == tensors else written}")
        return written

    triton_kernel_wrap.identify_mutated_tensors = recorded
    _, mode, forward_inputs, backward_inputs = ns["fake_inputs"](True)
    ns["mode"] = mode
    graphs = {"forward": (ns["forward"]("triton"), forward_inputs), "backward": (ns["backward"]("triton"), backward_inputs)}
    print(f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    failed = False
    with tempfile.TemporaryDirectory() as directory:
        for name, (fn, inputs) in graphs.items():
            analysis.clear()
            try:
                source = lower(ns, fn, inputs)
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"graph": name, "analysis": analysis, "lowering": f"{type(e).__name__}: {e}"[:1500]}))
                failed = True
                continue
            kernels = {k: compile_kernel(k, src, directory, False) for k, src in KERNEL.findall(source)}
            report = {"graph": name, "analysis": sorted(set(analysis)), "kernels": kernels}
            if args.path == "split":  # the wrapper's branch on the row count, and the opaque op in its large branch
                report["split"] = {"branch": sorted(set(re.findall(r"^\s*if (.*409[56].*):$", source, re.M))),
                                   "opaque_op": sorted(set(re.findall(r"torch\.ops\.jfa\.\w+", source)))}
                failed |= not (report["split"]["branch"] and report["split"]["opaque_op"])
            if os.environ.get("JFA_DUMP_WRAPPER"):
                with open(os.path.join(os.environ["JFA_DUMP_WRAPPER"], f"{name}.py"), "w") as f:
                    f.write(source)
            if args.workers:
                report["in_worker"] = {k: compile_kernel(k, src, directory, True) for k, src in KERNEL.findall(source)}
            failed |= any(v != "ok" for v in list(kernels.values()) + list(report.get("in_worker", {}).values()))
            failed |= any("EVERY TENSOR" in a for a in analysis)
            print(json.dumps(report), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

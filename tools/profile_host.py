"""Where the host time of one small eager call goes: `python tools/profile_host.py [--calls N]` on a CUDA machine.

The bench's overhead case (B=4, lengths <= 64, H=8, D=128, causal, bf16) through `jfa_ops.jagged_attention` with the
triton backend: cProfile over N eager calls (forward, then forward + backward), the top functions by own time, and
the GPU activities per call that torch.profiler records (how many launches the host pays for)."""
import argparse
import cProfile
import io
import pstats
import time

import torch

import jfa_ops


def make_inputs(device):
    lens = [64, 17, 1, 40]
    off = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    t = sum(lens)
    mk = lambda: torch.randn(t, 8, 128, device=device, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    return mk(), mk(), mk(), off, max(lens)


def section_times(fn, calls):
    """Host µs per call spent in named functions (wrapped in place; nested sections overlap)."""
    import functools
    import importlib

    # (module, functions looked up through it at call time); Triton's own path (first call of a key, interpreter) is
    # timed through JITFunction.run, direct launches through the modules' `launch`
    targets = {"jfa_ops.ops.attention": ["check_offset_values", "select_backend", "_params"],
               "meta_kernels": ["check_attention_args"],
               "jfa_ops.backends.triton.attn_fwd": ["attention_forward", "tile_schedule", "launch",
                                                    "rows_descriptor", "packed_rows", "get_config", "use_tma",
                                                    "window_bounds", "head_dim_consts"],
               "jfa_ops.backends.triton.attn_bwd": ["attention_backward", "tile_schedule", "launch"],
               "jfa_ops.backends.triton.scheduling": ["build_tiles"],
               "jfa_ops.validation": ["device_flag"],
               "jfa_ops.backends.triton.common": ["alloc_output"]}
    acc, saved = {}, []
    for mod_name, names in targets.items():
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name in names:
            orig = getattr(mod, name, None)
            if orig is None:
                continue
            key = f"{mod_name.split('.')[-1]}.{name}"

            def wrapped(*a, __orig=orig, __key=key, **kw):
                t0 = time.perf_counter()
                try:
                    return __orig(*a, **kw)
                finally:
                    acc[__key] = acc.get(__key, 0.0) + time.perf_counter() - t0
            saved.append((mod, name, orig))
            setattr(mod, name, functools.wraps(orig)(wrapped))
    from triton.runtime.jit import JITFunction
    run_orig = JITFunction.run

    def run_timed(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return run_orig(self, *a, **kw)
        finally:
            key = f"triton launch {self.fn.__name__}"
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0
    JITFunction.run = run_timed
    saved.append((JITFunction, "run", run_orig))
    try:
        for _ in range(5):
            fn()
        acc.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / calls * 1e6
    finally:
        for mod, name, orig in saved:
            setattr(mod, name, orig)
    print(f"  sections (us/call, wrapped run total {total:.1f}):")
    for key, t in sorted(acc.items(), key=lambda x: -x[1]):
        print(f"    {t / calls * 1e6:8.1f}  {key}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--backend", default="triton")
    args = ap.parse_args()
    q, k, v, off, mx = make_inputs("cuda")

    def fwd():
        return jfa_ops.jagged_attention(q, k, v, off, off, mx, mx, causal=True, backend=args.backend)

    def fwdbwd():
        fwd().sum().backward()

    for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.calls * 1e6
        section_times(fn, args.calls)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        kernels = {}
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name[:70]] = kernels.get(e.name[:70], 0) + 1
        print(f"===== {name}: {wall:.1f} us/call eager; GPU activities per call:")
        for kname, n in sorted(kernels.items(), key=lambda x: -x[1]):
            print(f"  {n / 10:5.1f}  {kname}")
        print("\n".join(s.getvalue().splitlines()[:45]))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()

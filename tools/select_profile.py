"""Where a `select_kv_blocks` call's time goes on a GPU machine: host time, GPU time, and each kernel's share, per
case and knob variant (one process: the variants' A/B in the same run).

`PYTHONPATH=$PWD python tools/select_profile.py [--calls 50] [--cases 0,2] [--variants default,v5]` on a CUDA machine
(~20 s a case and variant once compiled). The case is the bench's quick `sparse` case (bench.suites.sparse_cases:
T 66,944, B 22, H 16, D 128, bf16, 128-blocks; 0 keep 0.5, 1 keep 0.25, 2 and 3 the causal ones). A variant is
`default` (the shipped knobs) or `+`-joined `configs.KNOBS` names turned on (`v5` stands for selection v5's two, `pool6`
for selection pool v6's two: tools/sparse_profile.py's `_set_variant`). Prints, in microseconds per call:

- `bench_us`: what the bench's `select` row measures (triton.testing.do_bench: events around each call, L2 flushed
  before it; the GPU waits for the host between the flush and the call's first kernel);
- `host_us`: wall time per call with no sync, the queue never full (the host path alone when it is the slower side);
- `gpu_us`: wall time per replay of the call captured in a CUDA graph (GPU work without host gaps);
- per kernel (torch.profiler, `calls` calls): mean GPU time and launches per call, sorted by time; `pool_us` (the
  pooling kernels' sum; with `sparse_select_overlap` its one kernel, select included) and the rate it reads Q and K
  at (TB/s);
- `same`: whether the variant chose exactly the blocks `default` chose (index and count equal).

`--paths op,direct` (stop 28, helper selshare) times each variant on each host path: `op` (JFA_SELECT_DIRECT=0's: through
`torch.ops.jfa.select_kv_blocks`, every launch argument derived per call, the offsets checked on every call), `direct`
the default since 2026-12-03 (the op's body without the dispatcher, a call memo, covered offsets, the triton layouts); the
GPU's work is the same.

bench/NOTES.md "selection v5" and "selection pool v6" say what to expect.
"""
from __future__ import annotations

try:  # in a Triton 3.8 + TLX process (the bench's): the plugin registers before anything imports triton
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass
import argparse
import collections
import contextlib
import statistics
import time

import torch
from triton.testing import do_bench

import jfa_ops
from bench.suites import make_inputs, sparse_cases
from bench.timing import cuda_graph_us
from sparse_profile import _set_variant  # tools/ is on the path of a script run from it


@contextlib.contextmanager
def _host_path(path: str):
    """``op``: through ``torch.ops.jfa.select_kv_blocks``, no layouts (JFA_SELECT_DIRECT=0's); ``direct``: the default's
    path (the op's body without the dispatcher, the call memo, covered offsets, the triton layouts)."""
    from jfa_ops import validation
    from jfa_ops.backends.triton.configs import KNOBS
    from jfa_ops.ops import block_sparse
    if path not in ("op", "direct"):
        raise ValueError(f"unknown host path {path!r} (op, direct)")
    saved = block_sparse.SELECT_DIRECT, KNOBS.sparse_select_layouts
    block_sparse.SELECT_DIRECT = KNOBS.sparse_select_layouts = path == "direct"
    validation._COVERED.clear()
    try:
        yield
    finally:
        block_sparse.SELECT_DIRECT, KNOBS.sparse_select_layouts = saved
        validation._COVERED.clear()


def _profile(call, calls: int):
    """(bench_us, host_us, gpu_us or None, {kernel: [us per call, launches]}) of ``call``."""
    for _ in range(10):
        call()
    torch.cuda.synchronize()
    bench_us = do_bench(call, warmup=100, rep=500, return_mode="median") * 1e3
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    gpu_us = cuda_graph_us(call, calls)  # None: capture failed (the profile below still has the kernels)
    kernels = collections.defaultdict(lambda: [0.0, 0])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time / calls
            kernels[event.name][1] += 1
    return bench_us, statistics.median(runs), gpu_us, kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--cases", default="0")
    parser.add_argument("--case", type=int, help="one case (the old flag; --cases takes a list)")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--paths", default="direct", help="comma list of op (through the op, JFA_SELECT_DIRECT=0's), "
                        "direct (the default host path)")
    args = parser.parse_args()
    cases = sparse_cases([128], "quick")
    rows = []
    for index in [args.case] if args.case is not None else [int(c) for c in args.cases.split(",")]:
        case = cases[index]
        x = make_inputs(case, "cuda")

        def call():
            return jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv,
                                            block_q=case.block, block_kv=case.block, keep_ratio=case.keep_ratio,
                                            causal=case.causal, backend="triton")

        chosen = None
        for variant, path in ((v, p) for v in args.variants.split(",") for p in args.paths.split(",")):
            _set_variant(variant)
            with _host_path(path):
                index_count = call()
                same = chosen is None or all(torch.equal(a, b) for a, b in zip(chosen, index_count))
                chosen = chosen or index_count
                bench_us, host_us, gpu_us, kernels = _profile(call, args.calls)
            variant = f"{variant} [{path}]"
            total = sum(v[0] for v in kernels.values())
            # the pools' kernels (KNOBS.sparse_select_overlap: its one kernel, pools and select together)
            pool_us = sum(v[0] for name, v in kernels.items() if "pool" in name or "overlap" in name)
            rows.append((case.label, variant, bench_us, host_us, gpu_us, total, pool_us, same))
            print(f"{case.label} [{variant}]: bench_us {bench_us:.1f}  host_us {host_us:.1f}  gpu_us "
                  f"{'-' if gpu_us is None else f'{gpu_us:.1f}'}  (sum of kernels {total:.1f})  pool_us "
                  f"{pool_us:.1f} ({(x.q.nbytes + x.k.nbytes) / max(pool_us, 1e-9) / 1e6:.2f} TB/s)  same {same}",
                  flush=True)
            for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                print(f"  {us:8.1f} us  {n / args.calls:4.1f}x  {name[:100]}")
    _set_variant("default")
    print(f"{'case':24s} {'variant':40s} {'bench_us':>9s} {'host_us':>8s} {'gpu_us':>7s} {'kernels':>8s} "
          f"{'pool_us':>8s} same")
    for label, variant, bench_us, host_us, gpu_us, total, pool_us, same in rows:
        print(f"{label:24s} {variant:40s} {bench_us:9.1f} {host_us:8.1f} "
              f"{'-' if gpu_us is None else f'{gpu_us:.1f}':>7s} {total:8.1f} {pool_us:8.1f} {same}")


if __name__ == "__main__":
    main()

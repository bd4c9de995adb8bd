"""Where a `select_kv_blocks` call's time goes on a GPU machine: host time, GPU time, and each kernel's share.

`PYTHONPATH=$PWD python tools/select_profile.py [--calls 50] [--case 0..3]` on a CUDA machine (~1 min). The case is
the bench's quick `sparse` case (bench.suites.sparse_cases: T 66,944, B 22, H 16, D 128, bf16, 128-blocks; 0 keep 0.5,
1 keep 0.25, 2 and 3 the causal ones). Prints, in microseconds per call:

- `bench_us`: what the bench's `select` row measures (triton.testing.do_bench: events around each call, L2 flushed
  before it; the GPU waits for the host between the flush and the call's first kernel);
- `host_us`: wall time per call with no sync, the queue never full (the host path alone when it is the slower side);
- `gpu_us`: wall time per replay of the call captured in a CUDA graph (GPU work without host gaps);
- per kernel (torch.profiler, `calls` calls): mean GPU time and launches per call, sorted by time.

bench/NOTES.md "sparse v3" says what to expect (pools near HBM bandwidth, ~0.15 ms; select ~65 us; host ~130 us).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import jfa_ops
from bench.suites import make_inputs, sparse_cases
from bench.timing import cuda_graph_us


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--case", type=int, default=0)
    args = parser.parse_args()
    case = sparse_cases([128], "quick")[args.case]
    x = make_inputs(case, "cuda")

    def call():
        return jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv,
                                        block_q=case.block, block_kv=case.block, keep_ratio=case.keep_ratio,
                                        causal=case.causal, backend="triton")

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    from triton.testing import do_bench
    bench_us = do_bench(call, warmup=100, rep=500, return_mode="median") * 1e3
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        runs.append((time.perf_counter() - t0) / args.calls * 1e6)
        torch.cuda.synchronize()
    host_us = statistics.median(runs)
    gpu_us = cuda_graph_us(call, args.calls)  # None: capture failed (the profile below still has the kernels)
    kernels = collections.defaultdict(lambda: [0.0, 0])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time / args.calls
            kernels[event.name][1] += 1
    print(f"{case.name}: bench_us {bench_us:.1f}  host_us {host_us:.1f}  gpu_us "
          f"{'-' if gpu_us is None else f'{gpu_us:.1f}'}  (sum of kernels "
          f"{sum(v[0] for v in kernels.values()):.1f})")
    for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us:8.1f} us  {n / args.calls:4.1f}x  {name[:100]}")


if __name__ == "__main__":
    main()

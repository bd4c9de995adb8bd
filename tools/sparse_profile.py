"""Where the block-sparse forward and backward spend their GPU time, per kernel, and knob A/Bs in the same process.

`PYTHONPATH=$PWD python tools/sparse_profile.py [--cases 0,2] [--variants default,sparse_tma] [--profile]` on a CUDA
machine. Cases are the bench's quick `sparse` cases (bench.suites.sparse_cases: T 66,944, B 22, H 16, D 128, bf16,
128-blocks; 0 keep 0.5, 1 keep 0.25, 2 and 3 the causal ones). A variant is `default` or `+`-joined
`configs.KNOBS` names set True for that variant (`sparse_tma+sparse_causal_fwd_wide`; `v4` stands for the four
same-results knobs of bench/NOTES.md "sparse v4", `V4`; `v5` for selection v5's two, `V5`). For every case and variant
it prints the bench's measures (triton.testing.do_bench medians, ms): `fwd` = `sparse_attention` under no_grad
(selection included), `bwd` = the backward alone through a retained graph, `sel` = `select_kv_blocks` alone.
`--profile` adds, for the first variant, each kernel's GPU time per call (torch.profiler), forward and backward, so
the selection's, the attention's and the backward's pieces (delta, transposed index, dK/dV, dQ, tile lists) read
apart, and `gpu` columns: the summed kernel time per call (the bench's measure minus it is time the GPU waited for
the host). The variants' kernels compile first in parallel processes (one per variant; `--no-warm` skips that), so
the whole run fits one device call. bench/NOTES.md "sparse v4" says what to expect.
"""
from __future__ import annotations

import argparse
import collections
import subprocess
import sys

import torch
from triton.testing import do_bench

import jfa_ops
from bench.suites import make_inputs, sparse_cases
from jfa_ops.backends.triton import configs


# the block-sparse knobs (configs.KNOBS; v4's on by default since 2026-12-01); "v4" in a variant names that group
V4 = ("sparse_list_cost_in_kernel", "sparse_one_pass_split", "sparse_pool_fanout", "sparse_transpose_kernel")
# selection v5 (bench/NOTES.md "selection v5"): same choices; "v5" in a variant names these two
V5 = ("sparse_pool_whole_block", "sparse_select_visible")
# selection pool v6 (bench/NOTES.md "selection pool v6"): same bits; "pool6" in a variant names these two
POOL6 = ("sparse_pool_stream", "sparse_pool_one_launch")
# every knob a variant may turn on must be here: _set_variant resets these to SHIPPED before each variant
SPARSE_KNOBS = ("sparse_tma", "sparse_causal_fwd_wide", "sparse_dkdv_stages3", "sparse_select_rows",
                "sparse_select_grouped", "sparse_select_fp32_rn", "sparse_select_radix",
                "sparse_select_fill", "sparse_pool_skip", "sparse_select_overlap",
                "sparse_select_overlap_tail") + V4 + V5 + POOL6
GROUPS = {"v4": V4, "v5": V5, "pool6": POOL6}
SHIPPED = {name: getattr(configs.KNOBS, name) for name in SPARSE_KNOBS}  # as imported (JFA_* settings included)


def _set_variant(variant: str) -> None:
    """The shipped knob values with ``variant``'s knobs on (``default``: the shipped values alone; it set every knob
    off before, v4's too, once v4 was the default)."""
    for name, value in SHIPPED.items():
        setattr(configs.KNOBS, name, value)
    if variant != "default":
        for name in (n for part in variant.split("+") for n in GROUPS.get(part, (part,))):
            if name not in SHIPPED:  # a knob left on would leak into the next variant
                raise SystemExit(f"no knob {name!r} in sparse_profile.SPARSE_KNOBS")
            setattr(configs.KNOBS, name, True)


def _calls(case, x):
    kw = dict(block_q=case.block, block_kv=case.block, keep_ratio=case.keep_ratio, causal=case.causal,
              backend="triton")
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))

    def select():
        return jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv, **kw)

    def fwd():
        with torch.no_grad():
            return jfa_ops.sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv, **kw)

    out = jfa_ops.sparse_attention(q, k, v, x.q_offsets, x.kv_offsets, case.max_q, case.max_kv, **kw)
    out = out[0] if isinstance(out, tuple) else out

    def bwd():
        return torch.autograd.grad(out, (q, k, v), x.grad_out, retain_graph=True)
    return select, fwd, bwd


def _kernels(call, calls: int = 10):
    times = collections.defaultdict(float)
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:60]] += event.device_time / calls
    return sorted(times.items(), key=lambda kv: -kv[1])


def _warm(cases, variants) -> None:
    """Compile every kernel at once: one process per (variant, case) runs that case once (Triton's disk cache then
    serves the timing process; a fresh device machine compiles ~8 kernels per case and variant)."""
    procs = [subprocess.Popen([sys.executable, __file__, "--warm-only", "--cases", c, "--variants", v])
             for v in variants for c in cases.split(",")]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"warm-up {p.args[3:]} failed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="0,1,2,3")
    parser.add_argument("--variants", default="default")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--no-warm", action="store_true")
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = sparse_cases([128], "quick")
    variants = args.variants.split(",")
    if not (args.no_warm or args.warm_only):
        _warm(args.cases, variants)
    rows, profiles = [], {}
    for index in (int(c) for c in args.cases.split(",")):
        case = cases[index]
        x = make_inputs(case, "cuda")
        for n, variant in enumerate(variants):
            _set_variant(variant)
            select, fwd, bwd = _calls(case, x)
            if args.warm_only:
                fwd(), bwd(), select()
                torch.cuda.synchronize()
                continue
            ms = [do_bench(f, warmup=10, rep=args.rep_ms, return_mode="median") for f in (fwd, bwd, select)]
            rows.append((case.label, variant, *ms))
            print(f"{case.label} [{variant}] fwd {ms[0]:.3f} bwd {ms[1]:.3f} sel {ms[2]:.3f} ms", flush=True)
            if args.profile and n == 0:
                profiles[case.label] = (_kernels(fwd), _kernels(bwd))
            del select, fwd, bwd
    _set_variant("default")
    for label, (fwd_k, bwd_k) in profiles.items():
        for mode, kernels in (("fwd", fwd_k), ("bwd", bwd_k)):
            print(f"{label} [{variants[0]}] {mode}: {len(kernels)} kernels, {sum(us for _, us in kernels):.0f} us")
            for name, us in kernels[:8]:
                print(f"  {us:8.1f} us  {name}")
    print(f"{'case':24s} {'variant':42s} {'fwd ms':>7s} {'gpu':>7s} {'bwd ms':>7s} {'gpu':>7s} {'sel ms':>7s}")
    for label, variant, f, b, s in rows:
        gpu = [sum(us for _, us in k) / 1e3 for k in profiles[label]] if label in profiles and \
            variant == variants[0] else [float("nan")] * 2
        print(f"{label:24s} {variant:42s} {f:7.3f} {gpu[0]:7.3f} {b:7.3f} {gpu[1]:7.3f} {s:7.3f}")


if __name__ == "__main__":
    main()

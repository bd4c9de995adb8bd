"""Where a training step of the bench's `model` suite spends its GPU time, per attention implementation.

`PYTHONPATH=$PWD python tools/model_profile.py [--impls jfa:triton,varlen] [--kind large|small] [--steps 5]
[--host-top N] [--bounded]` on a
CUDA machine. Builds the model of bench/model.py (4-layer jagged transformer, compiled with dynamic shapes, AdamW),
warms it up on the kind's batches, then profiles ``--steps`` steps with torch.profiler and prints, per
implementation: the step's wall time, the GPU's busy time per step (sum of kernel, copy and memset time), and the
kernels taking the most GPU time per step, attention's own marked. The question it answers (issue 9, bench/NOTES.md
v7): when the attention kernels are faster than a peer's but the step is not, is the difference on the GPU (which
kernels) or on the host (GPU busy time well below wall time)? ``--smoke`` runs tiny shapes on the CPU (the plumbing).
``--bounded`` profiles each implementation a second time with the pool's largest sizes declared as bounds
(``torch._dynamo.mark_dynamic`` min/max): the A/B of what our traced graphs' tile lists cost a step.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])
from bench import model as bm  # noqa: E402

ATTENTION_MARKS = ("attn", "flash", "fmha", "jfa", "varlen", "tile_slots")  # kernel names counted as attention


def bound_sizes(pool: list) -> None:
    """Declare the pool's largest sizes as the bounds of the tokens' and offsets' dynamic dims (what a model that
    knows its largest batch can do): within them the traced attention takes the one-wave path, no tile list
    (docs/architecture.md, "The compiled path")."""
    rows = max(max(b[0].numel() for b in pool), 2)
    seqs = max(max(b[2].numel() for b in pool), 2)
    for tokens, targets, offsets, _ in pool:
        for t, most in ((tokens, rows), (targets, rows), (offsets, seqs)):
            torch._dynamo.mark_dynamic(t, 0, min=2, max=most)


def profile_impl(name: str, kind: bm.BatchKind, cfg: bm.ModelConfig, device, compile_backend: str, steps: int,
                 top: int, host_top: int = 0, bounded: bool = False, gaps: int = 0,
                 cprofile: int = 0) -> None:
    torch._dynamo.reset()
    bm.no_shared_autograd_cache()  # each implementation its own graphs (bench/model.py says why)
    torch.manual_seed(0)
    attend = bm.attention_for(name, cfg, device)
    model = bm.JaggedTransformer(cfg, attend).to(device=device, dtype=getattr(torch, cfg.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=torch.device(device).type == "cuda" or None)
    compiled = torch.compile(model, dynamic=True, backend=compile_backend)
    pool = [bm.make_batch(kind.lengths(i), cfg.vocab, device, seed=i) for i in range(kind.pool)]
    if bounded:
        bound_sizes(pool)

    def step(batch):
        tokens, targets, offsets, max_len = batch
        compiled(tokens, targets, offsets, max_len).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in bm.warmup_order(kind):  # the bench's warm-up: every batch of the pool once
        step(pool[i])
    bm.sync(device)
    order = (bm.timed_order(kind) * steps)[:steps]  # the timed batches, the same for every pass below
    host, walls = [], []  # unprofiled: the host's time to enqueue a step (step() returning) vs the synced wall
    for i in order:
        t0 = time.perf_counter()
        step(pool[i])
        host.append(time.perf_counter() - t0)
        bm.sync(device)
        walls.append(time.perf_counter() - t0)
    if cprofile:  # where the host's Python time goes (host-bound steps): cProfile over the steps, by own time
        import cProfile
        import pstats
        prof_py = cProfile.Profile()
        prof_py.enable()
        for i in order:
            step(pool[i])
        bm.sync(device)
        prof_py.disable()
        print(f"\n== {name}, cProfile of {steps} steps (tottime, cumtime in ms per step):")
        stats = pstats.Stats(prof_py)
        by_own = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:cprofile]
        by_cum = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:2 * cprofile]
        for label, rows in (("by own time", by_own), ("by cumulative time", by_cum)):
            print(f"  {label}:")
            for (file, line, fn), (_, calls, tottime, cumtime, _) in rows:
                print(f"  {tottime * 1e3 / steps:7.2f} {cumtime * 1e3 / steps:7.2f} {calls / steps:6.0f}x  "
                      f"{file.split('site-packages/')[-1][-60:]}:{line}({fn})")
    print(f"\n== {name}, unprofiled: step {statistics.median(walls) * 1e3:.2f} ms wall, the host enqueues it in "
          f"{statistics.median(host) * 1e3:.2f} ms (median of {steps}; host ~ wall: the step is host-bound)")
    walls = []
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in order:
            t0 = time.perf_counter()
            step(pool[i])
            bm.sync(device)
            walls.append(time.perf_counter() - t0)
    per_kernel = collections.Counter()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[evt.name] += evt.device_time / steps  # us per step
    busy = sum(per_kernel.values())
    attention = sum(t for n, t in per_kernel.items() if any(m in n.lower() for m in ATTENTION_MARKS))
    print(f"\n== {name}{' (bounded sizes)' if bounded else ''}, {kind.label}: step "
          f"{statistics.median(walls) * 1e3:.2f} ms wall (median of {steps}), GPU busy {busy / 1e3:.2f} ms/step, "
          f"attention kernels {attention / 1e3:.2f} ms/step")
    for kernel, t in per_kernel.most_common(top):
        mark = "*" if any(m in kernel.lower() for m in ATTENTION_MARKS) else " "
        print(f"  {mark} {t:9.1f} us  {kernel[:110]}")
    if gaps:  # GPU idle time inside a step (profiled, so host-inflated): the largest gaps and their neighbours
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
        idle = []
        for a, b in zip(kernels, kernels[1:]):
            gap = b.time_range.start - max(a.time_range.end, a.time_range.start)
            if 0 < gap < 5000:  # under 5 ms: inside a step, not the sync between steps
                idle.append((gap, a.name[:50], b.name[:50]))
        print(f"  GPU idle gaps over 20 us: {sum(g for g, *_ in idle if g > 20) / steps:.0f} us/step in "
              f"{sum(1 for g, *_ in idle if g > 20) / steps:.0f} gaps/step; largest:")
        for gap, a, b in sorted(idle, reverse=True)[:gaps]:
            print(f"    {gap:8.1f} us  after {a}  before {b}")
    if host_top:  # where the host's time goes (small batches are host-bound): CPU ops by self time, per step
        rows = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0),
                      key=lambda e: -e.self_cpu_time_total)[:host_top]
        print("  host, self CPU us per step (calls per step): " + "; ".join(
            f"{e.key[:60]} {e.self_cpu_time_total / steps:.0f} ({e.count / steps:.0f})" for e in rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", default="jfa:triton,varlen")
    parser.add_argument("--kind", default="large", choices=("small", "large"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--host-top", type=int, default=0, help="also list the CPU ops with the most self time")
    parser.add_argument("--gaps", type=int, default=0, help="also list the N largest GPU idle gaps in a step")
    parser.add_argument("--cprofile", type=int, default=0, help="also list the N Python functions with the most "
                        "own time in a step (cProfile)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (aot_eager)")
    parser.add_argument("--bounded", action="store_true",
                        help="also profile each implementation with the pool's largest sizes declared as bounds "
                             "(torch._dynamo.mark_dynamic max): our traced graphs then build no tile list")
    args = parser.parse_args()
    size = "smoke" if args.smoke else "quick"
    device = "cpu" if args.smoke else "cuda"
    cfg, kinds = bm.model_config(size), bm.batch_kinds(size)
    kind = kinds[0] if args.kind == "small" else kinds[1]
    for name in args.impls.split(","):
        for bounded in (False, True) if args.bounded else (False,):
            try:
                with uncached() if bounded else contextlib.nullcontext():
                    profile_impl(name, kind, cfg, device, "aot_eager" if args.smoke else "inductor", args.steps,
                                 args.top, args.host_top, bounded, args.gaps,
                                 args.cprofile)
            except Exception as e:  # noqa: BLE001 (one implementation failing does not stop the others)
                print(f"\n== {name}{' (bounded sizes)' if bounded else ''}: failed: {type(e).__name__}: {str(e)[:300]}")


def uncached():
    """AOTAutograd's and Inductor's graph caches off: their keys need not see the bounds, which change what our
    traced code builds (bench/NOTES.md v11: a knob flipped in one process did not always recompile)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    stack = contextlib.ExitStack()
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    return stack


if __name__ == "__main__":
    main()

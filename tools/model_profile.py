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
                 top: int, host_top: int = 0, bounded: bool = False) -> None:
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
    walls = []
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in (bm.timed_order(kind) * steps)[:steps]:
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
                                 args.top, args.host_top, bounded)
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

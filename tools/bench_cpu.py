"""CPU timing: the ``cpu`` backend vs the per-sequence ``reference`` and padded SDPA, on many short sequences.

    PYTHONPATH=. python tools/bench_cpu.py [--batch 4000] [--heads 8] [--threads 2] [--lengths uniform|lognormal]

Padded SDPA: ``scaled_dot_product_attention`` on ``[B, H, L_max, D]`` with a key-padding mask (the pre-jagged way).
Prints the median wall time of forward and forward+backward for fp32 and bf16.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import jfa_ops


def lengths_of(kind, batch, gen):
    if kind == "uniform":
        return torch.randint(1, 65, (batch,), generator=gen)
    return torch.empty(batch).log_normal_(3.2, 0.6, generator=gen).long().clamp(1, 256)  # mean ~29


def timed(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4000)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--lengths", default="uniform", choices=["uniform", "lognormal"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="also time the per-sequence reference backend")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    lengths = lengths_of(args.lengths, args.batch, gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    total, longest, h, d = int(offsets[-1]), int(lengths.max()), args.heads, args.head_dim
    print(f"B={args.batch} lengths {args.lengths} (mean {lengths.float().mean():.1f}, max {longest}) T={total} H={h} "
          f"D={d} threads={args.threads}")
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(total, h, d, generator=gen).to(dtype).requires_grad_() for _ in range(3))
        padded = [torch.randn(args.batch, h, longest, d, generator=gen).to(dtype).requires_grad_() for _ in range(3)]
        key_ok = (torch.arange(longest)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, L]

        def ours(backend, bwd):
            def run():
                out = jfa_ops.jagged_attention(q, k, v, offsets, offsets, backend=backend)
                if bwd:
                    out.sum().backward()
            return run

        def sdpa(bwd):
            def run():
                out = F.scaled_dot_product_attention(*padded, attn_mask=key_ok)
                if bwd:
                    out.sum().backward()
            return run

        name = str(dtype)[6:]
        for bwd in (False, True):
            what = "fwd+bwd" if bwd else "fwd"
            grad = torch.enable_grad() if bwd else torch.no_grad()
            with grad:
                t_cpu, t_sdpa = timed(ours("cpu", bwd), args.reps), timed(sdpa(bwd), args.reps)
                line = f"{name:8s} {what:7s} cpu {t_cpu * 1e3:8.1f} ms   padded SDPA {t_sdpa * 1e3:8.1f} ms   " \
                       f"ratio {t_cpu / t_sdpa:5.2f}"
                if args.reference:
                    t_ref = timed(ours("reference", bwd), 1)
                    line += f"   reference {t_ref * 1e3:8.1f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    main()

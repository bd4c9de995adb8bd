"""Data-parallel scaling: tokens/s of the example model from 1 to 2 (or more) GPUs under DDP and FSDP2.

    python -m bench.scaling                       # world sizes 1 and 2, both modes; writes scaling_<date>.json
    python -m bench.scaling --worlds 1,2,4 --modes fsdp2 --layers 8

Weak scaling: every GPU gets ``--batch`` histories per step (the global batch grows with the world size), split by
``balance_by_cost``. tokens/s counts all ranks' tokens over the timed steps (after ``--warmup``, which includes the
compile), each step timed from the forward to the end of the optimizer step (the synthetic batches are drawn
outside). Each world size runs in fresh processes (``examples.train_distributed.spawn``: NCCL, NVLink multicast
off), bf16 autocast, the ``triton`` backend. Besides tokens/s it reports what bounds the speedup on the data side:
the mean over steps of the busiest rank's attention cost (sum of squared lengths) over the mean rank's, for the
same batches.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
from typing import Dict, List, Optional, Sequence

import torch

from examples.train_distributed import MODES, Config, draw_batch, spawn
from jfa_ops.distributed import shard_costs


def cost_imbalance(cfg: Config, world_size: int, steps: int) -> float:
    """Mean over steps of max / mean rank attention cost for the batches a ``world_size`` run draws."""
    gen = torch.Generator().manual_seed(cfg.seed)
    ratios = []
    for step in range(steps):
        _, offsets, _, shards = draw_batch(gen, cfg, step, world_size)
        costs = shard_costs(offsets.diff().tolist(), shards)
        ratios.append(max(costs) / statistics.mean(costs))
    return statistics.mean(ratios)


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="1,2", help="world sizes (default 1,2)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch", type=int, default=64, help="histories per GPU per step (default 64)")
    p.add_argument("--median-len", type=float, default=512.0)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--embed-dim", type=int, default=1024)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
    args = _parse(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    gpus = torch.cuda.device_count()
    if max(worlds) > max(gpus, 1):
        raise SystemExit(f"asked for world sizes {worlds}, found {gpus} CUDA device(s)")
    rows = []
    for mode in args.modes.split(","):
        for world in worlds:
            cfg = Config(mode=mode, steps=args.steps, warmup=args.warmup, batch=args.batch * world,
                         max_len=args.max_len, median_len=args.median_len, embed_dim=args.embed_dim,
                         num_heads=args.num_heads, layers=args.layers, amp=gpus > 0)
            (result,) = spawn([cfg], world)
            rows.append({"mode": mode, "world_size": world, "tokens_per_s": result["tokens_per_s"],
                         "cost_imbalance": cost_imbalance(cfg, world, args.steps),
                         "recompiles": result["recompiles"], "config": dataclasses.asdict(cfg)})
            base = next(r["tokens_per_s"] for r in rows if r["mode"] == mode and r["world_size"] == worlds[0])
            rows[-1]["speedup"] = result["tokens_per_s"] / base
            print(f"{mode:6s} {world} GPU(s): {result['tokens_per_s']:12.0f} tokens/s  speedup {rows[-1]['speedup']:.2f}x"
                  f"  (ideal {world / worlds[0]:.0f}x; busiest rank's attention cost {rows[-1]['cost_imbalance']:.3f}x"
                  f" the mean; {result['recompiles']} recompiles)", flush=True)
    device = torch.cuda.get_device_name(0) if gpus else "cpu"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"scaling_{datetime.datetime.now():%Y-%m-%d_%H%M}.json")
    with open(path, "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()

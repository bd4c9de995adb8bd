"""Train a compiled jagged-attention classifier data-parallel under DDP or FSDP2, batches balanced by attention cost.

    torchrun --nproc-per-node 2 -m examples.train_distributed --mode fsdp2   # 2 GPUs over NCCL, or 2 CPU procs (gloo)
    python -m examples.train_distributed --mode ddp --nproc 2                 # the same, spawned without torchrun

The task and data are the demo's (``jfa_ops.demo.make_batch``: does the marker token occur in the history?). The
model embeds tokens, runs ``--layers`` pre-norm blocks (``JaggedSelfAttention`` + MLP), pools each history with
``SeedPooling`` and classifies it. It is compiled once with ``torch.compile(fullgraph=True, dynamic=True)`` and
wrapped by PyTorch's own engines: ``DistributedDataParallel``, or FSDP2 (``fully_shard`` on every block, then on
the root). Backend: ``triton`` on CUDA, the automatic choice on CPU.

Every rank draws the same global batch (same seed) and keeps the sequences ``balance_by_cost`` gives it, so the
ranks' sums of squared lengths (attention cost) are near equal. The loss is the mean over the *global* batch: each
rank sums its per-sequence losses and divides by the global count ``B``; DDP and FSDP2 average gradients over ranks
(divide by the world size), so each rank's loss is also multiplied by the world size. The gradients are then those
of the single-process loss on the whole batch, whatever the split (the tests check this to fp32 rounding).

Dynamo specializes sizes 0 and 1 and gives equal sizes one symbol ("duck sizing"), so a rank's shard must have
``B >= 2`` sequences, ``T >= 2`` rows and ``T != B+1`` (the demo's rule, applied per rank): batches where a shard
breaks it are drawn again, identically on every rank. Then no batch recompiles.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import tempfile
import time
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from jfa_ops.demo import make_batch
from jfa_ops.distributed import balance_by_cost, take_sequences
from jfa_ops.nn import JaggedSelfAttention, SeedPooling

VOCAB = 16
MODES = ("ddp", "fsdp2")


@dataclasses.dataclass
class Config:
    mode: str = "ddp"               # ddp | fsdp2 (a world of 1 runs the plain model: the single-process baseline)
    steps: int = 20
    batch: int = 32                 # histories per global batch (all ranks together)
    max_len: int = 64
    median_len: float = 12.0        # lognormal history lengths (sigma 1), capped at max_len
    embed_dim: int = 32
    num_heads: int = 4
    num_seeds: int = 8
    layers: int = 1
    lr: float = 0.1                 # plain SGD: the updated parameters stay comparable across runs
    seed: int = 0
    device: str = "auto"            # auto: cuda:<local rank> when CUDA is present, else cpu
    backend: Optional[str] = None   # jfa backend; None: triton on CUDA, automatic on CPU
    compile: str = "inductor"       # a torch.compile backend, or "none" for eager
    amp: bool = False               # bf16 autocast on CUDA (the bench); fp32 otherwise
    warmup: int = 3                 # steps left out of tokens/s
    batches_for: int = 0            # draw the batches a run on this many ranks draws (0: this run's world size);
                                    # a single process given N trains on the global batches of an N-rank run


class Block(nn.Module):
    """Pre-norm transformer block over packed rows: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, embed_dim: int, num_heads: int, backend: Optional[str]):
        super().__init__()
        self.attn_norm = nn.LayerNorm(embed_dim)
        self.attn = JaggedSelfAttention(embed_dim, num_heads, backend=backend)
        self.mlp_norm = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(), nn.Linear(4 * embed_dim, embed_dim))

    def forward(self, x: Tensor, offsets: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x), offsets)
        return x + self.mlp(self.mlp_norm(x))


class PoolHead(nn.Module):
    """rows [T, E], offsets [B+1] -> logits [B]: seed pooling (broadcast-Q attention), then a linear head."""

    def __init__(self, cfg: Config, backend: Optional[str]):
        super().__init__()
        self.pool = SeedPooling(cfg.embed_dim, cfg.num_heads, cfg.num_seeds, backend=backend)
        self.head = nn.Linear(cfg.num_seeds * cfg.embed_dim, 1)

    def forward(self, h: Tensor, offsets: Tensor) -> Tensor:
        return self.head(self.pool(h, offsets).flatten(1)).squeeze(-1)


class JaggedClassifier(nn.Module):
    """tokens [T] int64, offsets [B+1] -> logits [B]: embed, ``layers`` blocks, seed pooling and head."""

    def __init__(self, cfg: Config, backend: Optional[str]):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, cfg.embed_dim)
        self.blocks = nn.ModuleList(Block(cfg.embed_dim, cfg.num_heads, backend) for _ in range(cfg.layers))
        self.pool_head = PoolHead(cfg, backend)

    def forward(self, tokens: Tensor, offsets: Tensor) -> Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, offsets)
        return self.pool_head(h, offsets)


def draw_batch(gen: torch.Generator, cfg: Config, step: int, num_shards: int):
    """The next global batch and its split: (tokens, offsets, labels, shards), redrawn until every shard keeps
    dynamo's sizes symbolic (see the module docstring). The same generator state gives the same result."""
    while True:
        tokens, offsets, _, labels = make_batch(gen, cfg.batch, VOCAB, cfg.max_len, cfg.median_len)
        lengths = offsets.diff().tolist()
        shards = balance_by_cost(lengths, num_shards, seed=step)
        totals = [(sum(lengths[i] for i in shard), len(shard)) for shard in shards]
        if all(count >= 2 and total >= 2 and total != count + 1 for total, count in totals):
            return tokens, offsets, labels, shards


def shard_batch(gen: torch.Generator, cfg: Config, step: int, rank: int, world_size: int):
    """This rank's share of the next global batch: (tokens, offsets, labels); every rank draws the same batches."""
    num_shards = cfg.batches_for or world_size
    if world_size not in (1, num_shards):
        raise ValueError(f"batches_for ({cfg.batches_for}) must be 0, 1 or the world size ({world_size})")
    tokens, offsets, labels, shards = draw_batch(gen, cfg, step, num_shards)
    if world_size == 1:
        return tokens, offsets, labels
    mine = shards[rank]
    tokens, offsets = take_sequences(tokens, offsets, mine)
    return tokens, offsets, labels[mine]


def build(cfg: Config, world_size: int, device: torch.device) -> nn.Module:
    """The model, its blocks and pooling head compiled, wrapped for ``cfg.mode`` when ``world_size > 1``.

    Compile first, wrap second (torchtitan's order): each block and the pooling head is one ``fullgraph=True``
    graph, and the DDP / FSDP2 hooks run outside the compiled regions (FSDP2 shards each compiled block, then the
    root). Block's code compiles once for all its instances (dynamo lifts the parameters to inputs)."""
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    backend = cfg.backend or ("triton" if device.type == "cuda" else None)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = JaggedClassifier(cfg, backend).to(device)
    if cfg.compile != "none":
        compile_ = functools.partial(torch.compile, fullgraph=True, dynamic=True, backend=cfg.compile)
        model.blocks = nn.ModuleList(compile_(block) for block in model.blocks)
        model.pool_head = compile_(model.pool_head)
    if world_size > 1 and cfg.mode == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if world_size > 1 and cfg.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard  # public since torch 2.6
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model


def named_parameters(model: nn.Module):
    """(name, parameter) with the wrappers' prefixes removed, so every mode names a parameter alike."""
    prefix = "module." if isinstance(model, nn.parallel.DistributedDataParallel) else ""
    for name, p in model.named_parameters():
        yield name[len(prefix):].replace("_orig_mod.", ""), p


def full_copy(t: Tensor) -> Tensor:
    """A plain CPU copy of a parameter or gradient (an FSDP2 shard is gathered: every rank must call this)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def train(cfg: Config, rank: int = 0, world_size: int = 1) -> Dict:
    """Run ``cfg.steps`` SGD steps; returns (identically on every rank) the global losses, the first step's gradients,
    the final parameters, tokens/s and dynamo's compile and graph-break counts."""
    if cfg.device == "auto":
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    model = build(cfg, world_size, device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    counters = torch._dynamo.utils.counters
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    autocast = torch.autocast(device.type, torch.bfloat16) if cfg.amp else nullcontext()
    losses: List[float] = []
    first_grads: Dict[str, Tensor] = {}
    tokens_seen, timed_s = 0, 0.0
    for step in range(cfg.steps):
        tokens, offsets, labels = shard_batch(gen, cfg, step, rank, world_size)
        tokens, offsets, labels = tokens.to(device), offsets.to(device), labels.to(device)
        start = time.perf_counter()
        with autocast:
            logits = model(tokens, offsets)
        loss_sum = nn.functional.binary_cross_entropy_with_logits(logits.float(), labels, reduction="sum")
        # Global mean: / B, and * world_size because DDP and FSDP2 average gradients over the ranks.
        (loss_sum * (world_size / cfg.batch)).backward()
        if step == 0:
            graphs_after_first_step = counters["stats"]["unique_graphs"]
            first_grads = {name: full_copy(p.grad) for name, p in named_parameters(model)}
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats = torch.stack([loss_sum.detach().float(), torch.tensor(tokens.shape[0], device=device, dtype=torch.float)])
        if world_size > 1:
            dist.all_reduce(stats)
        global_loss_sum, global_tokens = stats.tolist()  # waits for the step; after the all-reduce, every rank's
        if step >= cfg.warmup:
            timed_s += time.perf_counter() - start
            tokens_seen += int(global_tokens)
        losses.append(global_loss_sum / cfg.batch)
    return {
        "losses": losses,
        "first_grads": first_grads,
        "params": {name: full_copy(p) for name, p in named_parameters(model)},
        "tokens_per_s": tokens_seen / timed_s if timed_s > 0 else float("nan"),
        "compiles": counters["stats"]["unique_graphs"] - graphs_before,
        "recompiles": counters["stats"]["unique_graphs"] - graphs_after_first_step,  # after the first step
        "graph_breaks": sum(counters["graph_break"].values()) - breaks_before,
        "world_size": world_size,
        "device": str(device),
    }


def _worker(rank: int, world_size: int, init_method: str, cfgs: List[Config], result_path: str) -> None:
    """One rank of a spawned run: join the group, train each config in turn, rank 0 saves the results."""
    cuda = torch.cuda.is_available() and cfgs[0].device in ("auto", "cuda")
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        results = [train(cfg, rank, world_size) for cfg in cfgs]
        if rank == 0:
            torch.save(results, result_path)
    finally:
        dist.destroy_process_group()


def spawn(cfgs: Sequence[Config], world_size: int) -> List[Dict]:
    """Train each config in turn in ``world_size`` processes started here (no torchrun; a file rendezvous, so no
    port to pick; later configs reuse what the first compiled). Returns rank 0's results. On CUDA, rank r uses
    cuda:r over NCCL; on CPU, gloo."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (the lent GPU machines need it off)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "results.pt")
        torch.multiprocessing.spawn(_worker, args=(world_size, f"file://{tmp}/rendezvous", list(cfgs), path),
                                    nprocs=world_size)
        return torch.load(path)


def _parse(argv: Optional[Sequence[str]]) -> tuple:
    p = argparse.ArgumentParser(prog="python -m examples.train_distributed", description=__doc__.splitlines()[0])
    defaults = Config()
    p.add_argument("--mode", choices=MODES, default=defaults.mode)
    p.add_argument("--nproc", type=int, default=0, help="spawn this many processes here (default: torchrun's)")
    for field in dataclasses.fields(Config):
        if field.name in ("mode",):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool",):
            p.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(field.type, str)
            p.add_argument(flag, type=kind, default=getattr(defaults, field.name))
    args = vars(p.parse_args(argv))
    nproc = args.pop("nproc")
    return Config(**args), nproc


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    cfg, nproc = _parse(argv)
    if nproc:
        result = spawn([cfg], nproc)[0]
    elif "RANK" in os.environ:  # under torchrun
        cuda = torch.cuda.is_available() and cfg.device in ("auto", "cuda")
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cuda else "gloo")
        try:
            result = train(cfg, dist.get_rank(), dist.get_world_size())
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return result
    else:
        result = train(cfg)
    losses = result["losses"]
    print(f"mode={cfg.mode} world_size={result['world_size']} device={result['device']} compile={cfg.compile}")
    print(f"loss: first {losses[0]:.4f} -> last {losses[-1]:.4f} over {len(losses)} steps")
    print(f"tokens/s (all ranks, after {cfg.warmup} warm-up steps): {result['tokens_per_s']:.0f}")
    print(f"dynamo on rank 0: {result['compiles']} compile(s), {result['recompiles']} after the first step, "
          f"{result['graph_breaks']} graph break(s)")
    return result


if __name__ == "__main__":
    main()

"""The `model` suite: what a user sees, a small jagged transformer trained under ``torch.compile(dynamic=True)``.

A 4-layer pre-LN causal transformer over packed sequences (E=512, 4 heads of 128, MLP 4x, bf16 parameters, AdamW),
its attention call swapped between our GPU backends and every peer that takes jagged data (issue 9). Each training
step takes the next batch from a fixed pool, so lengths (and the total token count) vary from step to step and a
recompile would show; Dynamo's counters are reported next to the times so it cannot hide. One compiled model per
attention implementation serves both batch kinds (small first, then large): with dynamic shapes it should compile
once; the large kind's warm-up compiles, if any, are recompiles.

The warm-up runs every batch of the pool once (``warmup_order``), so the timed steps meet only batch shapes this
implementation has run: the first step on a new total T pays per-shape costs outside the attention call (cuBLAS
picking GEMM algorithms for the new M, the caching allocator growing), once per process, so whichever implementation
ran first paid them for the others (bench/NOTES.md, "compiled path per call").

Records (one per batch kind and implementation, mode ``train``): ``step_ms`` (median over the timed steps),
``tokens_per_s`` (all timed tokens over all timed time), ``warmup_step_ms`` (median of the warm-up steps after the
first, which compiles: each one this implementation's first step on its batch), ``compiles_warmup`` /
``compiles_timed`` (graphs Dynamo compiled during that kind's warm-up / timed steps; the timed count should be 0),
``graph_breaks``, ``loss``.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import suites
from bench.peers import Skip, import_jfa_ops, one_line

PEERS = ("varlen", "fa4", "flex")  # the peers that run on packed jagged data


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    embed_dim: int = 512
    num_heads: int = 4
    head_dim: int = 128
    layers: int = 4
    vocab: int = 4096
    mlp_ratio: int = 4
    dtype: str = "bfloat16"


@dataclasses.dataclass(frozen=True)
class BatchKind:
    label: str
    lengths: Callable[[int], tuple]  # seed -> the lengths of one batch
    pool: int  # distinct batches, cycled through
    warmup: int  # steps before timing (compiles happen here), at least one per batch of the pool
    steps: int  # timed steps


def warmup_order(kind: BatchKind) -> List[int]:
    """Pool indices of the warm-up steps: every batch of the pool at least once."""
    return [i % kind.pool for i in range(max(kind.warmup, kind.pool))]


def timed_order(kind: BatchKind) -> List[int]:
    """Pool indices of the timed steps, continuing the cycle after the warm-up."""
    start = len(warmup_order(kind))
    return [(start + i) % kind.pool for i in range(kind.steps)]


def small_lengths(batch: int, max_len: int) -> Callable[[int], tuple]:
    return lambda seed: tuple(int(x) for x in np.random.default_rng(seed).integers(1, max_len + 1, size=batch))


def lognormal_total(total: int, max_len: int, mu: float = suites.LOGNORMAL_MU) -> Callable[[int], tuple]:
    return lambda seed: suites.lognormal_lengths(total, None, seed=100 + seed, max_len=max_len, mu=mu)


def batch_kinds(size: str) -> List[BatchKind]:
    if size == "smoke":
        return [BatchKind("B3 len 1-8", small_lengths(3, 8), pool=3, warmup=2, steps=3),
                BatchKind("T64 lognormal<=32", lognormal_total(64, 32, mu=suites.SMOKE_MU), pool=2, warmup=1,
                          steps=2)]
    steps = 20 if size == "quick" else 50
    return [BatchKind("small B8 len 1-64", small_lengths(8, 64), pool=16, warmup=5, steps=steps),
            BatchKind(f"large T32768 lognormal<={suites.MAX_LEN}", lognormal_total(32768, suites.MAX_LEN), pool=8,
                      warmup=3, steps=steps)]


def model_config(size: str) -> ModelConfig:
    if size == "smoke":  # fp32: the Triton interpreter's bf16 dot is garbage, and the reference is fp64 inside anyway
        return ModelConfig(embed_dim=32, num_heads=2, head_dim=16, layers=2, vocab=64, dtype="float32")
    return ModelConfig()


# --------------------------------------------------------------------------------------------------------------------
# Attention calls: (q, k, v [T, H, D], offsets [B+1] int32, max_len int) -> out [T, H, D], causal


def jfa_attention(backend: Optional[str]):
    jfa_ops = import_jfa_ops()

    def attend(q, k, v, offsets, max_len):
        # max_seqlen left out: our backends do not need it, and passing it costs nothing either way (a SymInt)
        return jfa_ops.jagged_attention(q, k, v, offsets, offsets, causal=True, backend=backend)
    return attend


def varlen_attention():
    from torch.nn.attention.varlen import varlen_attn

    def attend(q, k, v, offsets, max_len):
        return varlen_attn(q, k, v, offsets, offsets, max_len, max_len, window_size=(-1, 0))
    return attend


def fa4_attention():
    from flash_attn.cute.interface import flash_attn_varlen_func

    def attend(q, k, v, offsets, max_len):
        out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=offsets, cu_seqlens_k=offsets, max_seqlen_q=max_len,
                                     max_seqlen_k=max_len, causal=True)
        return out[0] if isinstance(out, (tuple, list)) else out
    return attend


def flex_attention():
    """FlexAttention with a causal document mask built from the offsets inside the compiled graph each step."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex

    def attend(q, k, v, offsets, max_len):
        t = q.shape[0]
        doc = torch.searchsorted(offsets, torch.arange(t, device=q.device, dtype=offsets.dtype), right=True) - 1

        def mask_mod(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (ki <= qi)

        block_mask = create_block_mask(mask_mod, None, None, t, t, device=q.device)
        out = flex(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=block_mask)
        return out[0].transpose(0, 1)
    return attend


def attention_for(name: str, cfg: ModelConfig, device, size: str = "full") -> Callable:
    """The attention call of ``name`` (``jfa:<backend>`` or a peer), or Skip with the reason it cannot run here."""
    on_cuda = torch.device(device).type == "cuda"
    if name.startswith("jfa:"):
        import_jfa_ops()
        from jfa_ops.backends import unavailable_reason
        from jfa_ops.backends.base import Problem
        problem = Problem(torch.device(device).type, getattr(torch, cfg.dtype), cfg.head_dim, cfg.num_heads,
                          cfg.num_heads, True, -1, -1, False, False)
        from bench.peers import AUTO, library_backend, split_compile_path, use_compile_path
        backend, compile_path = split_compile_path(name[4:])  # jfa:triton@opaque: the op as one opaque node
        reason = None if backend == AUTO else unavailable_reason(backend, problem)  # auto: the library's choice
        if reason:
            raise Skip(reason)
        use_compile_path(compile_path)
        return jfa_attention(library_backend(backend))
    if name == "flex" and size == "quick":
        raise Skip("not in --quick: compiling the document-mask training graph takes minutes; run without --quick")
    if not on_cuda:
        raise Skip("needs CUDA")
    try:
        if name == "varlen":
            return varlen_attention()
        if name == "fa4":
            return fa4_attention()
        if name == "flex":
            return flex_attention()
    except ImportError as e:
        raise Skip(f"not importable ({one_line(e, 100)})") from e
    raise Skip(f"no jagged attention call for {name!r} in the model suite")


# --------------------------------------------------------------------------------------------------------------------
# The model


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attend: Callable):
        super().__init__()
        width = cfg.num_heads * cfg.head_dim
        self.cfg, self.attend = cfg, attend
        self.ln1, self.ln2 = nn.LayerNorm(cfg.embed_dim), nn.LayerNorm(cfg.embed_dim)
        self.qkv = nn.Linear(cfg.embed_dim, 3 * width, bias=False)
        self.proj = nn.Linear(width, cfg.embed_dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.embed_dim, cfg.mlp_ratio * cfg.embed_dim), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.embed_dim, cfg.embed_dim))

    def forward(self, x, offsets, max_len):
        q, k, v = self.qkv(self.ln1(x)).unflatten(-1, (3, self.cfg.num_heads, self.cfg.head_dim)).unbind(1)
        x = x + self.proj(self.attend(q, k, v, offsets, max_len).flatten(1))
        return x + self.mlp(self.ln2(x))


class JaggedTransformer(nn.Module):
    """Token ids [T] of packed sequences -> next-token loss; every sequence attends causally to itself only."""

    def __init__(self, cfg: ModelConfig, attend: Callable):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.embed_dim)
        self.blocks = nn.ModuleList(Block(cfg, attend) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.embed_dim)
        self.head = nn.Linear(cfg.embed_dim, cfg.vocab, bias=False)

    def forward(self, tokens, targets, offsets, max_len):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, offsets, max_len)
        return F.cross_entropy(self.head(self.ln(x)).float(), targets)


# --------------------------------------------------------------------------------------------------------------------
# Running


def make_batch(lengths: tuple, vocab: int, device, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    t = int(sum(lengths))
    tokens = torch.randint(0, vocab, (t,), generator=g).to(device)
    targets = torch.randint(0, vocab, (t,), generator=g).to(device)
    return tokens, targets, suites.offsets_of(lengths, device), int(max(lengths))


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def train_one(name: str, kinds: List[BatchKind], cfg: ModelConfig, device, compile_backend: str,
              deadline: float, size: str = "full") -> List[dict]:
    """One compiled model with ``name``'s attention, trained on each batch kind in turn: a record per kind."""
    base = {"peer": name, "mode": "train"}
    describe = lambda kind: {"suite": "model", "label": kind.label, "name": f"model {kind.label}",  # noqa: E731
                             "layers": cfg.layers, "embed_dim": cfg.embed_dim, "num_heads": cfg.num_heads,
                             "head_dim": cfg.head_dim, "dtype": cfg.dtype, "compile_backend": compile_backend}
    try:
        attend = attention_for(name, cfg, device, size)
    except Skip as e:
        return [dict(base, case=describe(k), skip=str(e)) for k in kinds]
    records = _train(attend, kinds, cfg, device, compile_backend, deadline, base, describe)
    first = records[0].get("skip", "")
    if first.startswith("train failed") and name in ("varlen", "fa4"):
        # a peer Dynamo cannot trace still runs for users, as a graph break around each call: measure that (not
        # FlexAttention: uncompiled, it materializes every score)
        note = f"attention called outside the graph (torch.compiler.disable); traced, it failed: {first[14:]}"
        records = [dict(r, note=note) for r in _train(torch.compiler.disable(attend), kinds, cfg, device,
                                                      compile_backend, deadline, base, describe)]
    return records


def _train(attend, kinds, cfg, device, compile_backend, deadline, base, describe) -> List[dict]:
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    torch.manual_seed(0)
    model = JaggedTransformer(cfg, attend).to(device=device, dtype=getattr(torch, cfg.dtype))
    fused = torch.device(device).type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    compiled = torch.compile(model, dynamic=True, backend=compile_backend)

    def step(batch):
        tokens, targets, offsets, max_len = batch
        loss = compiled(tokens, targets, offsets, max_len)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def timed_step(batch):
        t0 = time.perf_counter()
        loss = step(batch)
        sync(device)
        return loss, time.perf_counter() - t0

    records = []
    for kind in kinds:
        rec = dict(base, case=describe(kind))
        if time.perf_counter() > deadline:
            records.append(dict(rec, skip="time budget spent"))
            continue
        pool = [make_batch(kind.lengths(i), cfg.vocab, device, seed=i) for i in range(kind.pool)]
        try:
            before = dynamo_counts()
            warmup_times = [timed_step(pool[i])[1] for i in warmup_order(kind)]
            warm = dynamo_counts()
            times, tokens = [], 0
            for i in timed_order(kind):
                loss, seconds = timed_step(pool[i])
                times.append(seconds)
                tokens += pool[i][0].numel()
            after = dynamo_counts()
            rec.update(step_ms=statistics.median(times) * 1e3, tokens_per_s=tokens / sum(times),
                       mean_tokens=tokens / len(times), steps=len(times), loss=float(loss.detach()),
                       warmup_step_ms=statistics.median(warmup_times[1:] or warmup_times) * 1e3,
                       compiles_warmup=warm["graphs"] - before["graphs"],
                       compiles_timed=after["graphs"] - warm["graphs"], graph_breaks=after["graph_breaks"])
        except Exception as e:  # noqa: BLE001 - one implementation failing does not stop the others
            rec = dict(rec, skip=f"train failed: {one_line(e)}")
        records.append(rec)
        del pool
    del compiled, model, opt
    return records


def model_peer_names(backends: List[str], peers: List[str], device) -> List[str]:
    """Our backends, then the jagged peers asked for. On a GPU the reference backend (float64, one sequence at a
    time) is left out unless it is the only backend asked for: a T=32768 step would take minutes."""
    ours = [f"jfa:{b}" for b in backends]
    if torch.device(device).type == "cuda" and len(ours) > 1:
        ours = [n for n in ours if n != "jfa:reference"]
    return ours + [p for p in PEERS if p in peers]


def run(backends: List[str], peers: List[str], device, size: str, deadline: float,
        compile_backend: Optional[str] = None, progress: Optional[Callable[[List[dict]], None]] = None) -> List[dict]:
    """Every implementation on every batch kind. ``compile_backend``: inductor on CUDA, aot_eager on the CPU (the
    smoke run checks the plumbing and the counters; compiling C++ kernels there would only cost test time).
    ``progress(records so far)`` is called after each implementation (the CLI rewrites its JSON there)."""
    device = torch.device(device)
    if compile_backend is None:
        compile_backend = "inductor" if device.type == "cuda" else "aot_eager"
    import torch._dynamo.config as dynamo_config
    for knob in ("recompile_limit", "cache_size_limit"):  # a recompile per step must show, not fall back to eager
        if hasattr(dynamo_config, knob):
            setattr(dynamo_config, knob, max(64, getattr(dynamo_config, knob)))
    cfg, kinds = model_config(size), batch_kinds(size)
    records = []
    for name in model_peer_names(backends, peers, device):
        if time.perf_counter() > deadline:
            records += [{"case": {"suite": "model", "label": k.label, "name": f"model {k.label}"}, "peer": name,
                         "mode": "train", "skip": "time budget spent"} for k in kinds]
            continue
        records += train_one(name, kinds, cfg, device, compile_backend, deadline, size)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if progress is not None:
            progress(records)
    return records

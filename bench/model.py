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

The timed steps are interleaved: every model is built and warmed up on a kind first, then each round runs one step of
every implementation on the same batch, the order rotating from round to round (``round_orders``). The small step is
host-bound and the host drifts by ~20% over seconds (the H200: one implementation 5.8 and 7.2 ms in two processes),
more than issue 9's margins, so implementations timed one after the other cannot be compared; our step over the
peer's in the same round can (bench/NOTES.md, "interleaved model timing, helper interleave, stop 29").

Records (one per batch kind and implementation, mode ``train``): ``step_ms`` (median over the timed steps),
``tokens_per_s`` (all timed tokens over all timed time), ``warmup_step_ms`` (median of the warm-up steps after the
first, which compiles: each one this implementation's first step on its batch), ``compiles_warmup`` /
``compiles_timed`` (graphs Dynamo compiled during that kind's warm-up / timed steps; the timed count should be 0),
``graph_breaks``, ``loss``, ``timing`` (``interleaved``, or why sequential: the models would not fit side by side);
our rows, timed interleaved with a jagged peer (varlen first): ``paired_peer``, ``paired_ratio`` (the median over
rounds of our step / the peer's in the same round), ``paired_ratio_q1`` / ``_q3`` (its quartiles), ``paired_rounds``.
"""
from __future__ import annotations

import dataclasses
import re
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench import suites
from bench.peers import Skip, import_jfa_ops, one_line, split_compile_path, use_compile_path

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
    steps: int  # timed steps (rounds: one step of each implementation)
    name: str  # small or large (--model-kinds)


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
        return [BatchKind("B3 len 1-8", small_lengths(3, 8), pool=3, warmup=2, steps=3, name="small"),
                BatchKind("T64 lognormal<=32", lognormal_total(64, 32, mu=suites.SMOKE_MU), pool=2, warmup=1,
                          steps=2, name="large")]
    steps = 20 if size == "quick" else 50
    return [BatchKind("small B8 len 1-64", small_lengths(8, 64), pool=16, warmup=5, steps=steps, name="small"),
            BatchKind(f"large T32768 lognormal<={suites.MAX_LEN}", lognormal_total(32768, suites.MAX_LEN), pool=8,
                      warmup=3, steps=steps, name="large")]


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


@dataclasses.dataclass
class Trainer:
    """One implementation's compiled model and optimizer. ``step(batch)`` runs a training step and returns the loss."""
    name: str
    attend: Optional[Callable] = None
    step: Optional[Callable] = None
    params: int = 0
    compile_path: Optional[str] = None  # JFA_COMPILE_PATH its graphs are traced with (jfa rows only)
    note: str = ""
    graph_breaks: int = 0  # its own so far: Dynamo's counters are the process's, read around each of its steps
    loss: float = float("nan")
    failed: str = ""  # why it cannot run or stopped (a Skip's reason, a failed step): its records are skips


def build(name: str, attend: Callable, cfg: ModelConfig, device, compile_backend: str) -> Trainer:
    torch.manual_seed(0)  # every implementation starts from the same weights
    # A class of its own per implementation: Dynamo keeps the compiled graphs on the forward's code object (shared by
    # every instance) and guards `self` by type. With one class, two implementations whose attention closures the
    # guards cannot tell apart (jfa:triton and jfa:triton@opaque: same code, same cell values) share the graph traced
    # first, under one compile path.
    cls = type("JaggedTransformer_" + re.sub(r"\W", "_", name), (JaggedTransformer,), {})
    model = cls(cfg, attend).to(device=device, dtype=getattr(torch, cfg.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=torch.device(device).type == "cuda" or None)
    compiled = torch.compile(model, dynamic=True, backend=compile_backend)

    def step(batch):
        tokens, targets, offsets, max_len = batch
        loss = compiled(tokens, targets, offsets, max_len)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    path = split_compile_path(name[4:])[1] if name.startswith("jfa:") else None
    return Trainer(name, attend, step, sum(p.numel() for p in model.parameters()), compile_path=path)


def run_step(tr: Trainer, batch, device) -> Tuple[float, int]:
    """One synchronized step of ``tr``: (seconds, graphs Dynamo compiled during it)."""
    if tr.compile_path:  # read when a graph is traced: the path of the implementation stepping now
        use_compile_path(tr.compile_path)
    before = dynamo_counts()
    t0 = time.perf_counter()
    loss = tr.step(batch)
    sync(device)
    seconds = time.perf_counter() - t0
    after = dynamo_counts()
    tr.loss = float(loss.detach())
    tr.graph_breaks += after["graph_breaks"] - before["graph_breaks"]
    return seconds, after["graphs"] - before["graphs"]


def warm_up(tr: Trainer, kind: BatchKind, pool: list, device) -> dict:
    times, graphs = [], 0
    for i in warmup_order(kind):
        seconds, new = run_step(tr, pool[i], device)
        times.append(seconds)
        graphs += new
    # the first step compiles (on the first kind): left out of the median
    return {"warmup_step_ms": statistics.median(times[1:] or times) * 1e3, "compiles_warmup": graphs}


def warm_up_retrying(tr: Trainer, kind: BatchKind, pool: list, device, cfg: ModelConfig,
                     compile_backend: str) -> Tuple[Trainer, Optional[dict]]:
    """``warm_up``; where a peer's compiled training fails (varlen, fa4), the peer built again with its attention
    called outside the graph, as it still runs for users (not Flex: uncompiled, it materializes every score; never
    ours). Failing: (the trainer, its ``failed`` set; None)."""
    try:
        return tr, warm_up(tr, kind, pool, device)
    except Exception as e:  # noqa: BLE001 - one implementation failing does not stop the others
        why = one_line(e)
    if tr.name not in ("varlen", "fa4") or tr.note:
        tr.failed = f"train failed: {why}"
        return tr, None
    retry = build(tr.name, torch.compiler.disable(tr.attend), cfg, device, compile_backend)
    retry.note = f"attention called outside the graph (torch.compiler.disable); traced, it failed: {why}"
    return warm_up_retrying(retry, kind, pool, device, cfg, compile_backend)


def round_orders(names: List[str], rounds: int) -> List[List[str]]:
    """The order of each timing round: every implementation once, rotated by one place a round and reversed every
    other n rounds, so that over 2n rounds each runs in every place and right after each other one equally often
    (what a step leaves behind, caches and the allocator's state, falls on all alike)."""
    n = len(names)
    out = []
    for r in range(rounds):
        base = names if (r // n) % 2 == 0 else names[::-1]
        out.append(base[r % n:] + base[:r % n])
    return out


def paired_ratio(ours: Dict[int, float], theirs: Dict[int, float]) -> Optional[dict]:
    """Median and quartiles over rounds of our step / the peer's step in the same round: host drift between rounds
    (seconds apart, ~20% on the H200) cancels in each ratio, which the ratio of the two medians does not."""
    ratios = [ours[r] / theirs[r] for r in ours if r in theirs]
    if not ratios:
        return None
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    return {"paired_ratio": float(med), "paired_ratio_q1": float(q1), "paired_ratio_q3": float(q3),
            "paired_rounds": len(ratios)}


# Bytes per token of one training step's activations: per layer the tensors autograd keeps (LayerNorm inputs and
# outputs 4E, q/k/v and the attention output 4W, the MLP's two 4E), the head's logits in the parameters' dtype and
# float32 with their softmax and gradient (~16 B x vocab); doubled for the backward's transients.
def step_bytes(cfg: ModelConfig, tokens: int) -> int:
    elem = torch.finfo(getattr(torch, cfg.dtype)).bits // 8
    per_layer = (12 * cfg.embed_dim + 4 * cfg.num_heads * cfg.head_dim) * elem
    return 2 * tokens * (cfg.layers * per_layer + 16 * cfg.vocab)


def state_bytes(model_params: int) -> int:
    return 16 * model_params  # parameters, gradients and AdamW's two moments, float32 at most


def interleave_fits(cfg: ModelConfig, tokens: int, trainers: List[Trainer], device) -> Optional[str]:
    """None where the models can be stepped in turn on the device, else why not. Worst case: every model's state
    plus a step's activations each (the allocator keeping each implementation's blocks apart; a step frees its own)."""
    n = len(trainers)
    if torch.device(device).type != "cuda" or n < 2:
        return None
    need = sum(state_bytes(tr.params) + step_bytes(cfg, tokens) for tr in trainers)
    free = torch.cuda.mem_get_info(device)[0]
    if need <= 0.8 * free:
        return None
    return f"sequential: {n} models need ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"


def time_kind(trainers: List[Trainer], kind: BatchKind, pool: list, device, deadline: float,
              interleave: bool = True) -> Dict[str, Dict[int, tuple]]:
    """The timed steps: {name: {round: (seconds, graphs compiled)}}. Interleaved, each round runs one step of every
    implementation on the same pool batch (``round_orders``); sequential, each implementation's steps in a block.
    Stops at the deadline (between rounds / blocks)."""
    names = [tr.name for tr in trainers]
    if not names:
        return {}
    by_name = {tr.name: tr for tr in trainers}
    batches = timed_order(kind)
    if interleave:
        rounds = [[(name, r) for name in order] for r, order in enumerate(round_orders(names, len(batches)))]
    else:
        rounds = [[(name, r) for r in range(len(batches))] for name in names]
    out: Dict[str, Dict[int, tuple]] = {name: {} for name in names}
    for steps in rounds:
        if time.perf_counter() > deadline:
            break
        for name, r in steps:
            tr = by_name[name]
            if tr.failed:
                continue
            try:
                out[name][r] = run_step(tr, pool[batches[r]], device)
            except Exception as e:  # noqa: BLE001 - one implementation failing does not stop the others
                tr.failed = f"train failed: {one_line(e)}"
        if not interleave and torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # one implementation's blocks at a time
    return out


def kind_records(trainers: List[Trainer], kind: BatchKind, pool: list, warm: Dict[str, dict],
                 timed: Dict[str, Dict[int, tuple]], timing_note: str, describe: Callable) -> List[dict]:
    """A record per implementation; our rows get the paired ratio against the first jagged peer timed (varlen)."""
    peer = next((p for p in PEERS if timed.get(p)), None)
    records = []
    for tr in trainers:
        rec = {"peer": tr.name, "mode": "train", "case": describe(kind)}
        if tr.note:
            rec["note"] = tr.note
        steps = timed.get(tr.name) or {}
        if tr.name not in warm or not steps:
            records.append(dict(rec, skip=tr.failed or "time budget spent"))
            continue
        times = [seconds for seconds, _ in steps.values()]
        tokens = sum(pool[timed_order(kind)[r]][0].numel() for r in steps)
        rec.update(step_ms=statistics.median(times) * 1e3, tokens_per_s=tokens / sum(times),
                   mean_tokens=tokens / len(times), steps=len(times), loss=tr.loss, **warm[tr.name],
                   compiles_timed=sum(graphs for _, graphs in steps.values()), graph_breaks=tr.graph_breaks,
                   timing=timing_note)
        if tr.failed:
            rec["note"] = (rec.get("note", "") + f"; stopped after {len(times)} steps: {tr.failed}").lstrip("; ")
        if peer and tr.name.startswith("jfa:") and timing_note == "interleaved":
            paired = paired_ratio({r: s for r, (s, _) in steps.items()}, {r: s for r, (s, _) in timed[peer].items()})
            if paired:
                rec.update(paired_peer=peer, **paired)
        records.append(rec)
    return records


def model_peer_names(backends: List[str], peers: List[str], device) -> List[str]:
    """Our backends, then the jagged peers asked for. On a GPU the reference backend (float64, one sequence at a
    time) is left out unless it is the only backend asked for: a T=32768 step would take minutes."""
    ours = [f"jfa:{b}" for b in backends]
    if torch.device(device).type == "cuda" and len(ours) > 1:
        ours = [n for n in ours if n != "jfa:reference"]
    return ours + [p for p in PEERS if p in peers]


def no_shared_autograd_cache() -> None:
    """Turn off torch's AOTAutograd cache for this process. Its key is Dynamo's graph, in which our op is one node
    whatever ``JFA_COMPILE_PATH`` is, so jfa:auto, jfa:auto@inductor and jfa:auto@split (same model, same call) would
    get the graphs of whichever compiled first, in the process or on the machine's disk (H200, 2026-12-04: auto and
    auto@split ran the same compiled graphs, `## Call CompiledFxGraph` keys equal). Inductor's own FX graph cache
    keys on the traced graph: left on."""
    import torch._functorch.config as functorch_config
    functorch_config.enable_autograd_cache = False


def run(backends: List[str], peers: List[str], device, size: str, deadline: float,
        compile_backend: Optional[str] = None, progress: Optional[Callable[[List[dict]], None]] = None,
        kinds: Optional[List[str]] = None) -> List[dict]:
    """Every implementation on every batch kind (``kinds``: their names, small / large; default all), timed
    interleaved: all models are built first, each warms up on a kind's pool in turn, then the timed steps run in
    rounds (``time_kind``). ``compile_backend``: inductor on CUDA, aot_eager on the CPU (the smoke run checks the
    plumbing and the counters; compiling C++ kernels there would only cost test time). ``progress(records so far)``
    is called after each kind (the CLI rewrites its JSON there)."""
    device = torch.device(device)
    if compile_backend is None:
        compile_backend = "inductor" if device.type == "cuda" else "aot_eager"
    import torch._dynamo.config as dynamo_config
    # A recompile per step must show, not fall back to eager; every implementation's graph counts against the limit
    # of the one forward code object they share (one entry each, their guards told apart by the model's class).
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, knob):
            setattr(dynamo_config, knob, max(64, getattr(dynamo_config, knob)))
    no_shared_autograd_cache()
    cfg = model_config(size)
    kind_list = [k for k in batch_kinds(size) if kinds is None or k.name in kinds]
    describe = lambda kind: {"suite": "model", "label": kind.label, "name": f"model {kind.label}",  # noqa: E731
                             "layers": cfg.layers, "embed_dim": cfg.embed_dim, "num_heads": cfg.num_heads,
                             "head_dim": cfg.head_dim, "dtype": cfg.dtype, "compile_backend": compile_backend}
    torch._dynamo.reset()  # once: every implementation's graphs stay alive to the end
    from torch._dynamo.utils import counters
    counters.clear()

    trainers = []
    for name in model_peer_names(backends, peers, device):
        try:
            trainers.append(build(name, attention_for(name, cfg, device, size), cfg, device, compile_backend))
        except Skip as e:
            trainers.append(Trainer(name, failed=str(e)))

    records = []
    for kind in kind_list:
        pool = [make_batch(kind.lengths(i), cfg.vocab, device, seed=i) for i in range(kind.pool)]
        warm = {}
        for i, tr in enumerate(trainers):
            if not tr.failed and time.perf_counter() <= deadline:
                trainers[i], result = warm_up_retrying(tr, kind, pool, device, cfg, compile_backend)
                if result:
                    warm[tr.name] = result
        live = [tr for tr in trainers if tr.name in warm]
        note = interleave_fits(cfg, max(b[0].numel() for b in pool), live, device) or "interleaved"
        timed = time_kind(live, kind, pool, device, deadline, interleave=note == "interleaved")
        records += kind_records(trainers, kind, pool, warm, timed, note, describe)
        del pool
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if progress is not None:
            progress(records)
    del trainers
    return records

"""Benchmark cases: the shapes each suite measures, and the inputs built for one case.

A ``Case`` is pure description (lengths, heads, mask); ``make_inputs`` turns it into tensors in the jagged layout
``jfa_ops`` takes. Every peer adapter (``bench.peers``) starts from those same tensors.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch

from bench import flops

SMOKE_MU = 3.5  # smoke shapes: median ~33 tokens, clipped to 128
SUITES = ("dense", "jagged", "broadcast", "gqa", "window", "overhead", "sparse", "mxfp8")  # per-call suites
ALL_SUITES = SUITES + ("model",)  # model: a training loop, not Cases (bench.model)
HEAD_DIMS = (64, 128, 256)
MAX_LEN = 8192
LOGNORMAL_MU, LOGNORMAL_SIGMA = 6.35, 1.2  # median ~570, mean ~1170 tokens
JAGGED_SEED = 3  # at T=32768: 27 sequences, mean 1214, one at the 8192 clip (device-facts.md's shape: 28, 1170, 8192)


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    label: str  # short, unique within the suite, e.g. "S4096 causal"
    q_lens: tuple  # one per sequence; for broadcast_q every entry is Lq
    kv_lens: tuple
    num_heads_q: int
    num_heads_kv: int
    head_dim: int
    causal: bool = False
    window: tuple = (-1, -1)
    broadcast_q: bool = False
    dense: bool = False  # every sequence has the same length: peers may use their dense (batched) path
    dtype: str = "bfloat16"
    keep_ratio: Optional[float] = None  # sparse suite: block-sparse attention keeping this share of visible blocks
    block: int = 128  # sparse suite: block_q = block_kv

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def total_q(self) -> int:
        return int(sum(self.q_lens))

    @property
    def total_kv(self) -> int:
        return int(sum(self.kv_lens))

    @property
    def max_q(self) -> int:
        return int(max(self.q_lens))

    @property
    def max_kv(self) -> int:
        return int(max(self.kv_lens))

    @property
    def name(self) -> str:
        return f"{self.suite} D{self.head_dim} {self.label}"

    def pairs(self) -> int:
        """Visible (query, key) pairs per query head."""
        return flops.visible_pairs(self.q_lens, self.kv_lens, self.causal, self.window)

    def flops(self, mode: str) -> float:
        return flops.attention_flops(self.pairs(), self.num_heads_q, self.head_dim, mode)

    def describe(self) -> dict:
        kv = np.asarray(self.kv_lens)
        return {
            "suite": self.suite, "label": self.label, "name": self.name, "batch": self.batch,
            "num_heads_q": self.num_heads_q, "num_heads_kv": self.num_heads_kv, "head_dim": self.head_dim,
            "causal": self.causal, "window": list(self.window), "broadcast_q": self.broadcast_q, "dense": self.dense,
            "dtype": self.dtype, "total_q": self.total_q, "total_kv": self.total_kv, "max_q": self.max_q,
            "max_kv": self.max_kv, "mean_kv": float(kv.mean()), "visible_pairs": self.pairs(),
            "keep_ratio": self.keep_ratio, "block": self.block,
            **({"kv_blocks": self.kv_blocks()} if self.keep_ratio is not None else {}),
        }

    def kv_blocks(self, top_k: int = 0) -> List[int]:
        """Sparse suite: [visible, kept] (block, block) pairs per head over the batch: what our dense kernel and the
        block-sparse kernel walk (``meta_kernels.block_sparse``'s visibility and keep count: keep_ratio, or top_k
        where > 0). Their ratio is the speedup a kernel with the dense kernel's cost per block would reach
        (bench/report.py ``sparse_lines``)."""
        import meta_kernels.block_sparse as mbs
        left, right = self.window
        visible = kept = 0
        for lq, lk in zip(self.q_lens, self.kv_lens):
            i = torch.arange(mbs.num_blocks(lq, self.block))[:, None]
            j = torch.arange(mbs.num_blocks(lk, self.block))[None, :]
            per_row = mbs.block_visible(lq, lk, self.block, self.block, self.causal, left, right, i, j).sum(1)
            visible += int(per_row.sum())
            kept += int(mbs.keep_count(per_row, self.keep_ratio, top_k).sum())
        return [visible, kept]


def lognormal_lengths(total: Optional[int], count: Optional[int], seed: int, max_len: int = MAX_LEN,
                      mu: float = LOGNORMAL_MU, sigma: float = LOGNORMAL_SIGMA) -> tuple:
    """Skewed lengths in 1..max_len: ``count`` of them, or as many as sum exactly to ``total`` (last one cut)."""
    rng = np.random.default_rng(seed)
    if count is not None:
        return tuple(int(x) for x in np.clip(rng.lognormal(mu, sigma, size=count).astype(np.int64), 1, max_len))
    lens, left = [], total
    while left > 0:
        n = int(np.clip(int(rng.lognormal(mu, sigma)), 1, max_len))
        n = min(n, left)
        lens.append(n)
        left -= n
    return tuple(lens)


# --------------------------------------------------------------------------------------------------------------------
# Suites. Each returns the cases for the given head dims; `size` is "full", "quick" or "smoke".


def dense_cases(head_dims, size):
    batch, heads = 8, 16
    if size == "smoke":
        batch, heads, seqs = 2, 2, {d: (64,) for d in head_dims}
    elif size == "quick":
        seqs = {d: (2048, 8192) for d in head_dims}
    else:  # the sweep at D=128, the headline length at the other head dims
        seqs = {d: (1024, 2048, 4096, 8192) if d == 128 else (4096,) for d in head_dims}
    out = []
    for d in head_dims:
        for s in seqs[d]:
            for causal in (False, True):
                out.append(Case("dense", f"B{batch} S{s}{' causal' if causal else ''}", (s,) * batch, (s,) * batch,
                                heads, heads, d, causal=causal, dense=True))
    return out


def jagged_cases(head_dims, size):
    heads = 16
    mu = SMOKE_MU if size == "smoke" else LOGNORMAL_MU
    if size == "smoke":
        heads, totals = 2, {d: (256,) for d in head_dims}
        max_len = 128
    else:
        max_len = MAX_LEN
        if size == "quick":
            totals = {d: (8 * 2048, 8 * 8192) for d in head_dims}
        else:
            totals = {d: tuple(8 * s for s in (1024, 2048, 4096, 8192)) if d == 128 else (8 * 4096,)
                      for d in head_dims}
    out = []
    for d in head_dims:
        for t in totals[d]:
            lens = lognormal_lengths(t, None, seed=JAGGED_SEED, max_len=max_len, mu=mu)
            for causal in (False, True):
                out.append(Case("jagged", f"T{t} n{len(lens)}{' causal' if causal else ''}", lens, lens, heads, heads,
                                d, causal=causal))
    return out


def broadcast_cases(head_dims, size):
    """Seed pooling: Lq learned queries shared by all B sequences, each with its own jagged KV."""
    if size == "smoke":
        configs = {d: ((16, 2, 3),) for d in head_dims}
        max_len = 64
    else:
        max_len = MAX_LEN
        headline = (128, 4, 512)  # (Lq, H, B): the device-facts shape
        if size == "quick":
            configs = {d: (headline,) for d in head_dims}
        else:
            configs = {d: (headline, (64, 8, 1024), (512, 4, 256)) if d == 128 else (headline,) for d in head_dims}
    out = []
    for d in head_dims:
        for lq, h, b in configs[d]:
            kv = lognormal_lengths(None, b, seed=b, max_len=max_len, mu=SMOKE_MU if size == "smoke" else LOGNORMAL_MU)
            out.append(Case("broadcast", f"Lq{lq} H{h} B{b}", (lq,) * b, kv, h, h, d, broadcast_q=True))
            if size == "smoke":  # bottom-right causal with Lq > Lk on some sequences: checks the mask alignment
                out.append(Case("broadcast", f"Lq{lq} H{h} B{b} causal", (lq,) * b, kv, h, h, d, causal=True,
                                broadcast_q=True))
    return out


def gqa_cases(head_dims, size):
    if size == "smoke":
        hq, hkv, t, max_len, causals, mu = 4, 2, 256, 128, (False, True), SMOKE_MU
    else:
        hq, hkv, t, max_len, causals, mu = 16, 2, 8 * 4096, MAX_LEN, (False, True), LOGNORMAL_MU
    lens = lognormal_lengths(t, None, seed=JAGGED_SEED, max_len=max_len, mu=mu)
    out = []
    for d in head_dims:
        for causal in (causals if (d == 128 or size == "smoke") else (False,)):
            if size == "quick" and not causal:
                continue
            out.append(Case("gqa", f"Hq{hq}:Hkv{hkv} T{t}{' causal' if causal else ''}", lens, lens, hq, hkv, d,
                            causal=causal))
    return out


def window_cases(head_dims, size):
    if size == "smoke":
        heads, t, max_len, windows, mu = 2, 256, 128, ((16, 0, True), (8, 8, False)), SMOKE_MU
    else:
        heads, t, max_len, windows, mu = 16, 8 * 4096, MAX_LEN, ((256, 0, True), (128, 128, False)), LOGNORMAL_MU
    lens = lognormal_lengths(t, None, seed=JAGGED_SEED, max_len=max_len, mu=mu)
    out = []
    for d in head_dims:
        for left, right, causal in windows:
            if size == "quick" and not causal:
                continue
            if size == "full" and d != 128 and not causal:
                continue
            out.append(Case("window", f"T{t} win({left},{right}){' causal' if causal else ''}", lens, lens, heads,
                            heads, d, causal=causal, window=(left, right)))
    return out


def overhead_cases(head_dims, size):
    """Tiny batch, host-bound: eager wall time per call against the kernels' own time."""
    lens = (64, 17, 40, 5)
    d = 128 if 128 in head_dims else head_dims[0]
    heads = 2 if size == "smoke" else 8
    return [Case("overhead", f"B4 len<=64 H{heads}", lens, lens, heads, heads, d, causal=True)]


SPARSE_MAX_LEN = 16384
SPARSE_KEEP_RATIOS = (0.5, 0.25)


def sparse_cases(head_dims, size):
    """Block-sparse attention (issue 11): jagged histories up to 16k, bf16, D128 (the first head dim otherwise), keep
    0.5 and 0.25 of the visible 128-blocks. Lengths are rounded up to whole blocks so that FlexAttention's blocks over
    the packed batch are the selection's blocks. TFLOP/s are dense-equivalent (the dense pairs over the time), so
    the sparse/dense speedup reads directly off the table; the ``jfa:<backend> dense`` and ``... select`` rows are
    our dense kernel and the selection alone on the same batch."""
    d = 128 if 128 in head_dims else head_dims[0]
    if size == "smoke":
        heads, block, totals, max_len, mu = 2, 16, (256,), 128, SMOKE_MU
    else:
        heads, block, max_len, mu = 16, 128, SPARSE_MAX_LEN, LOGNORMAL_MU + 1.0  # median ~1.5k
        totals = (8 * 8192,) if size == "quick" else (8 * 8192, 16 * 8192)
    out = []
    for t in totals:
        lens = lognormal_lengths(t, None, seed=JAGGED_SEED, max_len=max_len, mu=mu)
        lens = tuple(int(-(-n // block) * block) for n in lens)  # whole blocks
        for causal in (False, True):
            for keep in SPARSE_KEEP_RATIOS:
                out.append(Case("sparse", f"T{sum(lens)} n{len(lens)} keep{keep}{' causal' if causal else ''}", lens,
                                lens, heads, heads, d, causal=causal, keep_ratio=keep, block=block))
    return out


def mxfp8_cases(head_dims, size):
    """Issue 12: MXFP8 against bf16 on memory-bound shapes (broadcast-Q seed pooling, sliding window) and
    compute-bound ones (dense, jagged); head dims that are powers of two (the MXFP8 kernel's tiles)."""
    dims = [d for d in head_dims if d in (64, 128, 256)] or [128]
    if size == "smoke":
        kv = lognormal_lengths(None, 3, seed=3, max_len=64, mu=SMOKE_MU)
        lens = lognormal_lengths(256, None, seed=JAGGED_SEED, max_len=128, mu=SMOKE_MU)
        return [c for d in dims for c in (
            Case("mxfp8", "bcast Lq16 H2 B3", (16,) * 3, kv, 2, 2, d, broadcast_q=True),
            Case("mxfp8", "T256 win(16,0) causal", lens, lens, 2, 2, d, causal=True, window=(16, 0)),
            Case("mxfp8", "B2 S64", (64,) * 2, (64,) * 2, 2, 2, d, dense=True))]
    kv = lognormal_lengths(None, 512, seed=512, max_len=MAX_LEN)
    lens = lognormal_lengths(8 * 4096, None, seed=JAGGED_SEED, max_len=MAX_LEN)
    out = []
    for d in dims:
        out += [Case("mxfp8", "bcast Lq128 H4 B512", (128,) * 512, kv, 4, 4, d, broadcast_q=True),
                Case("mxfp8", "T32768 win(256,0) causal", lens, lens, 16, 16, d, causal=True, window=(256, 0))]
        for causal in ((False, True) if size == "full" else (False,)):
            tag = " causal" if causal else ""
            out += [Case("mxfp8", f"B8 S4096{tag}", (4096,) * 8, (4096,) * 8, 16, 16, d, causal=causal, dense=True),
                    Case("mxfp8", f"jagged T32768 n{len(lens)}{tag}", lens, lens, 16, 16, d, causal=causal)]
    return out


SUITE_BUILDERS = {
    "dense": dense_cases, "jagged": jagged_cases, "broadcast": broadcast_cases, "gqa": gqa_cases,
    "window": window_cases, "overhead": overhead_cases, "sparse": sparse_cases, "mxfp8": mxfp8_cases,
}


def build_cases(suites, head_dims, size) -> list:
    cases = []
    for s in suites:
        if s not in SUITE_BUILDERS:
            raise SystemExit(f"unknown suite {s!r}; choose from {', '.join(ALL_SUITES)}")
        # the headline head dim first, so a run cut short by its time budget still has it
        dims = sorted(head_dims, key=lambda d: (d != 128, d))
        cases += SUITE_BUILDERS[s](dims, size)
    return cases


# --------------------------------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass
class Inputs:
    """One case's tensors in the jfa_ops layout (leaf tensors without grad; adapters make their own leaves)."""

    q: torch.Tensor  # [T_q, Hq, D] (broadcast_q: [Lq, Hq, D])
    k: torch.Tensor  # [T_kv, Hkv, D]
    v: torch.Tensor
    q_offsets: Optional[torch.Tensor]  # [B+1] int32 (None for broadcast_q)
    kv_offsets: torch.Tensor
    q_offsets_materialized: torch.Tensor  # [B+1] int32 offsets of q expanded per sequence (b * Lq for broadcast_q)
    grad_out: torch.Tensor  # [T_q (or B*Lq), Hq, D]

    def q_materialized(self, case: Case) -> torch.Tensor:
        """Q as one jagged row block per sequence ([B*Lq, Hq, D] for broadcast_q), what peers without broadcast take."""
        if not case.broadcast_q:
            return self.q
        return self.q.unsqueeze(0).expand(case.batch, *self.q.shape).reshape(-1, *self.q.shape[1:]).contiguous()


def offsets_of(lens, device) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=device)


def make_inputs(case: Case, device, seed: int = 0) -> Inputs:
    """Random normal inputs drawn on ``device`` (seeded: the same seed gives the same tensors on that device)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    d = case.head_dim

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype)

    rows_q = case.q_lens[0] if case.broadcast_q else case.total_q
    q = rand(rows_q, case.num_heads_q, d)
    k = rand(case.total_kv, case.num_heads_kv, d)
    v = rand(case.total_kv, case.num_heads_kv, d)
    q_offsets = None if case.broadcast_q else offsets_of(case.q_lens, device)
    return Inputs(q=q, k=k, v=v, q_offsets=q_offsets, kv_offsets=offsets_of(case.kv_lens, device),
                  q_offsets_materialized=offsets_of(case.q_lens, device),
                  grad_out=rand(case.total_q, case.num_heads_q, d))


def input_bytes(case: Case) -> int:
    itemsize = torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
    rows_q = case.q_lens[0] if case.broadcast_q else case.total_q
    return itemsize * case.head_dim * (rows_q * case.num_heads_q + 2 * case.total_kv * case.num_heads_kv
                                       + case.total_q * case.num_heads_q)

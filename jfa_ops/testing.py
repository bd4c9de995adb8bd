"""Test helpers for ``jfa_ops`` users and backend authors.

Shape legend as in ``jfa_ops.jagged_attention``: ``T_q``/``T_kv`` total rows, ``B`` sequences, ``Hq``/``Hkv`` heads,
``D`` head_dim, ``L_q`` rows of a broadcast Q.

- ``reference_attention``: a float64 oracle, a plain softmax per sequence, written from the documented semantics and
  independent of ``jfa_ops.backends.reference``. Differentiable: gradients come from autograd.
- ``visible_mask``: the documented mask of one sequence, the one mask tests, bench and tools use.
- ``assert_attention_close``: relative-error-norm comparison with explicit tolerance kinds (``tolerance``).
- ``AttentionCase``: one problem (lengths, heads, head_dim, dtype, device, mask options); ``make_inputs(seed)``
  builds the tensors. ``FEATURE_MATRIX``: named cases that cover every feature once.
- ``jagged_lengths()``, ``attention_cases(...)``: hypothesis strategies.
- ``check_attention_case``: one case against the oracle (out, lse, gradients through out, lse and both).
- ``check_backend(name, ...)``: opcheck of both ops plus oracle comparisons on any registered backend.
- ``fp8_mma_model``: Hopper's FP8 tensor-core sum (truncating, ~14-bit accumulator), to reproduce GPU results on CPU.

hypothesis (the ``test`` extra) is imported lazily: only the strategies and ``check_backend`` need it.

Example::

    >>> from jfa_ops.testing import check_backend
    >>> check_backend("reference", device="cpu", dtypes=(torch.float32,), examples=5)
"""
from __future__ import annotations

import dataclasses
import math
import traceback
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import jfa_ops
from jfa_ops.backends import AttentionParams, Problem, get_backend, unavailable_reason

__all__ = [
    "TOLERANCES", "LSE_TOLERANCE", "tolerance", "visible_mask", "reference_attention", "row_visibility",
    "reference_block_selection", "block_sparse_masks", "BlockSparseCase", "check_block_sparse_case",
    "assert_attention_close", "AttentionCase", "AttentionInputs", "FEATURE_MATRIX", "OPCHECK_UTILS", "jagged_lengths", "attention_cases", "check_attention_case",
    "check_backend_writes_every_row", "check_opcheck", "backward_op_args", "check_backend",
    "mx_shared_exponent_spec", "e4m3_round_spec", "mx_quantize_spec", "mx_dequantize_spec", "mx_round_trip_spec",
    "reference_mxfp8_attention", "reference_mxfp8_attention_backward", "fp8_mma_model",
    "mx_rebased_row_blocks_spec", "mxfp8_attention_backward_model",
]

# ---------------------------------------------------------------------------------------------------------------
# Tolerances and comparison
# ---------------------------------------------------------------------------------------------------------------

# Relative error norm ||actual - expected|| / ||expected|| allowed, per input dtype: (out, gradients).
# fp32 gradients get 1e-4: where a row sees one key, dS = P * (dP - delta) is a difference of equal terms
# (delta = rowsum(dO * O)) and dq/dk are rounding noise plus the lse term; measured up to 1.3e-5 at D=256, and
# 7.7e-5 by a hypothesis draw of one query and one key at D=8 (stop 40's CI: cpu backend, a tiny dq): 1e-4.
# Measured worst cases of the reference backend over 400 random cases (std <= 2 logits): fp16 2.4e-4 / 1e-3,
# bf16 1.9e-3 / 5.3e-3, fp32 6e-7 / 1.3e-5.
TOLERANCES: Dict[torch.dtype, Tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 5e-3),
    torch.bfloat16: (1e-2, 2e-2),
}
# lse is float32 from fp32 scores whatever the input dtype (the oracle sees the same rounded inputs), so one
# tolerance: measured worst 1.7e-7 (reference backend, 400 random cases, every dtype) and 1.3e-7 (triton
# interpreter, fp16/fp32); 1e-5 leaves room for the GPU's exp2 and accumulation orders.
LSE_TOLERANCE = 1e-5
KINDS = ("forward", "lse", "grad")


def tolerance(dtype: torch.dtype, kind: str) -> float:
    """The relative-error-norm tolerance for ``kind`` in ("forward", "lse", "grad") of inputs of ``dtype``:
    forward is ``out``, lse is ``LSE_TOLERANCE`` for every dtype, grad is dq/dk/dv."""
    if kind not in KINDS:
        raise ValueError(f"kind must be 'forward', 'lse' or 'grad', got {kind!r}")
    fwd, grad = TOLERANCES[dtype]
    return {"forward": fwd, "lse": LSE_TOLERANCE, "grad": grad}[kind]


def assert_attention_close(actual: Tensor, expected: Tensor, *, dtype: torch.dtype, kind: str, name: str,
                           zero_rows: Optional[Tensor] = None) -> None:
    """Raise AssertionError unless ``actual`` matches ``expected`` (the oracle) for inputs of ``dtype``.

    - NaN in ``actual`` never passes; infinities must sit exactly where ``expected`` has the same infinity
      (lse -inf on rows that see no key).
    - ``zero_rows`` (bool, one per row of dim 0): rows of ``actual`` that must be exactly 0, e.g. out/dq rows that
      see no key, dk/dv rows that no query sees (see ``row_visibility``). This catches unwritten or stale rows.
    - The finite rest is compared by ``||actual - expected|| / ||expected||`` (absolute norm if ``expected`` is 0)
      against ``tolerance(dtype, kind)`` (``kind``: "forward", "lse" or "grad"); ``name`` only labels messages.
    """
    tol = tolerance(dtype, kind)
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a = actual.detach().to(device="cpu", dtype=torch.float64)
    e = expected.detach().to(device="cpu", dtype=torch.float64)
    if torch.isnan(e).any():
        raise AssertionError(f"{name}: the expected value has NaN (oracle bug)")
    nan = torch.isnan(a)
    if nan.any():
        raise AssertionError(f"{name}: {int(nan.sum())} NaN of {a.numel()}, first at index "
                             f"{tuple(nan.nonzero()[0].tolist())}")
    inf_mismatch = (torch.isinf(a) | torch.isinf(e)) & (a != e)
    if inf_mismatch.any():
        i = tuple(inf_mismatch.nonzero()[0].tolist())
        raise AssertionError(f"{name}: {int(inf_mismatch.sum())} infinities differ, first at {i}: "
                             f"actual {a[i].item()}, expected {e[i].item()}")
    if zero_rows is not None:
        nonzero = (a != 0).flatten(1).any(dim=1) & zero_rows.cpu()
        if nonzero.any():
            rows = nonzero.nonzero().flatten().tolist()
            raise AssertionError(f"{name}: {len(rows)} rows should be exactly 0 (nothing visible) but are not, "
                                 f"rows {rows[:8]}{' ...' if len(rows) > 8 else ''}")
    finite = torch.isfinite(e)
    a, e = a[finite], e[finite]
    ref_norm = torch.linalg.vector_norm(e).item()
    err = torch.linalg.vector_norm(a - e).item() / (ref_norm if ref_norm > 0 else 1.0)
    if not err <= tol:
        worst = (a - e).abs().argmax().item() if a.numel() else 0
        raise AssertionError(f"{name}: relative error norm {err:.3g} > {tol:g} ({dtype}, {kind}); largest abs error "
                             f"{(a - e).abs().max().item():.3g} (actual {a[worst].item():.6g}, expected "
                             f"{e[worst].item():.6g})")


# ---------------------------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------------------------

def visible_mask(q_rows: int, kv_rows: int, causal: bool = False, window: Sequence[int] = (-1, -1)) -> Tensor:
    """[q_rows, kv_rows] bool on CPU, True where query i sees key j, from the documented rule: d = i + Lk - Lq;
    causal j <= d; window d - left <= j <= d + right. The one mask of tests, bench and tools."""
    i = torch.arange(q_rows).unsqueeze(1)
    j = torch.arange(kv_rows).unsqueeze(0)
    d = i + (kv_rows - q_rows)
    ok = torch.ones(q_rows, kv_rows, dtype=torch.bool)
    if causal:
        ok = ok & (j <= d)
    left, right = window
    if left != -1:
        ok = ok & (j >= d - left)
    if right != -1:
        ok = ok & (j <= d + right)
    return ok


_visible = visible_mask  # the old private name (tests/backends/test_reference.py imports it)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                        scale: Optional[float] = None, causal: bool = False, window: Sequence[int] = (-1, -1),
                        broadcast_q: bool = False, block_masks: Optional[Sequence[Tensor]] = None
                        ) -> Tuple[Tensor, Tensor]:
    """Float64 oracle: (out [T_q, Hq, D] float64, lse [Hq, T_q] float64), differentiable w.r.t. q, k, v.

    One plain softmax per sequence over the visible keys, q head h reading kv head h // (Hq // Hkv).
    ``block_masks`` (block-sparse attention): one [Hkv, L_q, L_kv] bool per sequence (``block_sparse_masks``) that
    further restricts which keys each query sees. A row that sees
    no key gives out 0 and lse -inf, with zero (never NaN) gradients. Non-finite inputs propagate as in SDPA: a NaN or
    +inf visible score gives NaN out and lse; visible scores all -inf give 0 and -inf; inf in v gives inf/NaN out.
    """
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    heads_q, heads_kv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if scale is None else float(scale)
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    outs, lses = [], []
    for b in range(len(kv_bounds) - 1):
        qs = q64 if broadcast_q else q64[q_bounds[b]:q_bounds[b + 1]]
        ks = k64[kv_bounds[b]:kv_bounds[b + 1]].repeat_interleave(group, dim=1)  # [Lk, Hq, D]
        vs = v64[kv_bounds[b]:kv_bounds[b + 1]].repeat_interleave(group, dim=1)
        visible = visible_mask(qs.shape[0], ks.shape[0], causal, window).to(q.device)  # [Lq, Lk]
        if block_masks is not None:  # [Hq, Lq, Lk]: q head h uses kv head h // group's blocks
            visible = visible & block_masks[b].to(q.device).repeat_interleave(group, dim=0)
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale  # [Hq, Lq, Lk]
        scores = scores.masked_fill(~visible, -math.inf)
        # A row with no visible key, or whose visible scores are all -inf, has no softmax mass: out 0, lse -inf, zero
        # gradients (softmax over zeros, then zeroed). A NaN or +inf visible score gives NaN out and NaN lse.
        has_mass = (scores != -math.inf).any(dim=-1)  # [Hq, Lq]; NaN counts: it must propagate
        scores = torch.where(has_mass.unsqueeze(-1), scores, torch.zeros_like(scores))
        probs = torch.softmax(scores, dim=-1) * visible * has_mass.unsqueeze(-1)
        outs.append(torch.einsum("hij,jhd->ihd", probs, vs))
        lse = torch.logsumexp(scores, dim=-1) if scores.shape[-1] else scores.new_zeros(scores.shape[:-1])
        lse = torch.where(lse == math.inf, math.nan, lse)
        lses.append(torch.where(has_mass, lse, torch.full_like(lse, -math.inf)))
    if not outs:  # no sequences
        return q64.new_zeros(0, heads_q, head_dim), q64.new_zeros(heads_q, 0)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def reference_block_selection(q: Tensor, k: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                              block_q: int, block_kv: int, n_q_blocks: int, n_kv_blocks: int,
                              keep_ratio: float = 0.5, top_k: Optional[int] = None, causal: bool = False,
                              window: Sequence[int] = (-1, -1), broadcast_q: bool = False,
                              always_local: bool = True) -> Tuple[Tensor, Tensor]:
    """Float64 oracle of ``select_kv_blocks``, written from its documentation with plain loops: (kv_block_index
    [B, Hkv, n_q_blocks, n_kv_blocks] int32, kv_block_count [B, Hkv, n_q_blocks] int32) on CPU.

    Per sequence, kv head, Q block: the mean of the block's query rows over the group's heads, dotted with each
    KV block's mean key; the visible blocks (any query of the block sees any key, ``visible_mask``) ranked by score,
    ties to the lower index, the local block (diagonal key of the block's last row) first when ``always_local``;
    keep ``ceil(keep_ratio * n)`` (or ``min(top_k, n)``), report ascending."""
    heads_kv = k.shape[1]
    group = q.shape[1] // heads_kv
    batch = kv_offsets.shape[0] - 1
    index = torch.full((batch, heads_kv, n_q_blocks, n_kv_blocks), -1, dtype=torch.int32)
    count = torch.zeros((batch, heads_kv, n_q_blocks), dtype=torch.int32)
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    q64, k64 = q.detach().cpu().double(), k.detach().cpu().double()
    for b in range(batch):
        qs = q64 if broadcast_q else q64[q_bounds[b]:q_bounds[b + 1]]
        ks = k64[kv_bounds[b]:kv_bounds[b + 1]]
        lq, lk = qs.shape[0], ks.shape[0]
        visible = visible_mask(lq, lk, causal, window)
        for i in range(math.ceil(lq / block_q)):
            rows = slice(i * block_q, min((i + 1) * block_q, lq))
            diagonal = min(max(rows.stop - 1 + lk - lq, 0), max(lk - 1, 0))
            for h in range(heads_kv):
                pooled_q = qs[rows, h * group:(h + 1) * group].mean(dim=(0, 1))
                scores = {}
                for j in range(math.ceil(lk / block_kv)):
                    cols = slice(j * block_kv, min((j + 1) * block_kv, lk))
                    if visible[rows, cols].any():
                        scores[j] = float(pooled_q @ ks[cols, h].mean(dim=0))
                n = len(scores)
                # ceil(keep_ratio * n) with a margin for float64 rounding (0.3 * 10), which must not drop it to 0
                keep = min(top_k, n) if top_k is not None else min(n, max(1, math.ceil(keep_ratio * n - 1e-9)))
                ranked = sorted(scores, key=lambda j: (not (always_local and j == diagonal // block_kv), -scores[j],
                                                       j))
                chosen = sorted(ranked[:keep])
                index[b, h, i, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
                count[b, h, i] = len(chosen)
    return index, count


def block_sparse_masks(kv_block_index: Tensor, kv_block_count: Tensor, q_offsets: Optional[Tensor],
                       kv_offsets: Tensor, *, block_q: int, block_kv: int, broadcast_q: bool = False,
                       q_rows: Optional[int] = None) -> List[Tensor]:
    """Per sequence, the [Hkv, L_q, L_kv] bool mask a selection allows (query r sees key c iff c // block_kv is
    among the first count ids of r // block_q), for ``reference_attention(block_masks=...)``. ``q_rows``: L_q of a
    broadcast Q."""
    index, count = kv_block_index.cpu(), kv_block_count.cpu()
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    masks = []
    for b in range(len(kv_bounds) - 1):
        lq = q_rows if broadcast_q else q_bounds[b + 1] - q_bounds[b]
        lk = kv_bounds[b + 1] - kv_bounds[b]
        mask = torch.zeros(index.shape[1], lq, lk, dtype=torch.bool)
        for h in range(index.shape[1]):
            for i in range(min(math.ceil(lq / block_q), index.shape[2])):
                for j in index[b, h, i, :int(count[b, h, i])].tolist():
                    mask[h, i * block_q:(i + 1) * block_q, j * block_kv:(j + 1) * block_kv] = True
        masks.append(mask)
    return masks


def row_visibility(q_rows: int, q_offsets: Optional[Tensor], kv_offsets: Tensor, *, causal: bool = False,
                   window: Sequence[int] = (-1, -1), broadcast_q: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Which rows see anything: (out rows that see a key [T_out], q rows that see a key [T_q or L_q],
    kv rows that some query sees [T_kv]), bool on CPU. ``q_rows`` is q.shape[0]."""
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    out_sees, q_sees, kv_seen = [], torch.zeros(q_rows, dtype=torch.bool), []
    for b in range(len(kv_bounds) - 1):
        q0, q1 = (0, q_rows) if broadcast_q else (q_bounds[b], q_bounds[b + 1])
        visible = visible_mask(q1 - q0, kv_bounds[b + 1] - kv_bounds[b], causal, window)
        out_sees.append(visible.any(dim=1))
        q_sees[q0:q1] |= visible.any(dim=1)
        kv_seen.append(visible.any(dim=0))
    cat = lambda ts: torch.cat(ts) if ts else torch.zeros(0, dtype=torch.bool)  # noqa: E731
    return cat(out_sees), q_sees, cat(kv_seen)


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttentionInputs:
    """Tensors and keyword options of one call of ``jfa_ops.jagged_attention``."""

    q: Tensor
    k: Tensor
    v: Tensor
    q_offsets: Optional[Tensor]
    kv_offsets: Tensor
    kwargs: dict  # max_seqlen_q, max_seqlen_kv, scale, causal, window, broadcast_q

    def call(self, backend: Optional[str] = None, **extra):
        """``jagged_attention(q, k, v, q_offsets, kv_offsets, **kwargs, return_lse=True)`` -> (out, lse)."""
        return jfa_ops.jagged_attention(self.q, self.k, self.v, self.q_offsets, self.kv_offsets, **self.kwargs,
                                        return_lse=True, backend=backend, **extra)

    def op_args(self, backend: Optional[str] = None) -> Tuple[tuple, dict]:
        """(args, kwargs) of ``torch.ops.jfa.attention`` for this call."""
        kw = dict(self.kwargs)
        window = kw.pop("window")
        args = (self.q, self.k, self.v, self.q_offsets, self.kv_offsets,
                _hint(kw.pop("max_seqlen_q")), _hint(kw.pop("max_seqlen_kv")))
        return args, dict(kw, window_left=window[0], window_right=window[1], backend=backend)

    def visibility(self) -> Tuple[Tensor, Tensor, Tensor]:
        """``row_visibility`` of this call: (out rows, q rows, kv rows) that see / are seen by anything."""
        kw = self.kwargs
        return row_visibility(self.q.shape[0], self.q_offsets, self.kv_offsets, causal=kw["causal"],
                              window=kw["window"], broadcast_q=kw["broadcast_q"])

    def oracle(self) -> Tuple[Tensor, Tensor]:
        kw = self.kwargs
        return reference_attention(self.q, self.k, self.v, self.q_offsets, self.kv_offsets, scale=kw["scale"],
                                   causal=kw["causal"], window=kw["window"], broadcast_q=kw["broadcast_q"])


def _hint(max_seqlen: Optional[int]) -> int:
    return -1 if max_seqlen is None else max_seqlen


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    """One attention problem, without its tensor values.

    ``q_lengths``/``kv_lengths`` are per-sequence row counts (``B`` each). With ``broadcast_q=True``, ``q_lengths``
    is ``(L_q,)``: the single dense Q block every sequence reads.
    """

    q_lengths: Tuple[int, ...]
    kv_lengths: Tuple[int, ...]
    heads_q: int = 2
    heads_kv: int = 2
    head_dim: int = 16
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    broadcast_q: bool = False
    scale: Optional[float] = None
    offsets_dtype: torch.dtype = torch.int64
    pass_max_seqlen: bool = False  # pass exact max_seqlen_q/kv hints (else None)

    def __post_init__(self):
        if self.broadcast_q and len(self.q_lengths) != 1:
            raise ValueError(f"with broadcast_q, q_lengths must be (L_q,), got {self.q_lengths}")
        if not self.broadcast_q and len(self.q_lengths) != len(self.kv_lengths):
            raise ValueError(f"q_lengths and kv_lengths must have the same length B, got {self.q_lengths} and "
                             f"{self.kv_lengths}")

    def replace(self, **changes) -> "AttentionCase":
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        flags = [f for f, on in (("causal", self.causal), ("broadcast_q", self.broadcast_q)) if on]
        if self.window != (-1, -1):
            flags.append(f"window={self.window}")
        if self.scale is not None:
            flags.append(f"scale={self.scale:g}")
        if self.pass_max_seqlen:
            flags.append("max_seqlen")
        dt = str(self.dtype).replace("torch.", "")
        return (f"q_lengths={list(self.q_lengths)} kv_lengths={list(self.kv_lengths)} heads={self.heads_q}/"
                f"{self.heads_kv} D={self.head_dim} {dt} {self.device} offsets={str(self.offsets_dtype)[6:]}"
                + (" " + " ".join(flags) if flags else ""))

    def problem(self) -> Problem:
        """The static facts a backend's ``supports`` decides on."""
        return Problem(self.device, self.dtype, self.head_dim, self.heads_q, self.heads_kv, self.causal,
                       self.window[0], self.window[1], self.broadcast_q, False)

    def unsupported_reason(self, backend: Optional[str]) -> Optional[str]:
        """None when ``backend`` (None: automatic choice) can run this case, else why not."""
        if backend is None:
            return None
        return unavailable_reason(backend, self.problem())

    def _offsets(self, lengths: Sequence[int]) -> Tensor:
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        return torch.tensor(offsets, dtype=self.offsets_dtype, device=self.device)

    def make_inputs(self, seed: Union[int, torch.Generator] = 0, *, requires_grad: bool = False) -> AttentionInputs:
        """Fresh q, k, v ~ N(0, 1) from ``seed`` (drawn on CPU, so a seed gives the same values on every device)."""
        gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
        rows_q = self.q_lengths[0] if self.broadcast_q else sum(self.q_lengths)
        rows_kv = sum(self.kv_lengths)

        def rand(rows, heads):
            t = torch.randn(rows, heads, self.head_dim, generator=gen, dtype=torch.float32)
            return t.to(device=self.device, dtype=self.dtype).requires_grad_(requires_grad)

        q, k, v = rand(rows_q, self.heads_q), rand(rows_kv, self.heads_kv), rand(rows_kv, self.heads_kv)
        q_offsets = None if self.broadcast_q else self._offsets(self.q_lengths)
        kwargs = dict(
            max_seqlen_q=max(self.q_lengths, default=0) if self.pass_max_seqlen else None,
            max_seqlen_kv=max(self.kv_lengths, default=0) if self.pass_max_seqlen else None,
            scale=self.scale, causal=self.causal, window=self.window, broadcast_q=self.broadcast_q,
        )
        return AttentionInputs(q, k, v, q_offsets, self._offsets(self.kv_lengths), kwargs)


# One case per feature (fp32 on CPU; swap dtype/device with ``case.replace``). Lengths are small, not multiples of
# any block size, and include empty and length-1 sequences. opcheck and backend smoke tests are generated from this.
FEATURE_MATRIX: Dict[str, AttentionCase] = {
    "dense": AttentionCase((5, 3), (5, 3)),
    "jagged_empty_len1": AttentionCase((3, 0, 5, 1), (4, 0, 6, 1)),
    "cross_lq_ne_lk": AttentionCase((2, 7, 1), (6, 3, 9)),
    "gqa": AttentionCase((4, 6), (5, 2), heads_q=6, heads_kv=2),
    "mqa": AttentionCase((3, 5), (3, 5), heads_q=3, heads_kv=1, head_dim=8),
    "causal": AttentionCase((4, 6, 2), (7, 6, 3), causal=True),
    "causal_lq_gt_lk": AttentionCase((6, 3), (2, 0), causal=True),  # rows above the diagonal see no key
    "window": AttentionCase((5, 7), (6, 7), window=(2, 1)),
    "causal_window": AttentionCase((5, 7), (6, 9), causal=True, window=(3, 0)),
    "window_left_only": AttentionCase((5,), (8,), window=(1, -1)),
    "broadcast_q": AttentionCase((4,), (5, 0, 7), broadcast_q=True),
    "broadcast_q_causal_gqa": AttentionCase((3,), (2, 6), broadcast_q=True, causal=True, heads_q=4, heads_kv=2),
    "empty_kv": AttentionCase((3, 4), (0, 0)),  # T_kv == 0: out 0, lse -inf, zero grads
    "no_sequences": AttentionCase((), ()),  # B == 0
    "head_dim_256": AttentionCase((3, 2), (2, 4), head_dim=256),
    "int32_offsets_max_seqlen": AttentionCase((3, 6), (5, 4), offsets_dtype=torch.int32, pass_max_seqlen=True),
    "scale": AttentionCase((4, 3), (3, 5), scale=0.3),
}


# ---------------------------------------------------------------------------------------------------------------
# Strategies (hypothesis, imported lazily)
# ---------------------------------------------------------------------------------------------------------------

def jagged_lengths(*, min_batch: int = 0, max_batch: int = 5, max_len: int = 17, max_total: Optional[int] = None):
    """Strategy for a tuple of sequence lengths: empties, length 1, lengths that are not multiples of any block
    size, and heavy skew (one long sequence among short ones). The total is at most ``max_total``."""
    from hypothesis import strategies as st

    short = st.sampled_from([0, 1, 2, 3, 5, 7])
    any_len = st.integers(0, max_len)

    @st.composite
    def lengths(draw):
        n = draw(st.integers(min_batch, max_batch))
        out = list(draw(st.lists(st.one_of(short, any_len), min_size=n, max_size=n)))
        if out and draw(st.booleans()):  # skew: one sequence much longer than the rest
            out[draw(st.integers(0, n - 1))] = max_len
        if max_total is not None:
            budget, clipped = max_total, []
            for x in out:
                clipped.append(min(x, budget))
                budget -= clipped[-1]
            out = clipped
        return tuple(out)

    return lengths()


def attention_cases(*, devices: Sequence[str] = ("cpu",), dtypes: Sequence[torch.dtype] = (torch.float32,),
                    max_total: int = 48, max_batch: int = 5, max_len: int = 17, max_heads_kv: int = 4,
                    max_group: int = 4,
                    head_dims: Optional[Sequence[int]] = None, causal: Optional[bool] = None,
                    window: Optional[bool] = None, broadcast_q: Optional[bool] = None):
    """Strategy for ``AttentionCase``: jagged lengths (self- and cross-attention, Lq != Lk, empty KV with non-empty
    Q), heads and GQA ratios, head dims (multiples of 8 up to 256, small ones more often), causal, windows,
    broadcast-Q, scale, offsets dtype and max_seqlen hints. ``causal``/``window``/``broadcast_q``: None draws
    both, True/False fixes the feature on/off."""
    from hypothesis import strategies as st

    import meta_kernels

    dims = st.sampled_from(list(head_dims)) if head_dims else st.one_of(
        st.sampled_from([8, 16, 24, 32, 64]), st.sampled_from(list(meta_kernels.SUPPORTED_HEAD_DIMS)))
    flag = lambda fixed: st.booleans() if fixed is None else st.just(fixed)  # noqa: E731
    side = st.one_of(st.just(-1), st.integers(0, 6))

    @st.composite
    def cases(draw):
        bq = draw(flag(broadcast_q))
        kv = draw(jagged_lengths(max_batch=max_batch, max_len=max_len, max_total=max_total))
        mode = draw(st.sampled_from(["self", "cross", "empty_kv"]))
        if bq:
            q = (draw(st.integers(0, max_len)),)
        elif mode == "self":
            q = kv
        else:
            q = draw(jagged_lengths(min_batch=len(kv), max_batch=len(kv), max_len=max_len, max_total=max_total))
        if mode == "empty_kv":
            kv = tuple(0 for _ in kv)
        heads_kv = draw(st.integers(1, max_heads_kv))
        head_dim = draw(dims)
        # scale as a multiple of the default D**-0.5: logits of std <= 2. Much sharper softmaxes make the gradients
        # ill-conditioned (dq, dk are differences of nearly equal terms), which no tolerance of a dtype describes.
        factor = draw(st.one_of(st.none(), st.sampled_from([0.25, 0.5, 2.0])))
        return AttentionCase(
            q_lengths=q, kv_lengths=kv, heads_q=heads_kv * draw(st.integers(1, max_group)), heads_kv=heads_kv,
            head_dim=head_dim, dtype=draw(st.sampled_from(list(dtypes))), device=draw(st.sampled_from(list(devices))),
            causal=draw(flag(causal)),
            window=draw(st.tuples(side, side)) if draw(flag(window)) else (-1, -1),
            broadcast_q=bq, scale=None if factor is None else factor * head_dim ** -0.5,
            offsets_dtype=draw(st.sampled_from([torch.int32, torch.int64])), pass_max_seqlen=draw(st.booleans()),
        )

    return cases()


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------

GRAD_MODES = ("out", "lse", "both")  # gradient through out only, lse only (grad_out is None), and both


def check_attention_case(case: AttentionCase, backend: Optional[str] = None, *, seed: int = 0,
                         grads: Iterable[str] = GRAD_MODES) -> None:
    """Run ``case`` through ``jagged_attention`` on ``backend`` and compare out, lse and the gradients of q, k, v
    (through out, through lse, through both; ``grads`` picks) with ``reference_attention``. AssertionError on any
    mismatch, NaN or unwritten row."""
    inputs = case.make_inputs(seed, requires_grad=True)
    out, lse = inputs.call(backend)
    with torch.no_grad():
        ref_inputs = dataclasses.replace(
            inputs, q=inputs.q.detach().double().requires_grad_(), k=inputs.k.detach().double().requires_grad_(),
            v=inputs.v.detach().double().requires_grad_())
    with torch.enable_grad():
        ref_out, ref_lse = ref_inputs.oracle()
    out_sees, q_sees, kv_seen = inputs.visibility()
    assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name="out", zero_rows=~out_sees)
    assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name="lse")
    if out.dtype != case.dtype or lse.dtype != torch.float32:
        raise AssertionError(f"dtypes: out {out.dtype} (expected {case.dtype}), lse {lse.dtype} (expected float32)")
    gen = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=gen).to(device=out.device, dtype=out.dtype)
    grad_lse = torch.randn(lse.shape, generator=gen).to(device=lse.device, dtype=lse.dtype)
    primals = (inputs.q, inputs.k, inputs.v)
    ref_primals = (ref_inputs.q, ref_inputs.k, ref_inputs.v)
    for mode in grads:
        outputs, ref_outputs, cotangents = {
            "out": ((out,), (ref_out,), (grad_out,)),
            "lse": ((lse,), (ref_lse,), (grad_lse,)),
            "both": ((out, lse), (ref_out, ref_lse), (grad_out, grad_lse)),
        }[mode]
        got = _grad(outputs, primals, cotangents)
        want = _grad(ref_outputs, ref_primals, tuple(c.double() for c in cotangents))
        for var, g, w, p, zero in zip("qkv", got, want, primals, (~q_sees, ~kv_seen, ~kv_seen)):
            if g is None:
                g = torch.zeros_like(p)
            if w is None:
                w = torch.zeros(p.shape, dtype=torch.float64)
            if g.dtype != p.dtype:
                raise AssertionError(f"d{var} (grad through {mode}): dtype {g.dtype}, expected {p.dtype}")
            assert_attention_close(g, w, dtype=case.dtype, kind="grad", name=f"d{var} (grad through {mode})",
                                   zero_rows=zero)


def _grad(outputs, primals, cotangents):
    """autograd.grad over the outputs that require grad (the oracle's lse of an empty KV batch does not)."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents) if o.requires_grad]
    if not pairs:
        return (None,) * len(primals)
    return torch.autograd.grad([o for o, _ in pairs], primals, [c for _, c in pairs], retain_graph=True,
                               allow_unused=True)


def _poison_allocator(device: str, nbytes: int) -> None:
    """Fill then free ``nbytes`` of NaN so a kernel that leaves output rows unwritten likely shows NaN there
    (best effort: the caching allocator on CUDA, malloc on CPU, usually hand the block back to the next call)."""
    junk = torch.full((nbytes // 4 + 64,), math.nan, dtype=torch.float32, device=device)
    del junk


def check_backend_writes_every_row(name: str, case: AttentionCase, *, seed: int = 0) -> None:
    """Call the backend's ``forward`` directly (no op, no validation) after poisoning the allocator and check every
    out/lse row: rows that see no key must be exactly 0 / -inf, the others must match the oracle."""
    inputs = case.make_inputs(seed)
    params = AttentionParams(
        scale=case.head_dim ** -0.5 if case.scale is None else case.scale, causal=case.causal,
        window_left=case.window[0], window_right=case.window[1], broadcast_q=case.broadcast_q,
        max_seqlen_q=_hint(inputs.kwargs["max_seqlen_q"]), max_seqlen_kv=_hint(inputs.kwargs["max_seqlen_kv"]))
    rows = case.q_lengths[0] * len(case.kv_lengths) if case.broadcast_q else sum(case.q_lengths)
    _poison_allocator(case.device, 4 * rows * case.heads_q * (case.head_dim + 1) + 4096)
    out, lse = get_backend(name).forward(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets, params)
    ref_out, ref_lse = inputs.oracle()
    assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name=f"{name}.forward out",
                           zero_rows=~inputs.visibility()[0])
    assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name=f"{name}.forward lse")


@dataclasses.dataclass(frozen=True)
class BlockSparseCase:
    """One block-sparse problem: an ``AttentionCase`` (lengths, heads, mask, dtype, device) plus the selection's
    options. ``keep_ratio=None`` with ``top_k=None`` means a random selection (any subset of blocks per row, for
    stage 2 alone)."""

    case: AttentionCase
    block_q: int = 16
    block_kv: int = 16
    keep_ratio: Optional[float] = 0.5
    top_k: Optional[int] = None
    always_local: bool = True

    def __str__(self) -> str:
        how = f"top_k={self.top_k}" if self.top_k is not None else (
            "random blocks" if self.keep_ratio is None else f"keep_ratio={self.keep_ratio}")
        return (f"{self.case} blocks={self.block_q}x{self.block_kv} {how}"
                + ("" if self.always_local else " always_local=False"))

    def max_seqlens(self) -> Tuple[int, int]:
        return max(self.case.q_lengths, default=0), max(self.case.kv_lengths, default=0)

    def selection_kwargs(self) -> dict:
        c = self.case
        return dict(block_q=self.block_q, block_kv=self.block_kv, keep_ratio=self.keep_ratio or 0.5,
                    top_k=self.top_k, causal=c.causal, window=c.window, broadcast_q=c.broadcast_q,
                    always_local=self.always_local)

    def select(self, inputs: AttentionInputs, backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
        """``jfa_ops.select_kv_blocks`` on ``inputs`` (exact max_seqlen hints)."""
        max_q, max_kv = self.max_seqlens()
        return jfa_ops.select_kv_blocks(inputs.q.detach(), inputs.k.detach(), inputs.q_offsets, inputs.kv_offsets,
                                        None if self.case.broadcast_q else max_q, max_kv, backend=backend,
                                        **self.selection_kwargs())

    def oracle_selection(self, inputs: AttentionInputs) -> Tuple[Tensor, Tensor]:
        max_q, max_kv = self.max_seqlens()
        n_q = math.ceil((inputs.q.shape[0] if self.case.broadcast_q else max_q) / self.block_q)
        kw = self.selection_kwargs()
        return reference_block_selection(inputs.q, inputs.k, inputs.q_offsets, inputs.kv_offsets,
                                         n_q_blocks=n_q, n_kv_blocks=math.ceil(max_kv / self.block_kv), **kw)

    def random_selection(self, inputs: AttentionInputs, seed: int) -> Tuple[Tensor, Tensor]:
        """Any subset of each row's blocks (visible or not), on the inputs' device: stage 2 must honour whatever it
        is given."""
        index, _ = self.oracle_selection(inputs)  # for the shape only
        gen = torch.Generator().manual_seed(seed + 7)
        kv_blocks = [math.ceil(n / self.block_kv) for n in self.case.kv_lengths]
        new_index, count = torch.full_like(index, -1), torch.zeros(index.shape[:3], dtype=torch.int32)
        for b in range(index.shape[0]):
            for h in range(index.shape[1]):
                for i in range(index.shape[2]):
                    chosen = (torch.rand(kv_blocks[b], generator=gen) < 0.5).nonzero().flatten()
                    new_index[b, h, i, :len(chosen)] = chosen.to(torch.int32)
                    count[b, h, i] = len(chosen)
        device = inputs.q.device
        return new_index.to(device), count.to(device)


def check_block_sparse_case(case: BlockSparseCase, backend: Optional[str] = None, *, seed: int = 0,
                            select_backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """Stage 1 on ``select_backend`` (default ``backend``) == ``reference_block_selection`` exactly (unless the case
    asks for random blocks); stage 2 on ``backend``: out, lse and the gradients of q, k, v (through out and lse)
    == ``reference_attention`` with the selection's ``block_sparse_masks``. Returns the selection."""
    c = case.case
    inputs = c.make_inputs(seed, requires_grad=True)
    if case.keep_ratio is None and case.top_k is None:
        index, count = case.random_selection(inputs, seed)
    else:
        index, count = case.select(inputs, select_backend or backend)
        expected_index, expected_count = case.oracle_selection(inputs)
        if not (torch.equal(index.cpu(), expected_index) and torch.equal(count.cpu(), expected_count)):
            bad = (index.cpu() != expected_index).any(-1) | (count.cpu() != expected_count)
            b, h, i = bad.nonzero()[0].tolist()
            raise AssertionError(f"{case}: selection of (sequence {b}, kv head {h}, Q block {i}) is "
                                 f"{index[b, h, i, :count[b, h, i]].tolist()}, expected "
                                 f"{expected_index[b, h, i, :expected_count[b, h, i]].tolist()}")
    kw = inputs.kwargs
    out, lse = jfa_ops.block_sparse_attention(
        inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets, index, count, kw["max_seqlen_q"],
        kw["max_seqlen_kv"], block_q=case.block_q, block_kv=case.block_kv, scale=kw["scale"], causal=kw["causal"],
        window=kw["window"], broadcast_q=kw["broadcast_q"], return_lse=True, backend=backend)
    masks = block_sparse_masks(index, count, inputs.q_offsets, inputs.kv_offsets, block_q=case.block_q,
                               block_kv=case.block_kv, broadcast_q=c.broadcast_q, q_rows=inputs.q.shape[0])
    primals64 = [t.detach().double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v)]
    with torch.enable_grad():
        ref_out, ref_lse = reference_attention(*primals64, inputs.q_offsets, inputs.kv_offsets, scale=kw["scale"],
                                               causal=kw["causal"], window=kw["window"],
                                               broadcast_q=kw["broadcast_q"], block_masks=masks)
    name = str(case)
    assert_attention_close(out, ref_out, dtype=c.dtype, kind="forward", name=f"{name}: out")
    assert_attention_close(lse, ref_lse, dtype=c.dtype, kind="lse", name=f"{name}: lse")
    gen = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    grad_lse = torch.where(torch.isfinite(ref_lse.detach().cpu()), grad_lse, 0)  # -inf rows: no lse gradient
    grads = _grad((out, lse), (inputs.q, inputs.k, inputs.v),
                  (grad_out.to(out), grad_lse.to(device=lse.device, dtype=lse.dtype)))
    ref_grads = _grad((ref_out, ref_lse), primals64, (grad_out.to(ref_out.device),
                                                      grad_lse.to(ref_lse.device)))
    for g_name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        if r is None:  # nothing to differentiate (no rows)
            continue
        assert_attention_close(g, r, dtype=c.dtype, kind="grad", name=f"{name}: {g_name}")
    return index, count


# torch.library.opcheck's default test utilities, spelled out so a test can run them one at a time.
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def check_opcheck(case: AttentionCase, backend: Optional[str] = None, *, seed: int = 0,
                  test_utils: Sequence[str] = OPCHECK_UTILS,
                  ops: Sequence[str] = ("attention", "attention_backward")) -> None:
    """``torch.library.opcheck`` of ``jfa::attention`` (inputs requiring grad) and ``jfa::attention_backward``
    (inputs not requiring grad: it has no double backward) on ``case``."""
    inputs = case.make_inputs(seed, requires_grad=True)
    args, kwargs = inputs.op_args(backend)
    if "attention" in ops:
        torch.library.opcheck(torch.ops.jfa.attention.default, args, kwargs, test_utils=test_utils)
    if "attention_backward" in ops:
        bargs, bkwargs = backward_op_args(inputs, backend, seed=seed)
        torch.library.opcheck(torch.ops.jfa.attention_backward.default, bargs, bkwargs, test_utils=test_utils)


def backward_op_args(inputs: AttentionInputs, backend: Optional[str] = None, *, seed: int = 0,
                     with_grad_lse: bool = True) -> Tuple[tuple, dict]:
    """(args, kwargs) of ``torch.ops.jfa.attention_backward`` matching ``inputs`` (no tensor requires grad)."""
    args, kwargs = inputs.op_args(backend)
    q, k, v, q_offsets, kv_offsets, *hints = (a.detach() if isinstance(a, Tensor) else a for a in args)
    with torch.no_grad():
        out, lse = torch.ops.jfa.attention(q, k, v, q_offsets, kv_offsets, *hints, **kwargs)
    gen = torch.Generator().manual_seed(seed + 2)
    grad_out = torch.randn(out.shape, generator=gen).to(out)
    grad_lse = torch.randn(lse.shape, generator=gen).to(lse) if with_grad_lse else None
    return (grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *hints), kwargs


def check_backend(name: str, *, device: str = "cpu", dtypes: Sequence[torch.dtype] = (torch.float32,),
                  examples: int = 20, cases: Optional[Dict[str, AttentionCase]] = None, opcheck: bool = True,
                  seed: int = 0, **strategy_kwargs) -> Dict[str, object]:
    """Check a registered backend (ours or a third party's) against the float64 oracle.

    1. Every case of ``cases`` (default ``FEATURE_MATRIX``) in every dtype: ``torch.library.opcheck`` of both ops
       (``opcheck=True``), out/lse/gradients vs the oracle, and every output row written (poisoned allocator).
    2. ``examples`` random cases from ``attention_cases(devices=(device,), dtypes=dtypes, **strategy_kwargs)``,
       shrunk by hypothesis to a minimal failing one.

    Cases the backend does not support (its ``supports`` gives a reason) are not run; they are returned.
    Raises AssertionError with one entry per failing case, or when no case ran at all (everything unsupported: a
    check that checked nothing); else returns {"passed": [matrix cases], "unsupported": [matrix cases],
    "random": number of random cases run, "cases_run": matrix cases + random cases}.
    """
    failures: List[str] = []
    passed: List[str] = []
    unsupported: List[str] = []
    matrix_run = 0
    for case_name, base in (FEATURE_MATRIX if cases is None else cases).items():
        for dtype in dtypes:
            case = base.replace(dtype=dtype, device=device)
            reason = case.unsupported_reason(name)
            if reason is not None:
                unsupported.append(f"[{case_name}] {case}: {reason}")
                continue
            matrix_run += 1
            failed = len(failures)
            checks = [("oracle", lambda: check_attention_case(case, name, seed=seed)),
                      ("every row written", lambda: check_backend_writes_every_row(name, case, seed=seed))]
            if opcheck:
                checks.append(("opcheck", lambda: check_opcheck(case, name, seed=seed)))
            for what, check in checks:
                try:
                    check()
                except Exception as e:  # noqa: BLE001  (collect every failure into one report)
                    failures.append(f"[{case_name}] {what}: {case}\n    {type(e).__name__}: {_first_lines(e)}")
            if len(failures) == failed:
                passed.append(f"[{case_name}] {case}")
    random_run = 0
    if examples > 0:
        random_failures, random_run = _random_failures(name, device, dtypes, examples, seed, strategy_kwargs)
        failures.extend(random_failures)
    if failures:
        raise AssertionError(f"check_backend({name!r}, device={device!r}): {len(failures)} failure(s)\n"
                             + "\n".join(failures))
    if matrix_run + random_run == 0:
        raise AssertionError(f"check_backend({name!r}, device={device!r}) ran no case: {len(unsupported)} matrix "
                             f"cases unsupported, no random case supported of {examples} asked")
    return {"passed": passed, "unsupported": unsupported, "random": random_run, "cases_run": matrix_run + random_run}


def _first_lines(e: BaseException, n: int = 6) -> str:
    return "\n    ".join(str(e).strip().splitlines()[:n])


def _random_failures(name, device, dtypes, examples, seed, strategy_kwargs) -> Tuple[List[str], int]:
    """(failures, number of supported random cases run) of ``examples`` hypothesis draws."""
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    last, cases_run = {}, [0]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=attention_cases(devices=(device,), dtypes=dtypes, **strategy_kwargs), seed=st.integers(0, 2**31 - 1))
    def run(case, seed):
        assume(case.unsupported_reason(name) is None)
        last["case"], last["seed"] = case, seed
        cases_run[0] += 1
        check_attention_case(case, name, seed=seed)

    try:
        run()
    except Unsatisfiable:  # every draw unsupported: counted as zero cases run
        return [], 0
    except Exception as e:  # noqa: BLE001
        detail = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
        return [f"[random, shrunk] oracle: {last.get('case')} seed={last.get('seed')}\n    "
                + "\n    ".join(detail[:6])], cases_run[0]
    return [], cases_run[0]


# ---------------------------------------------------------------------------------------------------------------
# MXFP8 oracles (the spec, written with integer bit manipulation in float64; independent of the backends' frexp)
# ---------------------------------------------------------------------------------------------------------------

_F64_MANTISSA_BITS = 52
_RCEIL_MANTISSA = 3 << 50  # 1.75 * 2**52 - 2**52: amax / 2**floor(log2 amax) > 1.75 overflows 448 = 1.75 * 2**8


def _floor_log2(a: Tensor) -> Tensor:
    """floor(log2(a)) for finite a > 0 in float64 (every fp16/bf16/fp32 value is a normal float64), from the
    exponent bits; int64."""
    return ((a.view(torch.int64) >> _F64_MANTISSA_BITS) & 0x7FF) - 1023


def mx_shared_exponent_spec(amax: Tensor, rounding: str) -> Tensor:
    """The E8M0 exponent of blocks with absolute maxima ``amax`` (float64, finite, >= 0), int64 in [-127, 127].

    "floor" (OCP MX v1.0, 6.3): floor(log2(amax)) - emax(E4M3) = floor(log2(amax)) - 8; elements above 448 then
    saturate. "rceil": the smallest power of two ``2**e`` with ``amax / 2**e <= 448`` (no saturation): the floor
    exponent, plus one when amax's significand exceeds 1.75. A zero block gets the smallest scale, 2**-127.
    """
    a = amax.to(torch.float64)
    exp = _floor_log2(torch.where(a > 0, a, torch.ones_like(a))) - 8
    if rounding == "rceil":
        exp = exp + ((a.view(torch.int64) & ((1 << _F64_MANTISSA_BITS) - 1)) > _RCEIL_MANTISSA).to(torch.int64)
    exp = torch.where(a > 0, exp, torch.full_like(exp, -127))
    return exp.clamp(-127, 127)


def e4m3_round_spec(y: Tensor) -> Tensor:
    """Round float64 ``y`` to the nearest float8_e4m3fn value (ties to even), saturating at +-448: float64 values.

    E4M3: 3 mantissa bits, normals from 2**-6, subnormals spaced 2**-9. The spacing at |y| is 2**(max(e, -6) - 3)
    with e = floor(log2|y|); |y| / spacing is exact in float64, and torch.round rounds half to even.
    """
    a = y.abs().clamp(max=448.0)
    e = _floor_log2(torch.where(a > 0, a, torch.ones_like(a))).clamp(min=-6)
    spacing = torch.pow(2.0, (e - 3).to(torch.float64))
    return torch.copysign(torch.round(a / spacing) * spacing, y)


def _row_blocks(rows: int, offsets: Optional[Sequence[int]], block_rows: int) -> List[Tuple[int, int, int]]:
    """(first row, rows, scale row) of every row block: per sequence, 32-row blocks from the sequence's first row;
    sequence b's first block is offsets[b] // 32 + b (the documented layout)."""
    if block_rows == 1:
        return [(r, 1, r) for r in range(rows)]
    bounds = [0, rows] if offsets is None else list(offsets)
    out = []
    for b in range(len(bounds) - 1):
        first = bounds[b] // 32 + b
        for i, r0 in enumerate(range(bounds[b], bounds[b + 1], 32)):
            out.append((r0, min(32, bounds[b + 1] - r0), first + i))
    return out


def mx_quantize_spec(x: Tensor, offsets: Optional[Tensor] = None, block: Sequence[int] = (1, 32),
                     rounding: str = "rceil") -> Tuple[Tensor, Tensor]:
    """The MXFP8 oracle: (data float8_e4m3fn [T, H, D], scale float8_e8m0fnu) of ``x [T, H, D]``, block by block.

    Each block: X = 2**mx_shared_exponent_spec(amax), elements e4m3_round_spec(x / X). A block holding inf or NaN
    gets scale NaN (bits 0xFF) and every element NaN (0x7F): the spec decodes a NaN scale to NaN elements. Scale rows
    no sequence owns hold bits 0. The layout is ``meta_kernels.mxfp8``'s table.
    """
    import meta_kernels.mxfp8 as mx

    block_rows, block_cols = block
    rows, heads, dim = x.shape
    x64 = x.detach().cpu().to(torch.float64)
    if block_rows == 1:  # one-row blocks: every block at once (the per-block loop below, vectorized; GPU-test sizes)
        blk = x64.reshape(rows, heads, dim // block_cols, block_cols)
        finite = torch.isfinite(blk).all(dim=-1, keepdim=True)
        amax = torch.where(torch.isfinite(blk), blk.abs(), torch.zeros_like(blk)).amax(dim=-1, keepdim=True)
        exp = mx_shared_exponent_spec(amax, rounding)
        data_bits = e4m3_round_spec(blk * torch.pow(2.0, (-exp).to(torch.float64))).to(torch.float8_e4m3fn)
        data_bits = torch.where(finite, data_bits.view(torch.uint8), torch.full_like(data_bits.view(torch.uint8), 0x7F))
        scale_bits = torch.where(finite, exp + 127, torch.full_like(exp, 255))[..., 0]
        return (data_bits.reshape(rows, heads, dim).view(torch.float8_e4m3fn).to(x.device),
                scale_bits.to(torch.uint8).view(torch.float8_e8m0fnu).to(x.device))
    bounds = None if offsets is None else [int(o) for o in offsets.tolist()]
    scale_rows = mx.scale_shape(rows, heads, dim, offsets, block)[0]
    data = torch.zeros(rows, heads, dim, dtype=torch.float64)
    nan_data = torch.zeros(rows, heads, dim, dtype=torch.bool)
    scale_bits = torch.zeros(scale_rows, heads, dim // block_cols, dtype=torch.int64)
    # (1, 32), (32, 32): one block per head and 32-column group; (32, 1): one per head and column.
    reduce_dims = (0, 2) if block_cols > 1 else (0,)
    col_groups = range(dim // block_cols) if block_cols > 1 else [None]
    for r0, n, srow in _row_blocks(rows, bounds, block_rows):
        for c in col_groups:
            cols = slice(None) if c is None else slice(c * block_cols, (c + 1) * block_cols)
            blk = x64[r0:r0 + n, :, cols]
            finite = (~torch.isfinite(blk)).to(torch.int64).amax(dim=reduce_dims, keepdim=True) == 0
            amax = torch.where(torch.isfinite(blk), blk.abs(), torch.zeros_like(blk)).amax(dim=reduce_dims,
                                                                                         keepdim=True)
            exp = mx_shared_exponent_spec(amax, rounding)  # [1, H, 1] or [1, H, D]
            data[r0:r0 + n, :, cols] = e4m3_round_spec(blk * torch.pow(2.0, (-exp).to(torch.float64)))
            nan_data[r0:r0 + n, :, cols] = ~finite
            bits = torch.where(finite, exp + 127, torch.full_like(exp, 255))[0]
            scale_bits[srow, :, cols if c is None else c] = bits if c is None else bits[:, 0]
    data_bits = data.to(torch.float8_e4m3fn).view(torch.uint8)  # exact: every value is an e4m3 value
    data_bits = torch.where(nan_data, torch.full_like(data_bits, 0x7F), data_bits)
    return (data_bits.view(torch.float8_e4m3fn).to(x.device),
            scale_bits.to(torch.uint8).view(torch.float8_e8m0fnu).to(x.device))


def mx_dequantize_spec(data: Tensor, scale: Tensor, offsets: Optional[Tensor] = None,
                       block: Sequence[int] = (1, 32)) -> Tensor:
    """float64 values of an MXFP8 (data, scale) pair: element * 2**(bits - 127), NaN where the scale is NaN."""
    block_rows, block_cols = block
    rows, heads, dim = data.shape
    bounds = None if offsets is None else [int(o) for o in offsets.tolist()]
    values = data.detach().cpu().to(torch.float64)
    bits = scale.detach().cpu().view(torch.uint8).to(torch.int64)
    if block_rows == 1:  # one-row blocks: all at once (the loop below, vectorized)
        s = bits.repeat_interleave(block_cols, dim=-1)  # [T, H, D]
        return torch.where(s == 255, math.nan, values * torch.pow(2.0, (s - 127).to(torch.float64))).to(data.device)
    out = torch.empty_like(values)
    for r0, n, srow in _row_blocks(rows, bounds, block_rows):
        s = bits[srow].repeat_interleave(block_cols, dim=-1)  # [H, D]
        x = torch.pow(2.0, (s - 127).to(torch.float64))
        out[r0:r0 + n] = torch.where(s == 255, math.nan, values[r0:r0 + n] * x)
    return out.to(data.device)


def mx_round_trip_spec(x: Tensor, offsets: Optional[Tensor] = None, block: Sequence[int] = (1, 32),
                       rounding: str = "rceil") -> Tensor:
    """float64 values of ``x`` after MXFP8 quantization (oracle)."""
    return mx_dequantize_spec(*mx_quantize_spec(x, offsets, block, rounding), offsets, block)


def _mx_round_trip_last_axis(p: Tensor) -> Tensor:
    """float64 ``p [..., L]`` MXFP8 round-tripped in (1, 32) blocks along its last axis from index 0, the last block
    padded with zeros, rounding "rceil" (how attention quantizes P)."""
    length = p.shape[-1]
    padded = torch.nn.functional.pad(p, (0, -length % 32))
    flat = padded.reshape(-1, 1, padded.shape[-1])
    return mx_round_trip_spec(flat).reshape(padded.shape)[..., :length]


def _oracle_p(qs: Tensor, ks: Tensor, visible: Tensor, scale: float):
    """(P [H, Lq, Lk], M [H, Lq, 1], has_mass [H, Lq, 1]) of one sequence in ``reference_mxfp8_attention``: P =
    2**(s2 - M) on visible keys, s2 the log2-domain scores, M = ceil(max visible s2)."""
    s2 = torch.einsum("ihd,jhd->hij", qs, ks) * (scale / math.log(2))
    s2 = s2.masked_fill(~visible, -math.inf)
    row_max = s2.amax(dim=-1, keepdim=True) if s2.shape[-1] else s2.new_full((*s2.shape[:-1], 1), -math.inf)
    has_mass = (row_max > -math.inf) | row_max.isnan()  # a NaN score: NaN out and lse (README "Semantics")
    m = torch.where(has_mass, torch.ceil(row_max), torch.zeros_like(row_max))
    return torch.where(visible & has_mass, torch.exp2(s2 - m), torch.zeros_like(s2)), m, has_mass


def _p_near_ties(p: Tensor, rel: float = 1e-5) -> Tensor:
    """bool [Lq, H] of one sequence's P [H, Lq, Lk]: the rows whose quantized P changes when P moves by a relative
    ``rel`` either way, i.e. a P value within ``rel`` of an E4M3 rounding midpoint or a block max at an E8M0
    boundary. A kernel's fp32 P may round such a value the other way than the float64 oracle: one weight 12.5% off
    (stop 55's CI: fp32 0.53125 = 272 at scale 2^-9, the midpoint of E4M3's 256 and 288)."""
    lo = _mx_round_trip_last_axis(p * (1 - rel)) / (1 - rel)
    hi = _mx_round_trip_last_axis(p * (1 + rel)) / (1 + rel)
    return (~torch.isclose(lo, hi, rtol=4 * rel, atol=0)).any(dim=-1).T


def reference_mxfp8_attention(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                              scale: Optional[float] = None, causal: bool = False, window: Sequence[int] = (-1, -1),
                              broadcast_q: bool = False, rounding: str = "rceil", p_ties: bool = False):
    """Float64 oracle of ``jfa::mxfp8_attention``'s forward: (out [T_q, Hq, D], lse [Hq, T_q]), both float64; with
    ``p_ties`` also bool [T_q, Hq]: the rows whose P sits at a quantization near-tie (``_p_near_ties``), which tests
    leave out of their tight out bound, as the GPU tests leave out FP8 MMA ties.

    Per sequence: Q and K round-tripped through MXFP8 in (1, 32) blocks (along head_dim), V in (32, 1) blocks
    (along the sequence); s2 = (Q K^T) * scale / ln 2 (log2 domain), M = ceil(max visible s2) per row (an integer,
    so P's MXFP8 blocks are the same whatever running maximum a kernel rescales by), P = 2**(s2 - M) on visible keys,
    Pq = P round-tripped in (1, 32) blocks along the keys ("rceil"); out = Pq V / sum(Pq), lse = (M + log2(sum P))
    * ln 2 (the unquantized P: the backward's softmax). A row with no visible key: out 0, lse -inf.
    """
    heads_q, heads_kv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if scale is None else float(scale)
    qd = mx_round_trip_spec(q, None, (1, 32), rounding).cpu()
    kd = mx_round_trip_spec(k, None, (1, 32), rounding).cpu()
    vd = mx_round_trip_spec(v, kv_offsets, (32, 1), rounding).cpu()
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    outs, lses, ties = [], [], []
    for b in range(len(kv_bounds) - 1):
        qs = qd if broadcast_q else qd[q_bounds[b]:q_bounds[b + 1]]
        ks = kd[kv_bounds[b]:kv_bounds[b + 1]].repeat_interleave(group, dim=1)
        vs = vd[kv_bounds[b]:kv_bounds[b + 1]].repeat_interleave(group, dim=1)
        if qs.shape[0] == 0 or ks.shape[0] == 0:  # nothing visible: out 0, lse -inf
            outs.append(torch.zeros(qs.shape[0], heads_q, head_dim, dtype=torch.float64))
            lses.append(torch.full((heads_q, qs.shape[0]), -math.inf, dtype=torch.float64))
            ties.append(torch.zeros(qs.shape[0], heads_q, dtype=torch.bool))
            continue
        p, m, has_mass = _oracle_p(qs, ks, visible_mask(qs.shape[0], ks.shape[0], causal, window), scale)
        if p_ties:
            ties.append(_p_near_ties(p))
        pq = _mx_round_trip_last_axis(p)
        total_q = pq.sum(dim=-1, keepdim=True)
        outs.append(torch.einsum("hij,jhd->ihd", pq / torch.where(total_q > 0, total_q, 1.0), vs))
        total = p.sum(dim=-1, keepdim=True)
        lse = torch.where(has_mass, (m + torch.log2(torch.where(total > 0, total, 1.0))) * math.log(2), -math.inf)
        lses.append(lse.squeeze(-1))
    out = torch.cat(outs) if outs else torch.zeros(0, heads_q, head_dim, dtype=torch.float64)
    lse = torch.cat(lses, dim=1) if lses else torch.zeros(heads_q, 0, dtype=torch.float64)
    if p_ties:
        tie_rows = torch.cat(ties) if ties else torch.zeros(0, heads_q, dtype=torch.bool)
        return out.to(q.device), lse.to(q.device), tie_rows.to(q.device)
    return out.to(q.device), lse.to(q.device)


def _mx_round_trip_square(p: Tensor) -> Tensor:
    """float64 ``p [H, Lq, Lk]`` round-tripped in 32 x 32 blocks over (Lq, Lk) from (0, 0), rounding "rceil"."""
    heads, lq, lk = p.shape
    padded = torch.nn.functional.pad(p, (0, -lk % 32, 0, -lq % 32)).transpose(0, 1)  # [Lq', H, Lk']
    return mx_round_trip_spec(padded, None, (32, 32)).transpose(0, 1)[:, :lq, :lk]


def reference_mxfp8_attention_backward(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                                       out: Tensor, lse: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                                       scale: Optional[float] = None, causal: bool = False,
                                       window: Sequence[int] = (-1, -1), broadcast_q: bool = False,
                                       rounding: str = "rceil") -> Tuple[Tensor, Tensor, Tensor]:
    """Float64 oracle of ``jfa::mxfp8_attention_backward``: (dq, dk, dv) float64, per sequence.

    Q, K, dO round-tripped in (32, 32) blocks (row blocks per sequence; broadcast Q is one sequence, its dO rows per
    output sequence), V in (1, 32) blocks; P = exp(min(Q K^T scale - lse, 0)) from the given lse; dV = Pq^T dO with P
    round-tripped in 32 x 32 blocks over (query, key); dP = dO V^T; dS = P (dP - delta), delta = rowsum(dO * out)
    - grad_lse, round-tripped in 32 x 32 blocks; dQ = scale dS K; dK = scale dS^T Q.
    """
    return _mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, scale=scale,
                                     causal=causal, window=window, broadcast_q=broadcast_q, rounding=rounding)


def mx_rebased_row_blocks_spec(x: Tensor, offsets: Optional[Tensor], block: Sequence[int],
                               rounding: str = "rceil") -> Tensor:
    """float64 values of ``x``'s MXFP8 blocks re-based, per 32-row block (per sequence, from its first row) and head,
    to the largest block scale among them: each element E4M3-rounded (nearest even) at that scale. The MX values
    but for elements that fall to E4M3 subnormals there (re-basing's documented loss); NaN blocks stay NaN."""
    data, scales = mx_quantize_spec(x, offsets, block, rounding)
    values = mx_dequantize_spec(data, scales, offsets, block).cpu()
    bits = scales.detach().cpu().view(torch.uint8).to(torch.int64)  # 255: NaN block
    bits = torch.where(bits == 255, torch.zeros_like(bits), bits)
    bounds = None if offsets is None else [int(o) for o in offsets.tolist()]
    out = torch.empty_like(values)
    for r0, n, srow in _row_blocks(values.shape[0], bounds, 32):
        block_bits = bits[srow] if block[0] == 32 else bits[r0:r0 + n].amax(dim=0)  # [H, D / 32]
        factor = torch.pow(2.0, (block_bits.amax(dim=-1) - 127).to(torch.float64))[None, :, None]  # [1, H, 1]
        out[r0:r0 + n] = e4m3_round_spec(values[r0:r0 + n] / factor) * factor
    return out.to(x.device)


def mxfp8_attention_backward_model(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                                   out: Tensor, lse: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                                   scale: Optional[float] = None, causal: bool = False,
                                   window: Sequence[int] = (-1, -1), broadcast_q: bool = False,
                                   rounding: str = "rceil", rebased_s_dp: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """Float64 model of the MXFP8 backward bench/NOTES.md "MXFP8 backward on Hopper" proposes for the H200 (the
    oracle's computation but for two choices a Hopper kernel makes): P enters dV at one fixed scale (P x 2**8 rounded
    to E4M3: the oracle's 32 x 32 blocks wherever P >= 2**-14), and, with ``rebased_s_dp`` (FP8 S and dP), Q, K, dO
    and V reach S = Q K^T and dP = dO V^T re-based per 32-row (32-key) block over head_dim
    (``mx_rebased_row_blocks_spec``). dS in 32 x 32 blocks and dV, dK, dQ on the MX values (bf16 wgmma on values
    exact in bf16) are the oracle's. (dq, dk, dv) float64."""
    return _mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, scale=scale,
                                     causal=causal, window=window, broadcast_q=broadcast_q, rounding=rounding,
                                     fixed_p_scale=True, rebased_s_dp=rebased_s_dp)


def _mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *, scale, causal, window,
                              broadcast_q, rounding, fixed_p_scale=False, rebased_s_dp=False):
    """``reference_mxfp8_attention_backward`` (the defaults) and ``mxfp8_attention_backward_model``."""
    heads_q, heads_kv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if scale is None else float(scale)
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    batch = len(kv_bounds) - 1
    out_offsets = (torch.arange(batch + 1) * q.shape[0]) if broadcast_q else q_offsets.cpu()
    q_grid = None if broadcast_q else q_offsets
    qd = mx_round_trip_spec(q, q_grid, (32, 32), rounding).cpu()
    kd = mx_round_trip_spec(k, kv_offsets, (32, 32), rounding).cpu()
    vd = mx_round_trip_spec(v, None, (1, 32), rounding).cpu()
    dod = mx_round_trip_spec(grad_out, out_offsets, (32, 32), rounding).cpu()
    if rebased_s_dp:  # S's and dP's operands (dV, dK, dQ keep the MX values)
        q_s, k_s = (mx_rebased_row_blocks_spec(x, o, (32, 32), rounding).cpu() for x, o in ((q, q_grid),
                                                                                           (k, kv_offsets)))
        do_s = mx_rebased_row_blocks_spec(grad_out, out_offsets, (32, 32), rounding).cpu()
        v_s = mx_rebased_row_blocks_spec(v, kv_offsets, (1, 32), rounding).cpu()
    else:
        q_s, k_s, do_s, v_s = qd, kd, dod, vd
    p_for_dv = (lambda p: e4m3_round_spec(p * 256.0) / 256.0) if fixed_p_scale else _mx_round_trip_square
    delta = torch.einsum("ihd,ihd->hi", grad_out.detach().cpu().double(), out.detach().cpu().double())
    if grad_lse is not None:
        delta = delta - grad_lse.detach().cpu().double()
    lse64 = lse.detach().cpu().double()
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v))
    out_bounds = [int(x) for x in out_offsets.tolist()]
    for b in range(batch):
        q0, q1 = (0, q.shape[0]) if broadcast_q else (out_bounds[b], out_bounds[b + 1])
        o0, o1, k0, k1 = out_bounds[b], out_bounds[b + 1], kv_bounds[b], kv_bounds[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        ks = kd[k0:k1].repeat_interleave(group, dim=1)
        visible = visible_mask(q1 - q0, k1 - k0, causal, window)
        row_lse = lse64[:, o0:o1, None]
        s = torch.einsum("ihd,jhd->hij", q_s[q0:q1], k_s[k0:k1].repeat_interleave(group, dim=1)) * scale
        p = torch.where(visible & (row_lse > -math.inf), torch.exp((s - row_lse.clamp(min=-1e300)).clamp(max=0)), 0.0)
        do = dod[o0:o1]
        dv_h = torch.einsum("hij,ihd->jhd", p_for_dv(p), do)
        dp = torch.einsum("ihd,jhd->hij", do_s[o0:o1], v_s[k0:k1].repeat_interleave(group, dim=1))
        ds = _mx_round_trip_square(p * (dp - delta[:, o0:o1, None]))
        dq[q0:q1] += scale * torch.einsum("hij,jhd->ihd", ds, ks)
        dk[k0:k1] += (scale * torch.einsum("hij,ihd->jhd", ds, qd[q0:q1])).unflatten(1, (heads_kv, group)).sum(2)
        dv[k0:k1] += dv_h.unflatten(1, (heads_kv, group)).sum(2)
    return dq.to(q.device), dk.to(q.device), dv.to(q.device)


def rebased_mxfp8_attention_model(rebased, q_offsets: Optional[Tensor], kv_offsets: Tensor, *,
                                  scale: Optional[float] = None, causal: bool = False,
                                  window: Sequence[int] = (-1, -1), broadcast_q: bool = False,
                                  block_n: int = 128) -> Tuple[Tensor, Tensor]:
    """Float64 model of the TLX MXFP8 forward's arithmetic (``backends/tlx/mxfp8_attn_fwd.py``) on its re-based
    operands ``rebased = (qr, q_factors, kr, k_factors, vt, v_factors)`` (``backends/triton/mxfp8_rebase.py``):
    per sequence and key tile of ``block_n``: s = (Qr Kr^T) x row x key factors x scale / ln 2, an integer running
    maximum m, P x 2**8 = 2**(s - m + 8) rounded to E4M3 (nearest even), P V through the tile's V^T times its
    column factors, out = sum / (sum of the rounded P / 2**8), lse from the unrounded P. (out, lse) float64. It
    pins what the kernel computes (a GPU result within fp32 rounding of it); the issue's bound is checked against
    ``reference_mxfp8_attention``."""
    qr, qf, kr, kf, vt, vf = (t.detach().cpu() for t in rebased)
    heads_q, head_dim = qr.shape[1], qr.shape[2]
    heads_kv = kr.shape[1]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if scale is None else float(scale)
    qk = scale / math.log(2)
    kv_bounds = [int(x) for x in kv_offsets.tolist()]
    q_bounds = None if broadcast_q else [int(x) for x in q_offsets.tolist()]
    num_seqs = len(kv_bounds) - 1
    total_out = num_seqs * qr.shape[0] if broadcast_q else qr.shape[0]
    out = torch.zeros(total_out, heads_q, head_dim, dtype=torch.float64)
    lse = torch.full((heads_q, total_out), -math.inf, dtype=torch.float64)
    for b in range(num_seqs):
        q0, q1 = (0, qr.shape[0]) if broadcast_q else (q_bounds[b], q_bounds[b + 1])
        o0 = b * qr.shape[0] if broadcast_q else q0
        k0, k1 = kv_bounds[b], kv_bounds[b + 1]
        len_q, len_k = q1 - q0, k1 - k0
        if len_q == 0 or len_k == 0:
            continue
        visible = visible_mask(len_q, len_k, causal, window)
        tile0 = k0 // block_n + b
        for h in range(heads_q):
            hk = h // group
            s = (qr[q0:q1, h].double() @ kr[k0:k1, hk].double().T) * kf[hk, k0:k1].double()[None, :] \
                * (qf[h, q0:q1].double() * qk)[:, None]
            s = s.masked_fill(~visible, -math.inf)
            m = torch.full((len_q,), -math.inf, dtype=torch.float64)
            l, lq = torch.zeros(len_q, dtype=torch.float64), torch.zeros(len_q, dtype=torch.float64)
            acc = torch.zeros(len_q, head_dim, dtype=torch.float64)
            for i, n0 in enumerate(range(0, len_k, block_n)):
                st = s[:, n0:n0 + block_n]
                m_new = torch.maximum(m, torch.ceil(st.amax(dim=1)))
                m_ref = torch.where(m_new == -math.inf, 0.0, m_new)
                p = torch.exp2(st - (m_ref - 8)[:, None])
                alpha = torch.exp2(m - m_ref)
                p8 = p.float().to(torch.float8_e4m3fn).double()
                cols = (tile0 + i) * block_n
                values = vt[hk * head_dim:(hk + 1) * head_dim, cols:cols + st.shape[1]]
                pv = (p8 @ values.double().T) * vf[tile0 + i, hk].double()[None, :]
                acc, l, lq, m = acc * alpha[:, None] + pv, l * alpha + p.sum(dim=1), lq * alpha + p8.sum(dim=1), m_new
            empty = l == 0
            out[o0:o0 + len_q, h] = torch.where(empty[:, None], 0.0, acc / torch.where(empty, 1.0, lq / 256)[:, None])
            lse[h, o0:o0 + len_q] = torch.where(empty, -math.inf, (m - 8 + torch.log2(torch.where(empty, 1.0, l)))
                                                * math.log(2))
    return out, lse


def _truncate_to(x: Tensor, quantum: Tensor) -> Tensor:
    return torch.trunc(x / quantum) * quantum


def _exponent_of(x: Tensor) -> Tensor:
    return torch.floor(torch.log2(x.abs().clamp_min(1e-300)))


def fp8_mma_model(a: Tensor, b: Tensor, acc: Optional[Tensor] = None, *, group: int = 32, frac_bits: int = 13,
                  promote: Optional[int] = None) -> Tensor:
    """``acc + a [M, K] @ b [K, N]`` (float64, E4M3-representable operands) as Hopper's FP8 MMA sums it: a chain of
    k-steps of ``group`` products into one accumulator; each step's products (exact) and the accumulator aligned to
    their largest exponent and truncated toward zero to ``frac_bits`` fraction bits below it, the sum truncated to
    ``frac_bits`` + 1 significant bits (an e8m13 accumulator: DeepSeek-V3 report 3.5.2, SageAttention2; the PyTorch
    blog "Some matrix multiplication engines are not as accurate as we thought"). ``promote``: the chain restarts from
    zero every ``promote`` elements of K and the chains are added exactly, as fp32 registers would (Triton's
    ``max_num_imprecise_acc``; None: one chain). Calibrated on the H200: through the interpreter (``tests/backends/
    test_triton_mxfp8.py``'s ``fp8_dots_as_on_the_gpu``) it gives the triton ``rebase`` forward's out error on issue
    12's wide-range case to 3e-6 of the GPU's (bench/NOTES.md "MXFP8 re-basing on the GPU")."""
    a, b = a.double(), b.double()
    m, k = a.shape
    out = torch.zeros(m, b.shape[1], dtype=torch.float64) if acc is None else acc.double().clone()
    chain = k if promote is None else promote
    for c0 in range(0, k, chain):
        part = out if promote is None else torch.zeros_like(out)
        for g0 in range(c0, min(k, c0 + chain), group):
            prods = a[:, None, g0:g0 + group] * b[g0:g0 + group].T[None, :, :]  # [M, N, G]
            terms = torch.cat([part[:, :, None], prods], dim=2)
            quantum = torch.exp2(_exponent_of(terms.abs().amax(dim=2)) - frac_bits)[:, :, None]
            total = _truncate_to(terms, quantum).sum(dim=2)
            part = _truncate_to(total, torch.exp2(_exponent_of(total) - frac_bits))
        out = part if promote is None else out + part
    return out

"""The ``reference`` backend: exact attention in plain PyTorch, on any device.

Per sequence, Q rows in chunks so the score block never exceeds ``SCORE_BLOCK_BYTES`` (memory grows with
chunk_rows * L_kv, never L_q * L_kv). Accumulates in float32 (float64 for float64 inputs). It reads the offsets on the
host (one sync): it is the tests' second oracle, not a fast path (on CPU the ``cpu`` backend batches the same math
over length buckets and uses ``forward_into``/``backward_into`` for sequences too large to batch).
"""
from __future__ import annotations

import functools
from typing import Iterator, Optional, Tuple

import torch

from jfa_ops.backends.base import AttentionParams, Backend, FamilyImpl, Problem

SCORE_BLOCK_BYTES = 64 * 2**20


_AUTOCAST_KEYS = functools.reduce(
    lambda keys, name: keys.add(getattr(torch._C.DispatchKey, name)),
    [name for name in dir(torch._C.DispatchKey) if name.startswith("Autocast")],
    torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))  # every device's autocast key


def exact(fn):
    """``fn`` run with autocast's dispatch keys excluded (as ``jfa::attention``'s autocast kernel runs the op), so
    that its ops compute in the dtypes it chose. Why: ops without an autocast kernel of their own (the backward ops,
    the MXFP8 quantize ops, pre-quantized MXFP8 attention) run their bodies inside the caller's ``torch.autocast``
    region, where every fp32 einsum here ran in bf16/fp16: ~2e-2 relative error against the float64 oracle,
    silently, where the reference promises fp32 accumulation (bench/NOTES.md "Hardening, helper wrap38"). Free
    outside a region (one check)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not torch._C._is_any_autocast_enabled():
            return fn(*args, **kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return fn(*args, **kwargs)

    return run


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _sequences(q, q_offsets, kv_offsets, params) -> Iterator[Tuple[int, int, int, int, int, int]]:
    """Yield (b, q_start, q_rows, out_start, kv_start, kv_rows) for every sequence."""
    kv_bounds = kv_offsets.tolist()
    q_bounds = None if params.broadcast_q else q_offsets.tolist()
    for b in range(len(kv_bounds) - 1):
        kv_start, kv_rows = kv_bounds[b], kv_bounds[b + 1] - kv_bounds[b]
        if params.broadcast_q:
            q_start, q_rows, out_start = 0, q.shape[0], b * q.shape[0]
        else:
            q_start, q_rows = q_bounds[b], q_bounds[b + 1] - q_bounds[b]
            out_start = q_start
        yield b, q_start, q_rows, out_start, kv_start, kv_rows


def _row_chunks(q_rows: int, kv_rows: int, heads: int, elem_bytes: int) -> Iterator[Tuple[int, int]]:
    step = max(1, SCORE_BLOCK_BYTES // max(1, kv_rows * heads * elem_bytes))
    for r0 in range(0, q_rows, step):
        yield r0, min(q_rows, r0 + step)


def visible_mask(r0: int, r1: int, q_rows: int, kv_rows: int, params: AttentionParams, device) -> Optional[torch.Tensor]:
    """[r1-r0, kv_rows] bool: query i sees key j (bottom-right aligned causal/window). None when all visible."""
    if not params.causal and params.window_left < 0 and params.window_right < 0:
        return None
    i = torch.arange(r0, r1, device=device)[:, None]
    j = torch.arange(kv_rows, device=device)[None, :]
    diag = i + (kv_rows - q_rows)
    visible = torch.ones(r1 - r0, kv_rows, dtype=torch.bool, device=device)
    if params.causal:
        visible &= j <= diag
    if params.window_left >= 0:
        visible &= j >= diag - params.window_left
    if params.window_right >= 0:
        visible &= j <= diag + params.window_right
    return visible


def _scores(q_chunk, k_seq, visible, scale):
    """q_chunk [r, Hkv, G, D], k_seq [Lk, Hkv, D] -> scores [Hkv, G, r, Lk] (masked with -inf)."""
    s = torch.einsum("rhgd,khd->hgrk", q_chunk, k_seq) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return s


def row_lse(s):
    """logsumexp over keys; a NaN or +inf score makes the softmax undefined: lse NaN (out NaN), as in flash kernels."""
    lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is visible (or every visible score is -inf)
    return lse.masked_fill(lse == float("inf"), float("nan"))


def softmax_probs(s, lse):
    """softmax probabilities from scores and their lse. Rows with lse = -inf (no visible key, or all visible scores
    -inf) give zeros; a NaN lse gives NaN, so NaN inputs propagate like in SDPA (never a silent 0)."""
    empty = lse == float("-inf")
    p = torch.exp(s - lse.masked_fill(empty, 0)[..., None])
    return p.masked_fill(empty[..., None], 0)


def _grouped(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """[r, Hq, D] -> [r, Hkv, G, D] (q head h reads kv head h // G)."""
    return x.unflatten(1, (heads_kv, x.shape[1] // heads_kv))


def forward(q, k, v, q_offsets, kv_offsets, params: AttentionParams):
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if params.broadcast_q else q.shape[0]
    out = torch.zeros(rows, q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], rows), float("-inf"), dtype=torch.float32, device=q.device)
    forward_into(out, lse, q, k, v, _sequences(q, q_offsets, kv_offsets, params), params)
    return out, lse


def _restrict(visible, b, r0, r1, block_mask):
    """``visible`` ([r, Lk] or None) and the block-sparse family's ``block_mask(b, r0, r1)`` ([Hkv, 1, r, Lk]: one
    mask per kv head, broadcast over its query heads), or ``visible`` alone without one."""
    if block_mask is None:
        return visible
    mask = block_mask(b, r0, r1)
    return mask if visible is None else mask & visible


@exact
def forward_into(out, lse, q, k, v, sequences, params: AttentionParams, block_mask=None) -> None:
    """Write out/lse rows of ``sequences`` (tuples as ``_sequences`` yields); rows of the others are left alone.
    ``block_mask``: see ``_restrict`` (the block-sparse family)."""
    heads_q = q.shape[1]
    heads_kv = k.shape[1]
    cdt = _compute_dtype(q.dtype)
    for b, q_start, q_rows, out_start, kv_start, kv_rows in sequences:
        if q_rows == 0 or kv_rows == 0:
            continue
        k_seq = k[kv_start:kv_start + kv_rows].to(cdt)
        v_seq = v[kv_start:kv_start + kv_rows].to(cdt)
        for r0, r1 in _row_chunks(q_rows, kv_rows, heads_q, torch.finfo(cdt).bits // 8):
            q_chunk = _grouped(q[q_start + r0:q_start + r1].to(cdt), heads_kv)
            visible = _restrict(visible_mask(r0, r1, q_rows, kv_rows, params, q.device), b, r0, r1, block_mask)
            s = _scores(q_chunk, k_seq, visible, params.scale)
            lse_chunk = row_lse(s)  # [Hkv, G, r]
            p = softmax_probs(s, lse_chunk)
            o = torch.einsum("hgrk,khd->rhgd", p, v_seq).flatten(1, 2)
            out[out_start + r0:out_start + r1] = o.to(q.dtype)
            lse[:, out_start + r0:out_start + r1] = lse_chunk.flatten(0, 1).float()


def backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params: AttentionParams):
    cdt = _compute_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=cdt, device=q.device)
    dk = torch.zeros(k.shape, dtype=cdt, device=q.device)
    dv = torch.zeros(v.shape, dtype=cdt, device=q.device)
    backward_into(dq, dk, dv, grad_out, grad_lse, q, k, v, out, lse, _sequences(q, q_offsets, kv_offsets, params),
                  params)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@exact
def backward_into(dq, dk, dv, grad_out, grad_lse, q, k, v, out, lse, sequences, params: AttentionParams,
                  block_mask=None) -> None:
    """Add the gradients of ``sequences`` into dq/dk/dv (compute dtype: float32, float64 for float64 inputs).
    ``block_mask``: see ``_restrict`` (the block-sparse family)."""
    heads_q = q.shape[1]
    heads_kv = k.shape[1]
    cdt = dq.dtype
    for b, q_start, q_rows, out_start, kv_start, kv_rows in sequences:
        if q_rows == 0 or kv_rows == 0:
            continue
        kv_rows_slice = slice(kv_start, kv_start + kv_rows)
        k_seq, v_seq = k[kv_rows_slice].to(cdt), v[kv_rows_slice].to(cdt)
        for r0, r1 in _row_chunks(q_rows, kv_rows, heads_q, torch.finfo(cdt).bits // 8):
            q_rows_slice, o_rows_slice = slice(q_start + r0, q_start + r1), slice(out_start + r0, out_start + r1)
            q_chunk = _grouped(q[q_rows_slice].to(cdt), heads_kv)
            do_chunk = _grouped(grad_out[o_rows_slice].to(cdt), heads_kv)
            o_chunk = _grouped(out[o_rows_slice].to(cdt), heads_kv)
            visible = _restrict(visible_mask(r0, r1, q_rows, kv_rows, params, q.device), b, r0, r1, block_mask)
            s = _scores(q_chunk, k_seq, visible, params.scale)
            if cdt == torch.float64:  # the saved lse is float32: recompute it, or fp64 grads are only ~1e-7 exact
                lse_chunk = row_lse(s)
            else:
                lse_chunk = lse[:, o_rows_slice].to(cdt).unflatten(0, (heads_kv, -1))  # [Hkv, G, r]
            p = softmax_probs(s, lse_chunk)
            # delta = rowsum(dO * O) - dlse: d lse / d s = p, so the lse gradient enters like a shift of delta.
            delta = torch.einsum("rhgd,rhgd->hgr", do_chunk, o_chunk)
            if grad_lse is not None:
                delta = delta - grad_lse[:, o_rows_slice].to(cdt).unflatten(0, (heads_kv, -1))
            dv[kv_rows_slice] += torch.einsum("hgrk,rhgd->khd", p, do_chunk)
            dp = torch.einsum("rhgd,khd->hgrk", do_chunk, v_seq)
            ds = p * (dp - delta[..., None]) * params.scale
            # where P is 0 (a key the row does not see; every key of a row that sees none) dS is 0 even for a NaN/inf
            # dO or delta there: 0 x NaN would reach dq and the sequence's dk (autograd's masked softmax gives 0)
            ds = torch.where(p == 0, 0.0, ds)
            dq[q_rows_slice] += torch.einsum("hgrk,khd->rhgd", ds, k_seq).flatten(1, 2)
            dk[kv_rows_slice] += torch.einsum("hgrk,rhgd->khd", ds, q_chunk)


def supports(problem: Problem) -> Optional[str]:
    return None  # exact math on any device, dtype and mask


def _block_sparse_family():
    from jfa_ops.backends.reference import block_sparse  # imports this module: bind after its definitions

    return block_sparse.FAMILIES


from jfa_ops.backends.reference import mxfp8 as _mxfp8  # noqa: E402  (it imports visible_mask from here)

BACKEND = Backend(name="reference", forward=forward, backward=backward, supports=supports, priority=0, families={
    **_block_sparse_family(),
    "mxfp8_quantize": FamilyImpl(_mxfp8.quantize),
    "mxfp8_dequantize": FamilyImpl(_mxfp8.dequantize),
    "mxfp8_attention": FamilyImpl(_mxfp8.attention_forward, _mxfp8.attention_backward),
})
